"""Prepare-time requantization parameters shared by CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Tensor
from ..quant import activation_range, quantize_multipliers


@dataclass
class OutputStage:
    """Everything the output stage of a MAC op needs: per-channel (M, shift), the float32 scale of the
    xnnpack profile, the output zero point and the clamp range of the fused activation."""

    multiplier: np.ndarray  # int64 [C]
    shift: np.ndarray  # int64 [C]
    real_scale: np.ndarray  # float32 [C]
    zero_point: int
    lo: int
    hi: int

    @classmethod
    def prepare(cls, x: Tensor, w: Tensor, y: Tensor, channels: int, activation: str) -> "OutputStage":
        w_scale = np.broadcast_to(w.quant.scale, (channels,))
        # TFLM: all multiplier arithmetic in double from the float32 scales of the file.
        real = np.float64(x.quant.scale[0]) * w_scale.astype(np.float64) / np.float64(y.quant.scale[0])
        m, shift = quantize_multipliers(real)
        # XNNPACK computes input_scale * kernel_scale / output_scale in float32 arithmetic.
        real32 = (np.float32(x.quant.scale[0]) * w_scale.astype(np.float32)) / np.float32(y.quant.scale[0])
        lo, hi = activation_range(activation, float(y.quant.scale[0]), y.zero_point)
        return cls(m, shift, real32.astype(np.float32), y.zero_point, lo, hi)
