"""A float ONNX model as `npusim validate --float`'s reference for its QDQ / QOperator twin.

The float model is evaluated by ONNX's own reference implementation (`onnx.reference`, numpy, part
of the onnx package npusim reads ONNX with): the ONNX semantics of every op in float, with no
lowering of npusim's in between. Its values are matched to the int8 graph's tensors by name, as a
quantizer keeps them: ORT's quantize_static keeps each float op's output name (the QuantizeLinear
after it reads that name) and its node name. A value matches the int8 tensor the importer made of
the same name (Source.values), else of the output of the node with the same node name; what
matches neither is listed as unmatched. The graph outputs pair in order.
"""

from __future__ import annotations

import numpy as np

from ...errors import NpusimError
from .reader import parse

INTEGER_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinear", "QGemm")
QOPERATOR_SUFFIX = "_quantized"  # onnxruntime.quantization's TENSOR_NAME_QUANT_SUFFIX
ACTIVATIONS = ("Relu", "Clip")  # what a quantizer folds into a QuantizeLinear's range


def float_type(op_type: str) -> str:
    """The float op an integer ONNX node computes: QLinearConv -> Conv, QGemm -> Gemm,
    MatMulInteger -> MatMul; any other op type is itself."""
    if op_type.startswith("QLinear") and len(op_type) > 7:
        return op_type[7:]
    if op_type == "QGemm":
        return "Gemm"
    if op_type.endswith("Integer") and len(op_type) > 7:
        return op_type[:-7]
    return op_type


class OnnxFloatReference:
    """run_all(x) gives {int8 tensor index: the float model's value, in that tensor's layout}."""

    def __init__(self, data: bytes, int8, where: str = "--float"):
        from onnx import helper

        model = parse(data, where)
        g = model.graph
        if any(n.op_type.startswith(INTEGER_OPS) or n.op_type.endswith("Integer") for n in g.node):
            raise NpusimError(f"{where}: the model computes in integers, expected a float32 model")
        source = int8.source
        initializers = {t.name for t in g.initializer}
        inputs = [i for i in g.input if i.name not in initializers]
        if len(inputs) != 1 or inputs[0].type.tensor_type.elem_type != 1:
            raise NpusimError(f"{where}: expected one float32 graph input, found {len(inputs)}")
        declared = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim]
        x = int8.input(0)
        if tuple(declared[1:]) != tuple(x.shape[1:]):
            raise NpusimError(
                f"the model pair does not correspond: input is {list(x.shape[1:])} per sample in the int8 "
                f"model, {declared[1:]} in the float one"
            )
        if len(g.output) != len(int8.outputs):
            raise NpusimError(
                f"the model pair does not correspond: {len(int8.outputs)} and {len(g.output)} outputs"
            )
        self.input_name = inputs[0].name
        self.matched: dict = {}  # float value name -> (int8 tensor, perm)
        readers: dict = {}
        for node in g.node:
            for i in set(node.input):
                readers.setdefault(i, []).append(node)
        self._match_names(g, source, {t for op in int8.ops for t in op.outputs})
        for o in list(self.matched):
            self.matched[self._folded_into(o, readers)] = self.matched.pop(o)
        self._match_topology(g, source, int8, initializers, readers)
        self.clamps = self._clamps(g)
        self.unmatched = _unmatched(g, self.matched, initializers)  # (node index, op type)
        self.outputs = [o.name for o in g.output]
        extra = [n for n in self.matched if n not in self.outputs]
        model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in extra)
        self.names = self.outputs + extra
        self.int8 = int8
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(model)

    def _match_names(self, g, source, produced: set):
        """By value name (as is, or with the suffix ORT's QOperator quantizer gives the integer
        value of a float one), else by node name (the twin node's output at the same position)."""
        by_node = {n.name: n for n in source.model.graph.node if n.name}
        for node in g.node:
            for o in node.output:
                name = next((n for n in (o, o + QOPERATOR_SUFFIX) if n in source.values), None)
                twin = by_node.get(node.name)
                if name is None and twin is not None and len(twin.output) == len(node.output):
                    name = twin.output[list(node.output).index(o)]
                    name = name if name in source.values else None
                if name is not None and source.values[name][0] in produced:
                    self.matched[o] = source.values[name]

    def _match_topology(self, g, source, int8, initializers: set, readers: dict):
        """What names leave: a float node matches the int8 file's node of its op type (an integer
        node's float_type) that reads the same int8 tensors (QuantizeLinear / DequantizeLinear
        between them followed back to their source), a folded Relu or Clip taking the match."""
        producer = {t: op for op in int8.ops for t in op.outputs}

        def root(t):
            while t in producer and producer[t].kind == "QUANTIZE":
                t = producer[t].inputs[0]
            return t

        skip = object()  # a constant operand: not part of the key

        def key(node, lookup):
            ins = [lookup(i) for i in node.input if i and i not in initializers]
            ins = [i for i in ins if i is not skip]
            return (float_type(node.op_type), tuple(ins)) if ins and None not in ins else None

        twins: dict = {}
        constants = {t.name for t in source.model.graph.initializer}
        for node in source.model.graph.node:
            if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                k = key(
                    node,
                    lambda i: skip if i in constants or i not in source.values else root(source.values[i][0]),
                )
                if k is not None and all(o in source.values for o in node.output):
                    twins.setdefault(k, node)
        graph_inputs = {i.name for i in g.input}
        taken = {t for t, _ in self.matched.values()}
        for node in g.node:
            if any(o in self.matched for o in node.output):
                continue
            k = key(
                node,
                lambda i: (
                    root(source.values[i][0])
                    if i in graph_inputs and i in source.values
                    else root(self.matched[i][0])
                    if i in self.matched
                    else None
                ),
            )
            twin = twins.get(k) if k is not None else None
            if twin is None or len(twin.output) != len(node.output):
                continue
            for o, t in zip(node.output, twin.output):
                value = source.values[t]
                if value[0] in taken:
                    continue
                self.matched[self._folded_into(o, readers)] = value
                taken.add(value[0])

    def _folded_into(self, o: str, readers: dict) -> str:
        """Where a match of value o belongs: its one reader's output when that reader is an
        unmatched Relu or Clip, which the quantizer folded into the QuantizeLinear (ORT's QOperator
        output keeps the name of the value before it), so the int8 tensor holds its values."""
        rs = readers.get(o, [])
        if len(rs) == 1 and rs[0].op_type in ACTIVATIONS and rs[0].output[0] not in self.matched:
            return rs[0].output[0]
        return o

    def _clamps(self, g) -> dict:
        """{int8 tensor: (low, high)} where the matched float value is a Relu's or a Clip's output:
        the int8 op writes that activation only as its output range, so its float form (the
        layer's local reference) must clamp as the float model does, or the clamp counts as error."""
        constants = {t.name: t for t in g.initializer}
        clamps = {}
        for node in g.node:
            if node.op_type not in ACTIVATIONS or node.output[0] not in self.matched:
                continue
            bounds = _bounds(node, constants)
            if bounds is not None:
                clamps[self.matched[node.output[0]][0]] = bounds
        return clamps

    def mapping(self) -> dict:
        """{int8 tensor: int8 tensor} for the tensors run_all gives (validate's mapping)."""
        return {t: t for t, _ in self.matched.values()}

    def run_all(self, x: np.ndarray) -> dict:
        """The float model on x (float32 [N, ...], one sample at a time, as a model declaring batch 1
        may reshape to it), keyed by the int8 graph's tensors; graph outputs by the int8 outputs."""
        runs = [
            self.evaluator.run(self.names, {self.input_name: np.ascontiguousarray(x[i : i + 1], np.float32)})
            for i in range(x.shape[0])
        ]
        values = {name: np.concatenate([r[k] for r in runs]) for k, name in enumerate(self.names)}
        out = {}
        for name, (t, perm) in self.matched.items():
            out[t] = np.ascontiguousarray(values[name].transpose(perm)).astype(np.float32)
        for t, name in zip(self.int8.outputs, self.outputs):
            out[t] = values[name].astype(np.float32)
        return out


