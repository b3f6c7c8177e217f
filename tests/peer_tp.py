#!/usr/bin/env python3
"""Tensor parallelism on diffusers' real FluxTransformer2DModel, as users write it, dumped per rank with
flux_dump (tests/peer_tp.sh; the peer venv of tools/install-peer.sh: PyPI torch 2.15.0, diffusers 0.42.1).

    peer_tp.py REFDIR OUTDIR --tp megatron|dtensor|diffusers [--steps N] [--row-inline] [--bug proj-out-contiguous|timestep-temporary]

One process per rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), gloo, CPU, fp32. The model is built
from REFDIR/config.json, loaded strictly from REFDIR/weights.safetensors, run on the inputs of
REFDIR/dump_fp32.h5 with FluxPipeline's loop (tests/peer_diffusers.py's schedule helpers), and every
rank writes OUTDIR/rank_<r>.h5. Heads are split across ranks: the processor reshapes by head_dim
(`unflatten(-1, (-1, attn.head_dim))`), so a rank's column shard is its heads, nothing else changes.

--tp megatron: the Linears replaced at run time by seed 000's modules. `_Col` (column-parallel: this
  rank's output rows of the weight, no gather) for to_q/to_k/to_v, add_{q,k,v}_proj, ff.net.0.proj,
  ff_context.net.0.proj, proj_mlp; `_Row` (row-parallel: this rank's input columns, the local product
  all-reduced with dist.all_reduce, the bias added once) for to_out.0, to_add_out, ff.net.2,
  ff_context.net.2 and the single blocks' proj_out, whose input is cat([attn shard, mlp shard]) so
  its columns are [attn columns of rank r | mlp columns of rank r] (seed 000's `_row_split`).
  Declared to flux_dump: `_Col` and every module downstream of one that still holds the shard
  (norm_q/norm_k on the head axis, ff.net.0/.1, act_mlp, the single blocks' attn) with
  declare_shard; `_Row`'s local product (its child `mm`, before the all-reduce) with
  declare_partial; everything else whole: default_entry="replicated".
--tp dtensor: torch.distributed.tensor.parallel.parallelize_module over a DeviceMesh("cpu", (W,))
  (gloo), ColwiseParallel / RowwiseParallel on the same Linears (diffusers' own `_tp_plan` of the
  class says which), use_local_output=False so that their outputs are DTensors and flux_dump reads
  their placements (Shard(-1) for the column-parallel ones, Replicate after the row-parallel
  all-reduce). FLUX's forward cannot go on with DTensors (the gates, RoPE tables and RMSNorm weights
  it multiplies them with are plain tensors: "mixed torch.Tensor and DTensor"), so a second forward
  hook, registered after FluxDumper's, hands the model `.to_local()`; the modules downstream that
  hold local shards are declared as for Megatron. RowwiseParallel shards proj_out's input columns
  contiguously (Shard(1)), which is seed 000's bug for an input cat([attn shard, mlp shard]); the
  correct run permutes proj_out's columns first so that rank r's contiguous block is
  [attn r | mlp r] (diffusers' own PackedRowwiseParallel does the same slicing).
--tp diffusers: diffusers' own TP, enable_parallelism(config=TensorParallelConfig(tp_degree=W)) with the
  class's `_tp_plan`, two CPU patches (apply_diffusers_tp); flux_dump maps it by itself.
--bug proj-out-contiguous: seed 000's TP-1: the single blocks' proj_out sliced by contiguous columns
  (megatron: `_Row` of w[:, r*K:(r+1)*K]; dtensor: RowwiseParallel without the permutation).
--bug timestep-temporary: seed 000's TP-2: rank 0 broadcasts the schedule into a temporary on the
  other ranks (`dist.broadcast(timesteps.clone(), src=0)`, the `.cuda()` of the seed), which keep
  zeros: ranks > 0 run with timestep 0 (and record it, as the recipe records what is passed).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_diffusers import (dumped_loop, load_reference_model, pipeline_inputs, pipeline_schedule,  # noqa: E402
                            read_inputs, tp_cpu_patches)

COL = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
       "ff.net.0.proj", "ff_context.net.0.proj"]
ROW = ["attn.to_out.0", "attn.to_add_out", "ff.net.2", "ff_context.net.2"]
S_COL = ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]
# modules whose output is still the rank's shard (downstream of a column-parallel Linear): on the
# head axis of [B, S, H, D] (the QK norms) or on the last axis
HEAD_SHARD = ["attn.norm_q", "attn.norm_k", "attn.norm_added_q", "attn.norm_added_k"]
LAST_SHARD = ["ff.net.0", "ff.net.1", "ff_context.net.0", "ff_context.net.1"]
S_HEAD_SHARD = ["attn.norm_q", "attn.norm_k"]
S_LAST_SHARD = ["act_mlp", "attn"]


def sub(m, path):
    for p in path.split("."):
        m = m[int(p)] if p.isdigit() else getattr(m, p)
    return m


def set_sub(m, path, new):
    parent, _, last = path.rpartition(".")
    p = sub(m, parent) if parent else m
    if last.isdigit():
        p[int(last)] = new
    else:
        setattr(p, last, new)


# ---- seed 000's modules ---------------------------------------------------------------------------
class _Col(nn.Module):
    """Column-parallel Linear: this rank's rows of the weight (its output columns), no gather."""

    def __init__(self, w, b):
        super().__init__()
        self.weight = nn.Parameter(w.contiguous())
        self.bias = nn.Parameter(b.contiguous()) if b is not None else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class _Row(nn.Module):
    """Row-parallel Linear: this rank's input columns; the local product (`mm`, a partial sum) is
    all-reduced, then the bias added once."""

    def __init__(self, w, b):
        super().__init__()
        self.mm = nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            self.mm.weight.copy_(w)
        self.bias = nn.Parameter(b.clone()) if b is not None else None

    inline = False     # --row-inline: the product computed inline, no child module: nothing partial recorded

    def forward(self, x):
        y = F.linear(x, self.mm.weight) if self.inline else self.mm(x)
        dist.all_reduce(y)
        return y + self.bias if self.bias is not None else y


