#!/usr/bin/env python3
"""tests/torch_package.sh's toy: a FLUX-named model run (a) under a diffusers-style context-parallel
plan (`_cp_plan`, applied the way diffusers' hooks apply it: inputs split before the root's forward,
proj_out gathered after its own) or (b) with Megatron-style column/row-parallel attention declared
through flux_dump's API; WORLD=1 is the single-process reference. Sizes from argv."""
import os, sys, types, torch, torch.nn as nn, torch.distributed as dist
from flux_dump import FluxDumper, chunk_ranges, declare_shard, declare_partial, declare_replicated

mode, S_IMG, S_TXT, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
W, R = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
if W > 1:
    dist.init_process_group("gloo", rank=R, world_size=W)
CP = mode in ("even", "anything") and W > 1
TP = W if mode == "megatron" else 1
TR = R if TP > 1 else 0     # the TP rank
C, D, H, HD, J, P = 16, 32, 2, 16, 32, 16
CFG = {"patch_size": 1, "in_channels": C, "out_channels": C, "num_layers": 1, "num_single_layers": 1,
       "attention_head_dim": HD, "num_attention_heads": H, "joint_attention_dim": J, "pooled_projection_dim": P,
       "guidance_embeds": False, "axes_dims_rope": [4, 6, 6]}

class CPIn:          # the fields of diffusers' ContextParallelInput / ContextParallelOutput
    def __init__(s, split_dim, expected_dims=None, split_output=False):
        s.split_dim, s.expected_dims, s.split_output = split_dim, expected_dims, split_output
class CPOut:
    def __init__(s, gather_dim, expected_dims=None):
        s.gather_dim, s.expected_dims = gather_dim, expected_dims

def sizes_of(n):     # every rank's extent of a sequence of n tokens (the plan's chunking)
    return [b - a for a, b in chunk_ranges(n, W, uneven=(mode == "anything"))]

def gather_seq(x, dim, sizes):     # all_gather of uneven pieces (gloo wants equal ones: padded)
    if not CP:
        return x
    m = max(sizes); pad = list(x.shape); pad[dim] = m - x.shape[dim]
    xp = torch.cat([x, x.new_zeros(pad)], dim) if pad[dim] else x
    parts = [torch.empty_like(xp) for _ in range(W)]
    dist.all_gather(parts, xp.contiguous())
    return torch.cat([p.narrow(dim, 0, s) for p, s in zip(parts, sizes)], dim)

def full_linear(i, o, seed):
    g = torch.Generator().manual_seed(seed)
    l = nn.Linear(i, o)
    with torch.no_grad():
        l.weight.copy_(torch.randn(o, i, generator=g) / i ** 0.5); l.bias.copy_(torch.randn(o, generator=g) * 0.1)
    return l

class Col(nn.Module):   # Megatron ColumnParallelLinear (no gather): this rank's output columns
    def __init__(s, i, o, seed):
        super().__init__(); f = full_linear(i, o, seed); k = o // TP
        s.weight = nn.Parameter(f.weight[TR * k:(TR + 1) * k].clone()); s.bias = nn.Parameter(f.bias[TR * k:(TR + 1) * k].clone())
        if TP > 1: declare_shard(s, TR, TP, dim=-1)
    def forward(s, x): return nn.functional.linear(x, s.weight, s.bias)

class Row(nn.Module):   # Megatron RowParallelLinear: partial product, all-reduce, bias once
    def __init__(s, i, o, seed):
        super().__init__(); f = full_linear(i, o, seed); k = i // TP
        s.linear = nn.Linear(k, o, bias=False)
        with torch.no_grad(): s.linear.weight.copy_(f.weight[:, TR * k:(TR + 1) * k])
        s.bias = nn.Parameter(f.bias.clone())
        if TP > 1: declare_partial(s.linear); declare_replicated(s)
    def forward(s, x):
        y = s.linear(x)
        if TP > 1: dist.all_reduce(y)
        return y + s.bias

def Lin(i, o, seed): return full_linear(i, o, seed)

class Emb(nn.Module):
    def __init__(s): super().__init__(); s.linear_1 = Lin(256, D, 1); s.act = nn.SiLU(); s.linear_2 = Lin(D, D, 2)
    def forward(s, x): return s.linear_2(s.act(s.linear_1(x)))
class TimeProj(nn.Module):
    def forward(s, t):
        f = torch.exp(-torch.arange(128, dtype=torch.float32) * (9.21 / 128))
        a = t[:, None].float() * f[None]; return torch.cat([a.cos(), a.sin()], -1)
