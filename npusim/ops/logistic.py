"""LOGISTIC, int8 in -> int8 out (zero point -128), TFLM micro/kernels/logistic_common.cc (Prepare)
and reference_integer_ops::Logistic (kernels/internal/reference/integer_ops/logistic.h).

TFLM's int8 path is not a lookup table: the input is rescaled to Q4.27 with (input_multiplier,
input_left_shift), gemmlowp's fixed-point logistic gives a Q0.31 result, and a rounding shift by 23
brings it to the output with zero point -128 (the output scale is taken to be 1/256; TFLM does not
check it). Inputs at or beyond input_range_radius from the zero point saturate to -128 / 127.
The result depends only on the input byte: prepare runs TFLM's arithmetic on all 256 codes and eval
is a table lookup. int16 in and out (zero point 0, output scale 2^-15, tflm profile) takes TFLM's
int16 path instead, an interpolation in a sigmoid table (int16.logistic16).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.fixed_point import Q4_INTEGER_BITS as INPUT_INTEGER_BITS  # Q4.27 input
from ..kernels.fixed_point import fixed_point_logistic_q4, q4_activation_table
from ..kernels.int16 import is_int16
from ..profiles import onnxruntime as ort
from ..profiles import profile_of, xnnpack
from .float_form import Unary
from .int16 import logistic16, logistic16_params
from .softmax import calculate_input_radius
from .unary import UnaryTableKernel

OUTPUT_INTEGER_BITS = 8


class LogisticFloat(Unary):
    def function(self, x):
        return 1.0 / (1.0 + np.exp(-x))


class Logistic(UnaryTableKernel):
    kind = "LOGISTIC"
    float_form = LogisticFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.prepare_operands(int16=True)
        if is_int16(x):  # int16 in and out (int16.logistic16)
            multiplier, shift = logistic16_params(self, x, y)
            self.int16 = lambda v: logistic16(v, multiplier, shift)
            return
        # QLinearSigmoid and ORT's float Sigmoid (onnxruntime.sigmoid_table)
        if profile_of(profile).ort_qlinear:
            self.table = ort.sigmoid_table(x.scale, x.zero_point, y.scale, y.zero_point)
            return
        if profile_of(profile).xnnpack_delegate:  # XNNPACK's float lookup table (xnnpack.lut_table)
            self.table = xnnpack.lut_table(xnnpack.sigmoid, x.scale, x.zero_point, y.scale, y.zero_point)
            return
        if y.zero_point != -128:  # TF_LITE_ENSURE_EQ in TFLM's Prepare
            raise self.error(
                f"output {y.name!r} has zero point {y.zero_point}, expected -128 (TFLM int8 logistic)"
            )
        # input_real_multiplier = double(scale) * 2^27; frexp and TfLiteRound(q * 2^31) (exact for a
        # float32 scale: q has 24 significant bits).
        q, left_shift = math.frexp(float(np.float32(x.scale)) * float(1 << (31 - INPUT_INTEGER_BITS)))
        if left_shift < 0:
            raise self.error(f"input {x.name!r} has scale {x.scale:g}, expected at least 2^-28")
        multiplier = int(math.floor(q * 2.0**31 + 0.5))
        radius = calculate_input_radius(INPUT_INTEGER_BITS, left_shift)
        self.table = q4_activation_table(
            x.zero_point,
            radius,
            multiplier,
            left_shift,
            fixed_point_logistic_q4,
            31 - OUTPUT_INTEGER_BITS,
            -128,
        )
