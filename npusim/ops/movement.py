"""Data movement: RESHAPE, PAD, TRANSPOSE, CONCATENATION. No arithmetic, so no rounding.

Activations carry the batch on axis 0 where the model has 1; each op keeps it there and refuses
a model that would move it (which only a batch of 1 could run).
"""
from __future__ import annotations

import numpy as np

from .base import Kernel


class Reshape(Kernel):
    kind = "RESHAPE"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        if int(np.prod(x.shape)) != int(np.prod(y.shape)):
            raise self.error(f"cannot reshape {list(x.shape)} ({int(np.prod(x.shape))} elements) into {list(y.shape)}")
        if x.quant is not None and y.quant is not None and (x.scale, x.zero_point) != (y.scale, y.zero_point):
            raise self.error("input and output quantization differ, expected a pure reshape")
        self.per_image = tuple(y.shape[1:]) if y.shape and y.shape[0] == 1 else tuple(y.shape)

    def __call__(self, x, shape=None):
        return x.reshape((x.shape[0],) + self.per_image)


class Pad(Kernel):
    kind = "PAD"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, paddings = self.inputs[0], self.inputs[1]
        if paddings is None or paddings.data is None:
            raise self.error("paddings must be a constant tensor")
        self.paddings = paddings.data.astype(np.int64).reshape(-1, 2)
        if self.paddings.shape[0] != len(x.shape) or np.any(self.paddings < 0):
            raise self.error(f"paddings {self.paddings.tolist()} do not fit an input of rank {len(x.shape)}, expected [rank, 2] non-negative")
        if np.any(self.paddings[0] != 0):
            raise self.error("padding the batch axis is not supported")
        self.value = self.outputs[0].zero_point if x.dtype == np.int8 else 0
        if len(op.inputs) > 2 and op.inputs[2] >= 0 and graph.tensors[op.inputs[2]].data is not None:
            self.value = graph.tensors[op.inputs[2]].data.reshape(-1)[0]

    def __call__(self, x, paddings=None, value=None):
        return np.pad(x, [tuple(p) for p in self.paddings], constant_values=self.value)


class Transpose(Kernel):
    kind = "TRANSPOSE"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        perm = self.inputs[1]
        if perm is None or perm.data is None:
            raise self.error("permutation must be a constant tensor")
        self.perm = [int(p) for p in perm.data.reshape(-1)]
        if sorted(self.perm) != list(range(len(self.inputs[0].shape))):
            raise self.error(f"permutation {self.perm} is not a permutation of the input's {len(self.inputs[0].shape)} axes")
        if self.perm[0] != 0:
            raise self.error(f"permutation {self.perm} moves the batch axis, which is not supported")

    def __call__(self, x, perm=None):
        return np.ascontiguousarray(x.transpose(self.perm))


class Concatenation(Kernel):
    kind = "CONCATENATION"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        y = self.outputs[0]
        rank = len(y.shape)
        self.axis = op.options.get("axis", 0) % max(rank, 1)
        if self.axis == 0:
            raise self.error("concatenation along the batch axis is not supported")
        if op.options.get("fused_activation_function", "NONE") != "NONE":
            raise self.error("fused activation on CONCATENATION is not supported")
        for t in self.inputs:
            if t.dtype == np.int8 and (t.quant is None or (t.scale, t.zero_point) != (y.scale, y.zero_point)):
                raise self.error(f"input {t.name!r} has scale/zero point different from the output's, expected them shared")

    def __call__(self, *xs):
        n = max(x.shape[0] for x, t in zip(xs, self.inputs) if t.data is None)
        xs = [np.broadcast_to(x, (n,) + x.shape[1:]) if t.data is not None else x for x, t in zip(xs, self.inputs)]
        return np.concatenate(xs, axis=self.axis)