class TimeText(nn.Module):
    def __init__(s): super().__init__(); s.time_proj = TimeProj(); s.timestep_embedder = Emb(); s.text_embedder = Lin(P, D, 3)
    def forward(s, t, pooled): return s.timestep_embedder(s.time_proj(t * 1000)) + s.text_embedder(pooled)
class PosEmbed(nn.Module):
    def forward(s, ids):
        a = ids.sum(-1, keepdim=True) * torch.arange(1, HD // 2 + 1, dtype=ids.dtype); return a.cos(), a.sin()
class AdaNorm(nn.Module):
    def __init__(s, seed): super().__init__(); s.silu = nn.SiLU(); s.linear = Lin(D, 2 * D, seed); s.norm = nn.LayerNorm(D, elementwise_affine=False)
    def forward(s, x, emb):
        sh, sc = s.linear(s.silu(emb)).chunk(2, -1); return s.norm(x) * (1 + sc[:, None]) + sh[:, None], sc

def rope(x, cos, sin):   # x [B, S, H, HD]
    x1, x2 = x[..., 0::2], x[..., 1::2]; c, s_ = cos[None, :, None], sin[None, :, None]
    return torch.stack([x1 * c - x2 * s_, x1 * s_ + x2 * c], -1).flatten(-2)

class Attn(nn.Module):
    """Joint attention over [txt, img]: K and V of every rank's tokens gathered (CP); heads split (TP)."""
    def __init__(s, seed, added):
        super().__init__(); s.h = H // TP
        s.to_q, s.to_k, s.to_v = Col(D, D, seed), Col(D, D, seed + 1), Col(D, D, seed + 2)
        s.to_out = nn.ModuleList([Row(D, D, seed + 3), nn.Dropout(0.0)])
        if added:
            s.add_q_proj, s.add_k_proj, s.add_v_proj = Lin(D, D, seed + 4), Lin(D, D, seed + 5), Lin(D, D, seed + 6)
            s.to_add_out = Row(D, D, seed + 7)
    def forward(s, x, ctx, rot):
        B = x.shape[0]; hd = lambda t: t.reshape(B, t.shape[1], -1, HD)
        q, k, v = hd(s.to_q(x)), hd(s.to_k(x)), hd(s.to_v(x))
        if ctx is not None:   # double block: txt projections (full width; TP applies to the image stream only)
            q = torch.cat([hd(s.add_q_proj(ctx))[:, :, TR * s.h:(TR + 1) * s.h], q], 1)
            k = torch.cat([hd(s.add_k_proj(ctx))[:, :, TR * s.h:(TR + 1) * s.h], k], 1)
            v = torch.cat([hd(s.add_v_proj(ctx))[:, :, TR * s.h:(TR + 1) * s.h], v], 1)
        q, k = rope(q, *rot), rope(k, *rot)
        sizes = [a + b for a, b in zip(sizes_of(S_TXT), sizes_of(S_IMG))]
        k, v = gather_seq(k, 1, sizes), gather_seq(v, 1, sizes)
        a = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / HD ** 0.5, -1)
        o = torch.einsum("bhqk,bkhd->bqhd", a, v).flatten(2)
        if ctx is None:
            return s.to_out[1](s.to_out[0](o))
        n = ctx.shape[1]
        return s.to_out[1](s.to_out[0](o[:, n:])), s.to_add_out(o[:, :n])

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.norm1 = AdaNorm(10); s.norm1_context = AdaNorm(11); s.attn = Attn(20, True)
    def forward(s, x, ctx, emb, rot):
        nx, _ = s.norm1(x, emb); nc, _ = s.norm1_context(ctx, emb)
        a, c = s.attn(nx, nc, rot)
        return ctx + c, x + a
class Single(nn.Module):
    def __init__(s):
        super().__init__(); s.norm = AdaNorm(30); s.proj_mlp = Lin(D, 2 * D, 31); s.act_mlp = nn.GELU(); s.attn = Attn(40, False); s.proj_out = Lin(3 * D, D, 32)
    def forward(s, x, ctx, emb, rot):
        n = ctx.shape[1]; j = torch.cat([ctx, x], 1); nj, _ = s.norm(j, emb)
        j = j + s.proj_out(torch.cat([s.attn(nj, None, rot), s.act_mlp(s.proj_mlp(nj))], -1))
        return j[:, :n], j[:, n:]
