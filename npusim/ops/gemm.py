"""Exact int8 x int8 -> int32 matrix products on a float32 BLAS, and the fused requantization: the
path of CONV_2D and FULLY_CONNECTED on CPUs without AVX-512 VNNI (see vnni.py and amx.py).

Why float32 is exact here: an int8 x int8 product is at most 128 * 128 = 2^14 in magnitude and
float32 holds every integer below 2^24, so any partial sum of at most 2^10 products is exact in
whatever order the BLAS adds them. Longer reductions are split into chunks of 1024 whose exact
results are added in float64. The input zero point is folded out of the product
(sum w*(x - zp) = sum w*x - zp * sum w), so padding taps, filled with zp, contribute exactly zero,
as TFLM's kernels skip them.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..jit import parallel_kernel
from ..quant import requantize_to_output

CHUNK = 1024


def exact_matmul(cols: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """cols [..., R, K] float32 (integer valued) @ wt [..., K, O] float32 (int8 valued), exactly.

    Returns float32 when K <= CHUNK, else float64; both hold the exact integer result.
    """
    k = cols.shape[-1]
    if k <= CHUNK:
        return np.matmul(cols, wt)
    total = np.zeros(cols.shape[:-1] + (wt.shape[-1],), dtype=np.float64)
    for k0 in range(0, k, CHUNK):
        total += np.matmul(cols[..., k0:k0 + CHUNK], wt[..., k0:k0 + CHUNK, :])
    return total


def transposed_weights(weights: np.ndarray) -> np.ndarray:
    """[G, O, K] int8 -> contiguous [G, K, O] float32 (a stack of transposed views would make
    numpy's matmul leave the BLAS path)."""
    return np.ascontiguousarray(weights.astype(np.float32).transpose(0, 2, 1))


def int_matmul(cols: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """cols [G, R, K] float32 (integer valued), weights [G, O, K] int8 -> exact sum over K, [G, R, O]."""
    return exact_matmul(cols, transposed_weights(weights))


def accumulator_offset(weights: np.ndarray, bias: np.ndarray | None, input_zero_point: int) -> np.ndarray:
    """Per group and channel: bias - zp * sum(w), the part of the accumulator that does not depend on x."""
    g, o = weights.shape[0], weights.shape[1]
    wsum = weights.reshape(g, o, -1).astype(np.int64).sum(axis=2)
    b = np.zeros((g, o), dtype=np.int64) if bias is None else np.broadcast_to(bias.astype(np.int64).reshape(-1, o), (g, o))
    return b - np.int64(input_zero_point) * wsum


@parallel_kernel
def _requantize_products(products, offset, m, shift, real_scale, zero_point, lo, hi, profile, out):
    groups, rows, channels = products.shape
    for gr in nb.prange(groups * rows):
        g = gr // rows
        r = gr - g * rows
        for c in range(channels):
            acc = np.int64(products[g, r, c]) + offset[g, c]
            out[g, r, c] = requantize_to_output(acc, m[c], shift[c], real_scale[c], profile, zero_point, lo, hi)
    return out


def requantize_products(products, offset, m, shift, real_scale, zero_point, lo, hi, profile, out):
    """out[g, r, c] = clamp(requantize(products[g, r, c] + offset[g, c]) + zero_point)."""
    return _requantize_products(products, offset, m, shift, real_scale, np.int64(zero_point), np.int64(lo), np.int64(hi),
                                np.int64(profile), out)


def grouped_products(cols: np.ndarray, weights: np.ndarray, shared: bool) -> np.ndarray:
    """Exact products of cols [R, K] with weights [G, O, K] as [G, R', O].

    shared=False: the rows are G equal slices, slice g meets weights g (R' = R / G).
    shared=True: every group sees all rows (R' = R); the G weight sets are stacked into one wide
    GEMM [R, K] x [K, G*O], which a BLAS runs far better than G narrow ones.
    """
    g, o, k = weights.shape
    if shared:
        products = int_matmul(cols[None], weights.reshape(1, g * o, k))[0]
        return products.reshape(-1, g, o).transpose(1, 0, 2)
    return int_matmul(cols.reshape(g, -1, k), weights)
