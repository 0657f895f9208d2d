"""MAXIMUM and MINIMUM, int8 with broadcasting (TFLM micro/kernels/maximum_minimum.cc,
reference_ops::MaximumMinimumBroadcastSlow).

TFLM has no Prepare for these ops: it compares the raw int8 codes and ignores the quantization of
the operands and the output (a model whose operands differ in scale gets the raw maximum, as in
TFLM). The PyPI build broadcasts over any rank (6 tested). Eval is a lookup over the two input bytes
(pairwise.py).
"""

from __future__ import annotations

import numpy as np

from .float_form import Elementwise
from .pairwise import BinaryKernel, every_pair


class MaximumFloat(Elementwise):
    function = staticmethod(np.maximum)


class MinimumFloat(Elementwise):
    function = staticmethod(np.minimum)


class Maximum(BinaryKernel):
    kind = "MAXIMUM"
    float_form = MaximumFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        self.prepare_operands(quantized=False)
        xa, xb = every_pair()
        self.table = np.maximum(xa, xb).astype(np.int8)


class Minimum(BinaryKernel):
    kind = "MINIMUM"
    float_form = MinimumFloat

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        self.prepare_operands(quantized=False)
        xa, xb = every_pair()
        self.table = np.minimum(xa, xb).astype(np.int8)
