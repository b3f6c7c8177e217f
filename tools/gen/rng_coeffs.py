#!/usr/bin/env python3
"""rng_coeffs.py — derives every constant of fs_rng's normal transform (sim/base/fs_rng.h).

Run: /usr/bin/python3 tools/gen/rng_coeffs.py   (needs mpmath: Debian python3-mpmath)

Prints the constants as C99 hex floats, exactly as sim/base/fs_rng_kernel.h, sim/base/fs_rng.h and
tools/gen/fs_rng_ref.py hold them, and the error of each polynomial (coefficients rounded to double, evaluated exactly in
200-bit arithmetic, on a 20001-point grid). Nothing here is taken from a libm: the polynomials
are Chebyshev interpolants (near-minimax) computed by mpmath.chebyfit, degree 6 each, which is
where their error stops falling and coefficient rounding dominates (the degree table printed
with --degrees shows it).

  T(z)  = (2 atanh(sqrt z)/sqrt z - 2)/z  on z in [0, ZMAX]   log1p(f) = 2s + s*z*T(z), z = s^2,
                                                                ZMAX = s_max^2 (1 + 1e-4)
  P(t)  = sin(pi/4 sqrt t)/sqrt t          on t in [0, 1]      sin(pi/4 g) = g*P(g*g)
  (cos(pi/4 g) is sqrt(1 - S*S), no polynomial: see sim/base/fs_rng.h)
  LN2_HI = ln 2 rounded toward zero to 32 significant bits (e*LN2_HI exact for |e| < 2^21)
  LN2_LO = ln 2 - LN2_HI rounded to nearest
  SQRT2  = sqrt 2 rounded to nearest (the mantissa split threshold)
"""
import sys

import mpmath as mp

mp.mp.prec = 200
DEG = 6


def dbl(x):
    return float(x)  # mpf -> double, round to nearest even


# |s| <= (sqrt2 - 1)/(sqrt2 + 1) on the split interval [sqrt(1/2), sqrt 2]; 1e-4 of margin for the
# rounded threshold.
ZMAX = ((mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)) ** 2 * mp.mpf("1.0001")


def T(z):
    if z == 0:
        return mp.mpf(2) / 3
    r = mp.sqrt(z)
    return (2 * mp.atanh(r) / r - 2) / z


def P(t):
    if t == 0:
        return mp.pi / 4
    r = mp.sqrt(t)
    return mp.sin(mp.pi * r / 4) / r


def fit(f, a, b, n):
    c = mp.chebyfit(f, [a, b], n + 1)  # highest degree first
    cd = [dbl(x) for x in c]
    grid = [a + (b - a) * mp.mpf(i) / 20000 for i in range(20001)]
    err = max(abs(mp.polyval([mp.mpf(x) for x in cd], g) - f(g)) for g in grid)
    return cd[::-1], err  # lowest degree first


def main():
    if "--degrees" in sys.argv:
        for name, f, b, scale in (("T", T, ZMAX, ZMAX / 2), ("P", P, 1, 1 / mp.sin(mp.pi / 4))):
            for n in range(4, 9):
                _, e = fit(f, 0, b, n)
                print(f"{name} degree {n}: max relative error contributed {mp.nstr(e * scale, 3)}")
        return
    ln2 = mp.log(2)
    m, ex = mp.frexp(ln2)  # ln2 = m * 2^ex, m in [0.5, 1)
    hi = mp.floor(m * 2**32) / 2**32 * mp.mpf(2) ** ex
    print(f"LN2_HI {dbl(hi).hex()}")
    print(f"LN2_LO {dbl(ln2 - hi).hex()}")
    print(f"SQRT2  {dbl(mp.sqrt(2)).hex()}")
    for name, f, b, scale in (("T", T, ZMAX, ZMAX / 2), ("P", P, 1, 1 / mp.sin(mp.pi / 4))):
        c, e = fit(f, 0, b, DEG)
        print(f"{name} (degree {DEG}, lowest first; max |poly - f| = {mp.nstr(e, 3)}, "
              f"relative error contributed to the result <= {mp.nstr(e * scale, 3)}):")
        print("   " + ", ".join(x.hex() for x in c))


if __name__ == "__main__":
    main()
