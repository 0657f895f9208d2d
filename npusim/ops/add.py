"""ADD: int8 elementwise addition with TFLite broadcasting (TFLM reference_integer_ops/add.h).

Both inputs are brought to a common scale with 20 bits of headroom (left_shift = 20), added in
int32, then requantized to the output scale: three MultiplyByQuantizedMultiplier calls per element.
Eval runs these steps as vector code, 16 elements at a time (kernels/elementwise.add_run; generic
LLVM vector operations, built for any x86). A test runs all 65,536 input pairs through TFLM and npusim.
"""

from __future__ import annotations

import numpy as np

from ..kernels import aligned
from ..kernels.elementwise import add_vector
from ..kernels.requant import OutputStage, output_range
from ..profiles import onnxruntime as ort
from ..profiles import profile_of
from ..profiles import xnnpack as xnn
from .float_form import Elementwise
from .int16 import add16
from .pairwise import BinaryKernel


class Add(BinaryKernel):
    """The pairwise family's checks and multipliers (pairwise.py); eval in vector code, not a table
    (the onnxruntime profile: QLinearAdd's table, looked up as the family's other ops are)."""

    kind = "ADD"
    float_form = Elementwise

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        self.table = None
        if profile_of(profile).ort_qlinear:
            # QLinearAdd (onnxruntime.add_table) on the family's lookup, clamped to a fused
            # activation. ORT rescales in float32, so TFLM's output-multiplier limit (a CHECK in
            # QuantizeMultiplierSmallerThanOneExp, refused by rescale_multipliers) does not apply;
            # the family's operand checks do, and int8 operands only (ORT's 16-bit QDQ is not modelled).
            a, b, y = self.prepare_operands()
            lo, hi = output_range(op.options.get("fused_activation_function", "NONE"), y, profile)
            self.table = np.clip(ort.add_table(a, b, y), lo, hi).astype(np.int8)
            return
        self.params = self.prepare_rescaled(add16)  # None with int16 operands (int16.add16)
        if self.params is None:
            return
        a, b, y = self.inputs[0], self.inputs[1], self.outputs[0]
        if self.params[3] > 0 or self.params[5] > 0:  # add_run's shifted_high_mul takes no left shift
            raise self.error(f"input rescale shifts {self.params[3]}, {self.params[5]}: expected at most 0")
        # XNNPACK's qs8-vadd, as a table
        if profile_of(profile).xnnpack_delegate and xnn.delegates_add(a, b, y):
            self.table = xnn.add_table(a, b, y, False, self.activation)
        m_out, s_out, z_out, lo, hi = self.params[6:11]
        ones = np.ones(1, np.float32)
        # (add_run takes the tflm output stage for every profile but single, whose rows are unused)
        stage = OutputStage(
            np.array([m_out], np.int32),
            np.array([s_out]),
            ones,
            z_out,
            lo,
            hi,
            profile=profile_of(profile).integer_stage,
        )
        self.vector_params = np.array([*self.params, *stage.checked[:, 0]], np.int64)

    def eval_int8(self, a, b):
        if self.table is not None:  # onnxruntime, or XNNPACK's ADD: the pairwise table lookup
            return super().eval_int8(a, b)
        stage = np.int64(profile_of(self.profile).integer_stage)  # what add_run's each_stage switches on
        return add_vector(a, b, self.vector_params, stage, aligned.empty(a.shape, np.int8))
