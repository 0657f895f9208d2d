"""Reading an .onnx file with the `onnx` package: the ModelProto, its constants as numpy arrays, its
nodes in a checked execution order.

Hostile files stop here with one line: a truncated or damaged protobuf, a file that is not ONNX, a
graph with a cycle or a value read before anything produces it, an initializer that is missing or
larger than the model may hold, a shape beyond the allocation limit.
"""

from __future__ import annotations

import heapq

import numpy as np

from ...errors import NpusimError, first_line
from .. import limits

# Nodes in one graph: a large detector has a few thousand; the cap bounds the time on a hostile file.
MAX_NODES = 100_000


def looks_like_onnx(data: bytes) -> bool:
    """A serialized ModelProto starts with a field of tag 1..20 (ir_version is written first by every
    exporter): a cheap test that tells it from a TFLite flatbuffer (whose bytes 4..8 read 'TFL3')."""
    return (
        len(data) >= 2
        and data[0] in (0x08, 0x12, 0x1A, 0x22, 0x2A, 0x32, 0x3A, 0x42)
        and data[4:8] != b"TFL3"
    )


def parse(data: bytes, where: str):
    """The ModelProto of the serialized bytes. Raises NpusimError on anything that is not one."""
    import onnx  # lazily: importing npusim stays cheap
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(bytes(data))
    except (DecodeError, RuntimeError, ValueError, TypeError) as e:
        detail = first_line(e)
        raise NpusimError(
            f"{where}: not a valid ONNX protobuf, file truncated or damaged ({detail})"
        ) from None
    except Exception as e:  # the protobuf runtime raises its own types on some damage
        raise NpusimError(f"{where}: not a valid ONNX protobuf ({type(e).__name__})") from None
    if not model.HasField("graph") or not model.graph.node:
        raise NpusimError(f"{where}: ONNX model has no graph or no nodes")
    if len(model.graph.node) > MAX_NODES:
        raise NpusimError(f"{where}: ONNX graph has {len(model.graph.node)} nodes, more than {MAX_NODES}")
    if any(f.type == onnx.AttributeProto.GRAPH for n in model.graph.node for f in n.attribute):
        bad = next(
            n for n in model.graph.node if any(f.type == onnx.AttributeProto.GRAPH for f in n.attribute)
        )
        raise NpusimError(f"{node_name(bad)}: control flow (a subgraph attribute) is not supported")
    return model


def node_name(node, index: int | None = None) -> str:
    label = node.name or (f"#{index}" if index is not None else (node.output[0] if node.output else "?"))
    return f"node {label!r} ({node.op_type})"


def opset(model) -> int:
    return max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [1])


def tensor_array(proto, where: str) -> np.ndarray:
    """An initializer or Constant value as numpy, sizes checked before anything is allocated."""
    from onnx import TensorProto, numpy_helper

    if proto.data_location == TensorProto.EXTERNAL:
        raise NpusimError(
            f"{where}: initializer {proto.name!r} keeps its data in an external file, not supported"
        )
    dims = [int(d) for d in proto.dims]
    if len(dims) <= limits.MAX_RANK and all(d >= 0 for d in dims):
        from .validity import check_data_size

        check_data_size(proto, where)
    if len(dims) > limits.MAX_RANK or any(d < 0 for d in dims):
        raise NpusimError(
            f"{where}: initializer {proto.name!r} has shape {dims}, expected at most "
            f"{limits.MAX_RANK} non-negative axes"
        )
    if int(np.prod(dims, dtype=np.float64)) * 8 > limits.MAX_TENSOR_BYTES:
        raise NpusimError(
            f"{where}: initializer {proto.name!r} of shape {dims} is larger than the limit of "
            f"{limits.MAX_TENSOR_BYTES} bytes"
        )
    try:
        array = numpy_helper.to_array(proto)
    except Exception as e:
        detail = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise NpusimError(f"{where}: initializer {proto.name!r} cannot be read ({detail})") from None
    if array.dtype.name in ("int4", "uint4"):  # ml_dtypes' 4-bit types: the values, one per int8
        array = array.astype(np.int8 if array.dtype.name == "int4" else np.uint8)
    if tuple(array.shape) != tuple(dims):
        raise NpusimError(
            f"{where}: initializer {proto.name!r} holds {array.size} values, its shape "
            f"{dims} needs {int(np.prod(dims))}"
        )
    return array


