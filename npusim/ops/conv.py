"""CONV_2D: int8 NHWC convolution with per-channel requantization (TFLM reference_integer_ops/conv.h).

Eval is im2col + an exact float32 GEMM (see gemm.py) + a fused requantization.
Weights may carry an extra leading group axis [G, O, kh, kw, C] (bias [G, O]): the batch is then
split into G equal groups, group g convolved with weights g. The trainer uses this to run many
weight perturbations in one call.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .base import Kernel
from .gemm import accumulator_offset, grouped_products, requantize_products
from .padding import compute_padding
from .requant import OutputStage


@nb.njit(cache=True, parallel=True)
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


class Conv2D(Kernel):
    kind = "CONV_2D"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.require_int8(x, w, y)
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4:
            raise self.error(f"expected 4-D input, filter and output, got {list(x.shape)}, {list(w.shape)}, {list(y.shape)}")
        o = self.options = op.options
        self.out_channels, self.kh, self.kw, in_c = w.shape
        if in_c != x.shape[3]:
            raise self.error(f"filter depth {in_c} does not match input channels {x.shape[3]} (grouped conv is not supported)")
        self.out_h, self.pad_top = compute_padding(x.shape[1], self.kh, o.get("stride_h", 1), o.get("dilation_h_factor", 1), o.get("padding"))
        self.out_w, self.pad_left = compute_padding(x.shape[2], self.kw, o.get("stride_w", 1), o.get("dilation_w_factor", 1), o.get("padding"))
        if (self.out_h, self.out_w, self.out_channels) != tuple(y.shape[1:]):
            raise self.error(f"output shape {list(y.shape)} does not match the computed [N, {self.out_h}, {self.out_w}, {self.out_channels}]")
        self.stage = OutputStage.prepare(x, w, y, self.out_channels, o.get("fused_activation_function", "NONE"))

    def macs(self) -> int:
        return self.out_h * self.out_w * self.out_channels * self.kh * self.kw * self.inputs[0].shape[3]

    def __call__(self, x, w, b=None, shared=False):
        """shared=True: x is one batch seen by every weight group (output: G times the batch)."""
        o = self.options
        wg = w if w.ndim == 5 else w[None]
        groups = wg.shape[0]
        k = self.kh * self.kw * x.shape[3]
        if (self.kh, self.kw, o.get("stride_h", 1), o.get("stride_w", 1)) == (1, 1, 1, 1) and self.pad_top == 0 and self.pad_left == 0:
            cols = x.reshape(-1, k).astype(np.float32)
        else:
            cols = np.empty((x.shape[0] * self.out_h * self.out_w, k), dtype=np.float32)
            im2col(x, self.kh, self.kw, o.get("stride_h", 1), o.get("stride_w", 1), o.get("dilation_h_factor", 1),
                   o.get("dilation_w_factor", 1), self.pad_top, self.pad_left, self.out_h, self.out_w,
                   np.float32(self.inputs[0].zero_point), cols)
        products = grouped_products(cols, wg.reshape(groups, self.out_channels, k), shared)
        offset = accumulator_offset(wg, b, self.inputs[0].zero_point)
        s = self.stage
        out = np.empty(products.shape, dtype=np.int8)
        requantize_products(products, offset, s.multiplier, s.shift, s.real_scale, s.zero_point, s.lo, s.hi, self.profile, out)
        return out.reshape(-1, self.out_h, self.out_w, self.out_channels)
