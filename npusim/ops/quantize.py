"""QUANTIZE (float32, uint8 or int8 -> int8 or uint8) and DEQUANTIZE (int8 -> float32) at the graph
edges (TFLM micro/kernels/quantize_common.cc, dequantize_common.cc).

A uint8 output is the int8 computation at zero point - 128, shifted by 128 (every clamp and rounding
the same: TFLite's Requantize int8 -> uint8). Per-axis parameters (ONNX's QuantizeLinear of a float
graph input, DequantizeLinear of an integer one) run the per-tensor arithmetic channel by channel
(TFLite's PerChannelQuantize / PerChannelDequantize); no kernel between them takes per-axis
activations, so they occur only at the graph's inputs and outputs."""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..kernels.elementwise import add_bytes, affine_quantize
from ..kernels.lookup import lookup
from ..kernels.requant import requantization_multiplier
from ..profiles import onnxruntime as ort
from ..profiles import profile_of
from ..profiles import xnnpack as xnn
from ..quant import mbqm_array
from .base import Kernel
from .float_form import Identity


class Quantize(Kernel):
    kind = "QUANTIZE"
    float_form = Identity

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        if y.dtype not in (np.int8, np.uint8) or y.quant is None:
            raise self.error(
                f"output {y.name!r} has type {y.dtype.name}, expected int8 or uint8 with quantization"
            )
        if not np.all(y.quant.scale > 0):
            raise self.error(f"output {y.name!r} has scale {y.quant.scale[0]:g}, expected a positive scale")
        if tuple(y.shape) != tuple(x.shape):
            raise self.error(f"output shape {list(y.shape)} differs from the input shape {list(x.shape)}")
        self.ort = profile_of(profile).ort_qlinear  # MLAS QuantizeLinear (onnxruntime.quantize_linear)
        self.tail = None  # xnnpack: (how many last elements of each input, their table) in TFLM's form
        self.shift = 128 if y.dtype == np.uint8 else 0  # uint8 output: int8 at zp - 128, then + 128
        self.y_zp = np.asarray(y.quant.zero_point, np.int64) - self.shift
        self.channels = None  # per-axis: (axis, per channel a table or (scale, zero point))
        if y.quant.per_channel or (x.quant is not None and x.quant.per_channel):
            self.requant, self.code_offset = None, None
            self.channels = self.per_axis(x, y)
            return
        if x.dtype == np.uint8 or x.dtype == np.int8:
            if x.quant is None:
                raise self.error(f"input {x.name!r} has no quantization parameters")
            self.table = self.code_table(x.quant.scale[0], x.zero_point, y.quant.scale[0], int(self.y_zp[0]))
            if self.ort:
                self.requant, self.code_offset = (), None
                return
            self.requant = requantization_multiplier(
                np.float64(x.quant.scale[0]) / np.float64(y.quant.scale[0])
            )
            codes = np.arange(256, dtype=np.uint8).view(x.dtype).astype(np.int64)
            if profile_of(profile).xnnpack_delegate:
                self.table = self.xnnpack_table(codes - x.zero_point)
            # The usual input QUANTIZE (uint8 to int8 of the same scale) only shifts every code by one
            # constant, with no clamping: eval is then a vector add instead of a gather.
            steps = self.table - codes
            self.code_offset = np.uint8(steps[0] % 256) if np.all(steps == steps[0]) else None
        elif x.dtype == np.float32:
            self.requant = None
        else:
            raise self.error(f"input {x.name!r} has type {x.dtype.name}, expected float32, uint8 or int8")

    def code_table(self, x_scale, x_zp, y_scale, y_zp) -> np.ndarray:
        """The int8 output of each of the 256 input codes (an 8-bit input has only those): TFLM's
        requantization, or under onnxruntime DequantizeLinear then QuantizeLinear."""
        codes = np.arange(256, dtype=np.uint8).view(self.inputs[0].dtype).astype(np.int64)
        if self.ort:
            real = np.float32(x_scale) * (codes - x_zp).astype(np.float32)
            return ort.quantize_linear(real, y_scale, y_zp).astype(np.int8)
        requant = requantization_multiplier(np.float64(x_scale) / np.float64(y_scale))
        return np.clip(mbqm_array(codes - x_zp, *requant) + y_zp, -128, 127).astype(np.int8)

    def per_axis(self, x, y):
        """(axis, one table or (scale, zero point) per channel) of per-axis parameters."""
        q = y.quant if y.quant.per_channel else x.quant
        axis = int(q.axis)
        if profile_of(self.profile).xnnpack_delegate or axis == 0 or not 0 < axis < len(x.shape):
            raise self.error(f"per-axis parameters along axis {axis} are not supported here")
        n = int(x.shape[axis])

        def each(v, dtype):
            v = np.asarray(v, dtype).ravel()
            if v.size not in (1, n):
                raise self.error(f"{v.size} quantization parameters for {n} channels on axis {axis}")
            return np.broadcast_to(v, (n,))

        ys, yz = each(y.quant.scale, np.float32), each(self.y_zp, np.int64)
        if x.dtype == np.float32:
            return axis, [(ys[c], yz[c]) for c in range(n)]
        if x.quant is None:
            raise self.error(f"input {x.name!r} has no quantization parameters")
        xs, xz = each(x.quant.scale, np.float32), each(x.quant.zero_point, np.int64)
        return axis, [self.code_table(xs[c], xz[c], ys[c], yz[c]) for c in range(n)]

    def run_per_axis(self, x):
        axis, channels = self.channels
        out = np.empty(x.shape, dtype=np.int8)
        xm, om = np.moveaxis(x, axis, 0), np.moveaxis(out, axis, 0)
        for c, params in enumerate(channels):
            if isinstance(params, np.ndarray):  # an 8-bit input's table
                om[c] = params[np.ascontiguousarray(xm[c]).view(np.uint8)]
            else:
                om[c] = self.from_float(np.ascontiguousarray(xm[c]), *params)
        return out

    def xnnpack_table(self, centred: np.ndarray) -> np.ndarray:
        """The xnnpack profile's table of an 8-bit input (xnnpack.py): XNNPACK's qs8-vcvt where the
        delegate takes the op, else LiteRT's builtin NEON form, whose last size % 16 elements keep
        TFLM's table (self.tail)."""
        x, y = self.inputs[0], self.outputs[0]
        if xnn.delegates_requantize(x, y):
            return xnn.requantize_codes(centred, x, y, int(self.y_zp[0]))
        neon = np.clip(xnn.neon_multiply(centred, *self.requant) + int(self.y_zp[0]), -128, 127).astype(
            np.int8
        )
        leftover = int(np.prod(x.shape, dtype=np.int64)) % 16  # LiteRT invokes a batch-1 tensor
        if leftover and not np.array_equal(neon, self.table):
            self.tail = (leftover, self.table)
        return neon

    @property
    def elementwise(self) -> bool:
        # An 8-bit input's table; not the xnnpack tail, which depends on the element's position.
        return self.requant is not None and self.tail is None and not self.shift

    def workspace_bytes(self, n: int) -> int:
        return (
            n * 8 * int(np.prod(self.outputs[0].shape[1:], dtype=np.int64))
        )  # float64 / int64 intermediates

    def __call__(self, x):
        out = self.run_per_axis(x) if self.channels is not None else self.run(x)
        return out.view(np.uint8) ^ np.uint8(0x80) if self.shift else out

    def run(self, x):
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
        return self.from_float(x, self.outputs[0].quant.scale[0], int(self.y_zp[0]))

    def from_float(self, x, scale, zero_point):
        scale = np.float32(scale)
        if self.ort:
            return ort.quantize_linear(x, scale, zero_point).astype(np.int8)
        if profile_of(self.profile).xnnpack_delegate:  # f32-qs8-vcvt: defined for every float32 value
            return xnn.quantize_f32(x, scale, zero_point)
        out = np.empty(x.shape, dtype=np.int8)
        if affine_quantize(np.ascontiguousarray(x, dtype=np.float32), scale, np.int64(zero_point), out):
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
        q = self.inputs[0].quant
        # Dequantize: static_cast<float>(scale * (val - zero_point)), scale held as double.
        scale, zp = np.float64(q.scale[0]), q.zero_point[0]
        if q.per_channel:  # PerChannelDequantize: along the quantized axis
            shape = [1] * x.ndim
            shape[q.axis] = q.scale.size
            scale, zp = q.scale.astype(np.float64).reshape(shape), q.zero_point.reshape(shape)
        return (scale * (x.astype(np.int64) - zp)).astype(np.float32)
