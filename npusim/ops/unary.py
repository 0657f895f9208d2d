"""The shared shape of the one-input elementwise ops whose int8 output is a function of the input
byte alone (LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU): prepare fills a 256-entry table with TFLM's
arithmetic, eval is a lookup. The unary counterpart of pairwise.BinaryKernel."""

from __future__ import annotations

import numpy as np

from ..kernels.int16 import is_int16, require_int16, require_tflm
from ..kernels.lookup import lookup
from .base import Kernel


class UnaryTableKernel(Kernel):
    """An int8 per-tensor input and output of the same shape; subclasses set self.table (int8 [256],
    indexed by the input byte) in __init__ after calling prepare_operands()."""

    # An op with an int16 path sets it in __init__: f(x) of the int16 input, returning the int16
    # output (the table is then unused).
    int16 = None

    def prepare_operands(self, int16: bool = False):
        """int16 True: an int16 input and output are accepted as well (symmetric, tflm profile)."""
        x, y = self.inputs[0], self.outputs[0]
        if int16 and is_int16(x):
            require_tflm(self)
            require_int16(self, x, y)
        else:
            self.require_int8(x, y)
        for t in (x, y):
            if t.quant.per_channel:
                raise self.error(f"tensor {t.name!r} is quantized per channel, expected per-tensor")
        if tuple(y.shape) != tuple(x.shape):
            raise self.error(f"output shape {list(y.shape)} differs from the input shape {list(x.shape)}")
        return x, y

    @property
    def elementwise(self) -> bool:
        return self.int16 is None  # the 8-bit table

    def __call__(self, x):
        if self.int16 is not None:
            return self.int16(np.asarray(x))
        return lookup(self.table, np.ascontiguousarray(x).view(np.uint8), np.empty(x.shape, dtype=np.int8))
