/* fo_config.h — a dump's `config` root attribute as the oracle sees it: must be a JSON object,
 * and two dumps can only be compared when they describe the same model.
 *
 * This is deliberately not sim/base/fs_config (which builds a runnable model and rejects anything it
 * cannot run): the oracle compares dumps of any producer, so it only checks the FLUX keys of the
 * format (../shared/flux-dump.md) for equality. */
#ifndef FO_CONFIG_H
#define FO_CONFIG_H

#include <stddef.h>

#include "fs_common.h"

/* FS_OK when `json` parses as a JSON object; FS_E_INPUT "ORIGIN: attribute config is not valid
 * JSON (near '...')" / "... is not a JSON object" otherwise. */
int fo_config_check(const char *json, const char *origin, fs_err *e);

/* Compares the format's model keys (patch_size, in_channels, out_channels, num_layers,
 * num_single_layers, attention_head_dim, num_attention_heads, joint_attention_dim,
 * pooled_projection_dim, guidance_embeds, axes_dims_rope) of two configs. out_channels null or
 * absent means in_channels (diffusers' rule); booleans and 0/1 compare equal; a key present on
 * one side only is a difference. *same = 1 when they agree; else 0 and `why` lists the
 * differences ("num_layers 2 vs 1, axes_dims_rope [8, 12, 12] vs [4, 6, 6]"). Errors: either
 * side not a JSON object (see fo_config_check). */
int fo_config_compare(const char *ja, const char *origin_a, const char *jb, const char *origin_b, int *same, char *why,
                      size_t n, fs_err *e);

#endif
