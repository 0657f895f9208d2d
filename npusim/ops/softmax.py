"""SOFTMAX, int8 in -> int8 out (scale 1/256, zero point -128), over the last axis.

Prepare follows TFLM micro/kernels/softmax_common.cc (CalculateSoftmaxParams); Eval follows
reference_ops::Softmax<int8_t, int8_t> (kernels/internal/reference/softmax.h) with gemmlowp's
fixed-point exp_on_negative_values and one_over_one_plus_x_for_x_in_0_1 (fixedpoint/fixedpoint.h),
compiled in kernels/fixed_point.py.

Everything after the row maximum is a pure function of d = max - x in [0, 255], so prepare tabulates
exp(-d) once (in Q0.31 and in the Q12.19 accumulation format); eval only sums table entries, takes
the reciprocal and rescales. This is bit-identical to evaluating exp per element as TFLM does.

The xnnpack profile runs LiteRT's builtin int8 softmax instead, a float lookup table
(xnnpack.softmax): XNNPACK takes no int8 SOFTMAX.

int16 in and out (output scale 1/32768, zero point 0, tflm profile) takes TFLM's int16 path: exp and
1 / (1 + x) from interpolated lookup tables built as TFLM's Prepare builds them (int16.softmax16).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.fixed_point import SCALED_DIFF_INTEGER_BITS, build_exp_tables, softmax_rows
from ..kernels.int16 import is_int16, require_tflm
from ..profiles import profile_of, xnnpack
from ..quant import quantize_multiplier
from .base import Kernel
from .float_form import FloatForm, real
from .int16 import softmax16, softmax16_params


def preprocess_softmax_scaling(beta: float, input_scale: float, input_integer_bits: int) -> tuple[int, int]:
    """PreprocessSoftmaxScaling (quantization_util.cc, double-rounding build)."""
    real = min(float(beta) * float(input_scale) * float(1 << (31 - input_integer_bits)), float((1 << 31) - 1))
    return quantize_multiplier(real)


def calculate_input_radius(
    input_integer_bits: int, input_left_shift: int, total_signed_bits: int = 31
) -> int:
    """CalculateInputRadius: the largest |x - max| whose rescaled value still fits in int32."""
    max_input_rescaled = (
        1.0
        * ((1 << input_integer_bits) - 1)
        * float(1 << (total_signed_bits - input_integer_bits))
        / float(1 << input_left_shift)
    )
    return int(math.floor(max_input_rescaled))


class SoftmaxFloat(FloatForm):
    """exp(beta * (x - max)) / sum over the last axis (LiteRT reference_ops Softmax), in float64."""

    def __init__(self, op, graph):
        super().__init__(op, graph)
        self.beta = float(np.float32(op.options.get("beta", 1.0)))

    def __call__(self, x):
        x = real(x)
        z = x.astype(np.float64)
        e = np.exp(self.beta * (z - z.max(axis=-1, keepdims=True)))
        return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


class Softmax(Kernel):
    kind = "SOFTMAX"
    float_form = SoftmaxFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        inp, out = self.inputs[0], self.outputs[0]
        self.params16 = self.lut = None
        if is_int16(inp):
            require_tflm(self)
        else:
            self.require_int8(inp, out)
        if len(inp.shape) < 1:
            raise self.error(f"input {inp.name!r} is a scalar, expected at least one dimension")
        if tuple(out.shape) != tuple(inp.shape):
            raise self.error(
                f"output {out.name!r} has shape {list(out.shape)}, expected the input's {list(inp.shape)}"
            )
        self.depth = int(inp.shape[-1])
        if is_int16(inp):  # int16 in and out (int16.softmax16)
            beta = float(np.float32(op.options.get("beta", 1.0)))
            self.params16 = softmax16_params(self, inp, out, beta)
            return
        # TFLM: TF_LITE_ENSURE_EQ(zero_point, -128) and TF_LITE_ENSURE(scale == 1.f / 256), exact float32.
        if out.zero_point != -128 or np.float32(out.scale) != np.float32(1.0 / 256):
            raise self.error(
                f"output {out.name!r} has scale {out.scale:g} and zero point {out.zero_point}, "
                "expected scale 1/256 and zero point -128 (TFLM int8 softmax)"
            )
        beta = float(np.float32(op.options.get("beta", 1.0)))  # TfLiteSoftmaxParams.beta is a float
        # not delegated: LiteRT's builtin float-table softmax (xnnpack.softmax)
        if profile_of(profile).xnnpack_delegate:
            self.lut = xnnpack.softmax_table(inp.scale, beta)
            return
        input_scale = float(np.float32(inp.scale))
        real = beta * input_scale * float(1 << (31 - SCALED_DIFF_INTEGER_BITS))
        if not real > 1.0:
            # QuantizeMultiplierGreaterThanOne CHECK-fails in TFLM for these.
            raise self.error(
                f"beta {beta:g} * input scale {input_scale:g} is too small (beta*scale*2^26 must exceed 1)"
            )
        self.input_multiplier, self.input_left_shift = preprocess_softmax_scaling(
            beta, input_scale, SCALED_DIFF_INTEGER_BITS
        )
        self.diff_min = -calculate_input_radius(SCALED_DIFF_INTEGER_BITS, self.input_left_shift)
        self.exp_q0, self.exp_q12 = build_exp_tables(
            np.int64(self.input_multiplier), np.int64(self.input_left_shift), np.int64(self.diff_min)
        )
        self.depth = int(inp.shape[-1])

    def macs(self) -> int:
        return (
            int(np.prod(self.inputs[0].shape[1:], dtype=np.int64))
            if len(self.inputs[0].shape) > 1
            else self.depth
        )

    def __call__(self, x):
        x = np.asarray(x)
        if self.params16 is not None:
            if x.ndim < 1 or x.shape[-1] != self.depth:
                raise self.error(
                    f"input array has shape {list(x.shape)}, expected last dimension {self.depth}"
                )
            return softmax16(x, *self.params16)
        if x.dtype != np.int8:
            raise self.error(f"input array has type {x.dtype}, expected int8")
        if x.ndim < 1 or x.shape[-1] != self.depth:
            raise self.error(f"input array has shape {list(x.shape)}, expected last dimension {self.depth}")
        rows = np.ascontiguousarray(x.reshape(-1, self.depth))
        if self.lut is not None:
            return xnnpack.softmax(rows, self.lut, self.outputs[0].scale, -128).reshape(x.shape)
        out = np.empty(rows.shape, dtype=np.int8)
        bad = np.zeros(rows.shape[0], dtype=np.bool_)
        softmax_rows(rows, self.exp_q0, self.exp_q12, out, bad)
        if bad.any():
            raise self.error(
                f"sum of exponentials reached 512 ({int(bad.sum())} of {bad.size} rows, {self.depth} "
                "classes): TFLM aborts on such input (TFLITE_CHECK "
                "on the output exponent in reference softmax)"
            )
        return out.reshape(x.shape)
