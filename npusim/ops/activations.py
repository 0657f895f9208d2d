"""TANH, HARD_SWISH and LEAKY_RELU, int8 in -> int8 out, as 256-entry tables.

Each op's int8 output is a function of the input byte alone: prepare runs TFLM's exact integer
arithmetic on all 256 codes and eval is a table lookup (bit-identical to TFLM's per-element loop).

TANH: micro/kernels/tanh.cc (CalculateArithmeticOpData) and reference_integer_ops::Tanh: the input
is rescaled to Q4.27 as for LOGISTIC, gemmlowp's fixed-point tanh gives Q0.31, and a rounding shift
by 24 brings it to the output scale 1/128, zero point 0. TFLM checks neither the output scale nor
the output zero point: the output bytes are the same whatever they are, and npusim follows it.

HARD_SWISH: micro/kernels/hard_swish_common.cc (HardSwishPrepare) and reference_ops::HardSwish:
int16 fixed point with float32 scale ratios, multipliers downscaled to 16 bits, gemmlowp's int16
SaturatingRoundingDoublingHighMul and RoundingDivideByPOT (whose mask is cast to int16: a shift of
16 or more rounds every non-negative value to 1 and every negative one to -1), and a truncating
doubling high multiply for the final product.

LEAKY_RELU: micro/kernels/leaky_relu_common.cc and reference_ops::QuantizeLeakyRelu: two
multipliers, scale_in / scale_out and scale_in * alpha / scale_out, both computed in float32 (alpha
may be negative or above 1), MultiplyByQuantizedMultiplier, output zero point, clamp. With a
negative alpha the PyPI build does not round as MultiplyByQuantizedMultiplier(x, M < 0, s) would
(ties of the positive product go up there): it matches -MultiplyByQuantizedMultiplier(x, -M, s),
ties toward zero, on every code of 400 random scale / zero point / alpha sets (equally, the
multiplier M + 1 in gemmlowp's formula; no case was found where the two differ). npusim computes
the former; tests/test_ops_activations.py checks it on every code.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.elementwise import leaky_relu_table
from ..kernels.fixed_point import Q4_INTEGER_BITS as INPUT_INTEGER_BITS  # Q4.27 input to the tanh
from ..kernels.fixed_point import fixed_point_tanh_q4, q4_activation_table
from ..kernels.requant import requantization_multiplier
from ..profiles import onnxruntime as ort
from ..profiles import profile_of, xnnpack
from ..quant import INT32_MAX, TFLM, quantize_multiplier, trunc_div, wrap16
from .float_form import Unary
from .softmax import calculate_input_radius
from .unary import UnaryTableKernel

TANH_OUTPUT_SCALE_BITS = 7  # output scale 2^-7

EVERY_CODE = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int64)  # index: the byte as uint8


# ----------------------------------------------------------------------------------------------
# TANH
# ----------------------------------------------------------------------------------------------


class TanhFloat(Unary):
    def function(self, x):
        return np.tanh(x)


class HardSwishFloat(Unary):
    """x * relu6(x + 3) / 6 (LiteRT reference_ops HardSwish)."""

    def function(self, x):
        return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


class LeakyReluFloat(Unary):
    def __init__(self, op, graph):
        super().__init__(op, graph)
        self.alpha = float(np.float32(op.options.get("alpha", 0.0)))

    def function(self, x):
        return np.where(x >= 0, x, self.alpha * x)


class Tanh(UnaryTableKernel):
    kind = "TANH"
    float_form = TanhFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.prepare_operands()
        # XNNPACK's float lookup table, which honours the output scale
        if profile_of(profile).xnnpack_delegate:
            self.table = xnnpack.lut_table(np.tanh, x.scale, x.zero_point, y.scale, y.zero_point)
            return
        # As LOGISTIC: double(scale) * 2^27, frexp, TfLiteRound(q * 2^31).
        q, left_shift = math.frexp(float(np.float32(x.scale)) * float(1 << (31 - INPUT_INTEGER_BITS)))
        if left_shift < 0:
            raise self.error(f"input {x.name!r} has scale {x.scale:g}, expected at least 2^-28")
        multiplier = int(math.floor(q * 2.0**31 + 0.5))
        radius = calculate_input_radius(INPUT_INTEGER_BITS, left_shift)
        self.table = q4_activation_table(
            x.zero_point, radius, multiplier, left_shift, fixed_point_tanh_q4, 31 - TANH_OUTPUT_SCALE_BITS, 0
        )


# ----------------------------------------------------------------------------------------------
# HARD_SWISH (int16 fixed point, vectorized over the 256 codes)
# ----------------------------------------------------------------------------------------------

I16_MIN, I16_MAX = -(1 << 15), (1 << 15) - 1


def srdhm16(a, b):
    """gemmlowp SaturatingRoundingDoublingHighMul on int16."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = wrap16(trunc_div(ab + nudge, 1 << 15))
    return np.where((a == I16_MIN) & (b == I16_MIN), I16_MAX, q)


