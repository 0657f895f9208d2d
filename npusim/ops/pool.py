"""AVERAGE_POOL_2D and MAX_POOL_2D on int8 NHWC.

Prepare follows TFLM micro/kernels/pooling_common.cc (padding from ComputePaddingHeightWidth,
input and output quantization must match, activation range from the output quantization);
Eval follows reference_integer_ops::AveragePool / MaxPool (kernels/internal/reference/integer_ops/
pooling.h): only taps inside the image count, padding contributes nothing.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..kernels.geometry import ConvGeometry
from ..kernels.padding import compute_padding
from ..kernels.reduce import average_pool, max_pool
from ..kernels.requant import output_range
from .base import Kernel
from .float_form import FloatForm, pad_spatial, real, tap


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
