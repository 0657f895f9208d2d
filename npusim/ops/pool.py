"""AVERAGE_POOL_2D and MAX_POOL_2D on int8 NHWC.

Prepare follows TFLM micro/kernels/pooling_common.cc (padding from ComputePaddingHeightWidth,
input and output quantization must match, activation range from the output quantization);
Eval follows reference_integer_ops::AveragePool / MaxPool (kernels/internal/reference/integer_ops/
pooling.h): only taps inside the image count, padding contributes nothing.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..errors import NpusimError
from ..kernels.geometry import ConvGeometry
from ..kernels.jit import njit, parallel_kernel
from ..kernels.padding import compute_padding
from ..kernels.requant import output_range
from ..quant import clamp
from .base import Kernel
from .float_form import FloatForm, pad_spatial, real, tap


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


class _PoolFloat(FloatForm):
    def __init__(self, op, graph):
        super().__init__(op, graph)
        o = op.options
        self.geometry = ConvGeometry.from_options(
            o, self.inputs[0].shape, int(o["filter_height"]), int(o["filter_width"])
        )

    def windows(self, x, value):
        """The padded input and the views of it that each filter tap reads."""
        g = self.geometry
        xp = pad_spatial(real(x), g, value)
        return xp, [tap(xp, g, ky, kx) for ky in range(g.kh) for kx in range(g.kw)]


class AveragePool2DFloat(_PoolFloat):
    """The mean of the taps inside the image (LiteRT reference_ops AveragePool divides by the
    in-image count, filter_count)."""

    def __init__(self, op, graph):
        super().__init__(op, graph)
        self.count = self.window_sum(np.ones((1,) + tuple(int(d) for d in self.inputs[0].shape[1:3]) + (1,)))

    def window_sum(self, x):
        taps = self.windows(x, 0.0)[1]
        total = np.zeros_like(taps[0])
        for t in taps:  # tap by tap, in the filter's order
            total += t
        return total

    def __call__(self, x):
        x = real(x)
        return self.activate(self.window_sum(x) / self.count.astype(x.dtype))


class MaxPool2DFloat(_PoolFloat):
    """The largest tap; padding is -inf, so taps outside the image never win."""

    def __call__(self, x):
        return self.activate(np.max(self.windows(x, -np.inf)[1], axis=0))


class _Pool2D(Kernel):
    _eval = None

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        inp, out = self.inputs[0], self.outputs[0]
        self.require_int8(inp, out)
        if len(inp.shape) != 4:
            raise self.error(f"input {inp.name!r} has shape {list(inp.shape)}, expected 4-D NHWC")
        # TFLM PoolingPrepare: |s_in - s_out| <= 1e-6 and equal zero points; pooling never rescales.
        if abs(float(inp.scale) - float(out.scale)) > 1e-6 or inp.zero_point != out.zero_point:
            raise self.error(
                f"input {inp.name!r} (scale {inp.scale:g}, zero point {inp.zero_point}) and output "
                f"{out.name!r} (scale {out.scale:g}, zero point {out.zero_point}) must share quantization"
            )
        o = op.options
        try:
            self.kh, self.kw = int(o["filter_height"]), int(o["filter_width"])
            self.sh, self.sw = int(o["stride_h"]), int(o["stride_w"])
            padding = o["padding"]
        except KeyError as e:
            raise self.error(f"missing option {e.args[0]!r}") from None
        act = o.get("fused_activation_function", "NONE")
        _, in_h, in_w, depth = (int(d) for d in inp.shape)
        try:
            self.out_h, self.pad_h = compute_padding(in_h, self.kh, self.sh, 1, padding)
            self.out_w, self.pad_w = compute_padding(in_w, self.kw, self.sw, 1, padding)
            self.act_min, self.act_max = output_range(act, out)
        except NpusimError as e:  # from the shared helpers: say which op
            raise self.error(str(e)) from None
        self.depth = depth
        self.in_hw = (in_h, in_w)
        # a legacy uint8 model (npusim/runtime/uint8.py shifts it, only under a profile with Profile.uint8):
        # LiteRT's uint8 average rounds the uint8 codes, so the shift is undone around it
        self.code_offset = int(inp.quant.offset)
        expected = (self.out_h, self.out_w, depth)
        if tuple(int(d) for d in out.shape[1:]) != expected:
            raise self.error(
                f"output {out.name!r} has shape {list(out.shape)}, "
                f"expected [N, {self.out_h}, {self.out_w}, {depth}]"
            )

    def macs(self) -> int:
        return self.out_h * self.out_w * self.depth * self.kh * self.kw

    def workspace_bytes(self, n: int) -> int:
        return n * self.out_h * self.depth * 4  # the kernel's int32 accumulator rows

    def __call__(self, x):
        x = np.asarray(x)
        if x.dtype != np.int8:
            raise self.error(f"input array has type {x.dtype}, expected int8")
        if x.ndim != 4 or x.shape[1:] != (*self.in_hw, self.depth):
            raise self.error(
                f"input array has shape {list(x.shape)}, expected "
                f"[N, {self.in_hw[0]}, {self.in_hw[1]}, {self.depth}]"
            )
        out = np.empty((x.shape[0], self.out_h, self.out_w, self.depth), dtype=np.int8)
        self._eval(
            np.ascontiguousarray(x),
            self.kh,
            self.kw,
            self.sh,
            self.sw,
            self.pad_h,
            self.pad_w,
            np.int32(self.act_min),
            np.int32(self.act_max),
            np.int32(self.code_offset),
            out,
        )
        return out


class AveragePool2D(_Pool2D):
    kind = "AVERAGE_POOL_2D"
    float_form = AveragePool2DFloat
    _eval = staticmethod(average_pool)


class MaxPool2D(_Pool2D):
    kind = "MAX_POOL_2D"
    float_form = MaxPool2DFloat
    _eval = staticmethod(max_pool)
