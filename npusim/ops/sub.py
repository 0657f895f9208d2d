"""SUB: int8 elementwise subtraction with broadcasting (TFLM micro/kernels/sub_common.cc,
reference_ops::SubElementwise / BroadcastQuantSubSlow).

The rescale scheme of ADD (left_shift 20, both inputs to twice the larger scale, then to the output
scale) with QuantizeMultiplierSmallerThanOneExp. The multipliers are computed in double from the
float32 scales, as for ADD: the tflite-micro build on PyPI matches that and not the float32
arithmetic of some sub_common.cc versions (tests/test_ops_elementwise.py has scales where the two
differ). Eval is a lookup over the two input bytes (pairwise.py). int16 operands and output (symmetric,
tflm profile) take TFLM's int16 path: left_shift 15, the rest as above (int16.sub16).
"""

from __future__ import annotations

import numpy as np

from ..engines.int16 import is_int16, range16
from ..engines.requant import output_range
from ..jit import njit
from ..quant import (
    SINGLE,
    clamp,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_single,
)
from .float_form import Elementwise
from .int16 import sub16
from .pairwise import LEFT_SHIFT, BinaryKernel, every_pair


@njit(inline="always")
def _rescale(x, m, shift, profile):
    if profile == SINGLE:
        return multiply_by_quantized_multiplier_single(x, m, shift)
    return multiply_by_quantized_multiplier(x, m, shift)


@njit()
def sub_table(a, b, params, profile):
    """All pairs; the xnnpack profile subtracts as TFLM does (as ADD)."""
    z1, z2, m1, s1, m2, s2, mo, so, zo, lo, hi = params
    out = np.empty(a.size, dtype=np.int8)
    for i in range(a.size):
        x1 = _rescale((a[i] - z1) << LEFT_SHIFT, m1, s1, profile)
        x2 = _rescale((b[i] - z2) << LEFT_SHIFT, m2, s2, profile)
        out[i] = clamp(_rescale(x1 - x2, mo, so, profile) + zo, lo, hi)
    return out


class SubFloat(Elementwise):
    function = staticmethod(np.subtract)


class Sub(BinaryKernel):
    kind = "SUB"
    float_form = SubFloat
    max_rank = 5  # BroadcastQuantSubSlow handles up to 5 dimensions

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        a, b, y = self.prepare_operands(int16=True)
        params = self.rescale_multipliers(a, b, y)
        activation = op.options.get("fused_activation_function", "NONE")
        if is_int16(a):  # int16 operands and output (int16.sub16)
            params16 = (*params, *range16(self, activation, y))
            self.int16 = lambda a, b: sub16(a, b, params16)
            return
        params = (a.zero_point, b.zero_point, *params, y.zero_point)
        params += output_range(activation, y)
        xa, xb = every_pair()
        self.table = sub_table(xa, xb, tuple(np.int64(p) for p in params), np.int64(profile))
