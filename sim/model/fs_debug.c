#include "fs_debug.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "fs_backend.h"

char fs_debug_module[192];
int fs_debug_step = -1;
volatile int fs_debug_wait = 1;

void fs_debug_wait_for_debugger(int rank)
{
    char host[256] = "?";
    gethostname(host, sizeof host);
    fprintf(stderr,
            "flux-sim: rank %d (pid %ld on %s) is waiting for a debugger:\n"
            "  gdb -p %ld -x tools/debug/flux-sim.gdb -ex 'set var fs_debug_wait = 0' -ex continue\n",
            rank, (long)getpid(), host, (long)getpid());
    fflush(stderr);
    while (fs_debug_wait) sleep(1);
}

void fs_debug_print_tensor(const fs_tensor *dev, int64_t first, int64_t n)
{
    if (!dev || !dev->data) {
        fprintf(stdout, "(no tensor)\n");
        return;
    }
    /* a tensor in backend memory (a GPU, cpu-strict) is downloaded first: gdb can pass any */
    fs_tensor host;
    fs_err e = {0};
    if (fs_tensor_host_view(dev, &host, &e)) {
        fprintf(stdout, "(cannot download the tensor: %s)\n", e.msg);
        return;
    }
    const fs_tensor *t = &host;
    char s[96];
    int64_t N = fs_tensor_numel(t), nan = 0, inf = 0, fin = 0;
    double mn = INFINITY, mx = -INFINITY, sum = 0, sum2 = 0;
    for (int64_t i = 0; i < N; i++) {
        double v = fs_tensor_get(t, i);
        if (isnan(v)) nan++;
        else if (isinf(v)) inf++;
        else {
            fin++;
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
            sum += v;
            sum2 += v * v;
        }
    }
    double mean = fin ? sum / fin : 0, sd = fin ? sqrt(fmax(sum2 / fin - mean * mean, 0)) : 0;
    fprintf(stdout, "tensor %s %s: min %.6g max %.6g mean %.6g std %.6g, %lld NaN, %lld Inf\n",
            fs_tensor_shape_str(t, s, sizeof s), fs_dtype_name(t->dtype), mn, mx, mean, sd, (long long)nan, (long long)inf);
    if (first < 0) first = 0;
    fprintf(stdout, "  [%lld:%lld]", (long long)first, (long long)(first + n < N ? first + n : N));
    for (int64_t i = first; i < first + n && i < N; i++) fprintf(stdout, " %.7g", fs_tensor_get(t, i));
    fprintf(stdout, "\n");
    fflush(stdout); /* gdb prints around it: keep the order */
    fs_tensor_free(&host);
}
