/* flux-box — flux-sim, flux-oracle, gpu_check and bench_forward in one executable, for
 * tools/gpu/gpu-bundle.sh: each of them linked statically against OpenBLAS and HDF5 would be ~28 MB,
 * one copy of the libraries serves all four. The name it is called by picks the program
 * (symlinks flux-sim, flux-oracle, gpu_check, bench_forward → flux-box), or the first argument:
 * `flux-box flux-oracle diff a.h5 b.h5`. The four mains are the programs' own sources compiled
 * with -Dmain=NAME_main (Makefile, $(B)/flux-box). */
#include <stdio.h>
#include <string.h>

int flux_sim_main(int argc, char **argv);
int flux_oracle_main(int argc, char **argv);
int gpu_check_main(int argc, char **argv);
int bench_forward_main(int argc, char **argv);

static const struct prog {
    const char *name;
    int (*fn)(int, char **);
} progs[] = {
    {"flux-sim", flux_sim_main},
    {"flux-oracle", flux_oracle_main},
    {"gpu_check", gpu_check_main},
    {"bench_forward", bench_forward_main},
};

static const struct prog *find(const char *path)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    for (size_t i = 0; i < sizeof progs / sizeof *progs; i++)
        if (!strcmp(b, progs[i].name)) return &progs[i];
    return NULL;
}

int main(int argc, char **argv)
{
    const struct prog *p = find(argv[0]);
    if (p) return p->fn(argc, argv);
    if (argc > 1 && (p = find(argv[1]))) return p->fn(argc - 1, argv + 1);
    fprintf(stderr, "usage: flux-box {flux-sim|flux-oracle|gpu_check|bench_forward} [args] (or call it by one of those names)\n");
    return 2;
}
