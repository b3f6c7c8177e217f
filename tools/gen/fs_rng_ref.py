#!/usr/bin/env python3
"""fs_rng_ref.py — an independent numpy implementation of fs_rng's normals (sim/base/fs_rng.h) and of
the synthetic weights built on them (fs_weights_synthetic_value, sim/weights/fs_weights.c).

Written from the definition in sim/base/fs_rng.h, not from the C code: uint64 arithmetic wraps mod
2^64, every float operation is one numpy float64 ufunc (one IEEE binary64 operation, rounded to
nearest even, never fused), in the definition's order. tests/test_rng.c runs it and compares its
bits with the C library's.

  fs_rng_ref.py --seed S --name NAME --first I --count N [--scale linear:IN|bias|rms]

prints one line per element: the 16 hex digits of the double's bits (element first + j).
With --scale, the value of the synthetic weight (Linear weight z / sqrt(IN), bias 0.05 z,
RMSNorm weight 1 + 0.1 z) instead of the normal z.
"""
import argparse

import numpy as np

U64 = np.uint64
M64 = (1 << 64) - 1

LN2_HI = float.fromhex("0x1.62e42fee00000p-1")
LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")
SQRT2 = float.fromhex("0x1.6a09e667f3bcdp+0")
T = [float.fromhex(x) for x in ("0x1.5555555555558p-1", "0x1.99999999952d7p-2", "0x1.2492492df281ap-2",
                                "0x1.c71c62e3f11e6p-3", "0x1.7462b51cb66b1p-3", "0x1.39fe51a7c18f9p-3",
                                "0x1.2b5900de53b32p-3")]
P = [float.fromhex(x) for x in ("0x1.921fb54442d18p-1", "-0x1.4abbce625be41p-4", "0x1.466bc677587f8p-9",
                                "-0x1.32d2cce2e5b19p-15", "0x1.50782fda12d96p-22", "-0x1.e30071afc3e59p-30",
                                "0x1.e3f38399551bfp-38")]


def mix_int(z):
    """SplitMix64's finaliser on a Python int (for the key)."""
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def mix(z):
    """The same on a uint64 array (numpy wraps array products mod 2^64)."""
    z = (z ^ (z >> U64(30))) * U64(0xbf58476d1ce4e5b9)
    z = (z ^ (z >> U64(27))) * U64(0x94d049bb133111eb)
    return z ^ (z >> U64(31))


def key(seed, name):
    h = 0xcbf29ce484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001b3) & M64
    return mix_int(h ^ mix_int((seed + 0x9e3779b97f4a7c15) & M64))


def horner(c, x):
    """c[0] + x*(c[1] + x*(... + x*c[-1])), one rounding per operation."""
    acc = np.full_like(x, c[-1])
    for a in reversed(c[:-1]):
        acc = np.add(a, np.multiply(x, acc))
    return acc


def ln(u):
    """The definition's L = ln(u) for u in (0, 1)."""
    b = u.view(U64)
    E = (b >> U64(52)).astype(np.float64)  # exact: < 2^11
    m1 = ((b & U64(0xFFFFFFFFFFFFF)) | U64(0x3FF0000000000000)).view(np.float64)
    big = m1 > SQRT2
    m = np.where(big, 0.5 * m1, m1)
    e = E - np.where(big, 1022.0, 1023.0)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    R = z * horner(T, z)
    return e * LN2_HI + (e * LN2_LO + ((s + s) + s * R))


def cos_sin_2pi(u):
    """The definition's (C2, S2) = (cos 2 pi u, sin 2 pi u) for u in [0, 1)."""
    t8 = 8.0 * u
    kd = np.floor(t8)
    f = t8 - kd
    k = kd.astype(np.int64)
    odd = (k & 1) == 1
    g = np.where(odd, 1.0 - f, f)
    t = g * g
    S = g * horner(P, t)
    C = np.sqrt(1.0 - S * S)
    swap = ((k + 1) >> 1) & 1 == 1
    cneg = ((k + 2) >> 2) & 1 == 1
    sneg = (k >> 2) == 1
    c = np.where(swap, S, C)
    s = np.where(swap, C, S)
    return np.where(cneg, -c, c), np.where(sneg, -s, s)


def normals(k, first, count):
    """fs_rng_normal(k, first + j) for j < count."""
    idx = np.arange(first, first + count, dtype=U64)
    pair = idx >> U64(1)
    with np.errstate(over="ignore"):
        H = mix(U64(k) ^ (pair * U64(0x9E3779B97F4A7C15)))
        u = [(((mix(H + U64(lane) * U64(0xD1B54A32D192ED03) + U64(1)) >> U64(11)).astype(np.float64) + 0.5)
              * float.fromhex("0x1p-53")) for lane in (0, 1)]
    r = np.sqrt(-2.0 * ln(u[0]))
    c, s = cos_sin_2pi(u[1])
    return np.where((idx & U64(1)) == U64(1), r * s, r * c)


def scaled(z, how):
    """fs_weights_synthetic_value's scaling of a normal z."""
    if how.startswith("linear:"):
        return z / np.sqrt(float(int(how.split(":", 1)[1])))
    if how == "bias":
        return 0.05 * z
    if how == "rms":
        return 1.0 + 0.1 * z
    raise SystemExit(f"fs_rng_ref.py: unknown --scale {how!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--scale", default=None)
    a = ap.parse_args()
    z = normals(key(a.seed, a.name), a.first, a.count)
    if a.scale:
        z = scaled(z, a.scale)
    print("\n".join(f"{int(x):016x}" for x in z.view(U64)))


if __name__ == "__main__":
    main()
