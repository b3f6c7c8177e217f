#!/usr/bin/env python3
"""bench_diffusers_peer.py — time issue 22's peer: the real diffusers FluxTransformer2DModel on PyTorch 2.x
(the peer venv, tools/install-peer.sh: torch 2.15.0 + diffusers 0.42.1), float32 or bfloat16, on the CPU.

    .venv-peer/bin/python tools/bench/bench_diffusers_peer.py [--dtype fp32|bf16] [--threads N] [--reps N]

The config is build/bench_forward's: FLUX.1-dev width (24 heads x 128 = 3072, MLP 12288, joint 4096, in 64,
pooled 768, guidance), 1 double + 1 single block, a 32x32 image grid (1024 tokens) + 512 text tokens, batch 1,
synthetic weights (normal, std 0.02; RMSNorm scales 1). The model is built in float32 and cast with
`.to(dtype)` as a user's bf16 pipeline does; inputs are cast likewise. One warm-up forward, then --reps timed
ones under torch.inference_mode(); the model's plain forward, no hooks. Model FLOPs are counted exactly as
bench_forward counts them (docs/performance.md "Model FLOPs"): every Linear 2*rows*in*out, attention
4*S^2*D per block, nothing else.

Threads: --threads N sets OMP_NUM_THREADS before torch loads, then torch.set_num_threads(N) and one
inter-op thread. The CPU time per forward is printed beside the wall time, so "1 thread" can be seen
to use one core. torch's own kernel choice is printed (ATen CPU capability, oneDNN/MKL availability).
Last line: `diffusers_peer_median_s SECONDS`. Exit status: 0 success, 2 error (one line on stderr).
"""
import argparse
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_torch_peer import model_flops  # noqa: E402  (stdlib-only at import: the FLOPs as bench_forward counts them)

PROG = "bench_diffusers_peer.py"


def die(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="model and input dtype [fp32]")
    p.add_argument("--reps", type=int, default=3, metavar="N", help="timed forwards after 1 warm-up [3]")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch intra-op (and OpenMP) threads [1]")
    p.add_argument("--seed", type=int, default=0, help="weights and inputs seed [0]")
    p.add_argument("--tiny", action="store_true", help="a tiny config (2 heads x 32, 4x4 + 8 tokens), for tests")
    a = p.parse_args(argv)
    if a.reps < 1 or a.threads < 1:
        die("--reps and --threads must be >= 1")
    return a


def main():
    a = parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    try:
        import torch
        from diffusers import FluxTransformer2DModel
        import diffusers
    except ImportError as e:
        die(f"{e}: run it with the peer venv's python (tools/install-peer.sh builds .venv-peer)")
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    dtype = dict(fp32=torch.float32, bf16=torch.bfloat16)[a.dtype]
    if a.tiny:
        cfg = dict(num_attention_heads=2, attention_head_dim=32, in_channels=16, joint_attention_dim=64,
                   pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(8, 12, 12),
                   num_layers=1, num_single_layers=1, patch_size=1)
        gh, gw, s_txt = 4, 4, 8
    else:
        cfg = dict(num_attention_heads=24, attention_head_dim=128, in_channels=64, joint_attention_dim=4096,
                   pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56),
                   num_layers=1, num_single_layers=1, patch_size=1)
        gh, gw, s_txt = 32, 32, 512
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(a.seed)
    model = FluxTransformer2DModel(**cfg).eval()
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if "norm_q" in name or "norm_k" in name or "norm_added" in name:
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, 0.02, generator=gen)
    model = model.to(dtype)
    nparam = sum(p.numel() for p in model.parameters())
    s_img = gh * gw
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    inputs = dict(  # FluxPipeline's: packed latents, T5 states, CLIP pooled, t/1000, ids (0, row, col)
        hidden_states=torch.randn(1, s_img, cfg["in_channels"], generator=gen).to(dtype),
        encoder_hidden_states=torch.randn(1, s_txt, cfg["joint_attention_dim"], generator=gen).to(dtype),
        pooled_projections=torch.randn(1, cfg["pooled_projection_dim"], generator=gen).to(dtype),
        timestep=torch.tensor([1.0]).to(dtype), guidance=torch.tensor([3.5]).to(dtype),
        img_ids=torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float(),
        txt_ids=torch.zeros(s_txt, 3), return_dict=False)
    t_w = time.perf_counter() - t0

    def forward():
        c0, w0 = time.process_time(), time.perf_counter()
        with torch.inference_mode():
            out = model(**inputs)[0]
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if not torch.isfinite(out).all():
            die(f"the forward's output is not finite ({int((~torch.isfinite(out)).sum())} of {out.numel()})")
        return w, c, out

    lin, attn = model_flops(cfg, s_img, s_txt)
    total = lin + attn
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    print(f"{PROG}: torch {torch.__version__}, diffusers {diffusers.__version__}, {a.dtype}, D={D}, MLP {4 * D}, "
          f"1 double + 1 single block, {s_img} image + {s_txt} text tokens, batch 1, {a.reps} reps after 1 warm-up")
    print(f"  threads: torch {torch.get_num_threads()}; ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"oneDNN {'yes' if torch.backends.mkldnn.is_available() else 'no'}, MKL {'yes' if torch.backends.mkl.is_available() else 'no'}")
    print(f"  weights                      {nparam * (4 if a.dtype == 'fp32' else 2) / 1048576:10.1f} MiB {a.dtype}, built in {t_w:.1f} s")
    print(f"  model FLOPs per forward      {total * 1e-9:10.1f} GFLOP (Linear {lin * 1e-9:.1f} + attention {attn * 1e-9:.1f})")
    w, c, out = forward()
    print(f"  warm-up forward              {w:10.3f} s  (output {list(out.shape)}, finite)")
    times = []
    for r in range(a.reps):
        w, c, _ = forward()
        times.append(w)
        print(f"  rep {r + 1:<3d}                      {w:10.3f} s  {total / w * 1e-9:8.1f} GFLOP/s  "
              f"CPU {c:.3f} s ({c / w:.2f} cores)", flush=True)
    med = statistics.median(times)
    print(f"  diffusers peer forward (median) {med:7.3f} s  {total / med * 1e-9:8.1f} GFLOP/s")
    print(f"  process peak RSS             {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:10.1f} MiB")
    print(f"diffusers_peer_median_s {med:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
