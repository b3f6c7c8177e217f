#include "fs_inputs.h"

#include <string.h>

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
    memset(in, 0, sizeof *in);
}