def sdhm16(a, b):
    """reference_ops::SaturatingDoublingHighMul: as srdhm16 but truncating toward zero."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    q = wrap16(trunc_div(a * b, 1 << 15))
    return np.where((a == I16_MIN) & (b == I16_MIN), I16_MAX, q)


def rdbpot16(x, exponent: int):
    """gemmlowp RoundingDivideByPOT on int16, mask Dup<int16>((1 << exponent) - 1) included."""
    x = np.asarray(x, np.int64)
    mask = int(wrap16((1 << exponent) - 1))
    threshold = (mask >> 1) + (x < 0).astype(np.int64)
    return wrap16((x >> exponent) + ((x & mask) > threshold).astype(np.int64))


def saturating_left_shift16(x, amount: int):
    return np.clip(np.asarray(x, np.int64) << amount, I16_MIN, I16_MAX)


def downscale_multiplier16(m: int) -> int:
    """DownScaleInt32ToInt16Multiplier."""
    if m >= INT32_MAX - (1 << 15):
        return I16_MAX
    return (m + (1 << 15)) >> 16


def hard_swish_table(x_zp: int, y_zp: int, out_m: int, out_exp: int, rel_m: int, rel_exp: int) -> np.ndarray:
    v = EVERY_CODE - x_zp
    hires = wrap16(v * 128)
    preshift = srdhm16(hires, out_m)
    r = hires
    if rel_exp > 0:
        r = saturating_left_shift16(r, rel_exp - 1)
    r = srdhm16(r, rel_m)
    if rel_exp > 0:
        r = saturating_left_shift16(r, 1)
    if rel_exp < 0:
        r = rdbpot16(r, -rel_exp)
    r = (r + (1 << 15)) >> 1
    out = wrap16(rdbpot16(sdhm16(r, preshift), -out_exp) + y_zp)
    return np.clip(out, -128, 127).astype(np.int8)


class HardSwish(UnaryTableKernel):
    kind = "HARD_SWISH"
    float_form = HardSwishFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.prepare_operands()
        f32 = np.float32
        with np.errstate(over="ignore", under="ignore"):
            hires_input_scale = f32(1.0 / 128.0) * f32(x.scale)
            reluish_scale = f32(3.0) / f32(32768.0)
            real_out = hires_input_scale / f32(y.scale)
            real_reluish = hires_input_scale / reluish_scale
        if not (np.isfinite(real_out) and np.isfinite(real_reluish)):
            raise self.error(
                f"scales {x.scale:g} and {y.scale:g} give a multiplier that is not finite in float32"
            )
        out_m, out_exp = quantize_multiplier(float(real_out))
        rel_m, rel_exp = quantize_multiplier(float(real_reluish))
        if out_exp > 0:  # TF_LITE_ENSURE(output_multiplier_exponent <= 0)
            raise self.error(
                f"input scale {x.scale:g} / 128 over output scale {y.scale:g} is 1 or more "
                "(TFLM refuses HARD_SWISH with an output multiplier exponent above 0)"
            )
        if rel_exp > 16:  # the left shifts would run past int64 in no real model
            raise self.error(f"input scale {x.scale:g} is too large for TFLM's int16 HARD_SWISH")
        self.table = hard_swish_table(
            x.zero_point,
            y.zero_point,
            downscale_multiplier16(out_m),
            out_exp,
            downscale_multiplier16(rel_m),
            rel_exp,
        )


# ----------------------------------------------------------------------------------------------
# LEAKY_RELU
# ----------------------------------------------------------------------------------------------


class LeakyRelu(UnaryTableKernel):
    kind = "LEAKY_RELU"
    float_form = LeakyReluFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.prepare_operands()
        alpha = op.options.get("alpha", 0.0)
        if profile_of(profile).ort_qlinear:  # QLinearLeakyRelu and ORT's float LeakyRelu
            self.table = ort.leaky_relu_table(x.scale, x.zero_point, y.scale, y.zero_point, alpha)
            return
        if profile_of(profile).xnnpack_delegate:
            if xnnpack.leaky_relu_delegated(x.scale, y.scale, alpha):
                self.table = xnnpack.leaky_relu_table(x.scale, x.zero_point, y.scale, y.zero_point, alpha)
                return
            profile = TFLM  # XNNPACK refuses these scales: LiteRT's builtin kernel, TFLM's arithmetic
        f32 = np.float32
        # float32 arithmetic, as TFLM writes it (scale * alpha / scale on floats)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            real_alpha = f32(f32(x.scale) * f32(alpha) / f32(y.scale))
            real_id = f32(f32(x.scale) / f32(y.scale))
        if not (np.isfinite(real_alpha) and np.isfinite(real_id)):
            raise self.error(f"alpha {alpha:g} and the scales give a multiplier that is not finite")
        m_alpha, s_alpha = requantization_multiplier(float(real_alpha))
        m_id, s_id = requantization_multiplier(float(real_id))
        i64 = np.int64
        self.table = leaky_relu_table(
            i64(x.zero_point),
            i64(y.zero_point),
            i64(m_id),
            i64(s_id),
            real_id,
            i64(m_alpha),
            i64(s_alpha),
            real_alpha,
            i64(profile_of(profile).stage),
        )
