"""STRIDED_SLICE: data movement (TFLM micro/kernels/strided_slice_common.cc and
kernels/internal/strided_slice_logic.h StartForAxis / StopForAxis).

begin, end and strides are constant int32 tensors. Per input axis: the begin/end masks replace the
index by the whole range in the stride's direction, negative indices count from the end, then
start is clamped to [0, size] (stride > 0) or [-1, size - 1] (stride < 0) and so is stop; a shrunk
axis takes the one element at start (stop = start + 1) and leaves the output. The elements are
start, start + stride, ... while before stop, as TFLM's loop walks them.

ellipsis_mask and new_axis_mask: TFLM's Prepare sets both to 0 (they are ignored; a model whose
output shape relied on them fails TFLM's output size check). npusim does the same: it reads begin,
end and strides per input axis and ignores the two masks, so its output is TFLM's wherever TFLM
runs the model; the output shape check then refuses the rest with a clear message.
"""

from __future__ import annotations

import numpy as np

from .base import Kernel
from .float_form import MovementForm
from .movement import _same_dtype

INT32_LOWEST, INT32_MAX = -(2**31), 2**31 - 1


def _clamp(v: int, lo: int, hi: int) -> int:
    return lo if v < lo else hi if v > hi else v


def axis_indices(
    size: int, begin: int, end: int, stride: int, begin_masked: bool, end_masked: bool, shrink: bool
):
    """The input indices TFLM reads along one axis, in order (StartForAxis, StopForAxis, the loop)."""
    if size == 0:
        return []
    start = (INT32_LOWEST if stride > 0 else INT32_MAX) if begin_masked else begin
    if start < 0:
        start += size
    start = _clamp(start, 0, size) if stride > 0 else _clamp(start, -1, size - 1)
    if shrink:
        stop = start + 1
    else:
        stop = (INT32_MAX if stride > 0 else INT32_LOWEST) if end_masked else end
        if stop < 0:
            stop += size
        stop = _clamp(stop, 0, size) if stride > 0 else _clamp(stop, -1, size - 1)
    out = []
    i = start
    while (i < stop) if stride > 0 else (i > stop):
        out.append(i)
        i += stride
    return out


def _as_slice(idx: list) -> slice:
    """The arithmetic progression idx (one or more indices) as a Python slice."""
    step = idx[1] - idx[0] if len(idx) > 1 else 1
    stop = idx[-1] + (1 if step > 0 else -1)
    return slice(idx[0], None if stop < 0 else stop, step)


class StridedSlice(Kernel):
    kind = "STRIDED_SLICE"
    float_form = MovementForm()
    required_inputs, max_inputs, data_inputs = 4, 4, 1

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        _same_dtype(self)
        if x.quant is not None and y.quant is not None and (x.scale, x.zero_point) != (y.scale, y.zero_point):
            raise self.error("input and output quantization differ, expected a pure slice")
        rank = len(x.shape)
        operands = []
        for t, what in zip(self.inputs[1:], ("begin", "end", "strides")):
            self.require_constant(t, what)
            if t.dtype != np.int32 or t.data.ndim != 1 or t.data.size < rank:
                raise self.error(
                    f"{what} {t.name!r} is {np.dtype(t.dtype).name} {list(t.shape)}, expected int32 [{rank}]"
                )
            operands.append([int(v) for v in t.data[:rank]])
        begin, end, strides = operands
        opt = op.options
        begin_mask, end_mask = int(opt.get("begin_mask", 0)), int(opt.get("end_mask", 0))
        shrink_mask = int(opt.get("shrink_axis_mask", 0))
        if opt.get("offset", False):
            raise self.error("offset=True (end taken relative to begin) is not supported")
        self.slices = []
        out_shape = []
        for k in range(rank):
            if strides[k] == 0:
                raise self.error(f"stride of axis {k} is 0, expected non-zero strides")
            shrink = bool(shrink_mask >> k & 1)
            idx = axis_indices(
                x.shape[k],
                begin[k],
                end[k],
                strides[k],
                bool(begin_mask >> k & 1),
                bool(end_mask >> k & 1),
                shrink,
            )
            if not idx:
                raise self.error(
                    f"the slice of axis {k} is empty"
                    + (f" (shrunk with stride {strides[k]}: TFLM's loop reads no element)" if shrink else "")
                )
            if idx[0] >= x.shape[k] or idx[0] < 0:  # a shrunk axis at start == size (or -1)
                raise self.error(
                    f"axis {k} of size {x.shape[k]} is shrunk to index {idx[0]}, outside the axis "
                    "(TFLM would read out of bounds)"
                )
            if not shrink:
                out_shape.append(len(idx))
            self.slices.append(_as_slice(idx) if shrink or idx != list(range(x.shape[k])) else slice(None))
        # Axis 0 cut, reversed or shrunk: valid at the declared shapes (the model runs image by image).
        if self.slices[0] != slice(None) or shrink_mask & 1:
            self.crosses_batch = f"slices axis 0 (begin {begin[0]}, end {end[0]}, stride {strides[0]})"
        if out_shape != list(y.shape):
            raise self.error(
                f"output shape {list(y.shape)} is not the sliced shape {out_shape}"
                + (
                    " (ellipsis_mask and new_axis_mask are ignored, as TFLM does)"
                    if opt.get("ellipsis_mask", 0) or opt.get("new_axis_mask", 0)
                    else ""
                )
            )

    def __call__(self, x, begin=None, end=None, strides=None):
        out = np.ascontiguousarray(x[tuple(self.slices)])
        if self.crosses_batch:
            return out.reshape(self.outputs[0].shape)
        return out.reshape((x.shape[0],) + tuple(self.outputs[0].shape[1:]))
