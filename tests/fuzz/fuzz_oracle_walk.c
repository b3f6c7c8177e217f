/* fuzz_oracle_walk.c — flux-oracle's walk of a whole dump: the fuzzer's bytes describe a
 * flux-dump's structure, the harness writes it with the HDF5 API (a well-formed HDF5 file:
 * libhdf5's own crashes on damaged bytes are fuzz_dump's FUZZ_DUMP_FILES business), and the
 * oracle reads it as `stats` and as `diff` against itself and against a copy with one value
 * changed.
 *
 * Input: a byte script of records (op byte, flag byte, text up to 0xFF; 0xFE k b repeats b
 * 1024*k times, for long names). Ops: a dataset in step_0000 (listed in `order` or not; the name
 * may hold '/' = nested groups), a name in `order` that is no dataset, `order` replaced by a
 * single string / a 2-D array / a number, a dataset in /inputs, a recorded_modules or
 * recorded_steps attribute, a subgroup with a dataset deeper than the reader goes.
 *
 * Invariants — reliability probe 3, T2: "an oracle never passes on what it did not read":
 *   - errors are one line with a known code (fuzz_check_error);
 *   - when stats succeeds, every dataset the harness created under /inputs and step_0000 is in
 *     its report, by its whole name;
 *   - when diff of the file against itself succeeds, every created dataset is an entry, and the
 *     verdict is not a divergence (a tensor is equal to itself; NaN/Inf are not written);
 *   - when diff against the copy whose LAST created dataset is +1 succeeds, the verdict is a
 *     divergence (that dataset was compared). */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fo_diff.h"
#include "fuzz_common.h"

#define MAX_DS 64

/* HDF5 paths: '/' separates groups, and empty, "." and ".." components do not name themselves.
 * Such components are dropped, so the name the harness records is the one the file holds. */
static void clean_name(char *s)
{
    char *o = s;
    for (char *p = s; *p;) {
        char *e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        int skip = l == 0 || (l == 1 && p[0] == '.') || (l == 2 && p[0] == '.' && p[1] == '.');
        if (!skip) {
            if (o != s) *o++ = '/';
            memmove(o, p, l);
            o += l;
        }
        p += l + (e != NULL);
    }
    *o = 0;
}

static const char *CONFIG =
    "{\"_class_name\": \"FluxTransformer2DModel\", \"patch_size\": 1, \"in_channels\": 8, \"out_channels\": null, "
    "\"num_layers\": 1, \"num_single_layers\": 1, \"attention_head_dim\": 16, \"num_attention_heads\": 2, "
    "\"joint_attention_dim\": 16, \"pooled_projection_dim\": 16, \"guidance_embeds\": false, \"axes_dims_rope\": [4, 6, 6]}";

static void attr_str(hid_t loc, const char *name, const char *val)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    hid_t sp = H5Screate(H5S_SCALAR);
    if (H5Aexists(loc, name) > 0) H5Adelete(loc, name);
    hid_t a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) H5Awrite(a, t, &val), H5Aclose(a);
    H5Sclose(sp), H5Tclose(t);
}

static void attr_strs(hid_t loc, const char *name, const char *const *v, hsize_t n, int rank2)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    hsize_t dims[2] = {n, 1};
    if (rank2) dims[0] = 1, dims[1] = n;
    hid_t sp = H5Screate_simple(rank2 ? 2 : 1, dims, NULL);
    if (H5Aexists(loc, name) > 0) H5Adelete(loc, name);
    hid_t a = H5Acreate2(loc, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) H5Awrite(a, t, v), H5Aclose(a);
    H5Sclose(sp), H5Tclose(t);
}

static void attr_num(hid_t loc, const char *name, double v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    if (H5Aexists(loc, name) > 0) H5Adelete(loc, name);
    hid_t a = H5Acreate2(loc, name, H5T_NATIVE_DOUBLE, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) H5Awrite(a, H5T_NATIVE_DOUBLE, &v), H5Aclose(a);
    H5Sclose(sp);
}

