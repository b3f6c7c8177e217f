#!/usr/bin/python3
"""bench_torch_peer.py — time the PyTorch peer of issue 13: FluxTransformer2DModel (tools/torch/torch_flux.py's
modules, written from diffusers' source) forward in float32 on torch 1.13 CPU, synthetic weights.

    tools/bench/bench_torch_peer.py [--reps N] [--threads N] [config flags] [--tiny] [--native-kernels]

Defaults are build/bench_forward's config: FLUX.1-dev width (24 heads x 128 = 3072, MLP 12288,
joint 4096, in 64, pooled 768, guidance), 1 double + 1 single block, 32x32 image + 512 text tokens,
batch 1. One warm-up forward, then --reps timed ones under torch.no_grad() (as FluxPipeline runs
it); no dump hooks, no bug switches: the model's plain forward. Model FLOPs are counted as
bench_forward counts them (docs/performance.md "Model FLOPs"): every Linear 2*rows*in*out,
attention 4*S^2*D per block; nothing else.

Threads: --threads N sets OMP_NUM_THREADS and OPENBLAS_NUM_THREADS before torch loads (Debian's
torch does its float32 GEMMs in OpenBLAS, whose pthread pool torch.set_num_threads does not touch),
then torch.set_num_threads(N), one inter-op thread and openblas_set_num_threads(N). The CPU time
per forward is printed next to the wall time, so that "1 thread" can be seen to use one core.

Kernels: importing torch_flux.py sets OPENBLAS_CORETYPE=Haswell and ATEN_CPU_CAPABILITY=avx2 (the
reference dumps' kernels) unless already set; that is kept by default. --native-kernels loads torch
first, so OpenBLAS picks its kernels by CPU as it does in flux-sim's build/bench_forward (on an
AVX-512 machine Haswell's sgemm is the slower one). The kernels used are printed.
Last line: `torch_peer_median_s SECONDS`. Exit status: 0 success, 2 error (one line on stderr).
"""
import argparse
import importlib.util
import os
import resource
import statistics
import sys
import time

PROG = "bench_torch_peer.py"


def die(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        die(f"{message} (see --help)")


def parse_args(argv=None):
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="Exit status: 0 success, 2 error (one line on stderr).")
    p.add_argument("--reps", type=int, default=3, metavar="N", help="timed forwards after 1 warm-up [3]")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch, OpenMP and OpenBLAS threads [1]")
    p.add_argument("--seed", type=int, default=0, help="weights and inputs seed [0]")
    p.add_argument("--native-kernels", action="store_true",
                   help="let OpenBLAS pick its kernels by CPU instead of torch_flux.py's Haswell pin")
    g = p.add_argument_group("config (default FLUX.1-dev width, 1 + 1 blocks, 1024 + 512 tokens)")
    # None = not given: --tiny fills those in, then the FLUX.1-dev values
    g.add_argument("--tiny", action="store_true",
                   help="a seconds-long check config: 2 heads x 32, joint 64, in 16, pooled 32, 4x4 + 8 tokens")
    g.add_argument("--heads", type=int, metavar="H", help="attention heads [24]")
    g.add_argument("--head-dim", type=int, metavar="DH", help="head width; D = H*DH, MLP 4*D [128]")
    g.add_argument("--joint-dim", type=int, metavar="N", help="joint_attention_dim (text features) [4096]")
    g.add_argument("--in-channels", type=int, metavar="N", help="in_channels (= out_channels) [64]")
    g.add_argument("--pooled", type=int, metavar="N", help="pooled_projection_dim [768]")
    g.add_argument("--axes", metavar="A,B,C", help="axes_dims_rope, summing to DH [16,56,56]")
    g.add_argument("--no-guidance", action="store_true", help="no guidance embedder (FLUX.1-schnell)")
    g.add_argument("--double", type=int, metavar="N", help="double (joint) blocks [1]")
    g.add_argument("--single", type=int, metavar="N", help="single blocks [1]")
    g.add_argument("--grid", metavar="HxW", help="image token grid [32x32]")
    g.add_argument("--txt", type=int, metavar="N", help="text tokens [512]")
    a = p.parse_args(argv)
    tiny = dict(heads=2, head_dim=32, joint_dim=64, in_channels=16, pooled=32, axes="8,12,12", grid="4x4", txt=8)
    dev = dict(heads=24, head_dim=128, joint_dim=4096, in_channels=64, pooled=768, axes="16,56,56", grid="32x32",
               txt=512, double=1, single=1)
    for k, v in dev.items():
        if getattr(a, k) is None:
            setattr(a, k, tiny.get(k, v) if a.tiny else v)
    for k in ("reps", "threads", "heads", "head_dim", "joint_dim", "in_channels", "pooled", "txt"):
        if getattr(a, k) < 1:
            die(f"--{k.replace('_', '-')} must be >= 1, not {getattr(a, k)}")
    if a.double < 0 or a.single < 0:
        die("--double and --single must be >= 0")
    try:
        a.grid_h, a.grid_w = (int(x) for x in a.grid.lower().split("x"))
        assert a.grid_h >= 1 and a.grid_w >= 1
    except (ValueError, AssertionError):
        die(f"--grid {a.grid}: expected HxW with H, W >= 1, e.g. 32x32")
    try:
        axes = [int(x) for x in a.axes.split(",")]
        assert len(axes) == 3 and all(x > 0 and x % 2 == 0 for x in axes)
        a.axes = axes
    except (ValueError, AssertionError):
        die(f"--axes {a.axes}: expected three even positive integers, e.g. 16,56,56")
    if sum(a.axes) != a.head_dim:
        die(f"--axes {','.join(map(str, a.axes))} sums to {sum(a.axes)}, the head width is {a.head_dim}")
    return a


