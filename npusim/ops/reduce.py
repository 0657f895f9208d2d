"""SUM and REDUCE_MAX, int8 over the axes given by the constant int32 second input (TFLM
micro/kernels/reduce_common.cc EvalSumHelper / EvalMaxHelper). Axis resolution, keep_dims and the
declared output shape are MEAN's (mean.py).

SUM: reference_ops::QuantizedMeanOrSum with compute_sum true: as MEAN but without the 1/n folded
into the multiplier: y = clamp(MultiplyByQuantizedMultiplier(int32(sum - zp_in * n), M, e) + zp_out)
with (M, e) = QuantizeMultiplier(double(s_in) / double(s_out)).

REDUCE_MAX: TFLM requires the output's scale and zero point to equal the input's and takes the
maximum of the raw codes (ReduceGeneric, initial value -128).
"""

from __future__ import annotations

import numpy as np

from ..kernels.requant import requantization_multiplier
from .mean import Mean, MeanFloat


class SumFloat(MeanFloat):
    reduce = staticmethod(np.sum)


class ReduceMaxFloat(MeanFloat):
    reduce = staticmethod(np.max)


class Sum(Mean):
    kind = "SUM"
    float_form = SumFloat
    is_mean = False

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        inp, out = self.inputs[0], self.outputs[0]
        self.multiplier, self.shift = requantization_multiplier(
            float(np.float32(inp.scale)) / float(np.float32(out.scale))
        )


class ReduceMax(Mean):
    kind = "REDUCE_MAX"
    float_form = ReduceMaxFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        inp, out = self.inputs[0], self.outputs[0]
        if (float(inp.scale), inp.zero_point) != (float(out.scale), out.zero_point):
            raise self.error(
                f"output quantization ({float(out.scale):g}, {out.zero_point}) differs from the input's "
                f"({float(inp.scale):g}, {inp.zero_point}); TFLM requires them equal"
            )

    def workspace_bytes(self, n: int) -> int:
        return 0

    def __call__(self, x, axes=None):
        x = np.asarray(x)
        if x.dtype != np.int8 or x.shape[1:] != self.in_shape[1:]:
            raise self.error(
                f"input array {x.dtype} {list(x.shape)}, expected int8 [N, {list(self.in_shape[1:])}]"
            )
        return self.shaped(np.ascontiguousarray(x.max(axis=self.axes)), x)
