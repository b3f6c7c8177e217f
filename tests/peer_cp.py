#!/usr/bin/env python3
"""diffusers' own context parallelism at degree 3 with uneven chunks, in the unified (Ulysses x ring)
mode, and seed 001 (the ring merge with a wrongly shaped LSE) as the customer hit it
(tests/peer_cp.sh; the peer venv of tools/install-peer.sh). One process per rank (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), gloo, the CPU.

    peer_cp.py FAMILY REFDIR OUTDIR [--ring R] [--ulysses U] [--anything] [--steps N]
               [--inputs FILE] [--bug lse-reduced|timestep-ranks]

FAMILY flux1 | flux2, REFDIR (config.json, weights.safetensors, dump_fp32.h5's /inputs or --inputs
FILE) and the pipeline loop: as tests/peer_diffusers.py (whose helpers this imports), fp32.
`transformer.enable_parallelism(config=ContextParallelConfig(ring_degree=R, ulysses_degree=U,
ring_anything=.., ulysses_anything=..))`: --anything sets ring_anything (ring alone) or
ulysses_anything (Ulysses alone); R and U both > 1 is diffusers' unified mode (no *_anything there:
diffusers refuses it). OUTDIR/rank_<r>.h5, rank r of diffusers' flattened (ring, ulysses) mesh.

Run-time patches, none changing what is computed (docs/peers.md "diffusers' context parallelism
on a CPU"): peer_diffusers.py's three (device count, the `_native_flash` backend, its CPU kernel),
and for *_anything:
  4. init_process_group("cpu:gloo") instead of "gloo": diffusers' gather_size_by_comm
     (_modeling_parallel.py:367) gathers the per-rank sizes on "cpu" only when the backend string
     names "cpu", else on torch.accelerator.current_accelerator(), which PyPI's CUDA build of torch
     reports even without a GPU: torch.empty(device="cuda") at :368 raises "Found no NVIDIA
     driver". Same backend (gloo), same ranks, the same integers gathered.
  5. context_parallel._all_gather_anything (context_parallel.py:352, the gather of proj_out's
     uneven pieces): dist.all_gather of unequal tensors, which gloo refuses. Replaced by an
     all_gather of the pieces zero-padded to the longest, each trimmed back to its own length
     before the cat: the same tensor.

diffusers 0.37.1 (the customer's version, seed 001) runs the same way with its package first on
PYTHONPATH (tools/install-peer.sh places it beside the venv); the patches apply to it unchanged.

--bug lse-reduced: seed 001's other form: the attention op returns the LSE reduced over the heads
(their mean, one value per token, broadcast back to [B, S, H]) whenever the ring asks for it
(return_lse), so the ring merge weighs every head's partial output by the heads' mean LSE.
Planted at run time around the forward op; diffusers is not edited.
--bug timestep-ranks: seed 000's broadcast into a temporary: every rank but 0 embeds timestep 0
(its time embedding module's forward wrapped at run time).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_diffusers import (cpu_patches, dumped_loop, load_reference_model, pipeline_inputs,  # noqa: E402
                            pipeline_schedule, read_inputs)


def anything_patches():
    """patch 5: _all_gather_anything through an equal-size all_gather (gloo)."""
    import torch.distributed as dist
    import diffusers.hooks.context_parallel as cpm
    from diffusers.models._modeling_parallel import gather_size_by_comm

    def all_gather_anything_padded(tensor, dim, group):
        tensor = tensor.contiguous()
        sizes = gather_size_by_comm(tensor.shape[dim], group)
        smax = max(sizes)
        pad = list(tensor.shape)
        pad[dim] = smax - tensor.shape[dim]
        padded = torch.cat([tensor, tensor.new_zeros(pad)], dim=dim) if pad[dim] else tensor
        pieces = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(pieces, padded.contiguous(), group=group)
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(pieces, sizes)], dim=dim)

    cpm._all_gather_anything = all_gather_anything_padded


def plant_lse_reduced():
    import diffusers.models.attention_dispatch as ad
    op = ad._native_flash_attention_forward_op      # the CPU op of cpu_patches()

    def reduced(ctx, query, key, value, *a, **k):
        got = op(ctx, query, key, value, *a, **k)
        if not isinstance(got, tuple):
            return got
        out, lse = got                               # lse [B, S, H]
        return out, lse.mean(dim=-1, keepdim=True).expand_as(lse).contiguous()

    ad._native_flash_attention_forward_op = reduced


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("family", choices=["flux1", "flux2"])
    ap.add_argument("refdir")
    ap.add_argument("out")
    ap.add_argument("--ring", type=int, default=1)
    ap.add_argument("--ulysses", type=int, default=1)
    ap.add_argument("--anything", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--inputs")
    ap.add_argument("--bug", choices=["lse-reduced", "timestep-ranks"])
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    import torch.distributed as dist
    dist.init_process_group("cpu:gloo" if a.anything else "gloo")      # patch 4
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != a.ring * a.ulysses:
        raise SystemExit(f"peer_cp: WORLD_SIZE {world} != ring {a.ring} x ulysses {a.ulysses}")
    cpu_patches()
    if a.anything:
        anything_patches()
    if a.bug == "lse-reduced":
        plant_lse_reduced()

    import diffusers
    from diffusers import ContextParallelConfig, FlowMatchEulerDiscreteScheduler
    from flux_dump import FluxDumper
    f2 = a.family == "flux2"
    if f2:
        from diffusers import Flux2Transformer2DModel as Model
    else:
        from diffusers import FluxTransformer2DModel as Model

    model, cfg = load_reference_model(Model, a.refdir, torch.float32)
    inp, sched_cfg = read_inputs(a.inputs or os.path.join(a.refdir, "dump_fp32.h5"))
    x = pipeline_inputs(inp, torch.float32, f2)
    S_img = x["latents"].shape[1]

    N = a.steps
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(sched_cfg)
    timesteps = pipeline_schedule(scheduler, S_img, N, f2)

    model.set_attention_backend("_native_flash")                 # patch 2
    kw = dict(ring_degree=a.ring, ulysses_degree=a.ulysses)
    if a.anything:
        kw["ring_anything" if a.ulysses == 1 else "ulysses_anything"] = True
    cpc = ContextParallelConfig(**kw)
    model.enable_parallelism(config=cpc)
    if a.bug == "timestep-ranks" and rank > 0:
        emb = model.time_guidance_embed if f2 else model.time_text_embed
        orig = emb.forward
        emb.forward = lambda timestep, *args, **kw2: orig(timestep * 0, *args, **kw2)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "rank_{rank}.h5")
    what = ", ".join(f"{k}={v}" for k, v in kw.items())
    producer = (f"diffusers {diffusers.__version__} {Model.__name__} + enable_parallelism({what}) + flux_dump; "
                f"torch {torch.__version__} CPU")
    with torch.no_grad(), FluxDumper(path, model, producer=producer) as d:
        dumped_loop(d, model, scheduler, timesteps, x, f2)
    dist.barrier()
    dist.destroy_process_group()
    print(f"peer_cp: {a.family} rank {rank}/{world} ({what}), diffusers {diffusers.__version__}: {path} ({N} steps)")


if __name__ == "__main__":
    sys.exit(main())
