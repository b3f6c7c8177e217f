#!/usr/bin/env bash
# flux-oracle keeps its exit-code contract on damaged files (reliability probe, defect 6): byte
# mutants of two small flux-sim dumps (A contiguous, B chunked + deflate), most mutations on HDF5
# metadata bytes (raw data excluded), some truncations. Each mutant goes through `stats M` and
# `diff -q BASE M`; every run must exit 0, 1 or 2 — no signal, no timeout — and an exit 2 must
# print exactly one line on stderr. libhdf5 itself crashes or loops on some of these files; the
# oracle's guard turns that into "corrupted HDF5 metadata (libhdf5 crashed/hung reading X)".
#
#   FLUX_MUTANTS=N  mutants per base (default 100: 200 files, 400 runs, well under a minute)
#   FLUX_MUTANT_SEED=S  (default 1)   OR=path/to/flux-oracle (default ${FLUX_BUILD:-build}/flux-oracle)
# A failing mutant is kept in the temporary directory named in the output.
. "$(dirname "$0")/lib.sh"
OR=${OR:-${FLUX_BUILD:-build}/flux-oracle}
N=${FLUX_MUTANTS:-100}
SEED=${FLUX_MUTANT_SEED:-1}
tmpdir mutants
if ! $PY -c "import h5py, numpy" 2>/dev/null; then
  skip_all "mutant tests: python3-h5py/numpy not installed — they did NOT run"
fi
cat >"$T/mini.json" <<'JSON'
{"_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 8, "out_channels": null,
 "num_layers": 1, "num_single_layers": 1, "attention_head_dim": 16, "num_attention_heads": 2,
 "joint_attention_dim": 16, "pooled_projection_dim": 16, "guidance_embeds": false, "axes_dims_rope": [4, 6, 6]}
JSON
"$SIM" -q --config "$T/mini.json" --grid 1x2 --txt-len 2 --steps 1 --dump "$T/A.h5" || { echo "FAIL flux-sim A"; exit 1; }
"$SIM" -q --config "$T/mini.json" --grid 2x2 --txt-len 4 --steps 1 --dump-compress 1 --dump "$T/B.h5" || { echo "FAIL flux-sim B"; exit 1; }
for b in A B; do "$OR" stats -q "$T/$b.h5" >/dev/null || { echo "FAIL: the unmutated base $b does not pass stats"; exit 1; }; done
start=$(date +%s)
FLUX_ORACLE_WATCHDOG=${FLUX_ORACLE_WATCHDOG:-3} $PY - "$T" "$OR" "$N" "$SEED" <<'PY'
import os, random, subprocess, sys, h5py, numpy as np
T, OR, N, SEED = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(SEED)
def raw_ranges(path):
    out = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                off = obj.id.get_offset()
                if off is not None: out.append((off, off + obj.id.get_storage_size()))
                elif obj.chunks:
                    for i in range(obj.id.get_num_chunks()):
                        c = obj.id.get_chunk_info(i); out.append((c.byte_offset, c.byte_offset + c.size))
        f.visititems(visit)
    return out
def mutate(data, raw):
    d = bytearray(data)
    if rng.random() < 0.05:                       # truncation
        return bytes(d[: rng.randrange(1, len(d))])
    for _ in range(rng.choice([1, 1, 2, 4])):
        while True:                               # 80 % on metadata bytes
            i = rng.randrange(len(d))
            if rng.random() < 0.2 or not any(a <= i < b for a, b in raw): break
        k = rng.random()
        if k < 0.4: d[i] ^= 1 << rng.randrange(8)
        elif k < 0.7:
            v = rng.choice([0, 0xff, 0x7f, 0x80, 0x01, 0xfe])
            for j in range(rng.choice([1, 2, 4, 8])):
                if i + j < len(d): d[i + j] = v
        else: d[i] = rng.randrange(256)
    return bytes(d)
counts, bad = {}, []
for base in ["A", "B"]:
    bp = f"{T}/{base}.h5"; data = open(bp, "rb").read(); raw = raw_ranges(bp)
    for m in range(N):
        mp = f"{T}/m_{base}_{m}.h5"
        open(mp, "wb").write(mutate(data, raw))
        keep = False
        for args in (["stats", mp], ["diff", "-q", bp, mp]):
            try:
                p = subprocess.run(["timeout", "-s", "KILL", "20", OR] + args, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
                rc, err = p.returncode, p.stderr.decode(errors="replace")
            except Exception as ex:
                rc, err = -999, str(ex)
            key = rc if rc in (0, 1, 2) else ("signal %d" % -rc if rc < 0 else "rc %d" % rc)
            counts[key] = counts.get(key, 0) + 1
            lines = err.count("\n")
            if rc not in (0, 1, 2) or (rc == 2 and lines != 1) or (rc != 2 and lines > 1):
                bad.append(f"{' '.join(args)}: rc {rc}, {lines} stderr lines: {err.strip()[:300]}")
                keep = True
            elif "corrupted HDF5 metadata" in err:
                counts["guard"] = counts.get("guard", 0) + 1
        if not keep: os.unlink(mp)
print("exit codes over", 4 * N, "runs:", {str(k): v for k, v in counts.items()})
for b in bad[:20]: print("FAIL", b)
print(f"{len(bad)} runs broke the 0/1/2 contract")
sys.exit(1 if bad else 0)
PY
rc=$?
echo "$((2 * N)) mutants in $(( $(date +%s) - start )) s"
if [ $rc -eq 0 ]; then ok "every mutant run exited 0/1/2 with at most one stderr line"
else bad "(mutants kept in $T)"; T=; fi # T= : the EXIT trap keeps them
finish