/* A float32 dataset of 4 values; 1 when created. */
static int dataset(hid_t loc, const char *name, float base, hid_t lcpl)
{
    hsize_t d = 4;
    float v[4] = {base, base + 1, base - 2, 0.5f};
    hid_t sp = H5Screate_simple(1, &d, NULL);
    hid_t ds = H5Dcreate2(loc, name, H5T_IEEE_F32LE, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    int ok = ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0;
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(sp);
    return ok;
}

typedef struct plan {
    char *step_ds[MAX_DS];
    int listed[MAX_DS];
    int n_step;
    char *input_ds[MAX_DS];
    int n_input;
    char *order_extra[MAX_DS]; /* names in `order` that are no dataset */
    int n_extra;
    int order_form;            /* 0 list, 1 single string, 2 2-D, 3 number, 4 absent */
    char *modules, *steps;
} plan;

static void plan_free(plan *p)
{
    for (int i = 0; i < p->n_step; i++) free(p->step_ds[i]);
    for (int i = 0; i < p->n_input; i++) free(p->input_ds[i]);
    for (int i = 0; i < p->n_extra; i++) free(p->order_extra[i]);
    free(p->modules), free(p->steps);
}

/* Writes the plan to path; `bump` adds 1 to the last created dataset (step's, else inputs'). */
static void write_dump(const char *path, plan *p, int bump)
{
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    H5Pset_link_creation_order(fcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
    H5Pclose(fcpl);
    if (f < 0) abort();
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
    H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
    attr_str(f, "format", "flux-dump");
    attr_num(f, "version", 1);
    attr_str(f, "dtype", "float32");
    attr_str(f, "config", CONFIG);
    if (p->steps) attr_str(f, "recorded_steps", p->steps);
    hid_t in = H5Gcreate2(f, "inputs", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    {
        hsize_t d = 2;
        float sig[2] = {1, 0};
        hid_t sp = H5Screate_simple(1, &d, NULL);
        hid_t ds = H5Dcreate2(in, "sigmas", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, sig);
        H5Dclose(ds), H5Sclose(sp);
    }
    const int last_in = p->n_step ? -1 : p->n_input - 1;
    for (int i = 0; i < p->n_input; i++)
        if (!dataset(in, p->input_ds[i], (float)i + (bump && i == last_in ? 1.0f : 0.0f), lcpl)) {
            free(p->input_ds[i]); /* HDF5 refused the name: not in the file, not expected */
            memmove(p->input_ds + i, p->input_ds + i + 1, (size_t)(p->n_input - i - 1) * sizeof *p->input_ds);
            p->n_input--, i--;
        }
    H5Gclose(in);
    hid_t st = H5Gcreate2(f, "step_0000", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    dataset(st, "latents_in", 1, lcpl);
    const char *order[2 * MAX_DS + 2];
    int no = 0;
    order[no++] = "latents_in";
    for (int i = 0; i < p->n_step; i++) {
        if (!dataset(st, p->step_ds[i], 10.0f + (float)i + (bump && i == p->n_step - 1 ? 1.0f : 0.0f), lcpl)) {
            free(p->step_ds[i]);
            memmove(p->step_ds + i, p->step_ds + i + 1, (size_t)(p->n_step - i - 1) * sizeof *p->step_ds);
            memmove(p->listed + i, p->listed + i + 1, (size_t)(p->n_step - i - 1) * sizeof *p->listed);
            p->n_step--, i--;
            continue;
        }
        if (p->listed[i]) order[no++] = p->step_ds[i];
    }
    for (int i = 0; i < p->n_extra; i++) order[no++] = p->order_extra[i];
    dataset(st, "latents_out", 2, lcpl);
    order[no++] = "latents_out";
    if (p->modules) attr_str(st, "recorded_modules", p->modules);
    if (p->order_form == 0) attr_strs(st, "order", order, (hsize_t)no, 0);
    else if (p->order_form == 1) attr_str(st, "order", "latents_in,latents_out");
    else if (p->order_form == 2) attr_strs(st, "order", order, (hsize_t)no, 1);
    else if (p->order_form == 3) attr_num(st, "order", 3);
    H5Gclose(st);
    hid_t fin = H5Gcreate2(f, "final", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    dataset(fin, "latents", 3, lcpl);
    H5Gclose(fin);
    attr_num(f, "complete", 1);
    H5Pclose(lcpl), H5Pclose(gcpl);
    H5Fclose(f);
}

static int stat_has(const fo_stat_report *r, const char *group, const char *name)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].group, group) && !strcmp(r->v[i].name, name)) return 1;
    return 0;
}

static int diff_has(const fo_report *r, const char *group, const char *name)
{
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->v[i].group, group) && !strcmp(r->v[i].name, name)) return 1;
    return 0;
}

