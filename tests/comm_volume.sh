#!/usr/bin/env bash
# docs/parallel.md's communication table, checked against the code: for several layouts of the
# `odd` config (B=2, 35 image + 13 text tokens, uneven shards) the calls and bytes of every
# collective of the sampling loop that each rank reports (--comm-stats) must equal the formulas.
# Every rank prints its own comm-stats line: each rank writes to its own file (mpirun_per_rank),
# so no line is read from a stream where two ranks' output can interleave.
. "$(dirname "$0")/lib.sh"
tmpdir comm-volume
for L in "2|--tp 2" "3|--tp 3" "2|--ulysses 2" "3|--ulysses 3" "2|--ring 2" "3|--ring 3 --ring-rotate p2p" \
         "4|--ulysses 2 --ring 2" "4|--tp 2 --ring 2 --ring-rotate p2p"; do
  n=${L%%|*}; args=${L#*|}
  mpirun_per_rank "$T/ranks" "$n" "$SIM" --config odd --batch 2 --grid 5x7 --txt-len 13 --steps 2 --comm-stats -q $args >"$T/mpirun.log" 2>&1
  for ((r = 0; r < n; r++)); do cat "$T/ranks/rank.$r"; done >"$T/stats" 2>/dev/null
  if $PY - "$T/stats" "$n" $args <<'PY'
import sys, re
world = int(sys.argv[2]); a = sys.argv[3:]
deg = {"tp": 1, "ulysses": 1, "ring": 1}; rot = "allgather"
for i, x in enumerate(a):
    if x.startswith("--") and x[2:] in deg: deg[x[2:]] = int(a[i + 1])
    if x == "--ring-rotate": rot = a[i + 1]
T, U, R = deg["tp"], deg["ulysses"], deg["ring"]; P = U * R
# odd config: 1 double + 3 single blocks, 6 heads x 16, C_in 8; batch 2, 35 image + 13 text, 2 steps, fp32
L2, L1, H, Dh, Cin, B, Simg, Stxt, N, es = 1, 3, 6, 16, 8, 2, 35, 13, 2, 4
D = H * Dh
def split(S, P): return [S // P + (1 if q < S % P else 0) for q in range(P)]
t, i = split(Stxt, P), split(Simg, P)
s = [t[q] + i[q] for q in range(P)]
got = {}
for line in open(sys.argv[1]):
    m = re.match(r"comm-stats rank (\d+): (.*) \(calls/bytes sent\)", line)
    if m: got[int(m.group(1))] = {k.strip(): tuple(map(int, v.split("/"))) for k, v in re.findall(r"([a-z0-9 ]+?) (\d+/\d+)", m.group(2))}
assert len(got) == world, f"{len(got)} stats lines for {world} ranks"
for rank in range(world):
    q = rank // T                     # sp rank
    u, r = q % U, q // U
    Hl = H // T; hb = Hl // U
    exp = {"allreduce": (0, 0), "alltoallv": (0, 0), "allgatherv": (0, 0), "ring p2p": (0, 0)}
    attn = (L2 + L1) * N
    if T > 1:   # row-parallel all-reduces: to_out.0, to_add_out, ff.net.2, ff_context.net.2; single proj_out
        exp["allreduce"] = ((4 * L2 + L1) * N, N * (L2 * 2 * B * s[q] * D + L1 * B * s[q] * D) * es)
    S_u = sum(s[r * U + w] for w in range(U))
    if U > 1:   # q, k, v forward + output back, per attention
        fwd = B * s[q] * Dh * (Hl - hb); bwd = B * hb * Dh * (S_u - s[q])
        exp["alltoallv"] = (4 * attn, attn * (3 * fwd + bwd) * es)
    chunk = [sum(s[j * U + w] for w in range(U)) for j in range(R)]
    ag_calls, ag_bytes = 0, 0
    if R > 1 and rot == "allgather":
        ag_calls, ag_bytes = 2 * attn, attn * 2 * B * chunk[r] * hb * Dh * es
    if R > 1 and rot == "p2p":
        sent = sum(chunk[(r - k) % R] for k in range(R - 1))
        exp["ring p2p"] = (2 * (R - 1) * attn, attn * 2 * B * sent * hb * Dh * es)
    if P > 1:   # final latents, gathered once over the SP group
        ag_calls += 1; ag_bytes += B * i[q] * Cin * es
    exp["allgatherv"] = (ag_calls, ag_bytes)
    for k, v in exp.items():
        if got[rank].get(k) != v:
            print(f"   rank {rank} {k}: code {got[rank].get(k)} != formula {v}"); sys.exit(1)
print(f"   {world} ranks: " + "; ".join(f"{k} {v[0]}/{v[1]}" for k, v in exp.items() if v[0]) )
PY
  then ok "np=$n $args"; else bad "np=$n $args"; cat "$T/mpirun.log" "$T/stats" | tail -5; fi
done
finish
