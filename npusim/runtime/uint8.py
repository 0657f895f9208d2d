"""TFLite's legacy uint8 quantization run as LiteRT runs it: the same graph with every uint8 code
shifted to int8 (code - 128, zero point - 128, Quantization.offset 128).

LiteRT's uint8 kernels (XNNPACK's qu8 operators and the builtin uint8 kernels it falls back to)
compute on differences from the zero point, (x - z_x)(w - z_w), x - max, and clamp to the type's
range, so every one of them gives its int8 twin's result on the shifted codes: the shift is
exact, and the int8 kernels of the xnnpack profile then compute what LiteRT does
(tests/test_uint8.py proves it op by op against LiteRT). A uint8 filter keeps its zero point
(shifted), which the MAC layers take as an asymmetric filter (kernels/wide.py).

The graph's uint8 inputs and outputs stay uint8: a QUANTIZE (uint8 -> int8 of the same scale, a
shift by 128) is put after each input and one (int8 -> uint8) before each output, so that a user
feeds and reads the file's codes. TFLM has no uint8 kernels, so only the xnnpack profile runs such
a model (interpreter.check_int8 refuses it under the others).
"""

from __future__ import annotations

import copy

import numpy as np

from ..graph import Graph, Op, Quantization, Tensor, legacy_uint8
from ..profiles import PROFILES
from ..registry import kinds

# The ops proven in uint8: their kernels on the shifted codes equal LiteRT's uint8 ones.
UINT8_KINDS = kinds(uint8=True)

# The option that marks the QUANTIZEs shifted() adds at the graph edges (not the file's ops: inspect
# leaves them out).
EDGE = "uint8_edge"

# The profile that runs a legacy uint8 model (LiteRT's arithmetic): the one whose Profile says so.
UINT8_PROFILE = next(name for name, p in PROFILES.items() if p.uint8)


def _shifted_quant(q: Quantization) -> Quantization:
    return Quantization(q.scale, np.asarray(q.zero_point, np.int64) - 128, q.axis, 128)


def _shifted_tensor(t: Tensor, name: str | None = None) -> Tensor:
    data = None
    if t.data is not None:
        data = (np.asarray(t.data).astype(np.int16) - 128).astype(np.int8)
    return Tensor(name or t.name, t.shape, np.dtype(np.int8), _shifted_quant(t.quant), data)


def _is_uint8(t: Tensor) -> bool:
    return t.quant is not None and np.dtype(t.dtype) == np.uint8


def unproven(graph: Graph) -> list[Op]:
    """A legacy uint8 model's ops whose kind is not proven in uint8 (the registry's uint8 field,
    tests/test_uint8.py); none for an int8 model."""
    if legacy_uint8(graph) is None:
        return []
    return [op for op in graph.ops if op.kind not in UINT8_KINDS]


def unproven_reason(op: Op) -> str:
    """The one line that refuses op in a uint8 model."""
    return (
        f"op {op.index} ({op.kind}) in a uint8 model: npusim runs uint8 models with the "
        f"{len(UINT8_KINDS)} ops proven equal to LiteRT in uint8 only ({', '.join(sorted(UINT8_KINDS))})"
    )


def shifted(graph: Graph) -> Graph:
    """The graph that computes a legacy uint8 model in int8 (module doc); an int8 model unchanged."""
    if legacy_uint8(graph) is None:
        return graph
    tensors = list(graph.tensors)
    edges = set(graph.inputs) | set(graph.outputs)
    for i, t in enumerate(tensors):
        if _is_uint8(t) and i not in edges:
            tensors[i] = _shifted_tensor(t)
    inner: dict[int, int] = {}  # {uint8 graph input or output: its int8 twin inside the graph}
    for i in sorted(edges):
        if _is_uint8(tensors[i]):
            inner[i] = len(tensors)
            tensors.append(_shifted_tensor(tensors[i], f"{tensors[i].name}/int8"))
    ops = []
    first = len(graph.ops)  # the added QUANTIZEs are numbered past the file's ops
    for i in graph.inputs:
        if i in inner:
            ops.append(Op("QUANTIZE", [i], [inner[i]], {EDGE: True}, first + len(ops)))
    for op in graph.ops:
        op = copy.copy(op)
        op.inputs = [inner.get(i, i) if i >= 0 else i for i in op.inputs]
        op.outputs = [inner.get(i, i) for i in op.outputs]
        ops.append(op)
    added = len(ops) - len(graph.ops)
    for i in graph.outputs:
        if i in inner and i not in graph.inputs:
            ops.append(Op("QUANTIZE", [inner[i]], [i], {EDGE: True}, first + added))
            added += 1
    out = copy.copy(graph)
    out.tensors, out.ops = tensors, ops
    return out
