/* fs_model.c — fs_model_forward: the transformer call of either family (fs_model.h). */
#include "fs_layers.h"

int fs_model_forward(const fs_model *m, const fs_tensor *hidden_states, const fs_tensor *encoder_hidden_states,
                     const fs_tensor *pooled, const double *timestep, const double *guidance,
                     const fs_tensor *img_ids, const fs_tensor *txt_ids, fs_tensor *out, fs_err *e)
{
    const int nax = fs_config_axes(&m->cfg);
    if (img_ids->ndim != 2 || img_ids->shape[1] != nax || txt_ids->ndim != 2 || txt_ids->shape[1] != nax)
        return fs_errf(e, FS_E_INPUT, "position ids must have %d columns (one per RoPE axis of the config)", nax);
    if (m->cfg.family == FS_FLUX2)
        return fs_flux2_forward(m, hidden_states, encoder_hidden_states, timestep, guidance, img_ids, txt_ids, out, e);
    return fs_flux1_forward(m, hidden_states, encoder_hidden_states, pooled, timestep, guidance, img_ids, txt_ids, out, e);
}
