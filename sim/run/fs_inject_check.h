/* fs_inject_check.h — honesty of --inject: an injection that cannot act is refused, one that
 * never acted is not a pass.
 *
 * The checks read THE table of sim/parallel/fs_inject.c (fs_inject_info_of: what every bug's
 * hook needs to act and to change a result) against this run's layout, sequence partition,
 * config and inputs. They sit in run/, above the model whose inputs they read, so that the
 * injection hooks below stay a leaf every layer can include. */
#ifndef FS_INJECT_CHECK_H
#define FS_INJECT_CHECK_H

#include "fs_comm.h"
#include "fs_config.h"
#include "fs_inject.h"
#include "fs_inputs.h"
#include "fs_par.h"

/* Before any compute: FS_E_INPUT (exit 2), one line, when an armed injection "cannot fire under"
 * this layout, or "fires but cannot change anything under" this layout and shape; the line says
 * why and names the layouts where the bug shows. Every rank reaches the same verdict from the
 * same replicated data (layout, partition, config, ids, step count), except the value checks of
 * the *-temp-bcast bugs, made on world rank 0 alone — under those injections only rank 0 holds
 * the broadcast values — which the CLI's agreement on the exit code makes every rank's. */
int fs_inject_refuse(const fs_inject *in, const fs_par *p, const fs_config *c, const fs_inputs *inp,
                     fs_err *e);
/* After a run that did not diverge, on every rank (a collective over `world`): an armed injection
 * that fired on no rank is FS_E_INPUT ("never fired"), never a clean OK. Covers every bug whose
 * hook reports (fs_inject_fire, nan-rank's flag; fail-rank would have ended the job); for
 * timestep-/guidance-temp-bcast and rope-local-pos, whose hooks (fs_sampler.c) act whenever the
 * layout lets them, the table's check before the run is exact. */
int fs_inject_after_run(const fs_inject *in, const fs_group *world, fs_err *e);

#endif
