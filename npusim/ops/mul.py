"""MUL: int8 elementwise multiplication with broadcasting (TFLM micro/kernels/mul_common.cc,
reference_integer_ops::Mul / BroadcastMul4DSlow).

y = clamp(z_out + MBQM((x1 - z1) * (x2 - z2), M, shift), act range), with (M, shift) =
QuantizeMultiplier(double(s1) * double(s2) / double(s_out)). Eval is a lookup over the two input
bytes (pairwise.py).
"""

from __future__ import annotations

import numpy as np

from ..kernels.int16 import is_int16, range16
from ..kernels.pair_tables import mul_table
from ..kernels.requant import output_range, requantization_multiplier
from ..profiles import onnxruntime as ort
from ..profiles import profile_of
from ..profiles import xnnpack as xnn
from ..quant import TFLM
from .float_form import Elementwise
from .int16 import mul16
from .pairwise import BinaryKernel, every_pair


class MulFloat(Elementwise):
    function = staticmethod(np.multiply)


class Mul(BinaryKernel):
    kind = "MUL"
    float_form = MulFloat
    max_rank = 4  # BroadcastMul4DSlow

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        a, b, y = self.prepare_operands(int16=True)
        s1, s2, so = (np.float64(t.quant.scale[0]) for t in (a, b, y))
        m, shift = requantization_multiplier(s1 * s2 / so)
        if is_int16(a):  # int16 operands and output (int16.mul16)
            params = (m, shift, *range16(self, op.options.get("fused_activation_function", "NONE"), y))
            self.int16 = lambda a, b: mul16(a, b, params)
            return
        # The xnnpack profile: float32 product and scale, round half to even (rounding.requantize_one).
        real32 = np.float32(np.float32(s1) * np.float32(s2) / np.float32(so))
        if profile_of(profile).xnnpack_delegate and not xnn.delegates_mul(real32):
            profile = TFLM  # the delegate refuses it: LiteRT's builtin MUL, TFLM's arithmetic
        lo, hi = output_range(op.options.get("fused_activation_function", "NONE"), y, profile)
        # QLinearMul (onnxruntime.mul_table), clamped to a fused activation
        if profile_of(profile).ort_qlinear:
            self.table = np.clip(ort.mul_table(a, b, y), lo, hi).astype(np.int8)
            return
        xa, xb = every_pair()
        self.table = mul_table(
            xa, xb, a.zero_point, b.zero_point, m, shift, real32, profile, y.zero_point, lo, hi
        )
