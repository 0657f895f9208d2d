"""QUANTIZE (float32 or uint8 -> int8) and DEQUANTIZE (int8 -> float32) at the graph edges
(TFLM micro/kernels/quantize_common.cc, dequantize_common.cc)."""
from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..quant import mbqm_array
from .base import Kernel
from .requant import requantization_multiplier


class Quantize(Kernel):
    kind = "QUANTIZE"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        if y.dtype != np.int8 or y.quant is None:
            raise self.error(f"output {y.name!r} has type {y.dtype.name}, expected int8 with quantization")
        if not y.quant.scale[0] > 0:
            raise self.error(f"output {y.name!r} has scale {y.quant.scale[0]:g}, expected a positive scale")
        if tuple(y.shape) != tuple(x.shape):
            raise self.error(f"output shape {list(y.shape)} differs from the input shape {list(x.shape)}")
        if x.dtype == np.uint8 or x.dtype == np.int8:
            if x.quant is None:
                raise self.error(f"input {x.name!r} has no quantization parameters")
            self.requant = requantization_multiplier(np.float64(x.quant.scale[0]) / np.float64(y.quant.scale[0]))
            # An 8-bit input has 256 possible values: requantize each once, then eval is a lookup.
            self.low = int(np.iinfo(x.dtype).min)
            codes = np.arange(self.low, self.low + 256, dtype=np.int64)
            self.table = np.clip(mbqm_array(codes - x.zero_point, *self.requant) + y.zero_point, -128, 127).astype(np.int8)
        elif x.dtype == np.float32:
            self.requant = None
        else:
            raise self.error(f"input {x.name!r} has type {x.dtype.name}, expected float32, uint8 or int8")

    def workspace_bytes(self, n: int) -> int:
        return n * 8 * int(np.prod(self.outputs[0].shape[1:], dtype=np.int64))  # float64 / int64 intermediates

    def __call__(self, x):
        y = self.outputs[0]
        if self.requant is None:
            if not np.all(np.isfinite(x)):
                raise NpusimError(f"op {self.op.index} (QUANTIZE): input {self.inputs[0].name!r} holds NaN or infinite values")
            # AffineQuantize: TfLiteRound(val / scale) + zero_point with a float32 division: in
            # double, 3.85f / 0.1f lands just below 38.5 and would round the other way.
            with np.errstate(over="ignore"):  # an overflow to inf is refused just below
                r = (x.astype(np.float32) / np.float32(y.quant.scale[0])).astype(np.float64)
            # Values beyond the int8 range saturate, as in TFLM; beyond int32, TFLM's
            # static_cast<int32_t> is undefined (x86 and Arm disagree), so there is no answer to give.
            if np.any(np.abs(r) >= 2.0**31):
                big = float(x.reshape(-1)[np.argmax(np.abs(r).reshape(-1))])
                raise self.error(f"input {self.inputs[0].name!r} holds {big:g}, out of range for scale "
                                 f"{float(y.quant.scale[0]):g} (|value / scale| must stay below 2^31)")
            q = np.sign(r) * np.floor(np.abs(r) + 0.5) + y.zero_point
        else:
            return self.table[x.astype(np.intp) - self.low]
        return np.clip(q, -128, 127).astype(np.int8)


class Dequantize(Kernel):
    kind = "DEQUANTIZE"

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        if x.dtype not in (np.int8, np.uint8, np.int16) or x.quant is None:
            raise self.error(f"input {x.name!r} has type {x.dtype.name}, expected quantized int8")
        if y.dtype != np.float32 or tuple(y.shape) != tuple(x.shape):
            raise self.error(f"output {y.name!r} is {y.dtype.name} {list(y.shape)}, expected float32 {list(x.shape)}")

    def workspace_bytes(self, n: int) -> int:
        return n * 8 * int(np.prod(self.outputs[0].shape[1:], dtype=np.int64))  # int64 / float64 intermediates

    def __call__(self, x):
        t = self.inputs[0]
        # Dequantize: static_cast<float>(scale * (val - zero_point)), scale held as double.
        return (np.float64(t.quant.scale[0]) * (x.astype(np.int64) - t.zero_point)).astype(np.float32)
