"""Exact sums of (x - z_x)(w - z_w) for the MAC layers the int8 engines do not take: a constant
filter with a zero point (asymmetric weights, such as ONNX's uint8 weights of zero point 255, whose
codes minus zero point leave int8; TFLM's reference FullyConnected takes it as filter_offset), and
an int32 output, which is the accumulator itself plus the bias (ONNX's ConvInteger and
MatMulInteger as a graph's output: the integer sums with no rescale after them).

im2col (padding taps hold z_x, so they contribute exactly 0, as TFLM skips them) and one float64
GEMM: every product is at most 255 * 256 < 2^16 in magnitude and every partial sum an integer far
below 2^53, so the BLAS's result is exact in whatever order it adds. An int8 output is then
requantized by the layer's OutputStage (requantize_products: the profile's rounding); an int32
output wraps as int32 arithmetic does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gemm import columns, requantize_products
from .requant import OutputStage


@dataclass
class WideStage:
    """The plain data of a wide MAC layer: per output channel filter zero points, and the output
    stage (None: an int32 output, the accumulator itself)."""

    filter_zero_point: np.ndarray  # int64 [O]
    stage: OutputStage | None
    profile: int

    def sums(self, x: np.ndarray, w: np.ndarray, input_zero_point: int, g) -> np.ndarray:
        """x [N, H, W, C] int8, w [O, kh, kw, C] int8 -> the exact sums [N * P, O], float64."""
        cols = columns(x, g, input_zero_point).astype(np.float64) - np.float64(input_zero_point)
        wf = w.reshape(w.shape[0], -1).astype(np.float64) - self.filter_zero_point[:, None]
        return cols @ wf.T

    def depthwise_sums(self, x, w, input_zero_point: int, g, multiplier: int) -> np.ndarray:
        """x [N, H, W, C] int8, a depthwise filter [1, kh, kw, C * multiplier] -> the exact sums
        [N * P, C * multiplier], float64 (padding taps hold z_x, so they add 0)."""
        (sh, sw), (dh, dw), (top, left), (oh, ow) = g.stride, g.dilation, g.pad, g.out_hw
        need_h, need_w = (oh - 1) * sh + (g.kh - 1) * dh + 1, (ow - 1) * sw + (g.kw - 1) * dw + 1
        n, h, wd, c = x.shape
        padded = np.full((n, max(need_h, top + h), max(need_w, left + wd), c), input_zero_point, np.float64)
        padded[:, top : top + h, left : left + wd] = x
        padded -= np.float64(input_zero_point)
        wf = w.reshape(g.kh, g.kw, -1).astype(np.float64) - self.filter_zero_point
        acc = np.zeros((n, oh, ow, wf.shape[2]), np.float64)
        for i in range(g.kh):
            for j in range(g.kw):
                taps = padded[
                    :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw
                ]
                acc += np.repeat(taps, multiplier, axis=3) * wf[i, j]
        return acc.reshape(n * oh * ow, -1)

    def __call__(self, x, w, bias, input_zero_point: int, g, acc=None) -> np.ndarray:
        """As gemm.convolve for one weight group: [N * P, O], int8 or int32 (acc: the sums, when
        the caller computed them, as depthwise_sums)."""
        acc = self.sums(x, w, input_zero_point, g) if acc is None else acc
        o = acc.shape[1]
        if self.stage is None:
            total = acc.astype(np.int64)
            if bias is not None:
                total += np.asarray(bias, np.int64).reshape(1, o)
            return total.astype(np.int32)  # int32 arithmetic wraps
        s = self.stage
        offset = np.zeros((1, o), np.int64) if bias is None else np.asarray(bias, np.int64).reshape(1, o)
        out = np.empty((1,) + acc.shape, dtype=np.int8)
        args = (s.multiplier, s.shift, s.real_scale, s.zero_point, s.lo, s.hi, self.profile)
        return requantize_products(acc[None], offset, *args, out)[0]


def filter_zero_points(w, channels: int) -> np.ndarray:
    """The filter's zero points, one per output channel (axis 0), int64."""
    zp = np.asarray(w.quant.zero_point, np.int64).reshape(-1)
    return np.ascontiguousarray(np.broadcast_to(zp, (channels,)) if zp.size == 1 else zp)


def is_wide(w, y) -> bool:
    """Whether a MAC layer needs WideStage: an int32 output or a filter with a nonzero zero point."""
    return y.dtype == np.int32 or (w.quant is not None and bool(np.any(w.quant.zero_point)))


def prepare(error, x, w, y, channels: int, activation: str, profile: int, mac_profile: int) -> WideStage:
    """Checks a wide layer's operands (error(message) -> the exception to raise) and builds its stage."""
    zp = filter_zero_points(w, channels)
    if zp.size != channels:
        raise error(f"filter {w.name!r} has {zp.size} zero points, expected 1 or {channels}")
    if y.dtype == np.int32:
        if activation != "NONE":
            raise error(f"int32 output {y.name!r} with fused activation {activation}, expected NONE")
        if y.quant is not None and np.any(y.quant.zero_point):
            raise error(f"int32 output {y.name!r} has zero point {y.zero_point}, expected 0")
        return WideStage(zp, None, mac_profile)
    if y.dtype != np.int8:
        raise error(f"output {y.name!r} is {np.dtype(y.dtype).name}, expected int8 or int32")
    return WideStage(zp, OutputStage.prepare(x, w, y, channels, activation, profile), mac_profile)
