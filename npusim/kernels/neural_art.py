"""The Neural-ART NPU's integer units as vector code (`--profile neural-art`, docs/neural-art.md):
the CONVACC's accumulator, shifted and rounded into a 16- or 24-bit output; the ARITH unit's affine
A*x + B*y + C with its shifts, rounding, clipping and saturation.

Rounding modes (the unknown `round_mode`, options --n6-rounding): HALF_UP adds 2^(s-1) before an
arithmetic right shift by s; HALF_EVEN rounds a tie to the even result; TRUNCATE is the bare shift
(floor). A shift of 0 or less is exact (a negative one a left shift).
"""

from __future__ import annotations

import numpy as np

from . import gemm
from .jit import njit

HALF_UP, HALF_EVEN, TRUNCATE = 0, 1, 2
ROUNDING_IDS = {"half-up": HALF_UP, "half-even": HALF_EVEN, "truncate": TRUNCATE}


@njit
def shift_round(v, s, mode):
    """v >> s (int64) with the rounding mode; s <= 0 shifts left."""
    if s <= 0:
        return v << -s
    if mode == TRUNCATE:
        return v >> s
    half = np.int64(1) << (s - 1)
    q = (v + half) >> s
    if mode == HALF_EVEN and (v & ((np.int64(1) << s) - 1)) == half and (q & 1) == 1:
        q -= 1
    return q


@njit
def _clamp(v, lo, hi):
    return lo if v < lo else (hi if v > hi else v)


@njit
def convacc_output(acc, shift, mode, bits, out):
    """The CONVACC output stage: acc [..] int64 >> shift, rounded, saturated to `bits` signed bits."""
    lo, hi = -(np.int64(1) << (bits - 1)), (np.int64(1) << (bits - 1)) - 1
    flat, o = acc.ravel(), out.ravel()
    for i in range(flat.size):
        o[i] = _clamp(shift_round(flat[i], shift, mode), lo, hi)
    return out


@njit
def arith_channel(y, a, bc, shift, mode, lo, hi, out):
    """The off_bias ARITH: out[r, c] = clamp(round((a[c] * y[r, c] + bc[c]) >> shift)), y [R, C]."""
    rows, channels = y.shape
    for r in range(rows):
        for c in range(channels):
            out[r, c] = _clamp(shift_round(a[c] * y[r, c] + bc[c], shift, mode), lo, hi)
    return out


@njit
def arith_affine(x, a, bc, shift, mode, lo, hi, out):
    """A scalar single-input ARITH: out = clamp(round((a * x + bc) >> shift)) over x (flat)."""
    for i in range(x.size):
        out[i] = _clamp(shift_round(a * np.int64(x[i]) + bc, shift, mode), lo, hi)
    return out


@njit
def arith_add(x, y, a, b, c, ax, by, cs, shift, mode, rounded, lo, hi, out):
    """The two-input ARITH: (a*x >> ax) + (b*y >> by) + (c << cs), >> shift, clamped. rounded: each
    product is taken to output steps (rounded at its own shift + `shift`) before the sum, one reading
    of what ST does not publish; else (exact) the sum is kept at full precision and rounded once."""
    cc = np.int64(c) << cs
    top = max(ax, by)
    for i in range(x.size):
        px = a * np.int64(x[i])
        py = b * np.int64(y[i])
        if rounded:
            v = shift_round(px, ax + shift, mode) + shift_round(py, by + shift, mode)
            v += shift_round(cc, shift, mode)
        else:
            total = (px << (top - ax)) + (py << (top - by)) + (cc << top)
            v = shift_round(total, top + shift, mode)
        out[i] = _clamp(v, lo, hi)
    return out


def accumulate(x_unsigned: np.ndarray, weights: np.ndarray, g, fill: int, depthwise: bool) -> np.ndarray:
    """The CONVACC's accumulator: sum over the window of the unsigned 8-bit feature times the int8
    weight, exactly, as int64 [N, out_h, out_w, O]. fill: the feature value of a padding tap."""
    n = x_unsigned.shape[0]
    cols = gemm.columns(x_unsigned, g, fill)  # [R, kh * kw * C] float32, integer valued
    if depthwise:
        taps = g.kh * g.kw
        cin = x_unsigned.shape[-1]
        out_c = weights.shape[-1]
        w = weights.reshape(taps, out_c).astype(np.float64)
        per = cols.reshape(-1, taps, cin).astype(np.float64)
        mult = out_c // cin
        per = np.repeat(per, mult, axis=2) if mult > 1 else per
        acc = np.einsum("rtc,tc->rc", per, w)
    else:
        acc = gemm.int_matmul(cols[None], weights.reshape(1, weights.shape[0], -1))[0]
    return np.rint(acc).astype(np.int64).reshape(n, g.out_h, g.out_w, -1)


def dense_accumulate(x_unsigned: np.ndarray, weights: np.ndarray, out_shape) -> np.ndarray:
    """FULLY_CONNECTED's accumulator on the CONVACC: rows of the feature times the int8 weights
    [O, K], exactly, as int64 of out_shape."""
    k = weights.shape[-1]
    rows = x_unsigned.reshape(-1, k).astype(np.float32)
    acc = gemm.int_matmul(rows[None], weights.reshape(1, -1, k))[0]
    return np.rint(acc).astype(np.int64).reshape(out_shape)
