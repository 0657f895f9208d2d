"""SPLIT and SPLIT_V: one input cut into several outputs along an axis (TFLM micro/kernels/split.cc,
split_v.cc). Data movement: each output keeps the input's bytes. The kernels return a tuple, one
array per output (the interpreter stores each under its tensor).

SPLIT: inputs (axis, input), options num_splits, equal parts. SPLIT_V: inputs (input, size_splits,
axis), options num_splits; size_splits may hold one -1 (the rest of the axis).
"""

from __future__ import annotations

import numpy as np

from .base import Kernel
from .float_form import MovementForm


def _check_outputs(kernel: Kernel, x, axis_tensor, sizes):
    """Resolve the axis (a constant int32 scalar), check every output's type, quantization and shape;
    returns the axis and the list of cut points."""
    kernel.require_constant(axis_tensor, "axis")
    if axis_tensor.dtype != np.int32 or axis_tensor.data.size != 1:
        raise kernel.error(f"axis {axis_tensor.name!r} is not one int32 value")
    rank = len(x.shape)
    axis = int(axis_tensor.data.reshape(-1)[0])
    if not -rank <= axis < rank:
        raise kernel.error(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if axis == 0:  # np.split on the declared shapes (the model runs image by image)
        kernel.crosses_batch = "splits axis 0"
    if len(sizes) != len(kernel.outputs):
        raise kernel.error(f"{len(sizes)} parts for {len(kernel.outputs)} outputs")
    for t, size in zip(kernel.outputs, sizes):
        if t.dtype != x.dtype:
            got, want = np.dtype(t.dtype).name, np.dtype(x.dtype).name
            raise kernel.error(f"output {t.name!r} is {got}, expected the input's {want}")
        if x.quant is not None and t.quant is not None and (x.scale, x.zero_point) != (t.scale, t.zero_point):
            raise kernel.error(f"output {t.name!r} has quantization different from the input's")
        expected = list(x.shape)
        expected[axis] = size
        if list(t.shape) != expected:
            raise kernel.error(f"output {t.name!r} has shape {list(t.shape)}, expected {expected}")
    return axis, list(np.cumsum(sizes)[:-1])


class Split(Kernel):
    kind = "SPLIT"
    float_form = MovementForm()
    required_inputs, max_inputs, num_outputs = 2, 2, None

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        axis_tensor, x = self.inputs
        n = int(op.options.get("num_splits", len(self.outputs)))
        if n != len(self.outputs):
            raise self.error(f"num_splits {n} differs from the {len(self.outputs)} outputs")
        if axis_tensor.data is not None and axis_tensor.data.size == 1:
            size = x.shape[int(axis_tensor.data.reshape(-1)[0]) % max(len(x.shape), 1)]
            if size % n:
                raise self.error(f"axis of size {size} does not split into {n} equal parts")
            sizes = [size // n] * n
        else:
            sizes = []
        self.axis, self.cuts = _check_outputs(self, x, axis_tensor, sizes)

    def __call__(self, axis, x):
        return tuple(np.ascontiguousarray(p) for p in np.split(x, self.cuts, axis=self.axis))


class SplitV(Kernel):
    kind = "SPLIT_V"
    float_form = MovementForm()
    required_inputs, max_inputs, num_outputs = 3, 3, None

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, size_splits, axis_tensor = self.inputs
        self.require_constant(size_splits, "size_splits")
        if size_splits.dtype not in (np.int32, np.int64) or size_splits.data.ndim != 1:
            raise self.error(f"size_splits {size_splits.name!r} is not a 1-D integer tensor")
        sizes = [int(v) for v in size_splits.data]
        self.require_constant(axis_tensor, "axis")
        if axis_tensor.data.size == 1 and -len(x.shape) <= int(axis_tensor.data.reshape(-1)[0]) < len(
            x.shape
        ):
            total = x.shape[int(axis_tensor.data.reshape(-1)[0]) % len(x.shape)]
            unknown = [i for i, s in enumerate(sizes) if s == -1]
            if len(unknown) > 1 or any(s < -1 for s in sizes):
                raise self.error(f"size_splits {sizes}: at most one -1 and no other negative size")
            if unknown:
                sizes[unknown[0]] = total - (sum(sizes) + 1)
            if sum(sizes) != total or any(s < 0 for s in sizes):
                raise self.error(f"size_splits {sizes} do not add up to the axis size {total}")
        self.axis, self.cuts = _check_outputs(self, x, axis_tensor, sizes)

    def __call__(self, x, size_splits, axis):
        return tuple(np.ascontiguousarray(p) for p in np.split(x, self.cuts, axis=self.axis))
