/* fo_coords.h — coordinates of a tensor element in words ("batch 0, image token 12, head 2,
 * channel 7"), so a report says where a divergence is in model terms, not only as indices. */
#ifndef FO_COORDS_H
#define FO_COORDS_H

#include <stddef.h>
#include <stdint.h>

#include "fo_dump.h"

/* Model sizes the naming needs; any may be 0 = unknown. */
typedef struct fo_model_dims {
    int batch, s_txt, s_img, heads, head_dim;
} fo_model_dims;

/* batch and sequence lengths from /inputs, heads from `config`; what cannot be read stays 0
 * (naming is a convenience: a damaged file gets indices only, never an error). */
fo_model_dims fo_read_model_dims(fo_file *f);

/* "batch 0, image token 12, head 2, channel 7" for coordinates in a dataset named `name` of
 * `shape`, given the model sizes (any may be 0 = unknown). "" for /inputs datasets and shapes
 * that have no known meaning. */
void fo_describe_coords(const char *group, const char *name, int ndim, const int64_t *shape, const int64_t *coords,
                        int batch, int s_txt, int s_img, int heads, int head_dim, char *buf, size_t n);

#endif
