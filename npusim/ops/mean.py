"""MEAN (int8) over the axes given by the constant second input.

reference_ops::QuantizedMeanOrSum (kernels/internal/reference/reduce.h), as TFLM's
micro/kernels/reduce_common.cc runs it for int8: (M, e) = QuantizeMultiplier(s_in / s_out), 1/n folded
into the multiplier (sh = min(floor(log2 n), 32, 31 + e), M' = (M << sh) / n, e' = e - sh), then
y = clamp(MultiplyByQuantizedMultiplier(int32(sum - zp_in * n), M', e') + zp_out, -128, 127).

Older reduce_common.cc sources take reference_ops::Mean (raw sum / n, C++ truncating division) when
input and output share scale and zero point. The oracle TFLM (PyPI tflite-micro 0.dev20261023) no
longer does: with equal quantization it rounds exactly as above (checked on one-op models), so there
is one path here. The xnnpack profile requantizes the sums as XNNPACK's reduce operator does
(xnnpack.reduce_output: float32, round half to even). The output elements follow the input's dims
with the reduced axes dropped (or kept as 1 with keep_dims); as in TFLM, which never resizes
outputs, they take the declared output shape (checked to hold as many elements per image).
"""

from __future__ import annotations

import numpy as np

from ..kernels.reduce import mean_requantize, sum_middle_axis
from ..kernels.requant import requantization_multiplier
from ..profiles import profile_of, xnnpack
from .base import Kernel
from .float_form import FloatForm, real


class MeanFloat(FloatForm):
    """The reduction over the axes tensor as TFLite's ResolveAxis reads it (negative axes count
    from the end, duplicates dropped), in the input's precision, shaped as the output tensor."""

    reduce = staticmethod(np.mean)

    def __init__(self, op, graph):
        super().__init__(op, graph)
        rank = len(self.inputs[0].shape)
        axes = {int(a) % rank for a in np.asarray(self.inputs[1].data).ravel()}
        self.axes = tuple(sorted(axes))
        self.out_image_shape = tuple(self.outputs[0].shape[1:])
        self.crosses_batch = "reduces axis 0" if 0 in self.axes else None

    def __call__(self, x, axes=None):
        y = np.asarray(self.reduce(real(x), axis=self.axes))
        if self.crosses_batch:
            return y.reshape(self.outputs[0].shape)
        return y.reshape((x.shape[0],) + self.out_image_shape)


