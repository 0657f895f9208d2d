"""Fixed-point requantization at prepare time: multipliers (quantization_util.cc), activation
ranges, the profile lookup; with the compiled rounding of the kernels (kernels/rounding.py: the one
place where rounding is decided) re-exported.

Semantics follow TFLM (tensorflow/lite/kernels/internal/common.h and quantization_util.cc);
the other profiles are the roundings other real runtimes use (see docs in README).
"""

from __future__ import annotations

import math

import numpy as np

from .errors import NpusimError
from .kernels.rounding import (  # noqa: F401 - re-exported: the compiled rounding lives in kernels/
    INT32_MAX,
    INT32_MIN,
    clamp,
    mbqm_array,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_array,
    multiply_by_quantized_multiplier_single,
    requantize_one,
    requantize_to_output,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
    wrap32,
    wrap32_jit,
)
from .profiles import (  # noqa: F401 - re-exported
    DOUBLE_ROUNDING,
    NEURAL_ART,
    ONNXRUNTIME,
    PROFILES,
    SINGLE,
    SINGLE_ROUNDING,
    TFLM,
    XNNPACK,
    Profile,
    profile_of,
)


def profile_id(name: str) -> Profile:
    if name not in PROFILES:
        raise NpusimError(
            f"--profile: unknown rounding profile {name!r}, expected one of {', '.join(PROFILES)}"
        )
    return PROFILES[name]


def mac_profile(profile: int) -> int:
    """The output stage the MAC engines run for a profile. ONNX Runtime's integer kernels
    (QLinearConv, QLinearMatMul, QGemm) requantize with MlasRequantizeOutput (mlas/lib/quantize.cpp):
    float32(acc) * float32(x_scale * w_scale / y_scale), clamped in float to [qmin - zp, qmax - zp],
    rounded half to even (cvtps2dq), + zp. With integer clamp bounds, clamping before or after the
    rounding is the same, so that is XNNPACK's fp32 output stage, which the engines already emit."""
    return profile_of(profile).stage


def quantize_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier: real ~= M * 2^(shift - 31), M in [2^30, 2^31)."""
    if real == 0.0:
        return 0, 0
    if not math.isfinite(real):  # frexp would hand int() an infinity: a scale or option out of range
        raise NpusimError(f"real multiplier {real} is not finite, expected finite scales and options")
    q, shift = math.frexp(real)
    m = int(math.floor(abs(q) * 2.0**31 + 0.5)) * (1 if q >= 0 else -1)  # TfLiteRound: half away from zero
    if m == 2**31:
        m //= 2
        shift += 1
    if shift < -31:
        m, shift = 0, 0
    return m, shift


def quantize_multipliers(reals) -> tuple[np.ndarray, np.ndarray]:
    pairs = [quantize_multiplier(float(r)) for r in np.asarray(reals, dtype=np.float64).ravel()]
    return (np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64))


def round_half_away(x: float) -> int:
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def activation_range(
    activation: str, scale: float, zero_point: int, profile: int = TFLM, qmin: int = -128, qmax: int = 127
) -> tuple[int, int]:
    """Clamp range of a fused activation on an int8 output (int16: qmin, qmax = -32768, 32767), as
    the profile's runtime computes it.

    TFLM and single rounding: CalculateActivationRangeQuantized, zero_point + round_half_away(f / scale).
    XNNPACK: the LiteRT delegate passes the real bounds (0, 6, -1, 1) and XNNPACK quantizes them
    with xnn_qs8_quantize, lrintf(clamp(f / scale + (float) zero_point, -128, 127)): the zero point
    is added in float32 before rounding, and rounding is half to even. The two differ on ties, e.g.
    6 / scale = 1.5 with zero point 1: TFLM 1 + 2 = 3, XNNPACK rint(2.5) = 2.
    ONNX Runtime: its integer kernels have no fused activation; a Relu or Clip that the importer
    fuses is the float op then QuantizeLinear, so a bound is zero_point + rint(f / scale) (a float32
    division, MLAS QuantizeLinear), saturated.
    """
    lo, hi = qmin, qmax
    bounds = profile_of(profile).bounds

    # TFLM divides in float32 (f / scale with both float); in double a quotient can land on the
    # other side of .5 and move the RELU6 bound by one.
    def quantize(f: float) -> int:
        q = np.float32(f) / np.float32(scale)
        if bounds == "rint-float-zp":
            v = np.float32(q + np.float32(zero_point))
            if not np.isfinite(v):  # refused as for TFLM (see kernels/requant.output_range)
                raise OverflowError(f"{f} / {scale} is not finite in float32")
            return int(np.rint(min(max(v, np.float32(qmin)), np.float32(qmax))))
        if bounds == "rint-then-zp":
            if not np.isfinite(q):
                raise OverflowError(f"{f} / {scale} is not finite in float32")
            return int(min(max(np.rint(q) + zero_point, qmin), qmax))
        return zero_point + round_half_away(float(q))

    if activation == "RELU":
        lo = max(lo, zero_point)
    elif activation == "RELU6":
        lo = max(lo, zero_point)
        hi = min(hi, quantize(6.0))
    elif activation == "RELU_N1_TO_1":
        lo = max(lo, quantize(-1.0))
        hi = min(hi, quantize(1.0))
    elif activation != "NONE":
        raise NpusimError(
            f"fused activation {activation} is not supported, expected NONE, RELU, RELU6 or RELU_N1_TO_1"
        )
    return lo, hi


def wrap16(v):
    """int64 value(s) -> their int16 two's-complement value, as int64: C++'s wrapping int16
    arithmetic (gemmlowp's int16 fixed point, TFLM's int16 LUTLookup)."""
    return ((v + (1 << 15)) & 0xFFFF) - (1 << 15)


def trunc_div(v: np.ndarray, d: int) -> np.ndarray:
    """C++ integer division (toward zero) of int64 values by a positive d."""
    return np.where(v >= 0, v // d, -((-v) // d))


def multiply_by_quantized_multiplier_int64(x: np.ndarray, m, shift) -> np.ndarray:
    """TFLM's MultiplyByQuantizedMultiplier(int64_t x, int32_t M, int shift), the overload of the
    16x8 kernels' int64 accumulators (common.cc), elementwise; M and shift broadcast against x.

    M is first reduced to 16 bits, (M + 2^15) >> 16 (0x7FFF from M >= 0x7FFF0000 on), then one
    rounding: (x * M16 + 2^(total - 1)) >> total with total = 15 - shift, ties toward +inf. The
    result is cast to int32 as C does (TFLM assumes |x| < 2^47; larger products wrap in int64)."""
    x = np.asarray(x, dtype=np.int64)
    m = np.asarray(m, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - shift
    with np.errstate(over="ignore"):
        v = (x * reduced + (np.int64(1) << (total - 1))) >> total
    return v.astype(np.int32).astype(np.int64)
