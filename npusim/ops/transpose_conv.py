"""TRANSPOSE_CONV: int8 NHWC transposed convolution with per-channel requantization (TFLM
micro/kernels/transpose_conv.cc, reference_integer_ops::TransposeConv).

Inputs (output_shape int32 [4], filter int8 [O, kh, kw, I] per channel on axis 0, input, optional
int32 bias [O]). TFLM scatters: input pixel (y, x) adds (x - in_zp) * w[o, fy, fx, i] to output pixel
(y * stride - pad + fy, x * stride - pad + fx) when that lies in the output; the padding is
ComputePaddingHeightWidth run on the *output* size (as if the op were the convolution from the
output back to the input). Then bias, MultiplyByQuantizedMultiplier per channel, zero point and the
clamp of the fused activation.

Eval: one exact float64 matrix product per filter tap (x - in_zp is at most 255 in magnitude, so
every partial sum is an integer far below 2^53) added into a strided view of the accumulator, then
the output stage of the MAC ops (gemm.requantize_products), under the xnnpack profile XNNPACK's
where LiteRT's delegate takes the op. Where the taps do not overlap and leave no output pixel out
(stride = filter size, no padding: the 2x2 stride-2 upsampling of YOLOv8-seg's mask head and of
decoders), each output pixel takes exactly one tap, whose sum plus the bias is the whole
accumulator: the op is then one pointwise convolution with a filter per tap (kh * kw * O output
channels, the stage's parameters repeated) on the MAC engines, its outputs interleaved into place.
"""

from __future__ import annotations

import numpy as np

from ..kernels import aligned, backend, gemm
from ..kernels.geometry import ConvGeometry
from ..kernels.requant import OutputStage
from ..profiles import profile_of
from ..quant import TFLM, mac_profile, multiply_by_quantized_multiplier_array
from .base import Kernel, WeightMemo
from .float_form import FloatForm, real


def _padding(size: int, k: int, stride: int, padding: str) -> int:
    """The leading padding ComputePaddingHeightWidth gives for a window k over `size` (here the
    output's size): ComputeOutSize with C's truncating division, then half the total, rounded down."""
    num = size + stride - 1 if padding == "SAME" else size + stride - k
    out = abs(num) // stride * (1 if num >= 0 else -1)
    return max((out - 1) * stride + k - size, 0) // 2


def _taps(w: np.ndarray, w_zp: int = 0) -> np.ndarray:
    """Per tap (fy, fx): the weights [O, kh, kw, I] less their zero point (nonzero only for a uint8
    model's filter, npusim/runtime/uint8.py) as [kh, kw, I, O] float64 for the products."""
    return np.ascontiguousarray((w.astype(np.float64) - w_zp).transpose(1, 2, 3, 0))


class TransposeConvFloat(FloatForm):
    """The scatter TFLM and LiteRT's reference TransposeConv do, in float32: input pixel (y, x)
    adds x * w[o, fy, fx, :] to output pixel (y * stride - pad + fy, x * stride - pad + fx)."""

    mac_inputs = (2, 1, 3)

    def __init__(self, op, graph):
        super().__init__(op, graph)
        w, x, y = self.inputs[1], self.inputs[2], self.outputs[0]
        o = op.options
        self.stride = (int(o.get("stride_h", 1)), int(o.get("stride_w", 1)))
        _, self.kh, self.kw, _ = w.shape
        self.out_hw = (int(y.shape[1]), int(y.shape[2]))
        self.pad = tuple(
            _padding(size, k, s, o.get("padding"))
            for size, k, s in zip(self.out_hw, (self.kh, self.kw), self.stride)
        )
        self.in_hw = (int(x.shape[1]), int(x.shape[2]))

    def __call__(self, output_shape, w, x, b=None):
        (h, wd), (sh, sw), (oh, ow) = self.in_hw, self.stride, self.out_hw
        full_h = max((h - 1) * sh + self.kh, self.pad[0] + oh)
        full_w = max((wd - 1) * sw + self.kw, self.pad[1] + ow)
        x = real(x)
        out = np.zeros((x.shape[0], full_h, full_w, w.shape[0]), np.result_type(x, w))
        taps = w.transpose(1, 2, 3, 0)  # [kh, kw, I, O]
        for fy in range(self.kh):
            for fx in range(self.kw):
                out[:, fy : fy + (h - 1) * sh + 1 : sh, fx : fx + (wd - 1) * sw + 1 : sw] += x @ taps[fy, fx]
        y = out[:, self.pad[0] : self.pad[0] + oh, self.pad[1] : self.pad[1] + ow]
        if b is not None:
            y = y + b
        return self.activate(np.ascontiguousarray(y))