def _unmatched(g, matched: dict, initializers: set) -> list:
    """(node index, op type) of the float nodes no int8 tensor matches; a node whose one reader is
    matched and reads only it (a Conv before the Relu a quantizer folded into its QuantizeLinear) is
    part of that reader's layer."""
    readers: dict = {}
    for node in g.node:
        for i in set(node.input):
            readers.setdefault(i, []).append(node)
    matched_nodes = {id(n) for n in g.node if any(o in matched for o in n.output)}

    def folded(node) -> bool:
        rs = [r for o in node.output for r in readers.get(o, [])]
        return (
            len(rs) == 1
            and id(rs[0]) in matched_nodes
            and [i for i in rs[0].input if i not in initializers] == list(node.output)
        )

    return [(k, n.op_type) for k, n in enumerate(g.node) if id(n) not in matched_nodes and not folded(n)]


def _bounds(node, constants: dict):
    """(low, high) of a Relu or a Clip (its min and max inputs, constants, or the attributes of
    opset 6); None where a bound is not a constant."""
    from onnx import numpy_helper

    if node.op_type == "Relu":
        return (0.0, np.inf)
    attrs = {a.name: a.f for a in node.attribute}
    bounds = [attrs.get("min", -np.inf), attrs.get("max", np.inf)]
    for k, name in enumerate(node.input[1:3]):
        if not name:
            continue
        if name not in constants:
            return None
        bounds[k] = float(numpy_helper.to_array(constants[name]).reshape(()))
    return (float(bounds[0]), float(bounds[1]))
