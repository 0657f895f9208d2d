"""CONV_2D: int8 NHWC convolution with per-channel requantization (TFLM reference_integer_ops/conv.h).

Eval runs on AMX tiles where the host has them and the shape suits them (amx.py), else on AVX-512
VNNI (vnni.py), both direct convolutions in exact int32; elsewhere im2col + an exact float32 GEMM
(gemm.py) + a fused requantization.
Weights may carry an extra leading group axis [G, O, kh, kw, C] (bias [G, O]): the batch is then
split into G equal groups, group g convolved with weights g. The trainer uses this to run many
weight perturbations in one call.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..jit import parallel_kernel
from . import aligned, amx, vnni
from .base import Kernel, WeightMemo
from .gemm import (
    accumulator_offset,
    exact_matmul,
    grouped_products,
    requantize_products,
    transposed_weights,
)
from .padding import compute_padding
from .requant import OutputStage

TILE_BYTES = 4 << 20  # im2col slice size: a few MB stays in the last-level cache


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


class Conv2D(Kernel):
    kind = "CONV_2D"
    required_inputs, max_inputs = 2, 3

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.require_int8(x, w, y)
        self.require_constant(w, "filter")
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4:
            raise self.error(f"expected 4-D input, filter and output, got {list(x.shape)}, {list(w.shape)}, {list(y.shape)}")
        o = self.options = op.options
        self.out_channels, self.kh, self.kw, in_c = w.shape
        if in_c != x.shape[3]:
            raise self.error(f"filter depth {in_c} does not match input channels {x.shape[3]} (grouped conv is not supported)")
        self.require_bias(self.inputs[2] if len(self.inputs) > 2 else None, self.out_channels)
        self.in_image_shape = tuple(x.shape[1:])
        self.out_h, self.pad_top = compute_padding(x.shape[1], self.kh, o.get("stride_h", 1), o.get("dilation_h_factor", 1), o.get("padding"))
        self.out_w, self.pad_left = compute_padding(x.shape[2], self.kw, o.get("stride_w", 1), o.get("dilation_w_factor", 1), o.get("padding"))
        if (self.out_h, self.out_w, self.out_channels) != tuple(y.shape[1:]):
            raise self.error(f"output shape {list(y.shape)} does not match the computed [N, {self.out_h}, {self.out_w}, {self.out_channels}]")
        self.stage = OutputStage.prepare(x, w, y, self.out_channels, o.get("fused_activation_function", "NONE"))
        self.workspace = aligned.Workspace()  # the padded input of the AMX and VNNI paths
        self.memo = WeightMemo()

    def macs(self) -> int:
        return self.out_h * self.out_w * self.out_channels * self.kh * self.kw * self.inputs[0].shape[3]

    def workspace_bytes(self, n: int) -> int:
        pixels = self.out_h * self.out_w
        k = self.kh * self.kw * self.inputs[0].shape[3]
        images = min(n, max(1, TILE_BYTES // (pixels * k * 4)))  # _tiled: one slice of the batch at a time
        return images * pixels * max(k * 4, self.out_channels * 8)  # float32 im2col rows; exact products

    @property
    def pointwise(self) -> bool:
        o = self.options
        return (self.kh, self.kw, o.get("stride_h", 1), o.get("stride_w", 1), self.pad_top, self.pad_left) == (1, 1, 1, 1, 0, 0)

    def columns(self, x: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
        """im2col of x into float32 rows [N * out_h * out_w, kh * kw * C] (padding taps hold in_zp)."""
        o = self.options
        k = self.kh * self.kw * x.shape[3]
        if self.pointwise:
            return x.reshape(-1, k).astype(np.float32)
        if cols is None:
            cols = np.empty((x.shape[0] * self.out_h * self.out_w, k), dtype=np.float32)
        im2col(x, self.kh, self.kw, o.get("stride_h", 1), o.get("stride_w", 1), o.get("dilation_h_factor", 1),
               o.get("dilation_w_factor", 1), self.pad_top, self.pad_left, self.out_h, self.out_w,
               np.float32(self.inputs[0].zero_point), cols)
        return cols

    def __call__(self, x, w, b=None, shared=False):
        """shared=True: x is one batch seen by every weight group (output: G times the batch)."""
        if x.shape[1:] != self.in_image_shape:  # im2col indexes by the planned shape, unchecked
            raise self.error(f"input array has shape {list(x.shape)}, expected [N, {', '.join(map(str, self.in_image_shape))}]")
        wg = w if w.ndim == 5 else w[None]
        groups = wg.shape[0]
        k = self.kh * self.kw * x.shape[3]
        o = self.options
        # amx.convolve runs a pointwise convolution over whole images as rows (if C needs no padding).
        row_pixels = self.out_h * self.out_w if self.pointwise and x.shape[3] % 4 == 0 else self.out_w
        path = amx if amx.usable(k, x.shape[3], row_pixels) else vnni if vnni.usable(k) else None
        if path is not None:
            out = path.convolve(x, wg, b, self.inputs[0].zero_point, (o.get("stride_h", 1), o.get("stride_w", 1)),
                                (o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)), (self.pad_top, self.pad_left),
                                (self.out_h, self.out_w), self.stage, self.profile, shared, self.workspace,
                                self.memo if groups == 1 else None)
            return out.reshape(-1, self.out_h, self.out_w, self.out_channels)
        offset = accumulator_offset(wg, b, self.inputs[0].zero_point)
        s = self.stage
        if groups == 1:
            return self._tiled(x, transposed_weights(wg.reshape(1, self.out_channels, k)), offset)
        products = grouped_products(self.columns(x), wg.reshape(groups, self.out_channels, k), shared)
        out = np.empty(products.shape, dtype=np.int8)
        requantize_products(products, offset, s.multiplier, s.shift, s.real_scale, s.zero_point, s.lo, s.hi, self.profile, out)
        return out.reshape(-1, self.out_h, self.out_w, self.out_channels)

    def _tiled(self, x, wt, offset):
        """A batch in slices of images whose im2col fits in a reused buffer of about TILE_BYTES:
        the GEMM then reads its operand from cache instead of a fresh 100 MB array."""
        s = self.stage
        n, pixels = x.shape[0], self.out_h * self.out_w
        k = wt.shape[1]
        per_tile = max(1, TILE_BYTES // (pixels * k * 4))
        buffer = None if self.pointwise else np.empty((min(per_tile, n) * pixels, k), dtype=np.float32)
        out = np.empty((n, self.out_h, self.out_w, self.out_channels), dtype=np.int8)
        for i in range(0, n, per_tile):
            xi = x[i:i + per_tile]
            rows = len(xi) * pixels
            cols = self.columns(xi, None if buffer is None else buffer[:rows])
            products = exact_matmul(cols, wt[0])
            requantize_products(products[None], offset, s.multiplier, s.shift, s.real_scale, s.zero_point, s.lo, s.hi,
                                self.profile, out[i:i + len(xi)].reshape(1, rows, self.out_channels))
        return out
