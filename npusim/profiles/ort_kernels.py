"""Which kernel runs each op under the onnxruntime profile (quant.ONNXRUNTIME), its kernel table
OrtKernels (Profile.table): the op's own kernel where it already follows ORT's arithmetic (KINDS),
an exact model of ORT's kernel where one is written here, else the float op on dequantized values
and ORT's QuantizeLinear (FloatThenQuantize: what ORT does for an unfused DequantizeLinear -> op ->
QuantizeLinear group, and with its optimizations off for every group). The arithmetic itself is in
onnxruntime.py.
"""

from __future__ import annotations

import numpy as np

from .. import registry
from ..errors import NpusimError
from ..graph import Graph, Quantization
from ..kernels.lookup import lookup
from ..ops.base import Kernel
from ..ops.float_form import real_value
from . import Kernels, ort_literal
from . import onnxruntime as ort

_F32 = np.float32

# The kinds whose own kernel follows ORT under this profile (registry ORT_OWN): the MAC ops (exact
# sums, MlasRequantizeOutput), ADD, MUL, LOGISTIC, LEAKY_RELU, QUANTIZE and DEQUANTIZE
# (onnxruntime.py), and the ops that only move or select codes, exact in every runtime. The
# registry's ORT_MODEL kinds are AVERAGE_POOL_2D and MEAN (the classes below), the others ORT_FLOAT.
KINDS = registry.kinds(onnxruntime=registry.ORT_OWN)


class Plan:
    """The ops of an imported ONNX graph that round once where the Graph shows two roundings: the
    importer's record Graph.source.single_rounding (QUANTIZE op -> the op it requantizes), written
    where TFLite's kernel fixes an op's output quantization (LOGISTIC and SOFTMAX at 1/256 and -128,
    AVERAGE_POOL_2D and RESIZE_BILINEAR at their input's) and the ONNX node, whose QuantizeLinear rounds
    the float result once, has no such QUANTIZE. The op then quantizes straight to that QUANTIZE's
    output quantization and the QUANTIZE passes its codes on (the intermediate tensor holds codes of
    the final quantization, not of its own). A .tflite graph records none: both roundings are the
    model's."""

    def __init__(self, graph: Graph):
        self.out_quant: dict[int, Quantization] = {}  # producer op index -> quantization it rounds to
        self.pass_through: set[int] = set()  # the QUANTIZE ops that then only pass codes on
        for q, p in graph.source.single_rounding.items():
            self.out_quant[p] = graph.tensors[graph.ops[q].outputs[0]].quant
            self.pass_through.add(q)


class FloatThenQuantize(Kernel):
    """DequantizeLinear of each input, the float op (the kernel's float_form), ORT's QuantizeLinear
    of each int8 output. ORT's float kernels (MLAS) may round a last bit differently from the float
    form, so this is ORT within one output step where a result lands next to a rounding tie."""

    required_inputs, max_inputs, num_outputs = 0, None, None

    def __init__(self, kernel_class, op, graph, profile, out_quant: Quantization | None = None):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        self.form = kernel_class.float_form(op, graph)
        self.out_quants = [out_quant or t.quant for t in self.outputs]
        for t, q in zip(self.outputs, self.out_quants):
            if t.dtype == np.int8 and (q is None or q.per_channel):
                raise self.error(f"output {t.name!r} is not quantized per tensor, expected int8 per-tensor")

    def workspace_bytes(self, n: int) -> int:
        """The float32 copies of the inputs and outputs (the float form's own temporaries aside)."""
        tensors = [t for t in self.inputs + self.outputs if t is not None]
        return 4 * n * sum(int(np.prod(t.shape[1:], dtype=np.int64)) for t in tensors)

    def quantize(self, y, t, q) -> np.ndarray:
        return ort.quantize_linear(y, q.scale[0], int(q.zero_point[0])).astype(np.int8)

    def __call__(self, *inputs):
        reals = [x if t is None else real_value(t, x) for x, t in zip(inputs, self.inputs)]
        ys = self.form(*reals)
        ys = ys if isinstance(ys, tuple) else (ys,)
        out = tuple(
            self.quantize(y, t, q) if t.dtype == np.int8 else y
            for y, t, q in zip(ys, self.outputs, self.out_quants)
        )
        return out if len(out) > 1 else out[0]


