"""Data movement: RESHAPE, PAD, TRANSPOSE, CONCATENATION. No arithmetic, so no rounding.

Activations carry the batch on axis 0 where the model has 1, and each op keeps it there, but for
a model that moves elements across axis 0 (YOLO11's attention reshapes [1, 2, 64, 32] into
[2, 64, 32]): such an op sets `crosses_batch`, runs on its declared shapes only, and the
Interpreter runs that model image by image (chunks of the declared batch), as TFLM does.
"""

from __future__ import annotations

import numpy as np

from ..kernels import aligned
from ..kernels.movement import concatenate, pad_last_axis
from ..kernels.padding import pad_input
from .base import Kernel
from .float_form import Movement, MovementForm


def _same_dtype(kernel: Kernel):
    """Data movement never converts: every data input has the output's type."""
    y = kernel.outputs[0]
    for t in kernel.inputs[: kernel.data_inputs]:
        if t is None or t.dtype != y.dtype:
            got = "omitted" if t is None else np.dtype(t.dtype).name
            raise kernel.error(f"input is {got}, expected the output's type {np.dtype(y.dtype).name}")


class PadFloat(Movement):
    """The padding of the prepared integer kernel (Pad, bound below it) with a real value: PADV2's
    constant (as a real number), else 0.0, which is what padding with the zero point means in int8."""

    def __call__(self, x, paddings=None, value=None):
        v = 0.0 if value is None else float(np.asarray(value).reshape(-1)[0])
        return np.pad(x, [tuple(q) for q in self.kernel.paddings], constant_values=v)


class Reshape(Kernel):
    kind = "RESHAPE"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 1, 2, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        _same_dtype(self)
        if int(np.prod(x.shape)) != int(np.prod(y.shape)):
            raise self.error(
                f"cannot reshape {list(x.shape)} ({int(np.prod(x.shape))} elements) into {list(y.shape)}"
            )
        if int(np.prod(x.shape[1:])) != int(np.prod(y.shape[1:])):
            self.crosses_batch = f"moves elements across axis 0 ({list(x.shape)} into {list(y.shape)})"
        if x.quant is not None and y.quant is not None and (x.scale, x.zero_point) != (y.scale, y.zero_point):
            raise self.error("input and output quantization differ, expected a pure reshape")
        self.per_image = tuple(y.shape[1:])

    def __call__(self, x, shape=None):
        if self.crosses_batch:  # at the declared shapes only (the Interpreter runs image by image)
            return x.reshape(self.outputs[0].shape)
        return x.reshape((x.shape[0],) + self.per_image)


