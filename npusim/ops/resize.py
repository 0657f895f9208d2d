"""RESIZE_NEAREST_NEIGHBOR on NHWC (TFLM micro/kernels/resize_nearest_neighbor.cc and
reference_ops::ResizeNearestNeighbor). Data movement: output pixel (y, x) copies input pixel
(GetNearestNeighbor(y), GetNearestNeighbor(x)), computed in float32 as TFLM does:
scale = (in - 1) / (out - 1) with align_corners (and out > 1), else in / out;
v = (i + (0.5 if half_pixel_centers else 0)) * scale; index = round half away from zero (v) with
align_corners, floor(v) without; then min(index, in - 1), and max(index, 0) with half_pixel_centers.
"""

from __future__ import annotations

import numpy as np

from ..profiles import SINGLE_ROUNDING, profile_of, xnnpack
from ..quant import trunc_div
from .base import Kernel
from .float_form import FloatForm, MovementForm, real
from .movement import _same_dtype


def nearest_indices(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool) -> np.ndarray:
    f32 = np.float32
    if align_corners and out_size > 1:
        scale = f32(in_size - 1) / f32(out_size - 1)
    else:
        scale = f32(in_size) / f32(out_size)
    offset = f32(0.5) if half_pixel_centers else f32(0.0)
    v = (np.arange(out_size, dtype=np.float32) + offset) * scale  # float32 throughout
    if align_corners:
        r = np.floor(np.abs(v) + f32(0.5)) * np.sign(v)  # TfLiteRound: half away from zero
    else:
        r = np.floor(v)
    idx = np.minimum(r.astype(np.int64), in_size - 1)
    if half_pixel_centers:
        idx = np.maximum(idx, 0)
    return idx


def resize_target(kernel: Kernel) -> tuple[int, int, bool, bool]:
    """The checks both resize ops' Prepare makes (NHWC input, a constant 1-D size of two positive
    int32 values, the output of that size): (out height, out width, align_corners, half_pixel_centers)."""
    x, size, y = kernel.inputs[0], kernel.inputs[1], kernel.outputs[0]
    _same_dtype(kernel)
    if len(x.shape) != 4:
        raise kernel.error(f"input {x.name!r} has shape {list(x.shape)}, expected NHWC (rank 4)")
    kernel.require_constant(size, "size")
    if size.dtype != np.int32 or size.data.size != 2 or size.data.ndim != 1:
        raise kernel.error(f"size {size.name!r} is not a 1-D tensor of two int32 values")
    oh, ow = (int(v) for v in size.data.reshape(-1))
    if oh <= 0 or ow <= 0:
        raise kernel.error(f"output size {[oh, ow]} is not positive")
    expected = [x.shape[0], oh, ow, x.shape[3]]
    if list(y.shape) != expected:
        raise kernel.error(f"output shape {list(y.shape)} is not the resized shape {expected}")
    options = kernel.op.options
    return oh, ow, bool(options.get("align_corners", False)), bool(options.get("half_pixel_centers", False))


class ResizeBilinearFloat(FloatForm):
    """LiteRT reference_ops ResizeBilinear in float: source coordinate v = (i + 0.5) * scale - 0.5
    with half_pixel_centers, else i * scale (scale in float32 as resize_nearest_indices has it);
    rows floor(v) clamped to 0 and ceil(v) clamped to the last, weighted by v - lower."""

    def __init__(self, op, graph):
        super().__init__(op, graph)
        x = self.inputs[0]
        o = op.options
        align, half = bool(o.get("align_corners", False)), bool(o.get("half_pixel_centers", False))
        self.axes = [
            _bilinear_axis(int(x.shape[a]), int(self.outputs[0].shape[a]), align, half) for a in (1, 2)
        ]

    def __call__(self, x, size=None):
        (y0, y1, fy), (x0, x1, fx) = self.axes
        fy, fx = fy.reshape(1, -1, 1, 1), fx.reshape(1, 1, -1, 1)
        x = real(x)
        top = x[:, y0][:, :, x0] * (1 - fx) + x[:, y0][:, :, x1] * fx
        bottom = x[:, y1][:, :, x0] * (1 - fx) + x[:, y1][:, :, x1] * fx
        return (top * (1 - fy) + bottom * fy).astype(x.dtype)


def _bilinear_axis(in_size: int, out_size: int, align: bool, half: bool):
    """(lower index, upper index, weight of the upper) per output index, shaped to broadcast."""
    f32 = np.float32
    if align and out_size > 1:
        scale = f32(in_size - 1) / f32(out_size - 1)
    else:
        scale = f32(in_size) / f32(out_size)
    i = np.arange(out_size, dtype=np.float32)
    v = (i + f32(0.5)) * scale - f32(0.5) if half else i * scale
    lower = np.maximum(np.floor(v).astype(np.int64), 0)
    upper = np.minimum(np.ceil(v).astype(np.int64), in_size - 1)
    return lower, upper, (v - lower).astype(np.float32)


