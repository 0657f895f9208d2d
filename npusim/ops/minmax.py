"""MAXIMUM and MINIMUM, int8 with broadcasting (TFLM micro/kernels/maximum_minimum.cc,
reference_ops::MaximumMinimumBroadcastSlow).

TFLM has no Prepare for these ops: it compares the raw int8 codes and ignores the quantization of
the operands and the output (a model whose operands differ in scale gets the raw maximum, as in
TFLM). The PyPI build broadcasts over any rank (6 tested). Eval is a lookup over the two input bytes
(pairwise.py).
"""

from __future__ import annotations

import numpy as np

from .pairwise import BinaryKernel, every_pair


class Maximum(BinaryKernel):
    kind = "MAXIMUM"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        self.prepare_operands(quantized=False)
        xa, xb = every_pair()
        self.table = np.maximum(xa, xb).astype(np.int8)


class Minimum(BinaryKernel):
    kind = "MINIMUM"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        self.prepare_operands(quantized=False)
        xa, xb = every_pair()
        self.table = np.minimum(xa, xb).astype(np.int8)
