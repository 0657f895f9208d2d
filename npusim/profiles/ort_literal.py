"""ONNX Runtime with its optimizations off (ORT_DISABLE_ALL, "ORT-literal") on the float ops of a QDQ
graph: DequantizeLinear, the float op as ORT's CPU kernel computes it, QuantizeLinear. The onnxruntime
profile runs these kernels for the ops an ONNX file writes as float ops between DequantizeLinear and
QuantizeLinear (ort_kernels.OrtKernels); QOperator nodes (QLinearConv, QLinearAdd, ...) keep ORT's
integer kernels.

- Conv (CONV_2D, DEPTHWISE_CONV_2D): MLAS's im2col + SGEMM in its order of additions, which depends
  on the thread count (kernels/mlas_float.py), then the bias.
- Gemm, MatMul with a constant B (FULLY_CONNECTED): MLAS's SGEMM on the prepacked B.
- Add, Sub, Mul, Div (ADD, SUB, MUL): two float32 values, one operation, one rounding in
  QuantizeLinear; a constant operand is the file's own float32 value (a DequantizeLinear of an
  initializer: its dequantized value), not the int8 codes the Graph holds for the TFLite kernels.

The weights, biases and constants are read from the ONNX node's constants as the file stores them
(Lowering.origin), dequantized as ORT's DequantizeLinear does: float32(q - zero_point) * scale.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import NpusimError
from ..kernels import mlas_float
from ..kernels.elementwise import pair_lookup
from ..ops.base import Kernel
from ..ops.pairwise import every_pair
from ..quant import ONNXRUNTIME, activation_range
from . import onnxruntime as ort

_F32 = np.float32
THREADS_ENV = "NPUSIM_ORT_THREADS"


def physical_cores() -> int:
    """The host's physical cores among those this process may run on: ORT's default
    intra_op_num_threads (onnxruntime/core/util/thread_utils.cc: the physical core count)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as p, open(base + "core_id") as c:
                cores.add((p.read().strip(), c.read().strip()))
        except OSError:
            cores.add(("", str(cpu)))
    return max(1, len(cores))


def ort_threads() -> int:
    """The intra-op thread count whose MLAS order the profile follows: NPUSIM_ORT_THREADS, else ORT's
    default (physical_cores). An ORT session with intra_op_num_threads = n gives the same bits."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return physical_cores()
    if not value.isdigit() or int(value) < 1:
        raise NpusimError(f"{THREADS_ENV}={value!r}: expected a thread count of 1 or more")
    return int(value)


# ONNX op types that ORT runs in float between DequantizeLinear and QuantizeLinear, per Graph kind.
FLOAT_NODES = {
    "CONV_2D": {"Conv"},
    "DEPTHWISE_CONV_2D": {"Conv"},
    "FULLY_CONNECTED": {"Gemm", "MatMul"},
    "BATCH_MATMUL": {"MatMul"},
    "ADD": {"Add"},
    "SUB": {"Sub"},
    "MUL": {"Mul", "Div"},
    "RESIZE_BILINEAR": {"Resize"},
    "MEAN": {"GlobalAveragePool"},
}


def dequantized(c) -> np.ndarray:
    """A node's constant as ORT's DequantizeLinear gives it (its codes present), else its float32
    value: float32(q - zero_point) * scale, per axis when the scale is a vector."""
    if c.codes is None:
        return np.asarray(c.value, _F32)
    q = np.asarray(c.codes).astype(np.int64)
    scale, zp = np.asarray(c.scale, _F32), np.asarray(c.zero_point, np.int64)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[c.axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q - zp).astype(_F32) * scale


def origin(op, graph):
    """(ONNX node, {input position: Const}, {input position: activation layout}) the op was lowered
    from, or None."""
    return graph.source.origin.get(op.index)


def applies(op, graph) -> bool:
    """Whether op is an ONNX float op between Q/DQ that this module runs as ORT-literal does."""
    o = origin(op, graph)
    if o is None or o[0].op_type not in FLOAT_NODES.get(op.kind, ()):
        return False
    node, consts, _ = o
    if op.kind in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
        if 1 not in consts or node.output[0] in _normalized(graph):
            return False  # a BatchNormalization folded in: ORT runs it after the Conv, in float
        if op.kind == "CONV_2D" and _attr(node, "group", 1) != 1:
            return False  # a group of a split grouped Conv: which group is not recorded
        if node.op_type == "Gemm" and (
            _attr(node, "transA", 0) or _float_attr(node, "alpha") != 1.0 or _float_attr(node, "beta") != 1.0
        ):
            return False
        if node.op_type == "MatMul" and np.ndim(consts[1].value) != 2:
            return False
    if op.kind == "BATCH_MATMUL":  # batches of equal shapes, no transposition
        a, b, y = (graph.tensors[t] for t in (op.inputs[0], op.inputs[1], op.outputs[0]))
        adj = op.options.get("adj_x") or op.options.get("adj_y")
        return not adj and a.shape[:-2] == b.shape[:-2] == y.shape[:-2]
    return True


def _normalized(graph) -> set:
    """The ONNX values a BatchNormalization reads (the import folds it into the Conv before it)."""
    return graph.source.normalized


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return a.i if a.type == 2 else list(a.ints)
    return default


def _quantized_out(kernel, y) -> np.ndarray:
    """QuantizeLinear of the float result to the output tensor's quantization, then the fused
    activation's clamp (the Relu / Clip ORT runs in float before it: monotone, so the same codes)."""
    t = kernel.outputs[0]
    zp = int(t.quant.zero_point[0])
    q = ort.quantize_linear(y, t.quant.scale[0], zp)
    lo, hi = kernel.bounds
    return np.clip(q, lo, hi).astype(np.int8)


