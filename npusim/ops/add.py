"""ADD: int8 elementwise addition with TFLite broadcasting (TFLM reference_integer_ops/add.h).

Both inputs are brought to a common scale with 20 bits of headroom (left_shift = 20), added in
int32, then requantized to the output scale: three MultiplyByQuantizedMultiplier calls per element.
The result depends only on the two input bytes, so prepare evaluates those steps once for each of
the 65,536 pairs, and eval is a lookup in that 64 KB table.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..jit import parallel_kernel
from ..quant import (
    SINGLE,
    clamp,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_single,
)
from . import aligned
from .base import Kernel
from .requant import output_range, requantization_multiplier

LEFT_SHIFT = 20


@nb.njit(cache=True, inline="always")
def _mbqm(x, m, shift, profile):
    if profile == SINGLE:
        return multiply_by_quantized_multiplier_single(x, m, shift)
    return multiply_by_quantized_multiplier(x, m, shift)


@nb.njit(cache=True)
def add_table(z1, z2, m1, s1, m2, s2, mo, so, zo, lo, hi, profile):
    """table[(a & 255) << 8 | (b & 255)] = the int8 sum of int8 inputs a and b."""
    table = np.empty(65536, dtype=np.int8)
    for a in range(-128, 128):
        x1 = _mbqm((np.int64(a) - z1) << LEFT_SHIFT, m1, s1, profile)
        for b in range(-128, 128):
            x2 = _mbqm((np.int64(b) - z2) << LEFT_SHIFT, m2, s2, profile)
            table[((a & 255) << 8) | (b & 255)] = clamp(_mbqm(x1 + x2, mo, so, profile) + zo, lo, hi)
    return table


@parallel_kernel
def add_int8(a, b, table, out):
    """a, b (as bytes), out: same shape (already broadcast)."""
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    for i in nb.prange(fo.size):
        fo[i] = table[(np.int64(fa[i]) << 8) | np.int64(fb[i])]
    return out


class Add(Kernel):
    kind = "ADD"
    required_inputs, max_inputs = 2, 2

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        a, b, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.require_int8(a, b, y)
        for t in (a, b, y):
            if t.quant.per_channel:
                raise self.error(f"tensor {t.name!r} is quantized per channel, expected per-tensor")
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise self.error(f"input shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        if tuple(shape) != tuple(y.shape):
            raise self.error(f"output shape {list(y.shape)} is not the broadcast shape {list(shape)} of the inputs")
        for t in (a, b):  # an activation's axis 0 is the batch: it must line up with the output's
            if t.data is None and len(t.shape) != len(y.shape):
                raise self.error(f"input {t.name!r} has rank {len(t.shape)}, expected the output's rank {len(y.shape)}")
        s1, s2, so = (np.float64(t.quant.scale[0]) for t in (a, b, y))
        twice_max = 2.0 * max(s1, s2)
        self.params = (
            a.zero_point, b.zero_point,
            *requantization_multiplier(s1 / twice_max), *requantization_multiplier(s2 / twice_max),
            *requantization_multiplier(twice_max / ((1 << LEFT_SHIFT) * so)),
            y.zero_point, *output_range(op.options.get("fused_activation_function", "NONE"), y),
        )
        self.table = add_table(*(np.int64(p) for p in self.params), np.int64(profile))
        self.out_shape = tuple(y.shape[1:])

    def macs(self) -> int:
        return int(np.prod(self.out_shape))

    def workspace_bytes(self, n: int) -> int:
        return n * int(np.prod(self.out_shape))  # each operand broadcast to the output shape

    def __call__(self, a, b):
        a_is_batched = len(a.shape) == len(self.inputs[0].shape) and self.inputs[0].data is None
        b_is_batched = len(b.shape) == len(self.inputs[1].shape) and self.inputs[1].data is None
        if a_is_batched and b_is_batched and a.shape[0] != b.shape[0]:
            raise self.error(f"inputs carry batches of {a.shape[0]} and {b.shape[0]}, expected the same")
        n = a.shape[0] if a_is_batched else b.shape[0]
        shape = (n,) + self.out_shape
        a, b = (np.ascontiguousarray(np.broadcast_to(t, shape)).view(np.uint8) for t in (a, b))
        return add_int8(a, b, self.table, aligned.empty(shape, np.int8))
