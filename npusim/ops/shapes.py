"""Data movement and shape ops: SLICE, UNPACK, SQUEEZE, EXPAND_DIMS, SHAPE, TILE, GATHER.

No arithmetic: outputs keep the input's bytes (int8 operands must share the output's quantization,
as TFLM copies bytes). Activations carry the batch on axis 0; an op that moves or cuts axis 0 sets
crosses_batch and computes on the declared shapes (the Interpreter runs that model image by
image). Sources: TFLM micro/kernels/slice.cc, unpack.cc, squeeze.cc, expand_dims.cc, shape.cc,
gather.cc; TILE is not in TFLM (the PyPI build registers no TILE): it follows LiteRT's
kernels/tile.cc, whose reference resolver is the oracle of its tests.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel
from .float_form import MovementForm
from .movement import Reshape, _same_dtype

MAX_SLICE_DIMS = 5  # TFLM slice.cc kMaxDim


def _constant_ints(kernel: Kernel, t, what: str, dtypes=(np.int32, np.int64)) -> np.ndarray:
    if t is None:
        raise kernel.error(f"{what} is omitted, expected a constant integer tensor")
    kernel.require_constant(t, what)
    if t.dtype not in dtypes:
        names = " or ".join(np.dtype(d).name for d in dtypes)
        raise kernel.error(f"{what} {t.name!r} is {np.dtype(t.dtype).name}, expected {names}")
    return t.data.astype(np.int64).reshape(-1)


def _same_quant(kernel: Kernel, x, y):
    if x.quant is not None and y.quant is not None and (x.scale, x.zero_point) != (y.scale, y.zero_point):
        raise kernel.error(f"output {y.name!r} has quantization different from the input's")


def _expect_shape(kernel: Kernel, y, expected):
    if list(y.shape) != [int(d) for d in expected]:
        raise kernel.error(f"output {y.name!r} has shape {list(y.shape)}, expected {list(expected)}")


class Slice(Kernel):
    kind = "SLICE"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 3, 3, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, begin_t, size_t = self.inputs
        y = self.outputs[0]
        _same_dtype(self)
        _same_quant(self, x, y)
        rank = len(x.shape)
        if rank > MAX_SLICE_DIMS:
            raise self.error(f"input of rank {rank}, TFLM slices at most {MAX_SLICE_DIMS} dimensions")
        begin = _constant_ints(self, begin_t, "begin")
        size = _constant_ints(self, size_t, "size")
        if begin.size != rank or size.size != rank:
            raise self.error(
                f"begin {begin.tolist()} and size {size.tolist()} do not have one value per axis"
            )
        dims = np.asarray(x.shape, dtype=np.int64)
        if np.any(begin < 0) or np.any(begin > dims):
            raise self.error(f"begin {begin.tolist()} reaches outside the input {list(x.shape)}")
        size = np.where(size == -1, dims - begin, size)
        if np.any(size < 0) or np.any(size > dims - begin):
            raise self.error(
                f"begin {begin.tolist()} and size {size.tolist()} reach outside the input {list(x.shape)}"
            )
        _expect_shape(self, y, size)
        self.index = tuple(slice(int(b), int(b + s)) for b, s in zip(begin, size))
        if begin[0] != 0 or size[0] != x.shape[0]:
            self.crosses_batch = f"slices axis 0 ({begin[0]}:{begin[0] + size[0]} of {x.shape[0]})"
        else:
            self.index = (slice(None),) + self.index[1:]  # axis 0 whole: the batch

    def __call__(self, x, begin=None, size=None):
        return np.ascontiguousarray(x[self.index])


class Unpack(Kernel):
    kind = "UNPACK"
    float_form = MovementForm()
    required_inputs, max_inputs, num_outputs = 1, 1, None

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x = self.inputs[0]
        rank = len(x.shape)
        axis = int(op.options.get("axis", 0))
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        self.axis = axis % rank
        if self.axis == 0:  # np.take on the declared shapes (the model runs image by image)
            self.crosses_batch = "unpacks along axis 0"
        num = int(op.options.get("num", x.shape[self.axis]))
        if num != x.shape[self.axis] or num != len(self.outputs):
            raise self.error(
                f"num {num}, axis size {x.shape[self.axis]}, {len(self.outputs)} outputs: expected equal"
            )
        expected = list(x.shape[: self.axis]) + list(x.shape[self.axis + 1 :])
        for t in self.outputs:
            if t.dtype != x.dtype:
                raise self.error(f"output {t.name!r} is {np.dtype(t.dtype).name}, expected the input's type")
            _same_quant(self, x, t)
            _expect_shape(self, t, expected)

    def __call__(self, x):
        return tuple(np.ascontiguousarray(np.take(x, k, axis=self.axis)) for k in range(len(self.outputs)))


class Squeeze(Reshape):
    """A reshape that drops axes of size 1 (all of them, or squeeze_dims)."""

    kind = "SQUEEZE"
    required_inputs, max_inputs, data_inputs = 1, 1, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        rank = len(x.shape)
        dims = [int(d) for d in (op.options.get("squeeze_dims") or [])]
        if any(not -rank <= d < rank for d in dims):
            raise self.error(f"squeeze_dims {dims} out of range for rank {rank}")
        dims = {d % rank for d in dims} if dims else {i for i, s in enumerate(x.shape) if s == 1}
        if any(x.shape[d] != 1 for d in dims):
            raise self.error(f"squeeze_dims {sorted(dims)} name axes of {list(x.shape)} that are not 1")
        _expect_shape(self, y, [s for i, s in enumerate(x.shape) if i not in dims])


class ExpandDims(Reshape):
    """A reshape that inserts an axis of size 1 at `axis` (a constant int32 input)."""

    kind = "EXPAND_DIMS"
    required_inputs, max_inputs, data_inputs = 2, 2, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        axis_v = _constant_ints(self, self.inputs[1], "axis")
        if axis_v.size != 1:
            raise self.error(f"axis {axis_v.tolist()} is not one value")
        rank = len(x.shape) + 1
        axis = int(axis_v[0])
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for an output of rank {rank}")
        axis %= rank
        expected = list(x.shape)
        expected.insert(axis, 1)
        _expect_shape(self, y, expected)


class Shape(Kernel):
    """SHAPE: the input's shape as int32 (or int64, out_type). Shapes are static, so the output is
    the model's own shape of the input, batch 1 included, whatever the batch of the run: the tensor
    has no batch axis (each of TFLM's batch-1 runs gives this same array)."""

    kind = "SHAPE"
    float_form = MovementForm()

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        if y.dtype not in (np.int32, np.int64):
            raise self.error(f"output {y.name!r} is {np.dtype(y.dtype).name}, expected int32 or int64")
        _expect_shape(self, y, [len(x.shape)])
        self.value = np.asarray(x.shape, dtype=y.dtype)

    def __call__(self, x):
        return self.value.copy()


class Tile(Kernel):
    kind = "TILE"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 2, 2, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        _same_dtype(self)
        _same_quant(self, x, y)
        reps = _constant_ints(self, self.inputs[1], "multiples")
        if reps.size != len(x.shape):
            raise self.error(f"multiples {reps.tolist()} do not have one value per axis of {list(x.shape)}")
        if np.any(reps < 1):
            raise self.error(f"multiples {reps.tolist()} must be positive")
        if reps[0] != 1:  # np.tile on the declared shapes (the model runs image by image)
            self.crosses_batch = f"tiles axis 0 {int(reps[0])} times"
        _expect_shape(self, y, np.asarray(x.shape) * reps)
        self.reps = tuple(int(r) for r in reps)

    def __call__(self, x, multiples=None):
        return np.tile(x, self.reps)


class Gather(Kernel):
    """GATHER with constant int32/int64 indices along axis >= 1 (batch_dims 0): out =
    params[..., indices, ...]. TFLM refuses an index out of range at Eval; npusim at prepare."""

    kind = "GATHER"
    float_form = MovementForm()
    required_inputs, max_inputs = 2, 2

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, idx_t = self.inputs
        y = self.outputs[0]
        if x.dtype != y.dtype:
            raise self.error(f"output {y.name!r} is {np.dtype(y.dtype).name}, expected the params' type")
        _same_quant(self, x, y)
        if x.data is not None:
            raise self.error("constant params with activation indices are not supported")
        idx = _constant_ints(self, idx_t, "indices")
        rank = len(x.shape)
        axis = int(op.options.get("axis", 0))
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        axis %= rank
        if axis == 0:  # np.take on the declared shapes (the model runs image by image)
            self.crosses_batch = "gathers along axis 0"
        if int(op.options.get("batch_dims", 0)) != 0:
            raise self.error(f"batch_dims {op.options.get('batch_dims')} is not supported, expected 0")
        if np.any(idx < 0) or np.any(idx >= x.shape[axis]):
            raise self.error(f"indices {idx.tolist()} out of range for an axis of size {x.shape[axis]}")
        self.axis = axis
        self.indices = idx.reshape(idx_t.data.shape)
        _expect_shape(self, y, list(x.shape[:axis]) + list(self.indices.shape) + list(x.shape[axis + 1 :]))

    def __call__(self, x, indices=None):
        return np.take(x, self.indices, axis=self.axis)