class ResizeNearestNeighbor(Kernel):
    kind = "RESIZE_NEAREST_NEIGHBOR"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 2, 2, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        oh, ow, align, half = resize_target(self)
        if x.quant is not None and y.quant is not None and (x.scale, x.zero_point) != (y.scale, y.zero_point):
            raise self.error("input and output quantization differ, expected a pure resize")
        self.rows = nearest_indices(x.shape[1], oh, align, half)
        self.cols = nearest_indices(x.shape[2], ow, align, half)
        # Each axis an integer repeat of the input (the 2x upsampling of detection necks): np.repeat.
        self.repeats = tuple(
            out // n if out % n == 0 and np.array_equal(idx, np.repeat(np.arange(n), out // n)) else None
            for idx, n, out in ((self.rows, x.shape[1], oh), (self.cols, x.shape[2], ow))
        )

    def __call__(self, x, size=None):
        if self.repeats[0] is not None and self.repeats[1] is not None:
            return np.repeat(np.repeat(x, self.repeats[0], axis=1), self.repeats[1], axis=2)
        return np.ascontiguousarray(x[:, self.rows][:, :, self.cols])


def bilinear_taps(in_size: int, out_size: int, align_corners: bool, half_pixel_centers: bool):
    """ComputeInterpolationValuesInteger along one axis: (i0, i1, w1) with the weight of i1 in
    1/1024 (that of i0 is 1024 - w1; negative at a half-pixel edge, where i0 == i1)."""
    scale_10 = ((1 << 10) * in_size + out_size // 2) // out_size
    if align_corners and out_size > 1:
        scale_10 = ((1 << 10) * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    v = np.arange(out_size, dtype=np.int64)
    if half_pixel_centers:
        scaled = v * scale_10 + scale_10 // 2 - (1 << 9)
    else:
        scaled = v * scale_10
    i0 = np.maximum(trunc_div(scaled, 1 << 10), 0)
    i1 = np.minimum(trunc_div(scaled + (1 << 10) - 1, 1 << 10), in_size - 1)
    return i0, i1, scaled - (1 << 10) * i0


class ResizeBilinear(Kernel):
    """RESIZE_BILINEAR, int8 (TFLM micro/kernels/resize_bilinear.cc, reference_ops::
    ResizeBilinearInteger): scales in 1/1024 rounded to nearest, per output pixel the four corner
    codes weighted in 1/2^20 (int64), then (sum + sign(sum) * 2^19) / 2^20 truncated toward zero
    (with TFLITE_SINGLE_ROUNDING, the "single" profile: (sum + 2^19) >> 20), cast to int8. TFLM
    interpolates the raw codes and checks neither quantization: npusim follows it. The xnnpack
    profile blends in XNNPACK's 11-bit weights instead (xnnpack.resize_bilinear)."""

    kind = "RESIZE_BILINEAR"
    float_form = ResizeBilinearFloat
    required_inputs, max_inputs, data_inputs = 2, 2, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x = self.inputs[0]
        oh, ow, align, half = resize_target(self)
        if x.dtype != np.int8:
            raise self.error(f"input {x.name!r} is {np.dtype(x.dtype).name}, expected int8")
        if align and half:
            raise self.error("align_corners and half_pixel_centers are both set (TFLM refuses it)")
        self.rows = bilinear_taps(x.shape[1], oh, align, half)
        self.cols = bilinear_taps(x.shape[2], ow, align, half)
        self.single = profile_of(profile).stage == SINGLE_ROUNDING
        self.xnnpack = (align, half) if profile_of(profile).xnnpack_delegate else None
        self.out_image = (oh, ow, x.shape[3])

    def workspace_bytes(self, n: int) -> int:
        return 4 * 8 * n * int(np.prod(self.out_image))

    def __call__(self, x, size=None):
        if self.xnnpack is not None:
            return xnnpack.resize_bilinear(np.asarray(x), self.out_image[:2], *self.xnnpack)
        y0, y1, wy = self.rows
        x0, x1, wx = self.cols
        one = np.int64(1 << 10)
        wy, wx = wy[None, :, None, None], wx[None, None, :, None]
        top = x[:, y0].astype(np.int64)
        bottom = x[:, y1].astype(np.int64)
        acc = (top[:, :, x0] * (one - wx) + top[:, :, x1] * wx) * (one - wy)
        acc += (bottom[:, :, x0] * (one - wx) + bottom[:, :, x1] * wx) * wy
        if self.single:
            out = (acc + (1 << 19)) >> 20
        else:
            out = trunc_div(acc + np.where(acc > 0, 1 << 19, -(1 << 19)), 1 << 20)
        return out.astype(np.int8)