def _col(lin, rank, ws):
    k = lin.weight.shape[0] // ws
    b = lin.bias.data[rank * k:(rank + 1) * k] if lin.bias is not None else None
    return _Col(lin.weight.data[rank * k:(rank + 1) * k], b)


def _row(lin, rank, ws):
    k = lin.weight.shape[1] // ws
    return _Row(lin.weight.data[:, rank * k:(rank + 1) * k], lin.bias.data if lin.bias is not None else None)


def _row_split(lin, rank, ws, split_at):
    """seed 000's fix: proj_out's input is [attn shard | mlp shard] on every rank."""
    a_s, b_s = split_at // ws, (lin.weight.shape[1] - split_at) // ws
    w = torch.cat([lin.weight.data[:, rank * a_s:(rank + 1) * a_s],
                   lin.weight.data[:, split_at + rank * b_s:split_at + (rank + 1) * b_s]], dim=1)
    return _Row(w, lin.bias.data if lin.bias is not None else None)


def apply_megatron(model, rank, ws, bug):
    from flux_dump import declare_partial, declare_shard
    for blk in model.transformer_blocks:
        for p in COL:
            set_sub(blk, p, _col(sub(blk, p), rank, ws))
        for p in ROW:
            set_sub(blk, p, _row(sub(blk, p), rank, ws))
    inner = model.config.num_attention_heads * model.config.attention_head_dim
    for blk in model.single_transformer_blocks:
        for p in S_COL:
            set_sub(blk, p, _col(sub(blk, p), rank, ws))
        blk.proj_out = (_row(blk.proj_out, rank, ws) if bug == "proj-out-contiguous"
                        else _row_split(blk.proj_out, rank, ws, split_at=inner))
    # what flux_dump is told: shards, partial sums; the rest is whole (default_entry="replicated")
    for name, m in model.named_modules():
        if isinstance(m, _Col):
            declare_shard(m, rank, ws, dim=-1)
        elif isinstance(m, _Row) and not m.inline:
            declare_partial(m.mm)
    declare_downstream(model, rank, ws)
    check_plan_helper(model, rank, ws)


