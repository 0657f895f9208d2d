"""The binary elementwise family (ADD, SUB, MUL, MAXIMUM, MINIMUM, PRELU): operand checks and
broadcasting, written once, ADD's and SUB's rescaling multipliers, and eval as a lookup in a
65,536-entry table (ADD evaluates with its own vector code instead, add.py).

An int8 binary op of fixed quantization is a function of its two input bytes, so prepare runs the
op's exact TFLM arithmetic on every pair once and eval gathers table[a, b]: bit-identical to
computing each element, and vector code whatever the arithmetic.
"""

from __future__ import annotations

import numpy as np

from ..kernels import aligned
from ..kernels.elementwise import pair_lookup
from ..kernels.int16 import is_int16, range16, require_int16, require_tflm
from ..kernels.pair_tables import LEFT_SHIFT
from ..kernels.requant import output_range, requantization_multiplier
from .base import Kernel, broadcast_crossing

# ADD and SUB bring both inputs to twice the larger scale with this many bits of headroom (TFLM
# add_common.cc and sub_common.cc: 20 for int8 outputs, 15 for int16), then to the output scale.
LEFT_SHIFT_16 = 15


def read_only(x: np.ndarray) -> np.ndarray:
    """x as a read-only view. Numba compiles a kernel per signature, and read-only is part of an
    array's type: an operand that broadcast came as a fresh (writable) copy, one that did not as
    numpy's read-only broadcast view, so a batch other than the warm-up's one image loaded another
    form of the kernel on its first run (20 to 40 ms each, YOLOv8n's box decoding)."""
    view = x.view()
    view.flags.writeable = False
    return view


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
        # A constant [2, 3] against an activation [1, 3], or an activation of another rank: valid at
        # the declared shapes only, where __call__ then broadcasts (the model runs image by image).
        self.crosses_batch = broadcast_crossing((a, b), y)
        self.out_shape = tuple(y.shape[1:])
        return a, b, y

    def rescale_multipliers(self, a, b, y) -> tuple:
        """(m1, s1, m2, s2, m_out, s_out) of ADD and SUB, computed in double from the float32 scales
        as TFLM's Prepare does (QuantizeMultiplierSmallerThanOneExp, which CHECK-fails on an output
        multiplier not below 1: refused here)."""
        f1, f2, fo = (np.float64(t.quant.scale[0]) for t in (a, b, y))
        twice_max = 2.0 * max(f1, f2)
        left_shift = LEFT_SHIFT_16 if is_int16(a) else LEFT_SHIFT
        reals = (float(f1 / twice_max), float(f2 / twice_max), float(twice_max / ((1 << left_shift) * fo)))
        if not 0.0 < reals[2] < 1.0:
            raise self.error(
                f"output multiplier {reals[2]:g} is not below 1 (output scale {float(fo):g} too small "
                "for the input scales)"
            )
        return tuple(v for r in reals for v in requantization_multiplier(r))

    def prepare_rescaled(self, form16):
        """ADD's and SUB's Prepare (TFLM add_common.cc, sub_common.cc): the operand checks, the
        rescaling multipliers and the fused activation's clamp range. With int16 operands self.int16
        runs form16(a, b, params) and None is returned; with int8 ones, the parameters (z1, z2, m1,
        s1, m2, s2, m_out, s_out, z_out, lo, hi) of the op's int8 arithmetic."""
        a, b, y = self.prepare_operands(int16=True)
        multipliers = self.rescale_multipliers(a, b, y)
        activation = self.activation = self.op.options.get("fused_activation_function", "NONE")
        if is_int16(a):
            params16 = (*multipliers, *range16(self, activation, y))
            self.int16 = lambda a, b: form16(a, b, params16)
            return None
        return (a.zero_point, b.zero_point, *multipliers, y.zero_point, *output_range(activation, y))

    def macs(self) -> int:
        return int(np.prod(self.out_shape))

    def workspace_bytes(self, n: int) -> int:
        return 2 * n * int(np.prod(self.out_shape))  # each operand broadcast to the output shape

    @property
    def elementwise(self) -> bool:
        return self.int16 is None and not self.crosses_batch  # a scalar operand broadcasts, nothing else

    def __call__(self, a, b):
        if self.crosses_batch:
            shape = tuple(self.outputs[0].shape)
        else:
            shape = self.broadcast_batch(a, b, self.out_shape)
        if self.int16 is not None:
            return self.int16(*(np.broadcast_to(t, shape) for t in (a, b)))
        # (np.broadcast_to costs 7 us even where there is nothing to broadcast, the common case)
        a, b = (t if t.shape == shape else np.broadcast_to(t, shape) for t in (a, b))
        return self.eval_int8(read_only(np.ascontiguousarray(a)), read_only(np.ascontiguousarray(b)))

    def eval_int8(self, a, b):
        """a, b: the int8 operands broadcast to the output shape, contiguous: the table lookup."""
        return pair_lookup(self.table, a.view(np.uint8), b.view(np.uint8), aligned.empty(a.shape, np.int8))
