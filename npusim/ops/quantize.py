"""QUANTIZE (float32 or uint8 -> int8) and DEQUANTIZE (int8 -> float32) at the graph edges
(TFLM micro/kernels/quantize_common.cc, dequantize_common.cc)."""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..engines.lookup import lookup
from ..engines.requant import requantization_multiplier
from ..errors import NpusimError
from ..jit import parallel_kernel
from ..quant import ONNXRUNTIME, XNNPACK, clamp, mbqm_array
from . import onnxruntime as ort
from . import xnnpack as xnn
from .base import Kernel
from .float_form import Identity


@parallel_kernel
def affine_quantize(x, scale, zero_point, out):
    """AffineQuantize: TfLiteRound(val / scale) + zero_point, saturated to int8, with a float32
    division (in double, 3.85f / 0.1f lands just below 38.5 and would round the other way).
    Returns the number of values that are not finite or whose |val / scale| reaches 2^31 (TFLM's
    static_cast<int32_t> is undefined there: x86 and Arm disagree), which the caller refuses."""
    xf = x.reshape(-1)
    of = out.reshape(-1)
    bad = 0
    for i in nb.prange(xf.size):
        r = np.float64(xf[i] / scale)
        a = abs(r)
        if not a < 2.0**31:  # also true for NaN
            bad += 1
            a = 0.0
        q = math.floor(a + 0.5)  # round half away from zero
        v = np.int64(q if r >= 0 else -q) + zero_point
        of[i] = clamp(v, -128, 127)
    return bad


@parallel_kernel
def add_bytes(x, d, out):
    """out = x + d (mod 256) for bytes x: the lookup when the table is a shift of the codes."""
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in nb.prange(xf.size):
        of[i] = xf[i] + d
    return out


