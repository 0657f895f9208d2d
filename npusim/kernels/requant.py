"""Prepare-time requantization parameters shared by CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import NpusimError
from ..graph import Tensor
from ..profiles import profile_of
from ..quant import TFLM, activation_range, quantize_multiplier, quantize_multipliers
from .output_stage import CHECKED_ROWS, checked_parameters
from .stages import DOUBLE_ROUNDING

# MultiplyByQuantizedMultiplier shifts left by `shift` and, with single rounding, right by 31 - shift
# (TFLM saturates that shift at 30): a real multiplier of 2^30 or more has no defined result.
MAX_SHIFT = 30


def requantization_multiplier(real: float) -> tuple[int, int]:
    """quantize_multiplier, refusing the multipliers whose shift no runtime defines."""
    m, shift = quantize_multiplier(real)
    if shift > MAX_SHIFT:
        raise NpusimError(
            f"requantization multiplier {real:g} is 2^{MAX_SHIFT} or more (scales out of proportion)"
        )
    return m, shift


def output_range(activation: str, y: Tensor, profile: int = TFLM) -> tuple[int, int]:
    """Clamp range of a fused activation on int8 output y, by the rule of the rounding profile's
    runtime (quant.activation_range). A scale so small that 6 / scale overflows float32 (TFLM would
    cast inf to int32, undefined behaviour) is refused."""
    try:
        return activation_range(activation, float(y.quant.scale[0]), y.zero_point, profile)
    except (OverflowError, ValueError):
        raise NpusimError(
            f"output {y.name!r}: scale {float(y.quant.scale[0]):g} "
            f"is too small for the fused activation {activation}"
        ) from None


@dataclass
class OutputStage:
    """Everything the output stage of a MAC op needs: per-channel (M, shift), the float32 scale of the
    xnnpack profile, the output zero point and the clamp range of the fused activation."""

    multiplier: np.ndarray  # int32 [C] (M < 2^31: the high multiply is then one 32x32 -> 64 bit product)
    shift: np.ndarray  # int64 [C]
    real_scale: np.ndarray  # float32 [C]
    zero_point: int
    lo: int
    hi: int
    profile: int = TFLM  # the rounding profile it was prepared for

    @functools.cached_property
    def checked(self) -> np.ndarray:
        """The rows of output_stage.tflm_checked (checked_parameters, about 0.4 ms a layer), once per
        stage (a ZO step rebuilds the output parameters of its grouped weights every call), and
        only for the tflm profile: zeros elsewhere, which the checked form would send to the
        integer one."""
        if profile_of(self.profile).stage != DOUBLE_ROUNDING:
            return np.zeros((CHECKED_ROWS, self.multiplier.size), np.int32)
        return checked_parameters(self)

    @classmethod
    def prepare(
        cls, x: Tensor, w: Tensor, y: Tensor, channels: int, activation: str, profile: int = TFLM
    ) -> "OutputStage":
        """profile: the rounding profile id (quant.PROFILES); it decides the clamp range, whose
        bounds XNNPACK rounds differently from TFLM (quant.activation_range)."""
        if w.quant.scale.size not in (1, channels):
            raise NpusimError(
                f"filter {w.name!r} has {w.quant.scale.size} scales, "
                f"expected 1 or one per output channel ({channels})"
            )
        w_scale = np.broadcast_to(w.quant.scale, (channels,))
        # TFLM: all multiplier arithmetic in double from the float32 scales of the file.
        real = np.float64(x.quant.scale[0]) * w_scale.astype(np.float64) / np.float64(y.quant.scale[0])
        m, shift = quantize_multipliers(real)
        if np.any(shift > MAX_SHIFT):
            raise NpusimError(
                f"requantization multiplier {float(real.max()):g} "
                f"is 2^{MAX_SHIFT} or more (scales out of proportion)"
            )
        # XNNPACK computes input_scale * kernel_scale / output_scale in float32 arithmetic.
        real32 = (np.float32(x.quant.scale[0]) * w_scale.astype(np.float32)) / np.float32(y.quant.scale[0])
        lo, hi = output_range(activation, y, profile)
        return cls(m.astype(np.int32), shift, real32.astype(np.float32), y.zero_point, lo, hi, profile)
