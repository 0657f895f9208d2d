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

from ..kernels.pair_tables import sub_table
from ..profiles import profile_of
from ..profiles import xnnpack as xnn
from .float_form import Elementwise
from .int16 import sub16
from .pairwise import BinaryKernel, every_pair


class SubFloat(Elementwise):
    function = staticmethod(np.subtract)


class Sub(BinaryKernel):
    kind = "SUB"
    float_form = SubFloat
    max_rank = 5  # BroadcastQuantSubSlow handles up to 5 dimensions

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        params = self.prepare_rescaled(sub16)  # None with int16 operands (int16.sub16)
        a, b, y = self.inputs[0], self.inputs[1], self.outputs[0]
        if params is not None and profile_of(profile).xnnpack_delegate and xnn.delegates_add(a, b, y):
            # XNNPACK subtracts with its ADD kernel, the second operand's scale negated
            self.table = xnn.add_table(a, b, y, True, self.activation)
        elif params is not None:
            xa, xb = every_pair()
            self.table = sub_table(xa, xb, tuple(np.int64(p) for p in params), np.int64(profile))