class TransposeConv(Kernel):
    kind = "TRANSPOSE_CONV"
    float_form = TransposeConvFloat
    required_inputs, max_inputs = 3, 4
    takes_backends = True

    def __init__(self, op, graph, profile, backends: backend.Selection | None = None):
        super().__init__(op, graph, profile)
        shape_t, w, x = self.inputs[0], self.inputs[1], self.inputs[2]
        b = self.inputs[3] if len(self.inputs) > 3 else None
        y = self.outputs[0]
        self.require_int8(x, w, y)
        self.require_constant(w, "filter")
        self.require_constant(shape_t, "output_shape")
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4:
            shapes = ", ".join(str(list(t.shape)) for t in (x, w, y))
            raise self.error(f"expected 4-D input, filter and output, got {shapes}")
        if shape_t.dtype != np.int32 or shape_t.data.size != 4:
            raise self.error(f"output_shape {shape_t.name!r} is not four int32 values")
        declared = [int(v) for v in shape_t.data.reshape(-1)]
        if declared[1:] != list(y.shape[1:]):
            raise self.error(f"output_shape {declared} differs from the output tensor's {list(y.shape)}")
        self.out_channels, self.kh, self.kw, in_c = w.shape
        if in_c != x.shape[3] or self.out_channels != y.shape[3]:
            raise self.error(
                f"filter {list(w.shape)} does not map {x.shape[3]} input to {y.shape[3]} output channels"
            )
        self.require_bias(b, self.out_channels)
        o = op.options
        self.stride = (int(o.get("stride_h", 1)), int(o.get("stride_w", 1)))
        padding = o.get("padding")
        if padding not in ("SAME", "VALID"):
            raise self.error(f"padding {padding!r} is not supported, expected SAME or VALID")
        if min(self.stride) < 1:
            raise self.error(f"stride {list(self.stride)}, expected at least 1")
        self.pad = (
            _padding(y.shape[1], self.kh, self.stride[0], padding),
            _padding(y.shape[2], self.kw, self.stride[1], padding),
        )
        self.in_hw = tuple(x.shape[1:3])
        self.out_hw = tuple(y.shape[1:3])
        self.neon_uint8 = False  # requantize as LiteRT's builtin uint8 kernel (below)
        if (
            profile_of(profile).xnnpack_delegate
            and padding == "SAME"
            and (self.stride[0] > self.kh or self.stride[1] > self.kw)
        ):
            # SAME with a stride beyond the filter pads negatively: LiteRT's XNNPACK delegate refuses it
            # and runs its builtin kernel, which rounds as TFLM does (measured, ai-edge-litert 2.3.0);
            # its uint8 kernel (a shifted uint8 model's, offset 128) requantizes in NEON code instead
            self.profile = TFLM
            self.neon_uint8 = y.quant is not None and y.quant.offset == 128
        self.stage = OutputStage.prepare(
            x, w, y, self.out_channels, o.get("fused_activation_function", "NONE"), self.profile
        )
        self.w_zp = self._filter_zero_point(w)
        self.memo = WeightMemo()
        self.pointwise = None  # (geometry, engine, stage, workspace, memo) of the one-tap-per-pixel form
        (h, wd), (sh, sw) = self.in_hw, self.stride
        if (
            (sh, sw) == (self.kh, self.kw)
            and self.pad == (0, 0)
            and self.out_hw == (h * sh, wd * sw)
            and not self.w_zp  # the engines take a symmetric filter
            # under ONNX Runtime's arithmetic the op keeps gemm's output stage, not the engines'
            # (mac_profile), as it did when this form was added
            and not profile_of(self.profile).ort_qlinear
        ):
            g = ConvGeometry.from_options({"padding": "VALID"}, x.shape, 1, 1)
            taps, s = self.kh * self.kw, self.stage
            stage = OutputStage(
                np.tile(s.multiplier, taps),
                np.tile(s.shift, taps),
                np.tile(s.real_scale, taps),
                s.zero_point,
                s.lo,
                s.hi,
                profile=s.profile,
            )
            engine = (backends or backend.select()).for_geometry(g)
            self.pointwise = (g, engine, stage, aligned.Workspace(), WeightMemo())

    def _filter_zero_point(self, w) -> int:
        """The filter's one zero point: 0 for an int8 model; a uint8 model's (shifted) filter may have
        any, which LiteRT's uint8 kernel subtracts from each weight (tests/test_uint8.py)."""
        zp = np.unique(np.asarray(w.quant.zero_point if w.quant is not None else 0, np.int64))
        if zp.size > 1:
            raise self.error(f"filter {w.name!r} has zero points {zp.tolist()}, expected one")
        return int(zp[0]) if zp.size else 0

    def macs(self) -> int:
        return self.in_hw[0] * self.in_hw[1] * self.kh * self.kw * self.out_channels * self.inputs[1].shape[3]

    def workspace_bytes(self, n: int) -> int:
        (h, w), (sh, sw) = self.in_hw, self.stride
        full = ((h - 1) * sh + self.kh + self.pad[0]) * ((w - 1) * sw + self.kw + self.pad[1])
        return n * 8 * (full * self.out_channels + h * w * (self.inputs[1].shape[3] + self.out_channels))

    def __call__(self, output_shape, w, x, b=None):
        if w.shape != self.inputs[1].shape:
            raise self.error(f"filter has shape {list(w.shape)}, expected {list(self.inputs[1].shape)}")
        if self.pointwise is not None:
            return self._one_tap_per_pixel(w, x, b)
        taps = self.memo.get("taps", w, None, lambda: _taps(w, self.w_zp))
        n = x.shape[0]
        (h, wd), (sh, sw), (ph, pw) = self.in_hw, self.stride, self.pad
        oh, ow = self.out_hw
        # Accumulator over every position a tap reaches, shifted by the padding; cropped after.
        full_h = max((h - 1) * sh + self.kh, ph + oh)
        full_w = max((wd - 1) * sw + self.kw, pw + ow)
        acc = np.zeros((n, full_h, full_w, self.out_channels), dtype=np.float64)
        xs = (x.astype(np.float64) - self.inputs[2].zero_point).reshape(n * h * wd, -1)
        for fy in range(self.kh):
            for fx in range(self.kw):
                contribution = (xs @ taps[fy, fx]).reshape(n, h, wd, self.out_channels)
                acc[:, fy : fy + (h - 1) * sh + 1 : sh, fx : fx + (wd - 1) * sw + 1 : sw] += contribution
        acc = np.ascontiguousarray(acc[:, ph : ph + oh, pw : pw + ow]).reshape(1, n * oh * ow, -1)
        offset = (
            np.zeros((1, self.out_channels), np.int64) if b is None else b.astype(np.int64).reshape(1, -1)
        )
        s = self.stage
        if self.neon_uint8:
            return self._neon_requantize(acc.reshape(n, -1) + np.tile(offset, (1, oh * ow))).reshape(
                n, oh, ow, self.out_channels
            )
        out = np.empty(acc.shape, dtype=np.int8)
        gemm.requantize_products(
            acc, offset, s.multiplier, s.shift, s.real_scale, s.zero_point, s.lo, s.hi, self.profile, out
        )
        return out.reshape(n, oh, ow, self.out_channels)

    def _neon_requantize(self, acc) -> np.ndarray:
        """LiteRT's builtin uint8 TransposeConv's output stage (optimized_ops::Quantize), per image
        acc [N, H * W * O] (int64 with the bias): runs of 16 elements take the NEON form of
        xnnpack.neon_multiply (VQRDMULH then VRSHL, ties up), the last size % 16 TFLM's
        MultiplyByQuantizedMultiplier; each element at its channel's multiplier."""
        s = self.stage
        reps = acc.shape[1] // self.out_channels
        m = np.tile(np.broadcast_to(s.multiplier, (self.out_channels,)).astype(np.int64), reps)
        shift = np.tile(np.broadcast_to(s.shift, (self.out_channels,)).astype(np.int64), reps)
        acc = acc.astype(np.int64)
        runs = acc.shape[1] // 16 * 16
        left, right = np.maximum(shift[:runs], 0), np.maximum(-shift[:runs], 0)
        high = ((acc[:, :runs] << left) * m[:runs] * 2 + (1 << 31)) >> 32
        scaled = np.concatenate(
            [
                (high + ((1 << right) >> 1)) >> right,
                multiply_by_quantized_multiplier_array(acc[:, runs:], m[runs:], shift[runs:]),
            ],
            axis=1,
        )
        return np.clip(scaled + s.zero_point, s.lo, s.hi).astype(np.int8)

    def _one_tap_per_pixel(self, w, x, b):
        """Stride = filter size, no padding: output pixel (y * kh + fy, x * kw + fx) is tap (fy, fx)
        of input pixel (y, x) alone, so one pointwise convolution computes every tap of every pixel
        (its output channel (fy * kw + fx) * O + o), which is then interleaved: per input row, the
        kh blocks of kw * O bytes of each pixel go to kh output rows."""
        g, engine, stage, workspace, memo = self.pointwise
        if x.shape[1:] != (*self.in_hw, g.in_channels):  # the engines index by the planned shape
            raise self.error(
                f"input array has shape {list(x.shape)}, expected [N, {self.in_hw}, {g.in_channels}]"
            )

        def stacked():
            taps = self.kh * self.kw
            filters = np.ascontiguousarray(w.transpose(1, 2, 0, 3)).reshape(
                taps * self.out_channels, 1, 1, -1
            )
            return filters[None], None if b is None else np.tile(b.reshape(-1), taps)

        filters, bias = self.memo.get("pointwise", w, b, stacked)
        n, (h, wd), o = x.shape[0], self.in_hw, self.out_channels
        y = engine.convolve(
            g,
            x,
            filters,
            bias,
            self.inputs[2].zero_point,
            stage,
            mac_profile(self.profile),
            False,
            workspace,
            memo,
        )
        y = y.reshape(n, h, wd, self.kh, self.kw * o).transpose(0, 1, 3, 2, 4)
        out = aligned.empty((n, h, self.kh, wd, self.kw * o), np.int8)
        out[...] = y
        return out.reshape(n, *self.out_hw, o)