class QLinearAveragePool(FloatThenQuantize):
    """AVERAGE_POOL_2D as QLinearAveragePool (contrib_ops/cpu/quantization/qlinear_pool.cc): each
    tap dequantized in float32, summed row by row in float32 (the float form's order), divided by
    the count of taps inside the image, then quantize_value: nearbyintf(y / y_scale + y_zp), the
    zero point added in float before the rounding (not MlasQuantizeLinear), saturated."""

    def quantize(self, y, t, q) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            v = (np.asarray(y, np.float32) / _F32(q.scale[0])).astype(np.float32) + _F32(q.zero_point[0])
        return np.clip(np.rint(v), -128, 127).astype(np.int8)


class QLinearGlobalAveragePool(Kernel):
    """MEAN over H and W of an NHWC int8 tensor as QLinearGlobalAveragePool (mlas/lib/qlgavgpool.cpp,
    x86): the exact int32 sum of the codes minus x_zp * N, times float32 x_scale / (y_scale * N),
    rounded half to even (MlasRequantizeOutput), + y_zp, saturated."""

    required_inputs, max_inputs = 2, 2

    def __init__(self, op, graph, profile):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        self.require_int8(x, y)
        self.count = int(x.shape[1]) * int(x.shape[2])
        self.scale = _F32(_F32(x.scale) / _F32(_F32(y.scale) * _F32(self.count)))
        self.out_shape = tuple(y.shape[1:])

    @staticmethod
    def applies(op, graph) -> bool:
        """A MEAN over axes 1 and 2 (H, W) of a 4-D tensor, the lowering of GlobalAveragePool."""
        if len(op.inputs) != 2 or op.inputs[1] < 0:
            return False
        x, axes = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        if axes.data is None or len(x.shape) != 4:
            return False
        return sorted({int(a) % 4 for a in np.asarray(axes.data).ravel()}) == [1, 2]

    def __call__(self, x, axes=None):
        x, y = np.asarray(x), self.outputs[0]
        acc = x.astype(np.int64).sum(axis=(1, 2)) - self.inputs[0].zero_point * self.count
        v = np.rint(acc.astype(np.float32) * self.scale)
        v = np.clip(v, -128 - y.zero_point, 127 - y.zero_point) + y.zero_point
        return v.astype(np.int8).reshape((x.shape[0],) + self.out_shape)


class SigmoidTable(Kernel):
    """LOGISTIC rounded once to another output quantization (Plan): QLinearSigmoid's table."""

    def __init__(self, op, graph, profile, out_quant: Quantization):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        x = self.inputs[0]
        self.require_int8(x)
        self.table = ort.sigmoid_table(
            x.scale, x.zero_point, out_quant.scale[0], int(out_quant.zero_point[0])
        )

    def __call__(self, x):
        return lookup(self.table, np.ascontiguousarray(x).view(np.uint8), np.empty(x.shape, dtype=np.int8))


