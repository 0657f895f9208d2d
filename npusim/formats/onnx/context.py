"""The state of one lowering: the Graph being built, what each ONNX value has become, and the layout
of every activation.

Layout (docs/onnx.md): every value keeps its logical (declared, NCHW) shape, and its tensor in the
Graph holds it in a physical layout, `perm`, with physical = logical.transpose(perm). A convolution or
pooling reads and writes NHWC (perm (0, 2, 3, 1)); element-wise ops, Concat, Split, Slice, Pad,
Softmax and ReduceMean work in whatever layout their input has (their axes remapped); an op that
depends on the element order (Reshape, Flatten, MatMul, a graph output) gets its input back in the
declared layout by a TRANSPOSE, inserted once per tensor and marked `onnx_layout` in its options.
A Transpose node changes only `perm`, and moves no data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import NpusimError
from ...graph import Graph, Op, Quantization, Tensor
from .. import limits
from .reader import node_name, opset, tensor_array

NHWC = (0, 2, 3, 1)


def identity(rank: int) -> tuple:
    return tuple(range(rank))


def inverse(perm) -> tuple:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


@dataclass
class Value:
    """An activation: graph tensor `tensor` holds it with physical = logical.transpose(perm)."""

    tensor: int
    perm: tuple


@dataclass
class Const:
    """A constant: its real value (logical layout) and, when the file stores it quantized (a
    DequantizeLinear of an initializer, a QOperator weight), the integer codes and their parameters."""

    name: str
    value: np.ndarray
    codes: np.ndarray | None = None
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    axis: int = 0
    storage: str = ""  # the initializer's element type (int8, uint8, int4, uint4, int32) when quantized
    source: str = ""  # the initializer that holds the codes (for writing trained weights back)


# ONNX TensorProto element types the importer meets as quantized storage.
ELEM_TYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    6: "int32",
    7: "int64",
    10: "float16",
    11: "float64",
    21: "uint4",
    22: "int4",
    4: "uint16",
    5: "int16",
    9: "bool",
}


class Lowering:
    """Builds the Graph node by node; the lowering functions (lower_*.py) call its methods."""

    def __init__(self, model, where: str):
        self.model = model
        self.where = where
        self.opset = opset(model)
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.env: dict = {}  # ONNX value name -> Value or Const
        self.names: set = set()
        self.transposed: dict = {}  # (tensor, perm) -> tensor: each layout change made once
        self.skip: set = set()  # ids of nodes a fused lowering has taken over
        self.weights: dict = {}  # graph tensor index -> (initializer name, how to write it back)
        # graph tensor index -> how the file stores the weights it was made from ("int4", "int8", ...),
        # for every MAC filter, written back or not (a bias refit, a folded BatchNormalization): the
        # N6 view counts 4-bit weights packed (npu/arena.constant_bytes)
        self.storage: dict = {}
        self.node = None  # the node being lowered, for messages
        # op index -> (the ONNX node it was lowered from, {input position: Const}, {input position:
        # activation layout}): ORT's literal
        # float arithmetic needs the node and its constants as the file wrote them (profiles/ort_literal.py)
        self.origin: dict = {}
        self.single_rounding: dict = {}  # Source.single_rounding: QUANTIZE op -> the op it rounds
        self.unlowered: list = []  # plan_only: the nodes npusim cannot lower (plan.py)
        self.inferred: dict | None = None  # plan_only: ONNX shape inference, once
        self.consumers: dict = {}
        for n in model.graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.graph_outputs = {o.name for o in model.graph.output}

    # -- messages --------------------------------------------------------------------------------
    def error(self, message: str, node=None) -> NpusimError:
        node = node if node is not None else self.node
        where = node_name(node) if node is not None else self.where
        return NpusimError(f"{where}: {message}")

    # -- graph building --------------------------------------------------------------------------
    def tensor(self, name, shape, dtype=np.int8, quant=None, data=None) -> int:
        size = int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
        if size > limits.MAX_TENSOR_BYTES or any(int(d) < 0 for d in shape) or len(shape) > limits.MAX_RANK:
            raise self.error(
                f"tensor {name!r} of shape {list(shape)} is larger than the limit of "
                f"{limits.MAX_TENSOR_BYTES} bytes or malformed"
            )
        base, k = name or "t", 1
        while name in self.names or not name:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        self.tensors.append(
            Tensor(
                name=name, shape=tuple(int(d) for d in shape), dtype=np.dtype(dtype), quant=quant, data=data
            )
        )
        return len(self.tensors) - 1

    def constant(self, name, array, dtype, quant=None) -> int:
        array = np.ascontiguousarray(np.asarray(array).astype(dtype))
        return self.tensor(name, array.shape, dtype, quant, array)

    def emit(self, kind: str, inputs, outputs, **options) -> Op:
        op = Op(
            kind=kind,
            inputs=[int(i) for i in inputs],
            outputs=[int(o) for o in outputs],
            options=options,
            index=len(self.ops),
        )
        self.ops.append(op)
        if self.node is not None:
            inputs = {i: self.env.get(n) for i, n in enumerate(self.node.input) if n}
            consts = {i: c for i, c in inputs.items() if isinstance(c, Const)}
            perms = {i: v.perm for i, v in inputs.items() if isinstance(v, Value)}
            self.origin[op.index] = (self.node, consts, perms)
        return op

    def quant(self, t: int) -> Quantization:
        return self.tensors[t].quant

    def shape(self, t: int) -> tuple:
        return self.tensors[t].shape

    def logical_shape(self, v: Value) -> tuple:
        phys = self.shape(v.tensor)
        out = [0] * len(phys)
        for i, p in enumerate(v.perm):
            out[p] = phys[i]
        return tuple(out)

    # -- operands --------------------------------------------------------------------------------
    def get(self, name: str):
        if name not in self.env:
            raise self.error(f"value {name!r} is not available (produced by an op that was not lowered)")
        return self.env[name]

    def activation(self, node, k: int) -> Value:
        """Input k of a node as an int8 activation (what a DequantizeLinear of one gives)."""
        if k >= len(node.input) or not node.input[k]:
            raise self.error(f"input {k} is missing", node)
        v = self.get(node.input[k])
        if isinstance(v, Const):
            raise self.error(f"input {k} ({node.input[k]!r}) is a constant, expected an activation", node)
        t = self.tensors[v.tensor]
        if t.dtype != np.int8:
            raise self.error(
                f"input {k} ({node.input[k]!r}) is {t.dtype.name}, not quantized: expected a "
                "DequantizeLinear in front of it (npusim runs integer graphs)",
                node,
            )
        if t.quant is not None and t.quant.per_channel:
            raise self.error(
                f"input {k} ({node.input[k]!r}) is quantized per axis, which only a graph input or output "
                "may be (no kernel computes on one)",
                node,
            )
        return v

    def const(self, node, k: int, required: bool = True) -> Const | None:
        if k >= len(node.input) or not node.input[k]:
            if required:
                raise self.error(f"input {k} is missing", node)
            return None
        v = self.get(node.input[k])
        if not isinstance(v, Const):
            raise self.error(
                f"input {k} ({node.input[k]!r}) is computed at run time, expected a constant", node
            )
        return v

    def initializer_storage(self, name: str) -> str:
        """The element type of the initializer called name ("int8", "uint8", ...), "" if none is."""
        for init in self.model.graph.initializer:
            if init.name == name:
                return ELEM_TYPES.get(init.data_type, "")
        return ""

    def attr(self, node, name: str, default=None):
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                v = helper.get_attribute_value(a)
                return v.decode() if isinstance(v, bytes) else v
        return default

    def load_initializers(self):
        for init in self.model.graph.initializer:
            self.env[init.name] = Const(init.name, tensor_array(init, self.where))

    # -- layout ----------------------------------------------------------------------------------
    def physical(self, v: Value, perm) -> int:
        """The tensor holding v with physical layout perm (a TRANSPOSE the first time it is asked)."""
        perm = tuple(perm)
        if tuple(v.perm) == perm:
            return v.tensor
        key = (v.tensor, perm)
        if key not in self.transposed:
            inv = inverse(v.perm)
            # physical_out = physical_in.transpose(q); q[0] != 0 moves axis 0: the TRANSPOSE
            # kernel marks it and the model runs image by image (ops/movement.py)
            q = [inv[p] for p in perm]
            src = self.tensors[v.tensor]
            shape = tuple(src.shape[i] for i in q)
            out = self.tensor(src.name + "_" + "".join(map(str, perm)), shape, src.dtype, src.quant)
            p = self.constant(src.name + "_perm", np.asarray(q), np.int32)
            self.emit("TRANSPOSE", [v.tensor, p], [out], onnx_layout=True)
            self.transposed[key] = out
        return self.transposed[key]

    def logical(self, v: Value) -> int:
        return self.physical(v, identity(len(v.perm)))

    # -- quantization ----------------------------------------------------------------------------
    def qparams(self, node, scale_k: int, zp_k: int, activation: bool = True, boundary: bool = False):
        """(Quantization, storage type) of a QuantizeLinear/DequantizeLinear or QLinear* operand pair.
        uint8 becomes int8 with the zero point shifted by -128: the same real values, the same integer
        arithmetic. boundary: a QuantizeLinear of a float graph input or a DequantizeLinear of an
        integer one, which may be per axis (the only place a per-axis activation may be: no kernel
        between them computes on one)."""
        scale = self.const(node, scale_k).value.astype(np.float32).ravel()
        zp_c = self.const(node, zp_k, required=False)
        if zp_c is not None:
            storage = zp_c.value.dtype.name
            zp = zp_c.value.astype(np.int64).ravel()
        else:
            out_type = self.attr(node, "output_dtype", 0)
            storage = ELEM_TYPES.get(out_type, "uint8") if out_type else "uint8"
            zp = np.zeros(scale.size, np.int64)
        if zp.size == 1 and scale.size > 1:
            zp = np.repeat(zp, scale.size)
        if zp.size != scale.size:
            raise self.error(f"{scale.size} scales but {zp.size} zero points")
        if not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise self.error(f"quantization scale {scale[:4].tolist()} is not positive and finite")
        if activation and storage not in ("int8", "uint8"):
            raise self.error(f"activations of type {storage} are not supported, expected int8 or uint8")
        if storage == "uint8":
            zp = zp - 128
        axis = int(self.attr(node, "axis", 1))
        if scale.size > 1 and activation and not boundary:
            raise self.error(
                "per-axis quantization of an activation is supported at graph inputs and outputs only, "
                "expected one scale"
            )
        if self.attr(node, "block_size", 0):
            raise self.error("blocked quantization (block_size) is not supported")
        offset = 128 if storage == "uint8" else 0
        return Quantization(scale=scale, zero_point=zp, axis=axis, offset=offset), storage

    def q_consumer(self, name: str):
        for c in self.consumers.get(name, []):
            if c.op_type == "QuantizeLinear" and c.input[0] == name:
                return c
        return None

    def out_quant(self, node, k: int = 0, name: str | None = None) -> Quantization:
        """The quantization of output k of a float op in a QDQ graph: that of the QuantizeLinear that
        reads it (a float op whose output no QuantizeLinear reads is not an integer layer)."""
        name = name or node.output[k]
        q = self.q_consumer(name)
        if q is None:
            raise self.error(
                f"output {name!r} is not quantized (no QuantizeLinear reads it): npusim runs integer graphs",
                node,
            )
        return self.qparams(q, 1, 2)[0]

    def requantize(self, t: int, quant: Quantization, name: str | None = None) -> int:
        """t at another scale / zero point: a QUANTIZE int8 -> int8 (TFLite's requantize) if they differ."""
        src = self.tensors[t]
        if same_quant(src.quant, quant):
            return t
        out = self.tensor((name or src.name) + "_requantized", src.shape, np.int8, quant)
        self.emit("QUANTIZE", [t], [out])
        return out

    def bind(self, node, k: int, t: int, perm, quant: Quantization | None = None, fixed: bool = False):
        """Output k of node is tensor t (layout perm), requantized to `quant` (default: that of its
        QuantizeLinear) if its own differs; ops that keep their input's scale (pooling, movement) end so.
        fixed: t's quantization is the TFLite kernel's (LOGISTIC's 1/256, an average's input scale), not
        the file's, so a QUANTIZE here is a second rounding the ONNX node does not have: it is recorded
        in Source.single_rounding (with the op that made t), for the profiles that round once."""
        if quant is None and self.q_consumer(node.output[k]) is not None:
            quant = self.out_quant(node, k)
        if quant is not None:
            out = self.requantize(t, quant, node.output[k])
            if fixed and out != t:
                maker = next(op.index for op in reversed(self.ops[:-1]) if t in op.outputs)
                self.single_rounding[self.ops[-1].index] = maker
            t = out
        self.env[node.output[k]] = Value(t, tuple(perm))

    def new_output(self, node, k: int, phys_shape, quant: Quantization | None = None) -> int:
        quant = quant if quant is not None else self.out_quant(node, k)
        return self.tensor(node.output[k], phys_shape, np.int8, quant)

    def operand(self, c: Const, rank: int, perm, name: str) -> int:
        """A constant operand of an element-wise op: broadcast to the op's rank, in its layout, as int8
        (its own codes when the file quantized it per tensor, else quantized asymmetrically on its range
        with zero, so that a constant far from zero, such as anchor points, keeps all 256 codes)."""
        value, codes = c.value, c.codes
        if codes is not None and c.scale is not None and c.scale.size == 1 and c.storage in ("int8", "uint8"):
            zp = int(c.zero_point[0]) - (128 if c.storage == "uint8" else 0)
            q = codes.astype(np.int64) - (128 if c.storage == "uint8" else 0)
            quant = Quantization(np.asarray([c.scale[0]], np.float32), np.asarray([zp], np.int64))
        else:  # a float constant: all 256 codes over its range with 0 (as TFLite quantizes a range)
            value = np.asarray(value, np.float64)
            lo = min(0.0, float(value.min())) if value.size else 0.0
            hi = max(0.0, float(value.max())) if value.size else 0.0
            scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
            zp = int(np.clip(-128 - np.round(lo / np.float64(scale)), -128, 127))
            q = np.clip(np.round(value / np.float64(scale)) + zp, -128, 127).astype(np.int64)
            quant = Quantization(np.asarray([scale], np.float32), np.asarray([zp], np.int64))
        if q.ndim > rank:
            raise self.error(f"constant {c.name!r} has rank {q.ndim}, above the activation's {rank}")
        q = q.reshape((1,) * (rank - q.ndim) + q.shape).transpose(perm)
        return self.constant(name, q, np.int8, quant)


def same_quant(a: Quantization | None, b: Quantization | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.array_equal(
        np.asarray(a.scale, np.float32), np.asarray(b.scale, np.float32)
    ) and np.array_equal(a.zero_point, b.zero_point)


def to_graph(ctx: Lowering, inputs: list, outputs: list, source) -> Graph:
    return Graph(
        tensors=ctx.tensors, ops=ctx.ops, inputs=inputs, outputs=outputs, source=source, origin=ctx.where
    )