def check_plan_helper(model, rank, ws):
    """flux_dump.declare_flux_tp (declarations from FLUX.1's plan) must declare exactly what was
    declared by hand above (a module declared nothing is "replicated" through default_entry); the
    hand-written declarations stay in force."""
    from flux_dump import declare_flux_tp, declare_partial
    from flux_dump.sharding import _ATTR
    mods = list(model.named_modules())
    by_hand = {n: getattr(m, _ATTR, ("replicated",)) for n, m in mods}
    for _, m in mods:
        if hasattr(m, _ATTR):
            delattr(m, _ATTR)
    declare_flux_tp(model, rank, ws)
    for _, m in mods:
        if isinstance(m, _Row) and not m.inline:
            declare_partial(m.mm)
    helper = {n: getattr(m, _ATTR, ("replicated",)) for n, m in mods}
    diff = sorted(n for n in by_hand if by_hand[n] != helper[n])
    if diff:
        raise SystemExit(f"declare_flux_tp differs from the hand declarations at {diff[:6]}")
    print(f"declare_flux_tp: the same declarations as by hand "
          f"({sum(1 for v in helper.values() if v[0] == 'shard')} shards, "
          f"{sum(1 for v in helper.values() if v[0] == 'partial')} partial)")


def declare_downstream(model, rank, ws):
    from flux_dump import declare_shard
    for blocks, head, last in ((model.transformer_blocks, HEAD_SHARD, LAST_SHARD),
                               (model.single_transformer_blocks, S_HEAD_SHARD, S_LAST_SHARD)):
        for blk in blocks:
            for p in head:
                declare_shard(sub(blk, p), rank, ws, dim=2)
            for p in last:
                declare_shard(sub(blk, p), rank, ws, dim=-1)


# ---- torch DTensor ----------------------------------------------------------------------------------
def apply_dtensor(model, rank, ws, bug):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (ws,), mesh_dim_names=("tp",))
    inner = model.config.num_attention_heads * model.config.attention_head_dim
    if bug != "proj-out-contiguous":
        # RowwiseParallel gives rank r the contiguous columns [r*K, (r+1)*K) of proj_out; its input is
        # [attn shard r | mlp shard r]: permute the columns so that block r holds exactly those
        for blk in model.single_transformer_blocks:
            w = blk.proj_out.weight.data
            a_s, b_s = inner // ws, (w.shape[1] - inner) // ws
            perm = torch.cat([torch.cat([torch.arange(r * a_s, (r + 1) * a_s),
                                         torch.arange(inner + r * b_s, inner + (r + 1) * b_s)]) for r in range(ws)])
            blk.proj_out.weight.data = w[:, perm].contiguous()
    col, row = ColwiseParallel(use_local_output=False), RowwiseParallel(use_local_output=False)
    planned = []
    for blk in model.transformer_blocks:
        parallelize_module(blk, mesh, {**{p: col for p in COL}, **{p: row for p in ROW}})
        planned += [sub(blk, p) for p in COL + ROW]
    for blk in model.single_transformer_blocks:
        parallelize_module(blk, mesh, {**{p: col for p in S_COL}, "proj_out": row})
        planned += [sub(blk, p) for p in S_COL] + [blk.proj_out]
    declare_downstream(model, rank, ws)
    return planned