def _require_file_constants(kernel, w, b):
    """These kernels run the file's own float weights: weights given at run time (a trainer's
    overrides) would be ignored, so they are refused in one line instead."""
    for given, k in ((w, 1), (b, 2)):
        t = kernel.inputs[k] if k < len(kernel.inputs) else None
        if given is not None and t is not None and given is not t.data:
            raise kernel.error(
                "weights given at run time: --profile onnxruntime runs the ONNX file's own float "
                "weights for this QDQ node (ORT-literal); use --profile tflm to run other weights"
            )


class FloatConv(Kernel):
    """A QDQ Conv as ORT-literal runs it: MlasConv on the dequantized input and weights, + bias,
    MlasQuantizeLinear (the clamp of a fused Relu / Clip after it)."""

    required_inputs, max_inputs = 2, 3

    def __init__(self, op, graph, profile, threads: int | None = None):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        self.require_int8(x, y)
        node, consts, perms = origin(op, graph)
        w = dequantized(consts[1])  # [O, C / group, kh, kw], logical (OIHW)
        out_c, cg, kh, kw = w.shape
        groups = 1 if op.kind == "CONV_2D" else x.shape[-1] // cg
        filters = out_c // groups
        # [G, K, F]: K in im2col order (channel, kernel row, kernel column)
        self.wt = np.ascontiguousarray(w.reshape(groups, filters, cg * kh * kw).transpose(0, 2, 1))
        self.bias = dequantized(consts[2]).reshape(-1) if 2 in consts else np.zeros(out_c, _F32)
        o = op.options
        stride = (o.get("stride_h", 1), o.get("stride_w", 1))
        dilation = (o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1))
        oh, ow = y.shape[1], y.shape[2]
        pads = self._pads(x.shape, (kh, kw), stride, dilation, (oh, ow), o.get("padding"))
        self.geometry = np.asarray([kh, kw, *stride, *dilation, *pads], np.int64)
        # MLAS chooses its algorithm on the ONNX node's own attributes (padding included)
        onnx_pads = _attr(node, "pads", [0, 0, 0, 0])
        onnx_strides = _attr(node, "strides", [1, 1])
        pointwise = kh * kw == 1 and all(s == 1 for s in onnx_strides) and not any(onnx_pads)
        self.threads = mlas_float_threads(threads)
        self.blocks, self.filter_blocks = mlas_float.conv_blocks(
            filters, groups, oh * ow, cg * kh * kw, pointwise, self.threads
        )
        self.packed = mlas_float.packed_weights(self.wt, self.blocks, self.filter_blocks)
        zp = int(y.quant.zero_point[0])
        self.bounds = activation_range(
            o.get("fused_activation_function", "NONE"), float(y.quant.scale[0]), zp, ONNXRUNTIME
        )

    @staticmethod
    def _pads(shape, kernel, stride, dilation, out_hw, padding):
        """(top, left) padding of the Graph op (SAME, or VALID behind an explicit PAD op)."""
        if padding != "SAME":
            return (0, 0)
        pads = []
        for i in range(2):
            size = shape[1 + i]
            eff = (kernel[i] - 1) * dilation[i] + 1
            total = max(0, (out_hw[i] - 1) * stride[i] + eff - size)
            pads.append(total // 2)
        return tuple(pads)

    def macs(self) -> int:
        y = self.outputs[0].shape
        return int(np.prod(y[1:], dtype=np.int64)) * self.wt.shape[1]

    def __call__(self, x, w=None, b=None):
        _require_file_constants(self, w, b)
        x = np.ascontiguousarray(x)
        y, t = self.outputs[0], self.outputs[0].quant
        out = np.empty((x.shape[0],) + tuple(y.shape[1:]), np.int8)
        mlas_float.conv(
            x,
            self.inputs[0].quant.scale[0],
            int(self.inputs[0].quant.zero_point[0]),
            self.wt,
            self.bias,
            False,
            self.geometry,
            self.blocks,
            self.filter_blocks,
            t.scale[0],
            int(t.zero_point[0]),
            out,
            packed=self.packed,
        )
        lo, hi = self.bounds
        if lo > -128 or hi < 127:
            np.clip(out, lo, hi, out=out)
        return out


def mlas_float_threads(threads: int | None) -> int:
    return ort_threads() if threads is None else int(threads)


class FloatGemm(Kernel):
    """A QDQ Gemm or MatMul with a constant B as ORT-literal runs it: MLAS's SGEMM on the prepacked
    B (K in slices of 256), a Gemm's bias first (ORT broadcasts it into C, then beta 1), then
    MlasQuantizeLinear."""

    required_inputs, max_inputs = 2, 3

    def __init__(self, op, graph, profile, threads: int | None = None):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        x, y = self.inputs[0], self.outputs[0]
        self.require_int8(x, y)
        node, consts, perms = origin(op, graph)
        b = dequantized(consts[1])
        if node.op_type == "Gemm":
            if _attr(node, "transB", 0):
                b = b.T
        self.depth, self.n = b.shape
        self.wt = np.ascontiguousarray(b.reshape(1, self.depth, self.n))
        has_bias = 2 in consts and node.op_type == "Gemm"
        self.bias_first = has_bias
        self.bias = (
            np.broadcast_to(dequantized(consts[2]).reshape(-1), (self.n,)).astype(_F32)
            if has_bias
            else np.zeros(self.n, _F32)
        )
        self.geometry = np.asarray([1, 1, 1, 1, 1, 1, 0, 0], np.int64)
        zp = int(y.quant.zero_point[0])
        self.bounds = activation_range(
            op.options.get("fused_activation_function", "NONE"), float(y.quant.scale[0]), zp, ONNXRUNTIME
        )

    def __call__(self, x, w=None, b=None):
        _require_file_constants(self, w, b)
        x = np.ascontiguousarray(x)
        t = self.outputs[0].quant
        rows = int(np.prod(x.shape[:-1], dtype=np.int64))
        xs = x.reshape(1, 1, rows, self.depth)
        out = np.empty((1, 1, rows, self.n), np.int8)
        blocks = np.full(rows, mlas_float.PACKED_STRIDE_K, np.int64)
        mlas_float.conv(
            xs,
            self.inputs[0].quant.scale[0],
            int(self.inputs[0].quant.zero_point[0]),
            self.wt,
            self.bias,
            self.bias_first,
            self.geometry,
            blocks,
            np.zeros(self.n, np.int64),
            t.scale[0],
            int(t.zero_point[0]),
            out,
        )
        lo, hi = self.bounds
        if lo > -128 or hi < 127:
            np.clip(out, lo, hi, out=out)
        return out.reshape(x.shape[:-1] + (self.n,))


def _float_attr(node, name, default=1.0):
    for a in node.attribute:
        if a.name == name:
            return float(np.float32(a.f))
    return default


class FloatBinary(Kernel):
    """A QDQ Add, Sub, Mul or Div as ORT-literal runs it: each operand dequantized to float32 (a
    constant: the file's float32 value), the float op once, MlasQuantizeLinear. Two activations:
    a 65,536-entry table over every pair of codes."""

    required_inputs, max_inputs = 2, 2

    def __init__(self, op, graph, profile):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        node, consts, perms = origin(op, graph)
        self.onnx_op = node.op_type
        y = self.outputs[0]
        self.require_int8(y)
        self.consts = [None, None]
        for k, t in enumerate(self.inputs):
            if t.data is None:
                self.require_int8(t)
                continue
            c = consts.get(k)
            if c is None:  # a constant the import made (Neg's -1): its real value is exact
                self.consts[k] = _graph_constant(t)
            else:
                layout = perms.get(1 - k, tuple(range(len(t.shape))))  # the activation's
                self.consts[k] = _physical(dequantized(c), t.shape, layout)
        zp = int(y.quant.zero_point[0])
        self.bounds = activation_range(
            op.options.get("fused_activation_function", "NONE"), float(y.quant.scale[0]), zp, ONNXRUNTIME
        )
        self.table = None
        if self.consts[0] is None and self.consts[1] is None:
            a, b = every_pair()
            self.table = _quantized_out(self, self._op(self._real(0, a), self._real(1, b)))

    def _real(self, k, codes):
        t = self.inputs[k]
        s, zp = _F32(t.quant.scale[0]), np.int64(t.quant.zero_point[0])
        return (np.asarray(codes, np.int64) - zp).astype(_F32) * s

    def _op(self, a, b):
        with np.errstate(all="ignore"):
            if self.onnx_op == "Add":
                return (a + b).astype(_F32)
            if self.onnx_op == "Sub":
                return (a - b).astype(_F32)
            if self.onnx_op == "Mul":
                return (a * b).astype(_F32)
            return (a / b).astype(_F32)

    def __call__(self, a, b):
        if self.table is not None:  # the compiled lookup of every pair (ops/pairwise.py's)
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                a, b = np.broadcast_arrays(a, b)
            a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
            return pair_lookup(self.table, a.view(np.uint8), b.view(np.uint8), np.empty(a.shape, np.int8))
        xa = self.consts[0] if self.consts[0] is not None else self._real(0, a)
        xb = self.consts[1] if self.consts[1] is not None else self._real(1, b)
        return _quantized_out(self, self._op(xa, xb))


def _graph_constant(t) -> np.ndarray:
    q = np.asarray(t.data).astype(np.int64)
    return (q - np.int64(t.quant.zero_point[0])).astype(_F32) * _F32(t.quant.scale[0])


def _physical(value: np.ndarray, shape, perm) -> np.ndarray:
    """A constant broadcast to the rank of the Graph's operand and put in its layout, as
    Lowering.operand does with the codes."""
    rank = len(shape)
    v = value.reshape((1,) * (rank - value.ndim) + value.shape).transpose(perm)
    return np.ascontiguousarray(v.reshape(shape) if v.size == int(np.prod(shape)) else v)


def _resize_axis(in_size: int, out_size: int, scale, transform: str):
    """SetupUpsampleBilinear (onnxruntime/core/providers/cpu/tensor/upsample.h) along one axis:
    (lower index, upper index, weight of the lower dx1... as ORT names them: dx1 = |x - x1|,
    dx2 = |x - x2|), every step in float32."""
    x = np.arange(out_size, dtype=_F32)
    s = _F32(scale)
    if s == 1:
        v = x
    elif transform == "half_pixel":
        v = ((x + _F32(0.5)) / s).astype(_F32) - _F32(0.5)
    elif transform == "pytorch_half_pixel":
        v = ((x + _F32(0.5)) / s).astype(_F32) - _F32(0.5) if out_size > 1 else np.zeros_like(x)
    elif transform == "align_corners":
        v = (x * _F32(in_size - 1)).astype(_F32) / _F32(out_size - 1) if out_size > 1 else np.zeros_like(x)
    else:  # asymmetric
        v = x / s
    v = np.minimum(np.maximum(v.astype(_F32), _F32(0)), _F32(in_size - 1))
    x1 = np.minimum(v.astype(np.int64), in_size - 1)
    x2 = np.minimum(x1 + 1, in_size - 1)
    d1 = np.abs(v - x1.astype(_F32)).astype(_F32)
    d2 = np.abs(v - x2.astype(_F32)).astype(_F32)
    same = x1 == x2
    d1[same], d2[same] = _F32(0.5), _F32(0.5)
    return x1, x2, d1, d2


class FloatResize(Kernel):
    """A QDQ Resize (linear, 2-D) as ORT-literal runs it: UpsampleBilinear on the dequantized input,
    dx2 * dy2 * X11 + dx1 * dy2 * X21 + dx2 * dy1 * X12 + dx1 * dy1 * X22 in float32, left to right,
    then MlasQuantizeLinear to `out_quant` (the QUANTIZE after the TFLite op, rounded once)."""

    required_inputs, max_inputs = 1, 2

    def __init__(self, op, graph, profile, out_quant=None):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        node, consts, _ = origin(op, graph)
        x, y = self.inputs[0], self.outputs[0]
        self.require_int8(x)
        q = out_quant or y.quant
        self.y_scale, self.y_zp = q.scale[0], int(q.zero_point[0])
        transform = "half_pixel"
        for a in node.attribute:
            if a.name == "coordinate_transformation_mode":
                transform = a.s.decode()
        (h, w), (oh, ow) = x.shape[1:3], y.shape[1:3]
        if 2 in consts and np.asarray(consts[2].value).size == 4:
            sh, sw = (float(v) for v in np.asarray(consts[2].value, _F32)[2:])
        else:  # sizes: ORT's scale is output / input in float32
            sh, sw = float(_F32(oh) / _F32(h)), float(_F32(ow) / _F32(w))
        self.rows = _resize_axis(h, oh, sh, transform)
        self.cols = _resize_axis(w, ow, sw, transform)

    def __call__(self, x, size=None):
        t = self.inputs[0]
        v = (np.asarray(x).astype(np.int64) - np.int64(t.quant.zero_point[0])).astype(_F32)
        v = v * _F32(t.quant.scale[0])
        y1, y2, dy1, dy2 = (a[:, None, None] for a in self.rows)
        x1, x2, dx1, dx2 = (a[None, :, None] for a in self.cols)
        x11, x21 = v[:, y1, x1][..., 0, :], v[:, y1, x2][..., 0, :]
        x12, x22 = v[:, y2, x1][..., 0, :], v[:, y2, x2][..., 0, :]
        out = (dx2 * dy2).astype(_F32) * x11
        out = (out + (dx1 * dy2).astype(_F32) * x21).astype(_F32)
        out = (out + (dx2 * dy1).astype(_F32) * x12).astype(_F32)
        out = (out + (dx1 * dy1).astype(_F32) * x22).astype(_F32)
        return ort.quantize_linear(out, self.y_scale, self.y_zp).astype(np.int8)


class FloatMatMul(Kernel):
    """A QDQ MatMul of two activations as ORT-literal runs it: MatMul<float> calls MlasGemmBatch
    over the batch of matrices with B not prepacked (MlasSgemmOperation's K slices, its M = 1 and
    N = 1 kernels), then MlasQuantizeLinear."""

    required_inputs, max_inputs = 2, 2

    def __init__(self, op, graph, profile, threads: int | None = None):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        a, b, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.require_int8(a, b, y)
        m, k = a.shape[-2:]
        n = b.shape[-1]
        self.matrices = int(np.prod(y.shape[:-2], dtype=np.int64))  # per image (the declared batch)
        rows, cols = mlas_float.gemm_blocks(m, n, k, mlas_float_threads(threads), batch=self.matrices)
        self.blocks = rows if rows is not None else np.zeros(m, np.int64)
        self.filter_blocks = cols if cols is not None else np.zeros(n, np.int64)
        self.no_bias = np.zeros(n, _F32)
        self.geometry = np.asarray([1, 1, 1, 1, 1, 1, 0, 0], np.int64)

    def __call__(self, a, b):
        ta, tb, y = self.inputs[0], self.inputs[1], self.outputs[0]
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        a3 = np.ascontiguousarray(a).reshape(-1, m, k)
        bd = (np.asarray(b).astype(np.int64) - np.int64(tb.quant.zero_point[0])).astype(_F32)
        b3 = (bd * _F32(tb.quant.scale[0])).reshape(-1, k, n)
        out = np.empty((a3.shape[0], m, n), np.int8)
        for i in range(a3.shape[0]):
            o = out[i].reshape(1, 1, m, n)
            mlas_float.conv(
                a3[i].reshape(1, 1, m, k),
                ta.quant.scale[0],
                int(ta.quant.zero_point[0]),
                np.ascontiguousarray(b3[i].reshape(1, k, n)),
                self.no_bias,
                False,
                self.geometry,
                self.blocks,
                self.filter_blocks,
                y.quant.scale[0],
                int(y.quant.zero_point[0]),
                o,
            )
        return out.reshape(a.shape[:-2] + (m, n))


class FloatGlobalAveragePool(Kernel):
    """A QDQ GlobalAveragePool as ORT-literal runs it: MlasPoolGlobalKernel on the dequantized input,
    per channel four lane sums over the H x W values in row order (lane j takes i = j mod 4 of the
    whole fours), reduced as (l0 + l2) + (l1 + l3) (MlasReduceAddFloat32x4), the rest added one by
    one, divided by H * W in float32, then MlasQuantizeLinear."""

    required_inputs, max_inputs = 1, 2

    def __init__(self, op, graph, profile):
        self.kind = op.kind
        super().__init__(op, graph, profile)
        self.require_int8(self.inputs[0], self.outputs[0])

    def __call__(self, x, axes=None):
        t, y = self.inputs[0], self.outputs[0]
        n, h, w, c = x.shape
        v = (np.asarray(x).astype(np.int64) - np.int64(t.quant.zero_point[0])).astype(_F32)
        v = (v * _F32(t.quant.scale[0])).reshape(n, h * w, c)
        size = h * w
        body = size // 4 * 4
        lanes = np.zeros((4, n, c), _F32)
        for i in range(0, body, 4):
            for j in range(4):
                lanes[j] = lanes[j] + v[:, i + j]
        total = ((lanes[0] + lanes[2]).astype(_F32) + (lanes[1] + lanes[3]).astype(_F32)).astype(_F32)
        for i in range(body, size):
            total = (total + v[:, i]).astype(_F32)
        mean = (total / _F32(size)).astype(_F32)
        q = ort.quantize_linear(mean, y.quant.scale[0], int(y.quant.zero_point[0])).astype(np.int8)
        return q.reshape((n,) + tuple(y.shape[1:]))