def model_flops(cfg, s_img, s_txt):
    """(Linear, attention) FLOPs of one forward, as tools/bench/bench_forward.c's shape list counts them."""
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    F, S, C = 4 * D, s_img + s_txt, cfg["in_channels"]
    emb = (2 if cfg["guidance_embeds"] else 1) * (256 * D + D * D) + cfg["pooled_projection_dim"] * D + D * D
    dbl = 2 * 6 * D * D + 4 * S * D * D + 2 * S * F * D              # AdaLN x2; q,k,v,out; ff (img + txt rows)
    sgl = 3 * D * D + 3 * S * D * D + S * F * D + S * (D + F) * D      # AdaLN; q,k,v; proj_mlp; proj_out
    lin = s_img * C * D + s_txt * cfg["joint_attention_dim"] * D + emb + 2 * D * D + s_img * D * C \
        + cfg["num_layers"] * dbl + cfg["num_single_layers"] * sgl
    return 2.0 * lin, 4.0 * S * S * D * (cfg["num_layers"] + cfg["num_single_layers"])


def main():
    a = parse_args()
    # before torch (and numpy) load OpenBLAS and OpenMP: their pools are sized from these
    user_env = set(os.environ)
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    if a.native_kernels:
        importlib.import_module("torch")   # loads OpenBLAS before torch_flux.py pins OPENBLAS_CORETYPE
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("torch_flux", os.path.join(here, "..", "torch", "torch_flux.py"))
    tf = importlib.util.module_from_spec(spec)
    sys.modules["torch_flux"] = tf
    spec.loader.exec_module(tf)      # not __main__: parses no arguments; sets the kernel env (setdefault)
    if a.native_kernels and "ATEN_CPU_CAPABILITY" not in user_env:
        del os.environ["ATEN_CPU_CAPABILITY"]       # ATen reads it at its first dispatch
    torch = tf.torch
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    tf.openblas_set_threads(a.threads)   # torch_flux's own run() would set 2 (--blas-threads); here as asked

    cfg = dict(num_attention_heads=a.heads, attention_head_dim=a.head_dim, in_channels=a.in_channels,
               joint_attention_dim=a.joint_dim, pooled_projection_dim=a.pooled, guidance_embeds=not a.no_guidance,
               axes_dims_rope=a.axes, num_layers=a.double, num_single_layers=a.single, patch_size=1)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(a.seed)
    model = tf.FluxTransformer2DModel(tf.Numerics("float32"), cfg).eval()
    with torch.no_grad():             # std 0.02 (RMSNorm scales 1): activations stay O(1), nothing overflows
        for m in model.modules():
            for p in m.parameters(recurse=False):
                if isinstance(m, tf.RMSNorm):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
    nparam = sum(p.numel() for p in model.parameters())
    s_img, s_txt = a.grid_h * a.grid_w, a.txt
    rows, cols = torch.meshgrid(torch.arange(a.grid_h), torch.arange(a.grid_w), indexing="ij")
    inputs = dict(   # FluxPipeline's: packed latents, T5 states, CLIP pooled, t/1000, ids (0, row, col)
        hidden_states=torch.randn(1, s_img, a.in_channels, generator=gen),
        encoder_hidden_states=torch.randn(1, s_txt, a.joint_dim, generator=gen),
        pooled_projections=torch.randn(1, a.pooled, generator=gen),
        timestep=torch.tensor([1.0]), guidance=None if a.no_guidance else torch.tensor([3.5]),
        img_ids=torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float(),
        txt_ids=torch.zeros(s_txt, 3))
    t_w = time.perf_counter() - t0

    def forward():
        c0, w0 = time.process_time(), time.perf_counter()
        with torch.no_grad():
            out = model(**inputs)[0]
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if not torch.isfinite(out).all():
            die(f"the forward's output is not finite ({int((~torch.isfinite(out)).sum())} of {out.numel()})")
        return w, c, out

    lin, attn = model_flops(cfg, s_img, s_txt)
    total = lin + attn
    cores = "/".join(sorted(tf.openblas_cores())) or "?"
    blas = "/".join(sorted({str(lib.openblas_get_num_threads()) for lib in tf._openblas_libs()
                            if hasattr(lib, "openblas_get_num_threads")})) or "?"    # as OpenBLAS reports it
    cap = next((ln.split(":")[-1].strip() for ln in torch.__config__.show().splitlines() if "capability" in ln), "?")
    D = a.heads * a.head_dim
    print(f"{PROG}: torch {torch.__version__} float32, D={D} ({a.heads}x{a.head_dim}), MLP {4 * D}, "
          f"{a.double} double + {a.single} single block, {s_img} image ({a.grid_h}x{a.grid_w}) + {s_txt} text tokens, "
          f"batch 1, {a.reps} reps after 1 warm-up")
    print(f"  threads: torch {torch.get_num_threads()}, OpenBLAS {blas} ({cores} kernels"
          f"{', native' if a.native_kernels else ', torch_flux.py pin'}), ATen {cap}")
    print(f"  weights                      {nparam * 4 / 1048576:10.1f} MiB fp32, generated in {t_w:.1f} s")
    print(f"  model FLOPs per forward      {total * 1e-9:10.1f} GFLOP (Linear {lin * 1e-9:.1f} + attention {attn * 1e-9:.1f})")
    w, c, out = forward()
    print(f"  warm-up forward              {w:10.3f} s  (output {list(out.shape)}, finite, |mean| {out.abs().mean():.4g})")
    times = []
    for r in range(a.reps):
        w, c, _ = forward()
        times.append(w)
        print(f"  rep {r + 1:<3d}                      {w:10.3f} s  {total / w * 1e-9:8.1f} GFLOP/s  "
              f"CPU {c:.3f} s ({c / w:.2f} cores)", flush=True)
    med = statistics.median(times)
    print(f"  torch peer forward (median)  {med:10.3f} s  {total / med * 1e-9:8.1f} GFLOP/s")
    print(f"  process peak RSS             {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:10.1f} MiB")
    print(f"torch_peer_median_s {med:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