def execution_order(model, where: str) -> list:
    """The nodes in an order where each reads only graph inputs, initializers or values of earlier
    nodes (Kahn's algorithm, so a cycle is found rather than followed forever)."""
    g = model.graph
    available = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    producer = {}
    for k, node in enumerate(g.node):
        for o in node.output:
            if o in producer or o in available and o:
                raise NpusimError(f"{where}: {node_name(node, k)} writes {o!r}, which is already defined")
            if o:
                producer[o] = k
    waiting = [0] * len(g.node)
    readers: dict = {}
    for k, node in enumerate(g.node):
        for i in set(node.input):
            if i in available:
                continue
            if i not in producer:
                raise NpusimError(
                    f"{where}: {node_name(node, k)} reads {i!r}, which no node, input or initializer defines"
                )
            waiting[k] += 1
            readers.setdefault(i, []).append(k)
    ready = [k for k in range(len(g.node)) if waiting[k] == 0]
    heapq.heapify(ready)  # the file's order wherever it is already a valid one
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(g.node[k])
        for o in g.node[k].output:
            for r in readers.get(o, []):
                waiting[r] -= 1
                if waiting[r] == 0:
                    heapq.heappush(ready, r)
    if len(order) != len(g.node):
        stuck = next(k for k in range(len(g.node)) if waiting[k] > 0)
        raise NpusimError(f"{where}: the graph has a cycle through {node_name(g.node[stuck], stuck)}")
    for o in g.output:
        if o.name not in producer and o.name not in available:
            raise NpusimError(f"{where}: graph output {o.name!r} is never produced")
    return order


def check_shape(shape, name: str, where: str, itemsize: int = 4) -> tuple:
    """A declared activation shape: a dynamic leading axis is the batch (1 in the graph), any other
    unknown axis is refused, and the size is bounded before anything is allocated."""
    if len(shape) > limits.MAX_RANK:
        raise NpusimError(
            f"{where}: value {name!r} has {len(shape)} axes, at most {limits.MAX_RANK} are supported"
        )
    shape = tuple(1 if (k == 0 and d <= 0) else d for k, d in enumerate(shape))
    if any(d < 0 for d in shape):
        raise NpusimError(
            f"{where}: value {name!r} has shape {list(shape)} with an unknown axis, expected static shapes"
        )
    if int(np.prod(shape, dtype=np.float64)) * itemsize > limits.MAX_TENSOR_BYTES:
        raise NpusimError(
            f"{where}: value {name!r} of shape {list(shape)} needs more than the limit "
            f"of {limits.MAX_TENSOR_BYTES} bytes"
        )
    return shape


def bind_inputs(data: bytes, values: dict, where: str = "model") -> bytes:
    """The model with the graph inputs named in `values` made initializers of those values: a scale,
    zero point or weight a file leaves to run time (ONNX's conformance cases feed them as inputs)
    fixed at load, as an NPU compiler fixes them. Each value must have the input's element type and
    declared shape."""
    from onnx import helper, numpy_helper

    model = parse(data, where)
    inputs = {i.name: i for i in model.graph.input}
    for name, value in values.items():
        if name not in inputs:
            raise NpusimError(f"{where}: no graph input {name!r} to bind")
        value = np.asarray(value)
        tt = inputs[name].type.tensor_type
        declared = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if helper.np_dtype_to_tensor_dtype(value.dtype) != tt.elem_type or (
            tt.HasField("shape")
            and any(d not in (-1, v) for d, v in zip(declared, value.shape))
            or tt.HasField("shape")
            and len(declared) != value.ndim
        ):
            raise NpusimError(
                f"{where}: value for graph input {name!r} is {value.dtype.name} {list(value.shape)}, "
                f"expected {helper.tensor_dtype_to_np_dtype(tt.elem_type).name} {declared}"
            )
        model.graph.initializer.append(numpy_helper.from_array(value, name))
        model.graph.input.remove(inputs[name])
    return model.SerializeToString()
