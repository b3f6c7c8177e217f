#include "fs_inputs.h"

#include <string.h>

#include "fs_backend.h"

void fs_inputs_free(fs_inputs *in)
{
    if (!in) return;
    fs_tensor_free(&in->hidden_states);
    fs_tensor_free(&in->encoder_hidden_states);
    fs_tensor_free(&in->pooled_projections);
    fs_tensor_free(&in->img_ids);
    fs_tensor_free(&in->txt_ids);
    fs_tensor_free(&in->guidance);
    fs_tensor_free(&in->sigmas);
    fs_tensor_free(&in->timesteps);
    fs_tensor_free(&in->negative_encoder_hidden_states);
    fs_tensor_free(&in->negative_pooled_projections);
    fs_tensor_free(&in->negative_txt_ids);
    fs_tensor_free(&in->image_latents);
    fs_tensor_free(&in->image_latent_ids);
    memset(in, 0, sizeof *in);
}

int fs_inputs_alloc(fs_inputs *in, const fs_config *c, fs_dtype dt, int B, int S_img, int S_txt, int n_steps,
                    int has_guidance, fs_err *e)
{
    memset(in, 0, sizeof *in);
    in->B = B;
    in->S_img = S_img;
    in->S_txt = S_txt;
    in->n_steps = n_steps;
    in->has_guidance = has_guidance;
    int rc;
    const int nax = fs_config_axes(c);
    if ((rc = fs_tensor_alloc3(&in->hidden_states, dt, B, S_img, c->in_channels, e)) ||
        (rc = fs_tensor_alloc3(&in->encoder_hidden_states, dt, B, S_txt, c->joint_attention_dim, e)) ||
        /* FLUX.2 has no pooled vector: left empty (ndim 0) */
        (c->family != FS_FLUX2 && (rc = fs_tensor_alloc2(&in->pooled_projections, dt, B, c->pooled_projection_dim, e))) ||
        (rc = fs_tensor_alloc2(&in->img_ids, FS_F64, S_img, nax, e)) || (rc = fs_tensor_alloc2(&in->txt_ids, FS_F64, S_txt, nax, e)) ||
        (rc = fs_tensor_alloc(&in->sigmas, FS_F64, 1, (int64_t[]){n_steps + 1}, e)) ||
        (rc = fs_tensor_alloc(&in->timesteps, FS_F64, 1, (int64_t[]){n_steps}, e)) ||
        (has_guidance && (rc = fs_tensor_alloc(&in->guidance, FS_F64, 1, (int64_t[]){B}, e)))) {
        fs_inputs_free(in);
        return rc;
    }
    return FS_OK;
}

int fs_inputs_alloc_negative(fs_inputs *in, const fs_config *c, fs_dtype dt, int S_neg, double scale, fs_err *e)
{
    int rc;
    in->true_cfg_scale = scale;
    in->S_neg = S_neg;
    if ((rc = fs_tensor_alloc3(&in->negative_encoder_hidden_states, dt, in->B, S_neg, c->joint_attention_dim, e)) ||
        (c->family != FS_FLUX2 &&
         (rc = fs_tensor_alloc2(&in->negative_pooled_projections, dt, in->B, c->pooled_projection_dim, e))) ||
        (rc = fs_tensor_alloc2(&in->negative_txt_ids, FS_F64, S_neg, fs_config_axes(c), e)))
        return rc;
    return FS_OK;
}

int fs_inputs_alloc_ref(fs_inputs *in, const fs_config *c, fs_dtype dt, int S_ref, fs_err *e)
{
    int rc;
    in->S_ref = S_ref;
    if ((rc = fs_tensor_alloc3(&in->image_latents, dt, in->B, S_ref, c->in_channels, e)) ||
        (rc = fs_tensor_alloc2(&in->image_latent_ids, FS_F64, S_ref, fs_config_axes(c), e)))
        return rc;
    return FS_OK;
}

int fs_inputs_convert(fs_inputs *in, fs_dtype dt, fs_err *e)
{
    fs_tensor *act[6] = {&in->hidden_states, &in->encoder_hidden_states, &in->pooled_projections,
                         &in->negative_encoder_hidden_states, &in->negative_pooled_projections, &in->image_latents};
    for (int k = 0; k < 6; k++) {
        fs_tensor c;
        if (act[k]->dtype == dt || !act[k]->ndim) continue; /* FLUX.2: no pooled vector */
        int rc = fs_tensor_alloc(&c, dt, act[k]->ndim, act[k]->shape, e);
        if (!rc) rc = fs_tensor_copy(&c, act[k], e);
        if (rc) return rc;
        fs_tensor_free(act[k]);
        *act[k] = c;
    }
    return FS_OK;
}

int fs_inputs_copy(fs_inputs *dst, const fs_inputs *src, fs_err *e)
{
    memset(dst, 0, sizeof *dst);
    dst->B = src->B, dst->S_img = src->S_img, dst->S_txt = src->S_txt, dst->n_steps = src->n_steps;
    dst->has_guidance = src->has_guidance;
    dst->true_cfg_scale = src->true_cfg_scale, dst->S_neg = src->S_neg, dst->S_ref = src->S_ref;
    const fs_tensor *from[] = {&src->hidden_states, &src->encoder_hidden_states, &src->pooled_projections, &src->img_ids,
                               &src->txt_ids, &src->guidance, &src->sigmas, &src->timesteps,
                               &src->negative_encoder_hidden_states, &src->negative_pooled_projections,
                               &src->negative_txt_ids, &src->image_latents, &src->image_latent_ids};
    fs_tensor *to[] = {&dst->hidden_states, &dst->encoder_hidden_states, &dst->pooled_projections, &dst->img_ids,
                       &dst->txt_ids, &dst->guidance, &dst->sigmas, &dst->timesteps,
                       &dst->negative_encoder_hidden_states, &dst->negative_pooled_projections, &dst->negative_txt_ids,
                       &dst->image_latents, &dst->image_latent_ids};
    for (size_t k = 0; k < FS_ARRAY_LEN(to); k++) {
        if (!from[k]->ndim) continue;
        int rc = fs_tensor_alloc(to[k], from[k]->dtype, from[k]->ndim, from[k]->shape, e);
        if (!rc) rc = fs_tensor_copy(to[k], from[k], e);
        if (rc) {
            fs_inputs_free(dst);
            return rc;
        }
    }
    return FS_OK;
}