class Pad(Kernel):
    kind = "PAD"
    float_form = PadFloat
    required_inputs, max_inputs, data_inputs = 2, 3, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, paddings, y = self.inputs[0], self.inputs[1], self.outputs[0]
        _same_dtype(self)
        if paddings.data is None or paddings.dtype.kind != "i":
            raise self.error("paddings must be a constant integer tensor")
        if paddings.data.size != 2 * len(x.shape):
            raise self.error(
                f"paddings {list(paddings.shape)} do not fit an input "
                f"of rank {len(x.shape)}, expected [{len(x.shape)}, 2]"
            )
        self.paddings = paddings.data.astype(np.int64).reshape(-1, 2)
        if np.any(self.paddings < 0):
            raise self.error(
                f"paddings {self.paddings.tolist()} are negative, expected [rank, 2] non-negative"
            )
        if np.any(self.paddings[0] != 0):
            self.crosses_batch = f"pads axis 0 by {self.paddings[0].tolist()}"
        padded = [int(d + p0 + p1) for d, (p0, p1) in zip(x.shape, self.paddings)]
        if padded != list(y.shape):
            raise self.error(f"output shape {list(y.shape)} is not the padded input shape {padded}")
        self.value = self.outputs[0].zero_point if x.dtype == np.int8 else 0
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            v = graph.tensors[op.inputs[2]]
            if v.data is None or v.data.size != 1 or v.dtype != x.dtype:
                raise self.error(f"pad value {v.name!r} must be one constant {np.dtype(x.dtype).name}")
            self.value = v.data.reshape(-1)[0]

    def spatial_zero_point_padding(self, zero_point: int) -> tuple[int, int] | None:
        """(top, left) when this PAD pads an int8 NHWC activation along its height and width only,
        with zero_point (a convolution reading it may take the padding over: a padded tap adds
        (zp - zp) * w = 0, exactly as a tap TFLM skips), else None."""
        p = self.paddings
        if (
            len(p) != 4
            or p[0].any()
            or p[3].any()
            or not p[1:3].any()
            or self.value != zero_point
            or self.inputs[0].dtype != np.int8
        ):
            return None
        return int(p[1, 0]), int(p[2, 0])

    def __call__(self, x, paddings=None, value=None):
        p = self.paddings
        # spatial padding of NHWC: one pass
        if x.ndim == 4 and x.dtype == np.int8 and not p[0].any() and not p[3].any():
            out = aligned.empty(
                (x.shape[0], *(int(d + a + b) for d, (a, b) in zip(x.shape[1:], p[1:]))), np.int8
            )
            fill, top, left = np.int8(self.value), int(p[1, 0]), int(p[2, 0])
            return pad_input(np.ascontiguousarray(x), top, left, fill, np.int8(0), out)
        if x.ndim and x.size and not p[:-1].any():  # the last axis alone (BlazeFace's channel pads)
            return pad_last_axis(x, int(p[-1, 0]), int(p[-1, 1]), self.value)
        return np.pad(x, [tuple(q) for q in p], constant_values=self.value)


PadFloat.kernel_class = Pad


class Transpose(Kernel):
    kind = "TRANSPOSE"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 2, 2, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, perm, y = self.inputs[0], self.inputs[1], self.outputs[0]
        _same_dtype(self)
        if perm.data is None:
            raise self.error("permutation must be a constant tensor")
        self.perm = [int(p) for p in perm.data.reshape(-1)]
        if sorted(self.perm) != list(range(len(x.shape))):
            raise self.error(
                f"permutation {self.perm} is not a permutation of the input's {len(x.shape)} axes"
            )
        if self.perm[0] != 0:
            self.crosses_batch = f"permutation {self.perm} moves axis 0"
        permuted = [x.shape[p] for p in self.perm]
        if permuted != list(y.shape):
            raise self.error(f"output shape {list(y.shape)} is not the permuted input shape {permuted}")

    def __call__(self, x, perm=None):
        return np.ascontiguousarray(x.transpose(self.perm))


class Concatenation(Kernel):
    kind = "CONCATENATION"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 1, None, None

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        y = self.outputs[0]
        _same_dtype(self)
        rank = len(y.shape)
        axis = int(op.options.get("axis", 0))
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        self.axis = axis % rank
        if self.axis == 0:
            self.crosses_batch = "concatenates along axis 0"
        if op.options.get("fused_activation_function", "NONE") != "NONE":
            raise self.error("fused activation on CONCATENATION is not supported")
        for t in self.inputs:
            if len(t.shape) != rank or any(
                a != b for i, (a, b) in enumerate(zip(t.shape, y.shape)) if i != self.axis
            ):
                raise self.error(
                    f"input {t.name!r} {list(t.shape)} does not match "
                    f"the output {list(y.shape)} outside axis {self.axis}"
                )
            if t.dtype == np.int8 and (t.quant is None or (t.scale, t.zero_point) != (y.scale, y.zero_point)):
                raise self.error(
                    f"input {t.name!r} has scale/zero point different from the output's, expected them shared"
                )
        if sum(t.shape[self.axis] for t in self.inputs) != y.shape[self.axis]:
            raise self.error(
                f"inputs add up to {sum(t.shape[self.axis] for t in self.inputs)} along axis {self.axis}, "
                f"the output has {y.shape[self.axis]}"
            )

    def __call__(self, *xs):
        if self.crosses_batch:  # constants join as stored: there is no batch to broadcast them to
            return np.concatenate(xs, axis=0)
        return concatenate(self.batch_aligned(xs), self.axis)
