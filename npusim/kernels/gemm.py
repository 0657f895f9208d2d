"""Exact int8 x int8 -> int32 matrix products on a float32 BLAS, and the fused requantization: the
"blas" engine of CONV_2D and FULLY_CONNECTED (im2col + GEMM), which runs on CPUs without AVX-512
VNNI and for reductions too long for it (see backend.py).

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

from .jit import parallel_kernel
from .rounding import requantize_to_output

CHUNK = 1024
TILE_BYTES = 4 << 20  # im2col slice size: a few MB stays in the last-level cache


def exact_matmul(cols: np.ndarray, wt: np.ndarray) -> np.ndarray:
    """cols [..., R, K] float32 (integer valued) @ wt [..., K, O] float32 (int8 valued), exactly.

    Returns float32 when K <= CHUNK, else float64; both hold the exact integer result.
    """
    k = cols.shape[-1]
    if k <= CHUNK:
        return np.matmul(cols, wt)
    total = np.zeros(cols.shape[:-1] + (wt.shape[-1],), dtype=np.float64)
    for k0 in range(0, k, CHUNK):
        total += np.matmul(cols[..., k0 : k0 + CHUNK], wt[..., k0 : k0 + CHUNK, :])
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
    b = (
        np.zeros((g, o), dtype=np.int64)
        if bias is None
        else np.broadcast_to(bias.astype(np.int64).reshape(-1, o), (g, o))
    )
    return b - np.int64(input_zero_point) * wsum


@parallel_kernel
def _requantize_products(products, offset, m, shift, real_scale, zero_point, lo, hi, profile, out):
    groups, rows, channels = products.shape
    for gr in nb.prange(groups * rows):
        g = gr // rows
        r = gr - g * rows
        for c in range(channels):
            acc = np.int64(products[g, r, c]) + offset[g, c]
            out[g, r, c] = requantize_to_output(
                acc, m[c], shift[c], real_scale[c], profile, zero_point, lo, hi
            )
    return out


def requantize_products(products, offset, m, shift, real_scale, zero_point, lo, hi, profile, out):
    """out[g, r, c] = clamp(requantize(products[g, r, c] + offset[g, c]) + zero_point)."""
    return _requantize_products(
        products,
        offset,
        m,
        shift,
        real_scale,
        np.int64(zero_point),
        np.int64(lo),
        np.int64(hi),
        np.int64(profile),
        out,
    )


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


@parallel_kernel
def im2col(x, kh, kw, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, out_h, out_w, fill, cols):
    """cols[(n*out_h + oy)*out_w + ox, (ky*kw + kx)*C + c] = x[n, iy, ix, c], or fill outside the image."""
    n_batch, in_h, in_w, channels = x.shape
    for row in nb.prange(n_batch * out_h):
        n = row // out_h
        oy = row - n * out_h
        for ox in range(out_w):
            r = row * out_w + ox
            for ky in range(kh):
                iy = oy * stride_h - pad_top + ky * dil_h
                for kx in range(kw):
                    ix = ox * stride_w - pad_left + kx * dil_w
                    base = (ky * kw + kx) * channels
                    if 0 <= iy < in_h and 0 <= ix < in_w:
                        for c in range(channels):
                            cols[r, base + c] = x[n, iy, ix, c]
                    else:
                        for c in range(channels):
                            cols[r, base + c] = fill
    return cols


def columns(x: np.ndarray, g, fill: int, cols: np.ndarray | None = None) -> np.ndarray:
    """im2col of x [N, H, W, C] for geometry g (a geometry.ConvGeometry) into float32 rows
    [N * out_h * out_w, kh * kw * C]; padding taps hold fill (the input zero point)."""
    if g.pointwise:
        return x.reshape(-1, g.depth).astype(np.float32)
    if cols is None:
        cols = np.empty((x.shape[0] * g.out_h * g.out_w, g.depth), dtype=np.float32)
    im2col(x, g.kh, g.kw, *g.stride, *g.dilation, *g.pad, g.out_h, g.out_w, np.float32(fill), cols)
    return cols


def workspace_bytes(g, out_channels: int, n: int) -> int:
    """The largest temporary array of convolve for a batch of n: float32 im2col rows or exact products."""
    pixels = g.out_h * g.out_w
    images = min(n, max(1, TILE_BYTES // (pixels * g.depth * 4)))  # _tiled: one slice of the batch at a time
    return images * pixels * max(g.depth * 4, out_channels * 8)


def convolve(x, w, bias, input_zero_point, g, stage, profile, shared=False):
    """As vnni.convolve (same arrays and result, int8 [G * P, O]), for geometry g, by im2col and the
    exact float32 GEMM."""
    groups, o = w.shape[0], w.shape[1]
    offset = accumulator_offset(w, bias, input_zero_point)
    s = stage
    if groups == 1:
        return _tiled(
            x, g, transposed_weights(w.reshape(1, o, g.depth)), offset, input_zero_point, stage, profile
        )
    products = grouped_products(columns(x, g, input_zero_point), w.reshape(groups, o, g.depth), shared)
    out = np.empty(products.shape, dtype=np.int8)
    requantize_products(
        products, offset, s.multiplier, s.shift, s.real_scale, s.zero_point, s.lo, s.hi, profile, out
    )
    return out.reshape(-1, o)


def _tiled(x, g, wt, offset, input_zero_point, stage, profile):
    """A batch in slices of images whose im2col fits in a reused buffer of about TILE_BYTES: the GEMM
    then reads its operand from cache instead of a fresh 100 MB array."""
    s = stage
    n, pixels = x.shape[0], g.out_h * g.out_w
    k, o = wt.shape[1], wt.shape[2]
    per_tile = max(1, TILE_BYTES // (pixels * k * 4))
    buffer = None if g.pointwise else np.empty((min(per_tile, n) * pixels, k), dtype=np.float32)
    out = np.empty((n * pixels, o), dtype=np.int8)
    for i in range(0, n, per_tile):
        xi = x[i : i + per_tile]
        rows = len(xi) * pixels
        cols = columns(xi, g, input_zero_point, None if buffer is None else buffer[:rows])
        products = exact_matmul(cols, wt[0])
        requantize_products(
            products[None],
            offset,
            s.multiplier,
            s.shift,
            s.real_scale,
            s.zero_point,
            s.lo,
            s.hi,
            profile,
            out[i * pixels : i * pixels + rows].reshape(1, rows, o),
        )
    return out