class Quantize(Kernel):
    kind = "QUANTIZE"
    float_form = Identity

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        if y.dtype != np.int8 or y.quant is None:
            raise self.error(f"output {y.name!r} has type {y.dtype.name}, expected int8 with quantization")
        if not y.quant.scale[0] > 0:
            raise self.error(f"output {y.name!r} has scale {y.quant.scale[0]:g}, expected a positive scale")
        if tuple(y.shape) != tuple(x.shape):
            raise self.error(f"output shape {list(y.shape)} differs from the input shape {list(x.shape)}")
        self.ort = profile == ONNXRUNTIME  # MLAS QuantizeLinear (onnxruntime.quantize_linear)
        self.tail = None  # xnnpack: (how many last elements of each input, their table) in TFLM's form
        if x.dtype == np.uint8 or x.dtype == np.int8:
            if x.quant is None:
                raise self.error(f"input {x.name!r} has no quantization parameters")
            if self.ort:  # DequantizeLinear then QuantizeLinear, per input code
                self.requant, self.code_offset = (), None
                codes = np.arange(256, dtype=np.uint8).view(x.dtype).astype(np.int64)
                real = np.float32(x.quant.scale[0]) * (codes - x.zero_point).astype(np.float32)
                self.table = ort.quantize_linear(real, y.quant.scale[0], y.zero_point).astype(np.int8)
                return
            self.requant = requantization_multiplier(
                np.float64(x.quant.scale[0]) / np.float64(y.quant.scale[0])
            )
            # An 8-bit input has 256 possible values: requantize each once, then eval is a lookup
            # indexed by the input's byte.
            codes = np.arange(256, dtype=np.uint8).view(x.dtype).astype(np.int64)
            self.table = np.clip(
                mbqm_array(codes - x.zero_point, *self.requant) + y.zero_point, -128, 127
            ).astype(np.int8)
            if profile == XNNPACK:
                self.table = self.xnnpack_table(codes - x.zero_point)
            # The usual input QUANTIZE (uint8 to int8 of the same scale) only shifts every code by one
            # constant, with no clamping: eval is then a vector add instead of a gather.
            steps = self.table - codes
            self.code_offset = np.uint8(steps[0] % 256) if np.all(steps == steps[0]) else None
        elif x.dtype == np.float32:
            self.requant = None
        else:
            raise self.error(f"input {x.name!r} has type {x.dtype.name}, expected float32, uint8 or int8")

    def xnnpack_table(self, centred: np.ndarray) -> np.ndarray:
        """The xnnpack profile's table of an 8-bit input (xnnpack.py): XNNPACK's qs8-vcvt where the
        delegate takes the op, else LiteRT's builtin NEON form, whose last size % 16 elements keep
        TFLM's table (self.tail)."""
        x, y = self.inputs[0], self.outputs[0]
        if xnn.delegates_requantize(x, y):
            return xnn.requantize_codes(centred, x, y)
        neon = np.clip(xnn.neon_multiply(centred, *self.requant) + y.zero_point, -128, 127).astype(np.int8)
        leftover = int(np.prod(x.shape, dtype=np.int64)) % 16  # LiteRT invokes a batch-1 tensor
        if leftover and not np.array_equal(neon, self.table):
            self.tail = (leftover, self.table)
        return neon

    @property
    def elementwise(self) -> bool:
        # An 8-bit input's table; not the xnnpack tail, which depends on the element's position.
        return self.requant is not None and self.tail is None

    def workspace_bytes(self, n: int) -> int:
        return (
            n * 8 * int(np.prod(self.outputs[0].shape[1:], dtype=np.int64))
        )  # float64 / int64 intermediates

    def __call__(self, x):
        y = self.outputs[0]
        if self.requant is not None and self.tail is not None:
            out = lookup(self.table, np.ascontiguousarray(x).view(np.uint8), np.empty(x.shape, dtype=np.int8))
            count, table = self.tail
            flat, codes = out.reshape(len(x), -1), np.ascontiguousarray(x).view(np.uint8).reshape(len(x), -1)
            flat[:, -count:] = table[codes[:, -count:]]
            return out
        if self.requant is not None and self.code_offset is not None:
            return add_bytes(
                np.ascontiguousarray(x).view(np.uint8), self.code_offset, np.empty(x.shape, dtype=np.uint8)
            ).view(np.int8)
        if self.requant is not None:
            return lookup(
                self.table, np.ascontiguousarray(x).view(np.uint8), np.empty(x.shape, dtype=np.int8)
            )
        scale = np.float32(y.quant.scale[0])
        if self.ort:
            return ort.quantize_linear(x, scale, y.zero_point).astype(np.int8)
        if self.profile == XNNPACK:  # f32-qs8-vcvt: defined for every float32 value
            return xnn.quantize_f32(x, scale, y.zero_point)
        out = np.empty(x.shape, dtype=np.int8)
        if affine_quantize(np.ascontiguousarray(x, dtype=np.float32), scale, np.int64(y.zero_point), out):
            name = self.inputs[0].name
            if not np.all(np.isfinite(x)):
                raise NpusimError(
                    f"op {self.op.index} (QUANTIZE): input {name!r} holds NaN or infinite values"
                )
            with np.errstate(over="ignore"):
                r = np.abs(x.astype(np.float32) / scale)
            raise self.error(
                f"input {name!r} holds {float(x.reshape(-1)[np.argmax(r)]):g}, out of range for scale "
                f"{float(scale):g} (|value / scale| must stay below 2^31)"
            )
        return out


class Dequantize(Kernel):
    kind = "DEQUANTIZE"
    float_form = Identity

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        if x.dtype not in (np.int8, np.uint8, np.int16) or x.quant is None:
            raise self.error(f"input {x.name!r} has type {x.dtype.name}, expected quantized int8")
        if y.dtype != np.float32 or tuple(y.shape) != tuple(x.shape):
            raise self.error(
                f"output {y.name!r} is {y.dtype.name} {list(y.shape)}, expected float32 {list(x.shape)}"
            )

    def workspace_bytes(self, n: int) -> int:
        return (
            n * 8 * int(np.prod(self.outputs[0].shape[1:], dtype=np.int64))
        )  # int64 / float64 intermediates

    def __call__(self, x):
        t = self.inputs[0]
        # Dequantize: static_cast<float>(scale * (val - zero_point)), scale held as double.
        return (np.float64(t.quant.scale[0]) * (x.astype(np.int64) - t.zero_point)).astype(np.float32)
