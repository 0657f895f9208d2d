"""PRELU, int8 input and int8 alpha (a tensor, usually a constant [1, 1, C]) with broadcasting
(TFLM micro/kernels/prelu_common.cc CalculatePreluParams, reference_ops::BroadcastPrelu4DSlow,
which in the PyPI build broadcasts over any rank through ForEachBroadcastedElement: rank 5 and 6 tested).

x' = x - z_x; y = z_y + MBQM(x', M1, s1) when x' >= 0, else z_y + MBQM(x' * (alpha - z_a), M2, s2),
clamped to int8; (M1, s1) = QuantizeMultiplier(double(s_x) / double(s_y)) and
(M2, s2) = QuantizeMultiplier(double(s_x) * double(s_a) / double(s_y)). Eval is a lookup over the
(input, alpha) byte pair (pairwise.py).

The xnnpack profile runs TFLM's arithmetic: LiteRT's XNNPACK delegate takes no int8 PRELU (measured
with ai-edge-litert 2.3.0: constant and variable alpha, per-channel and full-shape), and LiteRT's
builtin int8 PRELU equals TFLM's on every case tried (tests/test_xnnpack_ops.py).
"""

from __future__ import annotations

import numpy as np

from ..kernels.pair_tables import prelu_table
from ..kernels.requant import requantization_multiplier
from ..profiles import DOUBLE_ROUNDING, profile_of
from .float_form import Elementwise
from .pairwise import BinaryKernel, every_pair


class PreluFloat(Elementwise):
    """x where x >= 0, else alpha * x (alpha broadcast to x, as LiteRT's BroadcastPrelu)."""

    @staticmethod
    def function(x, alpha):
        return np.where(x >= 0, x, alpha * x)


class Prelu(BinaryKernel):
    kind = "PRELU"
    float_form = PreluFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, alpha, y = self.prepare_operands()
        sx, sa, sy = (np.float64(t.quant.scale[0]) for t in (x, alpha, y))
        m1, s1 = requantization_multiplier(float(sx / sy))
        m2, s2 = requantization_multiplier(float(sx * sa / sy))
        f32 = np.float32
        with np.errstate(over="ignore", under="ignore"):  # float32 scales (read by no profile here)
            r1, r2 = f32(f32(sx) / f32(sy)), f32(f32(sx) * f32(sa) / f32(sy))
        xa, xb = every_pair()
        i64 = np.int64
        self.table = prelu_table(
            xa,
            xb,
            i64(x.zero_point),
            i64(alpha.zero_point),
            i64(y.zero_point),
            i64(m1),
            i64(s1),
            r1,
            i64(m2),
            i64(s2),
            r2,
            i64(DOUBLE_ROUNDING if profile_of(profile).xnnpack_delegate else profile_of(profile).stage),
        )