def apply_diffusers_tp(model, rank, ws):
    """diffusers' own tensor parallelism: enable_parallelism(config=TensorParallelConfig(tp_degree=W)),
    which applies the class's `_tp_plan` with parallelize_module (colwise / rowwise / packed rowwise
    for the single blocks' proj_out). On a CPU it needs two run-time patches that change nothing
    computed (peer_diffusers.tp_cpu_patches: the device index, modeling_utils.py:1719, and
    hooks/tensor_parallel.py:25's device list, which has no "cpu"). Nothing is
    declared here: FluxDumper finds the TensorParallelConfig on the model and declares the map from
    the same `_tp_plan` itself (flux_dump.declare_flux_tp; its styles hand back local tensors)."""
    from diffusers import TensorParallelConfig
    tp_cpu_patches()
    model.enable_parallelism(config=TensorParallelConfig(tp_degree=ws))


def to_local_after_dump(modules):
    """The model needs local tensors: after FluxDumper's hook (registered before this one) has read
    the placements, the output becomes the rank's local tensor."""
    from torch.distributed.tensor import DTensor

    def hook(mod, inputs, out):
        return out.to_local() if isinstance(out, DTensor) else out
    for m in modules:
        m.register_forward_hook(hook)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("refdir")
    ap.add_argument("out")
    ap.add_argument("--tp", choices=["megatron", "dtensor", "diffusers"], required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--bug", choices=["proj-out-contiguous", "timestep-temporary"])
    ap.add_argument("--row-inline", action="store_true",
                    help="megatron: _Row computes its local product inline (no `mm` child recorded, nothing "
                         "declared partial), so that flux-oracle assemble takes the dumps")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from flux_dump import FluxDumper

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    model, cfg = load_reference_model(FluxTransformer2DModel, a.refdir, torch.float32)
    if cfg["num_attention_heads"] % world:
        raise SystemExit(f"{cfg['num_attention_heads']} heads do not split over {world} ranks")
    inp, sched_cfg = read_inputs(os.path.join(a.refdir, "dump_fp32.h5"))
    x = pipeline_inputs(inp, torch.float32, flux2=False)
    S_img = x["latents"].shape[1]

    N = a.steps
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(sched_cfg)
    pipeline_schedule(scheduler, S_img, N, flux2=False)    # FluxPipeline's sigmas, mu, retrieve_timesteps
    # the schedule, rank 0's, broadcast to the others (seed 000's setup code)
    timesteps = scheduler.timesteps.float().contiguous()
    if rank != 0:
        timesteps = torch.zeros(len(timesteps), dtype=torch.float32)
    if a.bug == "timestep-temporary":
        dist.broadcast(timesteps.clone(), src=0)     # BROKEN: into a temporary (the seed's .cuda())
    else:
        dist.broadcast(timesteps, src=0)             # in place

    planned = []
    if a.tp == "megatron":
        _Row.inline = a.row_inline
        apply_megatron(model, rank, world, a.bug)
    elif a.tp == "dtensor":
        planned = apply_dtensor(model, rank, world, a.bug)
    else:
        apply_diffusers_tp(model, rank, world)

    os.makedirs(a.out, exist_ok=True)
    producer = (f"diffusers {diffusers.__version__} FluxTransformer2DModel + {a.tp} TP {world} + flux_dump; "
                f"torch {torch.__version__} CPU")
    # diffusers' TP: FluxDumper maps it itself (default_entry "replicated" included)
    kw = {} if a.tp == "diffusers" else {"default_entry": "replicated"}
    with torch.no_grad(), FluxDumper(os.path.join(a.out, "rank_{rank}.h5"), model, producer=producer, **kw) as d:
        if planned:
            to_local_after_dump(planned)
        dumped_loop(d, model, scheduler, timesteps, x, flux2=False)
    dist.barrier()
    dist.destroy_process_group()
    print(f"peer_tp: {a.tp} rank {rank}/{world}: {a.out} ({N} steps)")


if __name__ == "__main__":
    sys.exit(main())
