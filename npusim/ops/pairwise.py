"""Shared by the int8 binary elementwise ops (MUL, SUB): operand checks and broadcasting as ADD does
them, and eval as a lookup in a 65,536-entry table.

An int8 binary op of fixed quantization is a function of its two input bytes, so prepare runs the
op's exact TFLM arithmetic on every pair once and eval gathers table[a, b]: bit-identical to
computing each element, and vector code whatever the arithmetic.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from ..engines import aligned
from ..engines.int16 import is_int16, require_int16, require_tflm
from ..jit import parallel_kernel
from .base import Kernel


@parallel_kernel
def pair_lookup(table, a, b, out):
    """out[i] = table[a[i] * 256 + b[i]] for bytes a, b (uint8 views of the int8 operands)."""
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    for i in nb.prange(fo.size):
        fo[i] = table[(np.int64(fa[i]) << 8) | np.int64(fb[i])]
    return out


def every_pair() -> tuple[np.ndarray, np.ndarray]:
    """(a, b) as int64 values over all 65,536 pairs, a major: index a_byte * 256 + b_byte."""
    codes = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int64)
    return np.repeat(codes, 256), np.tile(codes, 256)


class BinaryKernel(Kernel):
    """Two int8 per-tensor operands that broadcast (numpy rules) to the int8 output; subclasses set
    self.table (int8 [65536]) in __init__ after calling prepare_operands()."""

    required_inputs, max_inputs = 2, 2
    max_rank: int | None = None  # TFLM's broadcasting kernels stop at rank 4 for some ops
    # An op with an int16 path sets it in __init__: f(a, b) of the int16 operands broadcast to the
    # output shape, returning the int16 output (the table is then unused).
    int16 = None

    def prepare_operands(self, quantized: bool = True, int16: bool = False):
        """quantized False: int8 operands whose quantization the op ignores (MAXIMUM, MINIMUM).
        int16 True: int16 operands and output are accepted as well (symmetric, tflm profile)."""
        a, b, y = self.inputs[0], self.inputs[1], self.outputs[0]
        if int16 and is_int16(a):
            require_tflm(self)
            require_int16(self, a, b, y)
        elif quantized:
            self.require_int8(a, b, y)
        for t in (a, b, y):
            if not quantized and t.dtype != np.int8:
                raise self.error(f"tensor {t.name!r} has type {np.dtype(t.dtype).name}, expected int8")
            if quantized and t.quant.per_channel:
                raise self.error(f"tensor {t.name!r} is quantized per channel, expected per-tensor")
        shape = self.require_broadcast(a, b, y)
        if self.max_rank is not None and tuple(a.shape) != tuple(b.shape) and len(shape) > self.max_rank:
            raise self.error(
                f"broadcasting over {len(shape)} dimensions, TFLM supports at most {self.max_rank}"
            )
        for t in (a, b):  # a constant may not broadcast along the batch axis 0
            if t.data is not None and len(t.shape) == len(y.shape) and len(t.shape) and t.shape[0] != 1:
                raise self.error(
                    f"constant {t.name!r} of shape {list(t.shape)} spans the batch axis 0 (size 1 expected)"
                )
        for t in (a, b):  # an activation's axis 0 is the batch: it must line up with the output's
            if t.data is None and len(t.shape) != len(y.shape):
                raise self.error(
                    f"input {t.name!r} has rank {len(t.shape)}, expected the output's rank {len(y.shape)}"
                )
        self.out_shape = tuple(y.shape[1:])
        return a, b, y

    def macs(self) -> int:
        return int(np.prod(self.out_shape))

    def workspace_bytes(self, n: int) -> int:
        return 2 * n * int(np.prod(self.out_shape))  # each operand broadcast to the output shape

    def __call__(self, a, b):
        shape = self.broadcast_batch(a, b, self.out_shape)
        if self.int16 is not None:
            return self.int16(*(np.broadcast_to(t, shape) for t in (a, b)))
        a, b = (np.ascontiguousarray(np.broadcast_to(t, shape)).view(np.uint8) for t in (a, b))
        return pair_lookup(self.table, a, b, aligned.empty(shape, np.int8))
