#include "fo_tolerance.h"

#include <string.h>

/* Measured on the reference configs (docs/tolerances.md): float32 vs float64, worst over every
 * dataset and step, rel_l2 3.1e-5 and max_rel 1.1e-4 (time_proj@1: diffusers' float32 sinusoid
 * of arguments up to 3500); flux-sim float64 vs diffusers float64, rel_l2 5.7e-14 and max_rel
 * 3.4e-13. The defaults sit 6.5x (rel_l2) and 4.5x (max_rel) above the float32 worst case, and
 * ~1700x / 3000x above the float64 one. bfloat16/float16 have no reference runs: they are scaled
 * from the format's epsilon (2^-8, 2^-11) and are a starting point, not a measurement. */
fo_tolerance fo_tolerance_default(const char *dtype)
{
    if (dtype && !strcmp(dtype, "float64")) return (fo_tolerance){.rtol = 1e-10, .atol = 1e-13, .mtol = 1e-9};
    if (dtype && !strcmp(dtype, "bfloat16")) return (fo_tolerance){.rtol = 4e-2, .atol = 1e-3, .mtol = 1e-1};
    if (dtype && !strcmp(dtype, "float16")) return (fo_tolerance){.rtol = 5e-3, .atol = 1e-4, .mtol = 1.5e-2};
    return (fo_tolerance){.rtol = 2e-4, .atol = 1e-6, .mtol = 5e-4};
}

static double dmax(double a, double b) { return a > b ? a : b; }

fo_tolerance fo_tolerance_layout(const char *dtype)
{
    if (dtype && !strcmp(dtype, "float64")) return (fo_tolerance){.rtol = 1e-10, .atol = 0, .mtol = 1e-9};
    return (fo_tolerance){.rtol = 2e-5, .atol = 0, .mtol = 2e-4};
}

fo_tolerance fo_tolerance_looser(fo_tolerance a, fo_tolerance b)
{
    fo_tolerance t = {dmax(a.rtol, b.rtol), dmax(a.atol, b.atol), dmax(a.mtol, b.mtol)};
    if (a.mtol <= 0 || b.mtol <= 0) t.mtol = 0;
    return t;
}

int fo_tolerance_pass(const fo_stats *s, fo_tolerance t)
{
    if (s->n_nonfinite_mismatch) return 0;
    if (s->max_abs <= t.atol) return 1;
    if (!(s->rel_l2 <= t.rtol)) return 0;
    return t.mtol <= 0 || fo_stats_max_rel(s) <= t.mtol;
}

int fo_tolerance_pass_truth(const fo_stats *sa, const fo_stats *sb, double m, fo_tolerance t)
{
    if (sb->n_nonfinite_mismatch > sa->n_nonfinite_mismatch) return 0;
    if (sb->max_abs <= t.atol) return 1;
    if (!(sb->rel_l2 <= m * sa->rel_l2 + t.rtol / 10)) return 0;
    return t.mtol <= 0 || fo_stats_max_rel(sb) <= m * fo_stats_max_rel(sa) + t.mtol / 10;
}