class NormOut(nn.Module):
    def __init__(s): super().__init__(); s.linear = Lin(D, 2 * D, 50); s.norm = nn.LayerNorm(D, elementwise_affine=False)
    def forward(s, x, emb): sc, sh = s.linear(nn.functional.silu(emb)).chunk(2, -1); return s.norm(x) * (1 + sc[:, None]) + sh[:, None]

class Toy(nn.Module):
    _cp_plan = {"": {"hidden_states": CPIn(1, 3), "encoder_hidden_states": CPIn(1, 3),
                     "img_ids": CPIn(0, 2), "txt_ids": CPIn(0, 2)},
                "proj_out": CPOut(1, 3)}
    def __init__(s):
        super().__init__()
        s.pos_embed = PosEmbed(); s.time_text_embed = TimeText(); s.context_embedder = Lin(J, D, 60); s.x_embedder = Lin(C, D, 61)
        s.transformer_blocks = nn.ModuleList([Block()]); s.single_transformer_blocks = nn.ModuleList([Single()])
        s.norm_out = NormOut(); s.proj_out = Lin(D, C, 62)
    def forward(s, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids):
        x = s.x_embedder(hidden_states); emb = s.time_text_embed(timestep, pooled_projections)
        ctx = s.context_embedder(encoder_hidden_states); rot = s.pos_embed(torch.cat([txt_ids, img_ids], 0))
        for b in s.transformer_blocks: ctx, x = b(x, ctx, emb, rot)
        for b in s.single_transformer_blocks: ctx, x = b(x, ctx, emb, rot)
        return (s.proj_out(s.norm_out(x, emb)),)

def enable_cp(m, cfg):
    """What diffusers' enable_parallelism does, in small: the root's inputs split per the plan
    before its forward, proj_out's output gathered after its own; the config left on the model."""
    orig = m.forward
    def forward(*args, **kw):
        for name, cpi in m._cp_plan[""].items():
            x = kw.get(name)
            if x is not None and x.dim() == cpi.expected_dims:
                a, b = chunk_ranges(x.shape[cpi.split_dim], W, uneven=cfg.ring_anything)[R]
                kw[name] = x.narrow(cpi.split_dim, a, b - a)
        return orig(*args, **kw)
    m.forward = forward
    m.proj_out.register_forward_hook(lambda mod, i, o: gather_seq(o, 1, sizes_of(S_IMG)))
    m._parallel_config = types.SimpleNamespace(context_parallel_config=cfg)

torch.manual_seed(0)
m = Toy().eval()
if CP:
    enable_cp(m, types.SimpleNamespace(ring_degree=W, ulysses_degree=1, ring_anything=(mode == "anything"),
                                       ulysses_anything=False))
g = torch.Generator().manual_seed(7)
lat = torch.randn(1, S_IMG, C, generator=g); ctx = torch.randn(1, S_TXT, J, generator=g); pooled = torch.randn(1, P, generator=g)
w = max(1, int(S_IMG ** 0.5))
img_ids = torch.stack([torch.zeros(S_IMG), torch.arange(S_IMG) // w, torch.arange(S_IMG) % w], -1).float()
txt_ids = torch.zeros(S_TXT, 3)
sigmas = torch.tensor([1.0, 0.6, 0.0]); timesteps = sigmas[:-1] * 1000
path = f"{out}/rank_{{rank}}.h5" if W > 1 else f"{out}/global.h5"
kw = {"default_entry": "replicated"} if mode == "megatron" else {}   # what TP does not declare is whole on every rank
with FluxDumper(path, m, config=CFG, rank=R if W > 1 else None, **kw) as d, torch.no_grad():
    d.write_inputs(hidden_states=lat, encoder_hidden_states=ctx, pooled_projections=pooled, img_ids=img_ids,
                   txt_ids=txt_ids, sigmas=sigmas, timesteps=timesteps / 1000)
    for i, t in enumerate(timesteps):
        ts = t.expand(1) / 1000
        with d.step(i, timestep=ts, sigma=sigmas[i], sigma_next=sigmas[i + 1]):
            d.record("latents_in", lat)
            v = m(hidden_states=lat, encoder_hidden_states=ctx, pooled_projections=pooled, timestep=ts,
                  img_ids=img_ids, txt_ids=txt_ids)[0]
            lat = lat + (sigmas[i + 1] - sigmas[i]) * v
            d.record("latents_out", lat)
    d.final(lat)
if W > 1:
    dist.barrier(); dist.destroy_process_group()