class IntegerRescale(Kernel):
    """A MAC op lowered from ConvInteger / MatMulInteger (formats/onnx/lower_integer.py), as ORT runs the
    chain: the exact integer sum of (x - x_zp) * w (its float form on float64 copies of the codes:
    exact, every partial sum an integer below 2^53), Cast to float32, times M[c] in float32, plus
    b[c] in float32 (Mul and Add, one rounding each), then MlasQuantizeLinear. The int32 bias tensor
    of the op is the `tflm` lowering's; this kernel adds b in float, as the graph does."""

    required_inputs, max_inputs = 2, 3

    def __init__(self, kernel_class, op, graph, profile):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.require_int8(x, y)
        self.form = kernel_class.float_form(op, graph)
        r = op.options["onnx_rescale"]
        if r["op"] == "ConvInteger" and r["types"] == ("int8", "uint8"):
            # measured: ORT 1.32's ConvInteger gives sums thousands off the exact ones for this pair
            raise self.error(
                "ConvInteger of int8 inputs with uint8 weights: ONNX Runtime's CPU kernel does not compute "
                "the exact sums for this pair of types (docs/onnx.md), and npusim has no model of it"
            )
        self.scale = np.asarray(r["scale"], _F32)
        self.bias = None if r["bias"] is None else np.asarray(r["bias"], _F32)
        self.x_zp = np.float64(x.zero_point)
        self.w = w.data
        # an asymmetric filter keeps its zero points (one per output channel, axis 0): subtracted here
        zp = np.asarray(w.quant.zero_point, np.float64)
        self.w_zp = zp.reshape((-1,) + (1,) * (w.data.ndim - 1)) if zp.size > 1 else zp.reshape(())
        self.y_scale, self.y_zp = y.quant.scale[0], int(y.quant.zero_point[0])

    def macs(self) -> int:
        out = self.outputs[0].shape
        return int(np.prod(out[1:], dtype=np.int64)) * (self.w.size // out[-1])

    def __call__(self, x, w=None, b=None, shared=False):
        acc = self.form(
            np.asarray(x, np.float64) - self.x_zp,
            np.asarray(self.w if w is None else w, np.float64) - self.w_zp,
        )
        v = acc.astype(_F32) * self.scale  # Cast (int32 -> float32, nearest), then Mul
        if self.bias is not None:
            v = v + self.bias  # Add, float32
        return ort.quantize_linear(v, self.y_scale, self.y_zp).astype(np.int8)


class PassThrough(Kernel):
    """A QUANTIZE whose rounding its producer already did (Plan): the codes pass on unchanged."""

    def __init__(self, op, graph, profile):
        self.kind = op.kind
        super().__init__(op, graph, profile)

    def __call__(self, x):
        return x


class OrtKernels(Kernels):
    """The onnxruntime profile's kernels for one graph (see the module docstring): its Plan, found
    once, and the kernel of each op."""

    def __init__(self, profile, graph: Graph):
        super().__init__(profile, graph)
        self.plan = Plan(graph)

    def kernel_for(self, kernel_class, op, **extra) -> Kernel:
        graph, profile, plan = self.graph, self.profile, self.plan
        out_quant = plan.out_quant.get(op.index)
        if "onnx_rescale" in op.options:
            return IntegerRescale(kernel_class, op, graph, profile)
        if op.index in plan.pass_through:
            return PassThrough(op, graph, profile)
        if ort_literal.applies(op, graph):  # a float op between Q/DQ: ORT_DISABLE_ALL's float kernel
            return _literal(op, graph, profile, out_quant)
        if op.kind == "LOGISTIC" and out_quant is not None:
            return SigmoidTable(op, graph, profile, out_quant)
        if op.kind in KINDS:
            return super().kernel_for(kernel_class, op, **extra)
        if op.kind == "AVERAGE_POOL_2D":
            return QLinearAveragePool(kernel_class, op, graph, profile, out_quant)
        if op.kind == "MEAN" and QLinearGlobalAveragePool.applies(op, graph):
            return QLinearGlobalAveragePool(op, graph, profile)
        if getattr(kernel_class, "float_form", None) is None:
            raise NpusimError(
                f"op {op.index} ({op.kind}): --profile onnxruntime has no model of ONNX Runtime's {op.kind}"
            )
        return FloatThenQuantize(kernel_class, op, graph, profile, out_quant)


def _literal(op, graph, profile, out_quant) -> Kernel:
    """ORT_DISABLE_ALL's float kernel of a float op between Q/DQ (ort_literal.py)."""
    if op.kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        return ort_literal.FloatConv(op, graph, profile)
    if op.kind == "FULLY_CONNECTED":
        return ort_literal.FloatGemm(op, graph, profile)
    if op.kind == "BATCH_MATMUL":
        return ort_literal.FloatMatMul(op, graph, profile)
    if op.kind == "MEAN":
        return ort_literal.FloatGlobalAveragePool(op, graph, profile)
    if op.kind == "RESIZE_BILINEAR":
        return ort_literal.FloatResize(op, graph, profile, out_quant)
    return ort_literal.FloatBinary(op, graph, profile)
