#!/usr/bin/env bash
# tools/torch/torch_dump.py on a small torch module tree named like diffusers' FluxTransformer2DModel
# (x_embedder, time_text_embed.time_proj called twice, pos_embed returning (cos, sin), blocks
# returning tuples with a None, ModuleLists, an identity whose output equals its input's):
#   - the dump has the format's names: `#k` tuple elements (None skipped), `@1` second calls, no
#     ModuleList / root datasets, `order` = hook firing order, latents_in first, latents_out last,
#     identical tensors hard-linked;
#   - flux-oracle reads it (stats), a float64 run of the same model diffs within the float32
#     defaults, and a run with one weight changed diverges first exactly at that module;
#   - completeness: a finished run carries `complete` = 1; a producer that raises inside its
#     loop leaves a file flux-oracle reports partial (exit 2, naming the step); a run recording
#     only some steps says so in `recorded_steps` and diffs cleanly against a full one; sigmas
#     that are not N+1 values are refused.
# Needs python3-torch (Debian); without it this test is SKIPPED, loudly (torch is ~1 GB, so it
# is not in tools/install-deps.sh).
. "$(dirname "$0")/lib.sh"
OR=${FLUX_BUILD:-build}/flux-oracle
tmpdir torchdump
if ! $PY -c "import torch, h5py" 2>/dev/null; then
  skip_all "torch_dump tests: python3-torch (or h5py) not installed — they did NOT run"
fi
if PYTHONPATH=tools/torch $PY - "$T" <<'PY'
import sys, torch, torch.nn as nn, h5py, numpy as np
from torch_dump import FluxDumper
T = sys.argv[1]
D, S_IMG, S_TXT, C = 16, 20, 4, 8   # to_q: 320 elements, so it is compressed