class Mean(Kernel):
    kind = "MEAN"
    float_form = MeanFloat
    required_inputs, max_inputs = 2, 2
    is_mean = True  # SUM: False (no 1/n under the xnnpack profile)

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        if (
            len(self.inputs) != 2
            or self.inputs[0] is None
            or self.inputs[1] is None
            or len(self.outputs) != 1
        ):
            raise self.error(
                f"expected 2 inputs (data, axes) and 1 output, got {len(self.inputs)} and {len(self.outputs)}"
            )
        inp, axes_t, out = self.inputs[0], self.inputs[1], self.outputs[0]
        self.require_int8(inp, out)
        if axes_t.data is None:
            raise self.error(f"axes tensor {axes_t.name!r} is not a constant, expected constant int32 axes")
        if axes_t.dtype != np.int32:
            raise self.error(
                f"axes tensor {axes_t.name!r} has type {np.dtype(axes_t.dtype).name}, expected int32"
            )
        rank = len(inp.shape)
        if rank < 1:
            raise self.error(f"input {inp.name!r} is a scalar, expected at least one axis to reduce")
        # ResolveAxis: negative axes count from the end, duplicates are dropped.
        axes: list[int] = []
        for a in np.asarray(axes_t.data).ravel().tolist():
            r = a + rank if a < 0 else a
            if not 0 <= r < rank:
                raise self.error(f"axis {a} is out of range for input of rank {rank}")
            if r not in axes:
                axes.append(r)
        if 0 in axes:  # valid at the declared shapes: the model runs image by image
            self.crosses_batch = "reduces axis 0"
        if not axes:
            raise self.error("no axis to reduce")
        self.axes = tuple(sorted(axes))
        self.keep_dims = bool(op.options.get("keep_dims", False))
        self.in_shape = tuple(int(d) for d in inp.shape)
        self.count = int(np.prod([self.in_shape[a] for a in self.axes], dtype=np.int64))
        if self.count == 0:
            raise self.error("reduces over an empty axis")
        if self.keep_dims:
            kept = [1 if i in self.axes else d for i, d in enumerate(self.in_shape)]
        else:
            kept = [d for i, d in enumerate(self.in_shape) if i not in self.axes]
        declared = tuple(int(d) for d in out.shape)
        elements = int(np.prod(declared, dtype=np.int64)) == int(np.prod(kept, dtype=np.int64))
        if not declared or not elements or (not self.crosses_batch and declared[0] != kept[0]):
            raise self.error(
                f"output {out.name!r} has shape {list(declared)}, "
                f"expected {kept} (or as many elements per image)"
            )
        self.out_image_shape = declared[1:]  # per image, batch axis dropped

        self.input_zero_point = inp.zero_point
        self.output_zero_point = out.zero_point
        m, e = requantization_multiplier(float(np.float32(inp.scale)) / float(np.float32(out.scale)))
        n = self.count
        # 63 - CountLeadingZeros(uint64 n) = floor(log2 n); QuantizeMultiplier keeps e >= -31, so sh >= 0.
        sh = min(n.bit_length() - 1, 32, 31 + e)
        self.multiplier = (m << sh) // n  # int64 division of non-negative values
        self.shift = e - sh

    def macs(self) -> int:  # per row of the output's axis 0, which is the input's unless it is reduced
        return int(np.prod(self.in_shape, dtype=np.int64)) // self.outputs[0].shape[0]

    def workspace_bytes(self, n: int) -> int:
        return n * 8 * int(np.prod(self.out_image_shape, dtype=np.int64))  # int64 sums

    def __call__(self, x, axes=None):
        x = np.asarray(x)
        if x.dtype != np.int8:
            raise self.error(f"input array has type {x.dtype}, expected int8")
        if x.shape[1:] != self.in_shape[1:]:
            raise self.error(
                f"input array has shape {list(x.shape)}, expected [N, "
                f"{', '.join(map(str, self.in_shape[1:]))}]"
            )
        axes = self.axes
        if axes == tuple(range(axes[0], axes[-1] + 1)):  # contiguous axes: [outer, reduced, inner]
            outer = int(np.prod(x.shape[: axes[0]], dtype=np.int64))
            view = np.ascontiguousarray(x).reshape(outer, self.count, -1)
            sums = sum_middle_axis(view, np.empty((outer, view.shape[2]), dtype=np.int64))
        else:
            sums = np.ascontiguousarray(x.sum(axis=axes, dtype=np.int64))
        if profile_of(self.profile).xnnpack_delegate:
            i, o = self.inputs[0], self.outputs[0]
            out = xnnpack.reduce_output(
                sums, self.count, i.scale, i.zero_point, o.scale, o.zero_point, self.is_mean
            )
            return self.shaped(out, x)
        out = np.empty(sums.shape, dtype=np.int8)
        mean_requantize(
            sums,
            np.int64(self.input_zero_point) * np.int64(self.count),
            np.int64(self.multiplier),
            np.int64(self.shift),
            np.int64(self.output_zero_point),
            out,
        )
        return self.shaped(out, x)

    def shaped(self, out, x):
        """The reduced values in the output's declared shape (over the batch of x, unless axis 0
        was reduced: then the run is image by image, at the declared shapes)."""
        if self.crosses_batch:
            return out.reshape(self.outputs[0].shape)
        return out.reshape((x.shape[0],) + self.out_image_shape)
