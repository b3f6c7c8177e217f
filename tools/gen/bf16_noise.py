#!/usr/bin/env python3
"""bf16_noise.py — measure the bfloat16 noise floor that oracle/fo_tolerance.c's bf16 rules rest on.

    tools/gen/bf16_noise.py TRUTH.h5 BASELINE.h5 CAND.h5 [CAND.h5 ...] [--json OUT]

TRUTH is a matched float64 run of the bf16 problem (flux-sim --precision fp64 --match bf16, or the
reference's dump_bf16_matched_fp64.h5), BASELINE flux-sim's own bf16 emulation of the same run,
each CAND another bf16 run of it (diffusers on a GPU or CPU, flux-sim under a parallel layout or
another all-reduce order, a buggy run...). For every dataset of every step present in all files it
computes, per candidate:
  rel_l2(C, T), rel_l2(B, T)        errors against the truth (||a-b|| / ||b||)
  max_rel(C, T), max_rel(B, T)      max|a-b| / max|b|
  ratio = err(C, T) / err(B, T)     what the --truth arbiter rule bounds by the multiplier m
  rel_l2(C, B), max_rel(C, B)       the distance between two bf16 runs (the no-truth rule)
and prints, per module class, the worst and the 99th percentile, so that a rule (m, floors, rtol)
can be set with a stated margin over correct runs and under bug effects (docs/bf16.md).
Needs numpy and h5py (/usr/bin/python3 on Debian 12)."""
import argparse
import json
import re
import sys

import h5py
import numpy as np


def classify(name):
    if name in ("latents_in", "latents_out"):
        return "latents"
    if name.startswith("time_text_embed.time_proj") or name.startswith("pos_embed"):
        return "float32 tables (sinusoids, RoPE)"
    if name.startswith("time_text_embed") or name in ("x_embedder", "context_embedder"):
        return "embedders"
    if re.search(r"\.attn\.(to_[qkv]|add_[qkv]_proj|norm_(q|k|added_q|added_k))$", name):
        return "q/k/v projections and QK norms"
    if re.search(r"\.attn(#\d)?$|to_out|to_add_out", name):
        return "attention outputs"
    if re.search(r"norm1|norm1_context|\.norm\b|norm2|norm_out", name):
        return "AdaLN / LayerNorm"
    if re.search(r"\.ff|ff_context|proj_mlp|act_mlp", name):
        return "MLPs"
    if re.search(r"proj_out", name):
        return "proj_out"
    if re.search(r"blocks\.\d+#\d$", name):
        return "block outputs"
    return "other"


def metrics(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    d = np.abs(a - b)
    nb = np.linalg.norm(b)
    mb = np.abs(b).max() if b.size else 0.0
    rel = float(np.linalg.norm(a - b) / nb) if nb > 0 else (0.0 if not d.any() else float("inf"))
    mrel = float(d.max() / mb) if mb > 0 else (0.0 if not d.size or not d.any() else float("inf"))
    return rel, mrel


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("truth")
    ap.add_argument("baseline")
    ap.add_argument("cand", nargs="+")
    ap.add_argument("--json", help="write every per-dataset row here")
    args = ap.parse_args()
    T, B = h5py.File(args.truth, "r"), h5py.File(args.baseline, "r")
    rows = []
    for cpath in args.cand:
        C = h5py.File(cpath, "r")
        for st in sorted(k for k in T if k.startswith("step_")):
            if st not in B or st not in C:
                continue
            for name in T[st].attrs["order"]:
                if name not in B[st] or name not in C[st]:
                    continue
                t, b, c = T[st][name][()], B[st][name][()], C[st][name][()]
                if t.shape != c.shape or t.shape != b.shape:
                    continue
                r_ct, m_ct = metrics(c, t)
                r_bt, m_bt = metrics(b, t)
                r_cb, m_cb = metrics(c, b)
                rows.append(dict(cand=cpath, step=st, name=name, cls=classify(name), r_ct=r_ct, r_bt=r_bt, m_ct=m_ct,
                                 m_bt=m_bt, r_cb=r_cb, m_cb=m_cb))
    if args.json:
        json.dump(rows, open(args.json, "w"))
    print(f"{len(rows)} (candidate, step, dataset) rows; truth {args.truth}, baseline {args.baseline}")
    hdr = f"{'class':36s} {'n':>5s} {'relL2(C,T) max':>15s} {'relL2(B,T) max':>15s} {'ratio max':>10s} {'ratio p99':>10s} " \
          f"{'maxrel ratio max':>16s} {'relL2(C,B) max':>15s} {'maxrel(C,B) max':>16s}"
    print(hdr)
    for cls in sorted({r["cls"] for r in rows}) + ["ALL"]:
        sel = [r for r in rows if cls == "ALL" or r["cls"] == cls]
        rat = [r["r_ct"] / r["r_bt"] for r in sel if r["r_bt"] > 0]
        mrat = [r["m_ct"] / r["m_bt"] for r in sel if r["m_bt"] > 0]
        print(f"{cls:36s} {len(sel):5d} {max(r['r_ct'] for r in sel):15.3g} {max(r['r_bt'] for r in sel):15.3g} "
              f"{max(rat) if rat else 0:10.3f} {np.percentile(rat, 99) if rat else 0:10.3f} {max(mrat) if mrat else 0:16.3f} "
              f"{max(r['r_cb'] for r in sel):15.3g} {max(r['m_cb'] for r in sel):16.3g}")
    zero = [r for r in rows if r["r_bt"] == 0]
    if zero:
        print(f"datasets where the baseline equals the truth exactly: {len(zero)}; candidate error there at most "
              f"{max(r['r_ct'] for r in zero):.3g} rel L2, {max(r['m_ct'] for r in zero):.3g} max rel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
