#!/usr/bin/env bash
# flux-sim on bad input: each case must exit 2, print ONE line on stderr that names the file /
# tensor / cause, and leave no output file (not even a temporary) behind.
. "$(dirname "$0")/lib.sh"
tmpdir cli
ref=${FLUX_REFERENCE_DIR:-../shared/reference}
check() { # name, expected-substring, args...
  local name=$1 want=$2; shift 2
  local out="$T/out-$name.h5"
  "$SIM" -q "$@" --dump "$out" >"$T/stdout" 2>"$T/stderr"; local rc=$?
  local lines; lines=$(wc -l <"$T/stderr")
  local leftovers; leftovers=$(ls "$T" | grep -c "^out-$name.h5" || true)
  if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -qF -- "$want" "$T/stderr" && [ "$leftovers" -eq 0 ]; then
    ok "$name: $(cat "$T/stderr")"
  else
    bad "$name: rc=$rc lines=$lines leftovers=$leftovers want '$want'"; cat "$T/stderr"
  fi
}
# a valid tiny model to corrupt: synthetic weights written by python from our own config
$PY - "$T" <<'PY' || { echo "FAIL: fixture generation (needs python3-numpy, python3-h5py)"; exit 1; }
import json, struct, sys, os
import numpy as np
T = sys.argv[1]
def write(path, tensors, header_extra=None, raw_header=None, truncate=None):
    hdr, off, blobs = {}, 0, []
    for name, (dt, arr) in tensors.items():
        b = arr.tobytes(); hdr[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    if header_extra: header_extra(hdr)
    h = raw_header if raw_header is not None else json.dumps(hdr).encode()
    data = struct.pack("<Q", len(h)) + h + b"".join(blobs)
    if truncate: data = data[:truncate]
    open(path, "wb").write(data)
# config 'odd'-shaped tiny model: build the full param list with shapes
D, F, Dh, Cin, J, P = 96, 384, 16, 8, 40, 24
names = {}
def lin(n, i, o): names[n + ".weight"] = (o, i); names[n + ".bias"] = (o,)
lin("x_embedder", Cin, D); lin("context_embedder", J, D)
lin("time_text_embed.timestep_embedder.linear_1", 256, D); lin("time_text_embed.timestep_embedder.linear_2", D, D)
lin("time_text_embed.text_embedder.linear_1", P, D); lin("time_text_embed.text_embedder.linear_2", D, D)
for i in range(1):
    p = f"transformer_blocks.{i}."
    lin(p + "norm1.linear", D, 6 * D); lin(p + "norm1_context.linear", D, 6 * D)
    for n in ["attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out"]: lin(p + n, D, D)
    for n in ["norm_q", "norm_k", "norm_added_q", "norm_added_k"]: names[p + "attn." + n + ".weight"] = (Dh,)
    for ff in ["ff", "ff_context"]: lin(p + ff + ".net.0.proj", D, F); lin(p + ff + ".net.2", F, D)
for i in range(3):
    p = f"single_transformer_blocks.{i}."
    lin(p + "norm.linear", D, 3 * D)
    for n in ["attn.to_q", "attn.to_k", "attn.to_v"]: lin(p + n, D, D)
    names[p + "attn.norm_q.weight"] = (Dh,); names[p + "attn.norm_k.weight"] = (Dh,)
    lin(p + "proj_mlp", D, F); lin(p + "proj_out", D + F, D)
lin("norm_out.linear", D, 2 * D); lin("proj_out", D, Cin)
rng = np.random.default_rng(0)
good = {n: ("F32", (rng.standard_normal(s) * 0.05).astype("<f4")) for n, s in sorted(names.items())}
write(f"{T}/good.safetensors", good)
write(f"{T}/truncated.safetensors", good, truncate=os.path.getsize(f"{T}/good.safetensors") - 100)
open(f"{T}/hdrlen.safetensors", "wb").write(struct.pack("<Q", 1 << 40) + b"{}")
write(f"{T}/badjson.safetensors", good, raw_header=b'{"x_embedder.weight": {"dtype": "F32",')
def unknown_dtype(h): h["proj_out.bias"]["dtype"] = "Q8"
write(f"{T}/dtype.safetensors", good, header_extra=unknown_dtype)
def past_end(h): h["proj_out.bias"]["data_offsets"] = [10**9, 10**9 + 32]
write(f"{T}/pastend.safetensors", good, header_extra=past_end)
def overlap(h):
    a = h["proj_out.bias"]["data_offsets"]; h["proj_out.weight"]["data_offsets"] = [a[0], a[0] + (h["proj_out.weight"]["data_offsets"][1] - h["proj_out.weight"]["data_offsets"][0])]
write(f"{T}/overlap.safetensors", good, header_extra=overlap)
bad = dict(good); bad["x_embedder.weight"] = ("F32", np.zeros((D, Cin + 1), "<f4"))
write(f"{T}/shape.safetensors", bad)
miss = dict(good); del miss["transformer_blocks.0.attn.to_k.bias"]
write(f"{T}/missing.safetensors", miss)
cfg = {"patch_size": 1, "in_channels": Cin, "out_channels": None, "num_layers": 1, "num_single_layers": 3, "attention_head_dim": Dh,
       "num_attention_heads": 6, "joint_attention_dim": J, "pooled_projection_dim": P, "guidance_embeds": False, "axes_dims_rope": [4, 6, 6]}
json.dump(cfg, open(f"{T}/config.json", "w"))
open(f"{T}/config-bad.json", "w").write('{"in_channels": 8,')
open(f"{T}/not-hdf5.h5", "w").write("hello")
import h5py
with h5py.File(f"{T}/noinputs.h5", "w") as f:
    f.attrs["format"] = "flux-dump"; f.attrs["version"] = 1; f.attrs["dtype"] = "float32"; f.attrs["config"] = json.dumps(cfg)
PY
C="--config $T/config.json --grid 2x3 --txt-len 4 --steps 1"
check truncated      "truncated.safetensors"   $C --weights "$T/truncated.safetensors"
check header-length  "hdrlen.safetensors"      $C --weights "$T/hdrlen.safetensors"
check malformed-json "badjson.safetensors"     $C --weights "$T/badjson.safetensors"
check unknown-dtype  "Q8"                      $C --weights "$T/dtype.safetensors"
check offsets-past   "proj_out.bias"           $C --weights "$T/pastend.safetensors"
check overlapping    "overlap"                 $C --weights "$T/overlap.safetensors"
check shape-config   "x_embedder.weight"       $C --weights "$T/shape.safetensors"
check missing-tensor "transformer_blocks.0.attn.to_k.bias" $C --weights "$T/missing.safetensors"
check no-such-path   "/nonexistent/w.safetensors" $C --weights /nonexistent/w.safetensors
check bad-config     "config-bad.json"         --config "$T/config-bad.json"
check not-hdf5       "not-hdf5.h5"             --inputs "$T/not-hdf5.h5"
check no-inputs      "no /inputs"              --inputs "$T/noinputs.h5"
check missing-dump   "/nonexistent/in.h5"      --inputs /nonexistent/in.h5
check bad-precision  "fp16"                    --precision fp16
check bad-grid       "--grid"                  --grid 0x3
check ref-grid-comma "2x3,"                    --config flux2-tiny --ref-grid 2x3,
check ref-grid-empty "1x1,,1x1"                --config flux2-tiny --ref-grid 1x1,,1x1
check ref-grid-nine  "more than 8 reference images" --config flux2-tiny --ref-grid 1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1
# unwritable dump path: the dump goes to a directory that does not exist
"$SIM" -q $C --weights "$T/good.safetensors" --dump /nonexistent/dir/out.h5 >/dev/null 2>"$T/stderr"; rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <"$T/stderr")" -eq 1 ] && grep -q "/nonexistent/dir/out.h5" "$T/stderr"; then
  ok "unwritable-dump: $(cat "$T/stderr")"
else bad "unwritable-dump rc=$rc"; cat "$T/stderr"; fi
# and the good file really works (so the failures above are about the corruption)
if "$SIM" -q $C --weights "$T/good.safetensors" --dump "$T/good-out.h5" && [ -f "$T/good-out.h5" ] && ! ls "$T"/good-out.h5.tmp.* 2>/dev/null; then
  ok "control: the uncorrupted checkpoint runs and dumps"
else bad "control run"; fi
finish