static void check_err(int rc, const fs_err *e)
{
    fuzz_check_error(rc, e);
    FUZZ_ASSERT(!strchr(e->msg, '\n') && !strchr(e->msg, '\033'), "error message not one clean line: %s", e->msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char pa[64], pb[64];
    if (!pa[0]) {
        const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(pa, sizeof pa, "%.40s/fuzz-walk-%d-a.h5", tmp, (int)getpid());
        snprintf(pb, sizeof pb, "%.40s/fuzz-walk-%d-b.h5", tmp, (int)getpid());
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    }
    fuzz_cursor c = {data, size};
    plan p = {0};
    for (int rec = 0; c.n && rec < 3 * MAX_DS; rec++) {
        int op = fuzz_byte(&c), flag = fuzz_byte(&c);
        char *t = fuzz_text(&c, 'z');
        switch (op % 8) {
        case 0:
        case 1:
        case 2: /* a dataset in step_0000 */
            clean_name(t);
            if (!t[0] || p.n_step == MAX_DS || !strcmp(t, "latents_in") || !strcmp(t, "latents_out")) break;
            p.listed[p.n_step] = !(flag & 1);
            p.step_ds[p.n_step++] = t, t = NULL;
            break;
        case 3: /* a name in `order`, no dataset */
            if (p.n_extra < MAX_DS) p.order_extra[p.n_extra++] = t, t = NULL;
            break;
        case 4:
            p.order_form = flag % 5;
            break;
        case 5: /* a dataset in /inputs */
            clean_name(t);
            if (!t[0] || p.n_input == MAX_DS || !strcmp(t, "sigmas")) break;
            p.input_ds[p.n_input++] = t, t = NULL;
            break;
        case 6:
            if (flag & 1) free(p.modules), p.modules = t;
            else free(p.steps), p.steps = t;
            t = NULL;
            break;
        default: { /* a dataset 12 groups deep: deeper than the reader lists */
            char deep[64] = "";
            for (int k = 0; k < 12; k++) strcat(deep, "d/");
            strcat(deep, "x");
            if (p.n_step < MAX_DS) p.listed[p.n_step] = flag & 1, p.step_ds[p.n_step++] = strdup(deep);
        }
        }
        free(t);
    }
    /* a dataset created twice keeps its first creation: drop duplicates from the expectation */
    for (int i = 0; i < p.n_step; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(p.step_ds[i], p.step_ds[j])) {
                free(p.step_ds[i]);
                memmove(p.step_ds + i, p.step_ds + i + 1, (size_t)(p.n_step - i - 1) * sizeof *p.step_ds);
                memmove(p.listed + i, p.listed + i + 1, (size_t)(p.n_step - i - 1) * sizeof *p.listed);
                p.n_step--, i--;
                break;
            }
    for (int i = 0; i < p.n_input; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(p.input_ds[i], p.input_ds[j])) {
                free(p.input_ds[i]);
                memmove(p.input_ds + i, p.input_ds + i + 1, (size_t)(p.n_input - i - 1) * sizeof *p.input_ds);
                p.n_input--, i--;
                break;
            }
    /* A dataset whose name is a prefix group of another ("a" and "a/b") fails to be created
     * second; write_dump drops those from the plan while writing A, so B, written from what is
     * left, holds the same names, and the plan is what the files hold. */
    write_dump(pa, &p, 0);
    write_dump(pb, &p, 1);
    fs_err e = {0};
    fo_file *a = NULL, *b = NULL;
    int rc = fo_file_open(&a, pa, &e);
    if (rc) check_err(rc, &e);
    if (!rc) rc = fo_file_open(&b, pb, &e);
    if (rc) {
        check_err(rc, &e);
        goto out;
    }
    fo_stat_report sr;
    rc = fo_stats_run(a, NULL, &sr, &e);
    if (rc) check_err(rc, &e);
    else {
        for (int i = 0; i < p.n_step; i++)
            FUZZ_ASSERT(stat_has(&sr, "/step_0000", p.step_ds[i]), "stats passed without /step_0000/%.200s (%zu bytes)",
                        p.step_ds[i], strlen(p.step_ds[i]));
        for (int i = 0; i < p.n_input; i++)
            FUZZ_ASSERT(stat_has(&sr, "/inputs", p.input_ds[i]), "stats passed without /inputs/%.200s", p.input_ds[i]);
    }
    fo_stat_report_free(&sr);
    fo_diff_opts o = {0};
    fo_report r;
    rc = fo_diff_run(a, a, NULL, &o, &r, &e);
    if (rc) check_err(rc, &e);
    else {
        for (int i = 0; i < p.n_step; i++)
            FUZZ_ASSERT(diff_has(&r, "/step_0000", p.step_ds[i]), "diff passed without /step_0000/%.200s", p.step_ds[i]);
        for (int i = 0; i < p.n_input; i++)
            FUZZ_ASSERT(diff_has(&r, "/inputs", p.input_ds[i]), "diff passed without /inputs/%.200s", p.input_ds[i]);
        char why[512];
        fo_verdict v = fo_report_verdict(&r, 0, pa, pa, why, sizeof why);
        FUZZ_ASSERT(v != FO_VERDICT_DIVERGE, "a dump diverges from itself: %s", why);
    }
    fo_report_free(&r);
    if (p.n_step || p.n_input) {
        rc = fo_diff_run(a, b, NULL, &o, &r, &e);
        if (rc) check_err(rc, &e);
        else {
            char why[512];
            fo_verdict v = fo_report_verdict(&r, 0, pa, pb, why, sizeof why);
            FUZZ_ASSERT(v != FO_VERDICT_PASS, "PASS although the last dataset (%.200s) differs by 1",
                        p.n_step ? p.step_ds[p.n_step - 1] : p.input_ds[p.n_input - 1]);
        }
        fo_report_free(&r);
    }
out:
    fo_file_close(a);
    fo_file_close(b);
    plan_free(&p);
    return 0;
}