class Timesteps(nn.Module):
    def forward(self, t):
        f = torch.exp(-torch.arange(D // 2, dtype=t.dtype) / 4)
        a = t[:, None] * 1000 * f[None]
        return torch.cat([a.cos(), a.sin()], -1)

class Embedder(nn.Module):
    def __init__(s):
        super().__init__(); s.linear_1 = nn.Linear(D, D); s.act = nn.SiLU(); s.linear_2 = nn.Linear(D, D)
    def forward(s, x): return s.linear_2(s.act(s.linear_1(x)))

class TimeText(nn.Module):
    def __init__(s):
        super().__init__(); s.time_proj = Timesteps(); s.timestep_embedder = Embedder(); s.guidance_embedder = Embedder()
    def forward(s, t, g):
        return s.timestep_embedder(s.time_proj(t)) + s.guidance_embedder(s.time_proj(g))   # time_proj twice

class PosEmbed(nn.Module):
    def forward(s, ids):
        a = ids.sum(-1, keepdim=True) * torch.arange(1, D // 2 + 1, dtype=ids.dtype)
        return a.cos(), a.sin()

class AdaNorm(nn.Module):
    def __init__(s):
        super().__init__(); s.silu = nn.SiLU(); s.linear = nn.Linear(D, 2 * D); s.norm = nn.LayerNorm(D, elementwise_affine=False)
    def forward(s, x, emb):
        sh, sc = s.linear(s.silu(emb)).chunk(2, -1)
        return s.norm(x) * (1 + sc[:, None]) + sh[:, None], None, sc    # a None element, as some diffusers norms

class Attn(nn.Module):
    def __init__(s):
        super().__init__(); s.to_q = nn.Linear(D, D); s.to_out = nn.ModuleList([nn.Linear(D, D), nn.Dropout(0.0)])
    def forward(s, x): return s.to_out[1](s.to_out[0](torch.softmax(s.to_q(x) @ x.transpose(1, 2), -1) @ x))

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.norm1 = AdaNorm(); s.attn = Attn()
    def forward(s, img, txt, emb):
        n, _, _ = s.norm1(img, emb)
        img = img + s.attn(n)
        return txt, img

class Toy(nn.Module):
    config = {"patch_size": 1, "in_channels": C, "out_channels": C, "num_layers": 2, "num_single_layers": 0,
              "attention_head_dim": 8, "num_attention_heads": 2, "joint_attention_dim": D,
              "pooled_projection_dim": D, "guidance_embeds": True, "axes_dims_rope": (2, 3, 3)}
    def __init__(s):
        super().__init__()
        s.x_embedder = nn.Linear(C, D); s.context_embedder = nn.Linear(D, D); s.time_text_embed = TimeText()
        s.pos_embed = PosEmbed(); s.transformer_blocks = nn.ModuleList([Block(), Block()]); s.proj_out = nn.Linear(D, C)
    def forward(s, x, ctx, t, g, ids):
        emb = s.time_text_embed(t, g); s.pos_embed(ids)
        img, txt = s.x_embedder(x), s.context_embedder(ctx)
        for b in s.transformer_blocks: txt, img = b(img, txt, emb)
        return (s.proj_out(img),)

def run(path, dtype, tweak=False, fail_at=None, only=None):
    torch.manual_seed(0)
    m = Toy().to(dtype)
    if tweak:
        with torch.no_grad(): m.transformer_blocks[1].attn.to_q.weight[0, 0] += 0.05
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, S_IMG, C, generator=g).to(dtype); ctx = torch.randn(1, S_TXT, D, generator=g).to(dtype)
    ids = torch.zeros(S_IMG + S_TXT, 3, dtype=dtype); sig = torch.tensor([1.0, 0.5, 0.0], dtype=dtype)
    gd = torch.tensor([3.5], dtype=dtype)
    with FluxDumper(path, m, config=Toy.config, compress=True) as d, torch.no_grad():
        d.write_inputs(hidden_states=x, encoder_hidden_states=ctx, guidance=gd, sigmas=sig, timesteps=sig[:2])
        for i in range(2):
            if only is not None and i not in only:
                x = x + (sig[i + 1] - sig[i]) * m(x, ctx, sig[i:i + 1], gd, ids)[0]
                continue
            with d.step(i, timestep=sig[i:i + 1], sigma=sig[i], sigma_next=sig[i + 1]):
                d.record("latents_in", x)
                v = m(x, ctx, sig[i:i + 1], gd, ids)[0]
                if i == fail_at: raise RuntimeError("simulated crash inside the loop")
                x = x + (sig[i + 1] - sig[i]) * v
                d.record("latents_out", x)
        d.final(x)

run(f"{T}/t32.h5", torch.float32); run(f"{T}/t64.h5", torch.float64); run(f"{T}/tweak.h5", torch.float32, tweak=True)
try:
    run(f"{T}/crash.h5", torch.float32, fail_at=1); raise AssertionError("no exception")
except RuntimeError as ex:
    assert "simulated" in str(ex)
run(f"{T}/only1.h5", torch.float32, only=[1])
with h5py.File(f"{T}/crash.h5") as f:
    assert "complete" not in f.attrs and "order" not in f["step_0001"].attrs, "a crashed run looks complete"
with h5py.File(f"{T}/only1.h5") as f:
    assert f.attrs["complete"] == 1 and f.attrs["recorded_steps"] == "1" and "step_0000" not in f
with h5py.File(f"{T}/t64.h5") as f:
    assert f.attrs["complete"] == 1 and "recorded_steps" not in f.attrs and f.attrs["dtype"] == "float64"
    assert f["step_0001"].attrs["timestep"] == 0.5
try:   # sigmas must be the scheduler's N+1 values
    with FluxDumper(f"{T}/badsig.h5", Toy(), config=Toy.config) as d:
        d.write_inputs(sigmas=torch.tensor([1.0, 0.5]), timesteps=torch.tensor([1.0, 0.5]))
    raise AssertionError("N sigmas accepted")
except ValueError as ex:
    assert "N+1" in str(ex), ex
f = h5py.File(f"{T}/t32.h5")
assert f.attrs["complete"] == 1
assert f.attrs["format"] == "flux-dump" and f.attrs["version"] == 1 and f.attrs["dtype"] == "float32"
order = list(f["step_0000"].attrs["order"])
print("order:", order)
assert order[0] == "latents_in" and order[-1] == "latents_out"
for n in ["time_text_embed.time_proj", "time_text_embed.time_proj@1", "pos_embed#0", "pos_embed#1",
          "transformer_blocks.0.norm1#0", "transformer_blocks.0.norm1#2", "transformer_blocks.0#0",
          "transformer_blocks.1#1", "transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.attn.to_out.1", "proj_out"]:
    assert n in order and n in f["step_0000"], n
assert "transformer_blocks.0.norm1#1" not in order, "None element stored"
assert not any(n in ("transformer_blocks", "transformer_blocks.0.attn.to_out", "") for n in order), "container stored"
# execution order: time_proj before time_proj@1 before the timestep embedder's second half; blocks in order
assert order.index("time_text_embed.time_proj") < order.index("time_text_embed.timestep_embedder.linear_1") < order.index("time_text_embed.time_proj@1")
assert order.index("transformer_blocks.0#1") < order.index("transformer_blocks.1.norm1.silu")
s0 = f["step_0000"]
assert s0["transformer_blocks.0.attn.to_out.1"].id == s0["transformer_blocks.0.attn.to_out.0"].id, "identity output not hard-linked"
assert f["step_0001"]["pos_embed#0"].id == s0["pos_embed#0"].id, "pos_embed not linked across steps"
assert s0["transformer_blocks.0.attn.to_q"].compression == "gzip" and s0["transformer_blocks.0.norm1.linear"].compression is None
print(len(order), "datasets in step 0")
PY
then ok "torch_dump.py writes the format's names, order, hard links"; else bad "torch_dump.py output"; fi

if "$OR" stats -q "$T/t32.h5" >"$T/out" 2>&1 && grep -q FINITE "$T/out"; then ok "flux-oracle stats reads the torch dump"; else bad "stats: $(cat "$T/out")"; fi
if "$OR" diff -q "$T/t32.h5" "$T/t64.h5" >"$T/out" 2>&1; then ok "torch float32 vs float64 dump: $(cat "$T/out")"; else bad "fp32 vs fp64: $(cat "$T/out")"; fi
"$OR" diff -q "$T/tweak.h5" "$T/t32.h5" >"$T/out" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "DIVERGE at step 0 transformer_blocks.1.attn.to_q:" "$T/out"; then ok "changed weight: first divergence at the module that owns it"; else bad "tweak: rc=$rc $(cat "$T/out")"; fi
"$OR" stats -q "$T/crash.h5" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/err")" -eq 1 ] && grep -q "crash.h5: partial dump (last step present: 1): step_0001 has no \`order\`: the producer stopped inside step 1" "$T/err"
then ok "a producer that raised inside its loop: $(cat "$T/err")"; else bad "crash: rc=$rc $(cat "$T/out" "$T/err")"; fi
"$OR" diff -q "$T/t32.h5" "$T/crash.h5" >"$T/out" 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && ok "diff against the crashed run: exit 2" || bad "diff crash: rc=$rc"
"$OR" diff -q --allow-partial "$T/t32.h5" "$T/crash.h5" >"$T/out" 2>&1; rc=$?
[ $rc -eq 0 ] && grep -q "crash.h5 is partial" "$T/out" && ok "--allow-partial compares the finished step: $(cat "$T/out" | cut -c1-160)" || bad "allow-partial: rc=$rc $(cat "$T/out")"
"$OR" diff -q "$T/only1.h5" "$T/t32.h5" >"$T/out" 2>&1; rc=$?
[ $rc -eq 0 ] && ok "recorded_steps=1 against a full run: $(cat "$T/out" | cut -c1-160)" || bad "only1: rc=$rc $(cat "$T/out")"
finish
