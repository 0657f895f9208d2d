"""PACK: N tensors of one shape stacked along a new axis (TFLM micro/kernels/pack.cc). Data
movement; int8 inputs must share the output's quantization (TFLM copies the bytes)."""

from __future__ import annotations

import numpy as np

from .base import Kernel
from .float_form import MovementForm
from .movement import _same_dtype


class Pack(Kernel):
    kind = "PACK"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 1, None, None

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        y = self.outputs[0]
        _same_dtype(self)
        shape = tuple(self.inputs[0].shape)
        n = int(op.options.get("values_count", len(self.inputs)))
        if n != len(self.inputs):
            raise self.error(f"values_count {n} differs from the {len(self.inputs)} inputs")
        rank = len(shape) + 1
        axis = int(op.options.get("axis", 0))
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for an output of rank {rank}")
        self.axis = axis % rank
        if self.axis == 0:
            self.crosses_batch = "packs along axis 0"
        for t in self.inputs:
            if tuple(t.shape) != shape:
                raise self.error(f"input {t.name!r} has shape {list(t.shape)}, expected {list(shape)}")
            if (
                t.quant is not None
                and y.quant is not None
                and (t.scale, t.zero_point) != (y.scale, y.zero_point)
            ):
                raise self.error(f"input {t.name!r} has quantization different from the output's")
        expected = list(shape)
        expected.insert(self.axis, len(self.inputs))
        if list(y.shape) != expected:
            raise self.error(f"output shape {list(y.shape)} is not the packed shape {expected}")

    def __call__(self, *xs):
        if self.crosses_batch:  # constants join as stored: there is no batch to broadcast them to
            return np.stack(xs, axis=0)
        return np.stack(self.batch_aligned(xs), axis=self.axis)
