"""The compiled reductions: AVERAGE_POOL_2D's and MAX_POOL_2D's windows (TFLM's
reference_integer_ops/pooling.h: only taps inside the image count) and MEAN's sums and
requantization (reference_ops::QuantizedMeanOrSum). The operators (npusim/ops/pool.py, mean.py)
prepare the windows and multipliers and call these.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .jit import njit, parallel_kernel
from .rounding import clamp, multiply_by_quantized_multiplier


@njit(inline="always")
def window(out_index, stride, pad, k, size):
    """Start of a pooling window along one axis and the range of its taps inside the input
    (TFLM counts and reads only those)."""
    start = out_index * stride - pad
    return start, max(0, -start), min(k, size - start)


@parallel_kernel
def average_pool(x, kh, kw, sh, sw, pad_h, pad_w, lo, hi, offset, out):
    """x [N, H, W, C] int8 -> out [N, OH, OW, C] int8. offset 128: a uint8 model's codes shifted to
    int8 (npusim/runtime/uint8.py), averaged as LiteRT's uint8 kernel does, (sum + count / 2) / count of the
    uint8 codes, half up where the int8 kernel rounds half away from zero."""
    n, in_h, in_w, depth = x.shape
    _, out_h, out_w, _ = out.shape
    acc = np.zeros((n * out_h, depth), dtype=np.int32)
    for row in nb.prange(n * out_h):
        b = row // out_h
        oy = row % out_h
        y0, fy0, fy1 = window(oy, sh, pad_h, kh, in_h)
        for ox in range(out_w):
            x0, fx0, fx1 = window(ox, sw, pad_w, kw, in_w)
            count = (fy1 - fy0) * (fx1 - fx0)
            for c in range(depth):
                acc[row, c] = 0
            for fy in range(fy0, fy1):
                for fx in range(fx0, fx1):
                    for c in range(depth):
                        acc[row, c] += x[b, y0 + fy, x0 + fx, c] + offset
            half = count // 2
            for c in range(depth):
                a = acc[row, c]
                # C++ integer division truncates: round half away from zero.
                if a > 0:
                    v = (a + half) // count
                else:
                    v = -((half - a) // count)
                out[b, oy, ox, c] = clamp(v - offset, lo, hi)
    return out


@parallel_kernel
def max_pool(x, kh, kw, sh, sw, pad_h, pad_w, lo, hi, offset, out):
    """x [N, H, W, C] int8 -> out [N, OH, OW, C] int8: the maximum over the window's taps inside
    the image (TFLM starts from -128), in two passes per output row: down the window's rows for
    every column of the image, then across each window's columns. The maximum of a rectangle is
    the maximum of its column maxima; both passes are flat loops of max() that LLVM vectorizes,
    where a compare and branch per tap ran at about one tap per ns (YOLOv8n's SPPF, three 5x5
    windows)."""
    n, in_h, in_w, depth = x.shape
    _, out_h, out_w, _ = out.shape
    for row in nb.prange(n * out_h):
        b = row // out_h
        oy = row % out_h
        y0, fy0, fy1 = window(oy, sh, pad_h, kh, in_h)
        columns = np.full(in_w * depth, -128, dtype=np.int8)
        for fy in range(fy0, fy1):
            line = x[b, y0 + fy].reshape(-1)
            for k in range(in_w * depth):
                columns[k] = max(columns[k], line[k])
        best = np.empty(depth, dtype=np.int8)
        for ox in range(out_w):
            x0, fx0, fx1 = window(ox, sw, pad_w, kw, in_w)
            best[:] = -128
            for fx in range(fx0, fx1):
                column = columns[(x0 + fx) * depth : (x0 + fx + 1) * depth]  # indexed from 0: vectorized
                for c in range(depth):
                    best[c] = max(best[c], column[c])
            for c in range(depth):
                out[b, oy, ox, c] = clamp(np.int32(best[c]), lo, hi)
    return out


@parallel_kernel
def sum_middle_axis(x, sums):
    """sums[a, c] = sum over r of x[a, r, c] (exact: int64). The reduced axes of an NHWC mean are
    contiguous, so the sum runs over the middle axis of this view; the inner loop over c vectorizes
    (numpy's x.sum(axis, dtype=int64) casts every byte to int64 first: several times slower)."""
    for a in nb.prange(x.shape[0]):
        acc = np.zeros(x.shape[2], dtype=np.int64)
        for r in range(x.shape[1]):
            for c in range(x.shape[2]):
                acc[c] += x[a, r, c]
        sums[a] = acc
    return sums


@parallel_kernel
def mean_requantize(sums, input_offset, multiplier, shift, output_zero_point, out):
    """MultiplyByQuantizedMultiplier(int32(sum - zp_in * n), M', e') + zp_out, clamped to int8."""
    flat = sums.ravel()
    of = out.ravel()
    for i in nb.prange(flat.size):
        shifted = np.int64(np.int32(flat[i] - input_offset))  # static_cast<int32_t> in TFLM
        of[i] = clamp(
            multiply_by_quantized_multiplier(shifted, multiplier, shift) + output_zero_point, -128, 127
        )
    return out
