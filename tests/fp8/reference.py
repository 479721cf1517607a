"""Pure-Python FP8 references written from the format definitions (no torch float8 casts)."""

from __future__ import annotations

import itertools
import math

# name: (exponent bits, mantissa bits, bias, has_inf)
LAYOUTS = {"E4M3": (4, 3, 7, False), "E5M2": (5, 2, 15, True)}


def decode(code: int, name: str) -> float:
    """The value of an 8-bit code: sign | exponent | mantissa, IEEE-style with subnormals.

    E4M3 ("fn"): no infinities; exponent 1111 with mantissa 111 is NaN, other 1111 codes are normal.
    E5M2: exponent 11111 is inf (mantissa 0) or NaN (mantissa != 0).
    """
    e_bits, m_bits, bias, has_inf = LAYOUTS[name]
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    e_all_ones = e == (1 << e_bits) - 1
    if has_inf and e_all_ones:
        return sign * math.inf if m == 0 else math.nan
    if not has_inf and e_all_ones and m == (1 << m_bits) - 1:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m / (1 << m_bits), 1 - bias)
    return sign * math.ldexp(1 + m / (1 << m_bits), e - bias)


def finite_codes(name: str) -> list[tuple[float, int]]:
    """(value, code) for every finite non-negative code, sorted by value."""
    out = []
    for c in range(128):
        v = decode(c, name)
        if math.isfinite(v):
            out.append((v, c))
    return sorted(out)


def max_finite(name: str) -> float:
    return finite_codes(name)[-1][0]


def round_saturate(x: float, name: str) -> float:
    """Round to the nearest representable value, ties to an even mantissa; saturate to +-max; NaN -> NaN."""
    if math.isnan(x):
        return math.nan
    table = finite_codes(name)
    sign = -1.0 if x < 0 else 1.0
    a = abs(x)
    if a >= table[-1][0]:
        return sign * table[-1][0]
    for (lo, clo), (hi, chi) in itertools.pairwise(table):
        if lo <= a <= hi:
            if a - lo < hi - a:
                return sign * lo
            if hi - a < a - lo:
                return sign * hi
            return sign * (lo if clo % 2 == 0 else hi)  # tie: even mantissa LSB
    raise AssertionError(x)


def mx_exponent(amax: float, fp8_max: float, emax_elem: int, rounding: str) -> int:
    """E8M0 exponent for a block: smallest e with amax <= fp8_max * 2**e ("ceil") or
    floor(log2(amax)) - emax_elem ("floor"); 0 blocks get -127; clamp to [-127, 127]."""
    if amax == 0:
        return -127
    if rounding == "ceil":
        e = -200
        while amax > fp8_max * 2.0**e:
            e += 1
    else:
        e = math.floor(math.log2(amax)) - emax_elem
    return max(-127, min(127, e))
