"""Reading and writing .tflite flatbuffers: the only module that knows the file format.

The schema is the one ai-edge-litert ships (schema_py_generated, with the object API), so the
reader follows the format as LiteRT maintains it rather than a private copy.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from ..errors import NpusimError, first_line
from ..graph import Graph, Op, Quantization, Source, Tensor
from . import limits

# Tables in one file (tensors, operators, buffers, quantization and options tables, ...). A large
# vision model has a few thousand; the cap bounds the time spent on a hostile file to seconds.
MAX_TABLES = 100_000

_OP_NAMES = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
_TYPE_NAMES = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
_DTYPES = {
    schema.TensorType.FLOAT32: np.float32,
    schema.TensorType.FLOAT16: np.float16,  # float models' half-precision weights (DEQUANTIZE)
    schema.TensorType.INT32: np.int32,
    schema.TensorType.UINT8: np.uint8,
    schema.TensorType.INT64: np.int64,
    schema.TensorType.INT8: np.int8,
    schema.TensorType.INT16: np.int16,
    schema.TensorType.BOOL: np.bool_,
}
_PADDINGS = {v: k for k, v in vars(schema.Padding).items() if not k.startswith("_")}
_ACTIVATIONS = {v: k for k, v in vars(schema.ActivationFunctionType).items() if not k.startswith("_")}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _options(op_t) -> dict:
    """Builtin options as a plain dict with snake_case keys and enum names for padding/activation."""
    if op_t.builtinOptions is None:
        return {}
    out = {}
    for key, value in vars(op_t.builtinOptions).items():
        key = _snake(key)
        if key == "padding":
            value = _PADDINGS.get(value, value)
        elif key == "fused_activation_function":
            value = _ACTIVATIONS.get(value, value)
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        out[key] = value
    return out


def _quantization(t, dtype: np.dtype) -> Quantization | None:
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) == 0:
        return None
    scale = np.asarray(q.scale, dtype=np.float32).ravel()
    zp = np.asarray(q.zeroPoint if q.zeroPoint is not None else np.zeros(scale.size), dtype=np.int64).ravel()
    if zp.size == 1 and scale.size > 1:
        zp = np.zeros(scale.size, dtype=np.int64) + zp[0]
    if zp.size != scale.size:
        raise NpusimError(
            f"tensor {_name(t)!r}: {scale.size} scales but {zp.size} "
            "zero points, expected one zero point per scale"
        )
    if not np.all(np.isfinite(scale)) or np.any(scale < 0):
        raise NpusimError(f"tensor {_name(t)!r}: quantization scale is negative or not finite")
    if dtype.kind in "iu" and dtype.itemsize <= 2:
        info = np.iinfo(dtype)
        if np.any(zp < info.min) or np.any(zp > info.max):
            raise NpusimError(
                f"tensor {_name(t)!r}: zero point {int(zp[(zp < info.min) | (zp > info.max)][0])} is outside "
                f"the range of {dtype.name}"
            )
    return Quantization(scale=scale, zero_point=zp, axis=int(q.quantizedDimension))


def _name(t) -> str:
    n = t.name
    return n.decode("utf-8", "replace") if isinstance(n, (bytes, bytearray)) else str(n or "")


# Union fields of the schema and the enum that names each member's table.
_UNIONS = {
    "builtinOptions": schema.BuiltinOptions,
    "builtinOptions2": schema.BuiltinOptions2,
    "details": schema.QuantizationDetails,
    "arraySegments": schema.SparseIndexVector,
    "arrayIndices": schema.SparseIndexVector,
}
_UNION_TABLES = {
    enum: {
        code: getattr(schema, name)
        for name, code in vars(enum).items()
        if not name.startswith("_") and isinstance(getattr(schema, name, None), type)
    }
    for enum in set(_UNIONS.values())
}
_FIELDS: dict = {}


def _fields(reader: type) -> list[tuple[str, str]]:
    """(accessor, kind) of every field of a schema table, from the object API class that unpacks it:
    'numbers' (a scalar vector, unpacked as a view), 'tables' (a vector of tables), 'union',
    'scalar' (a number or flag: the object API's default is one), or 'value' (a string or a
    table)."""
    if reader not in _FIELDS:
        fields = []
        for attr, default in vars(getattr(schema, reader.__name__ + "T")()).items():
            name = attr[0].upper() + attr[1:]
            if isinstance(default, (bool, int, float)):
                fields.append((name, "scalar"))
            elif hasattr(reader, name + "AsNumpy"):
                fields.append((name, "numbers"))
            elif hasattr(reader, name + "Length"):
                fields.append((name, "tables"))
            elif attr in _UNIONS:
                fields.append((name, "union"))
            else:
                fields.append((name, "value"))
        _FIELDS[reader] = fields
    return _FIELDS[reader]


def check_structure(data: bytearray, where: str):
    """Walk every table, vector and string that unpacking the file will visit, within a budget.

    The Python flatbuffers package has no verifier, and unpacking follows offsets blindly: a file whose
    offsets point many times at the same table (a vector of 3000 references to one subgraph that
    holds 3000 references to one tensor) makes a 24 KB file unpack into 9 million objects. A file
    written by a converter is a tree, so everything reachable fits in the file once; the walk stops
    at twice the file size (plus slack for shared strings), or at MAX_TABLES tables, before anything
    is expanded. Offsets and lengths that lead outside the file raise from the accessors.
    """
    budget = 2 * len(data) + (1 << 16)
    tables = 0

    def spend(nbytes: int):
        nonlocal budget
        budget -= nbytes
        if budget < 0:
            raise NpusimError(
                f"{where}: malformed flatbuffer: its offsets reach the same data over and over "
                f"(more than twice the file's {len(data)} bytes), refusing to unpack it"
            )

    def walk(table):
        nonlocal tables
        tables += 1
        if tables > MAX_TABLES:
            raise NpusimError(
                f"{where}: model has more than {MAX_TABLES} flatbuffer tables, refusing to unpack it"
            )
        spend(4)
        for name, kind in _fields(type(table)):
            if kind == "numbers":
                values = getattr(table, name + "AsNumpy")()  # a view; raises past the end of the file
                if isinstance(values, np.ndarray):
                    spend(4 + values.nbytes)
            elif kind == "tables":
                n = getattr(table, name + "Length")()
                if 4 * n > len(data):
                    raise NpusimError(
                        f"{where}: malformed flatbuffer: vector of {n} tables is longer than the file"
                    )
                spend(4 + 4 * n)
                get = getattr(table, name)
                for i in range(n):
                    item = get(i)
                    if isinstance(item, bytes):  # a vector of strings (none in today's schema)
                        spend(len(item))
                    else:
                        walk(item)
            elif kind == "union":
                member = getattr(table, name)()
                reader = _UNION_TABLES[_UNIONS[name[0].lower() + name[1:]]].get(
                    getattr(table, name + "Type")()
                )
                if member is not None and reader is not None:
                    obj = reader()
                    obj.Init(member.Bytes, member.Pos)
                    walk(obj)
            elif kind == "value":  # a scalar expands nothing: the unpacking reads it (and fails on it)
                value = getattr(table, name)()
                if isinstance(value, bytes):
                    spend(4 + len(value))
                elif hasattr(value, "_tab"):
                    walk(value)

    walk(schema.Model.GetRootAs(data, 0))


def load_model(source) -> Graph:
    """Read a .tflite file (path or bytes) into a Graph. Every defect ends in NpusimError."""
    if isinstance(source, (str, Path)):
        try:
            data = Path(source).read_bytes()
        except OSError as e:
            raise NpusimError(f"{source}: cannot read model file ({e.strerror})") from None
        where = str(source)
    else:
        data, where = bytes(source), "model"
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise NpusimError(f"{where}: not a TFLite flatbuffer (missing 'TFL3' identifier)")
    try:
        buf = bytearray(data)
        check_structure(buf, where)
        model = _read(buf)
    except NpusimError:
        raise
    except Exception as e:  # flatbuffers raises whatever the damaged offsets lead to
        raise NpusimError(f"{where}: malformed flatbuffer, {_damage(e, len(data))}") from None
    try:
        return _to_graph(model, where, Source(format="tflite", model=buf))
    except NpusimError:
        raise
    except Exception as e:
        raise NpusimError(f"{where}: malformed model ({type(e).__name__}: {e})") from None


def _damage(e: Exception, size: int) -> str:
    """What a flatbuffer read that failed says of the file: an offset past the end (struct's
    "unpack_from requires a buffer of at least N bytes") is a truncated file, named with both sizes."""
    import struct

    need = re.search(r"at least (\d+) bytes", str(e)) if isinstance(e, struct.error) else None
    if need:
        return (
            f"file truncated or damaged: an offset reaches byte {int(need.group(1)):,} of a "
            f"{size:,}-byte file, expected a complete .tflite"
        )
    return f"file truncated or damaged ({first_line(e)})"


def _unpack(data: bytearray, where: str):
    """The file's whole object tree (ModelT), unpacked afresh on each write; reading a model needs a
    fraction of that tree (_read). It reads fields that loading did not (the file's version, other
    subgraphs, signatures...): a damaged one ends here, in NpusimError."""
    try:
        return schema.ModelT.InitFromPackedBuf(data, 0)
    except Exception as e:  # flatbuffers raises whatever the damaged offsets lead to
        detail = first_line(e)
        raise NpusimError(f"{where}: malformed flatbuffer, cannot write the model back ({detail})") from None


def _vector(table, field: str):
    """A vector of numbers of a schema table as a numpy view, None where the file has none: what the
    object API's unpacking holds in that field."""
    return None if getattr(table, field + "IsNone")() else getattr(table, field + "AsNumpy")()


def _read(buf: bytearray) -> SimpleNamespace:
    """The fields _to_graph reads, with the object API's names and values (ModelT, TensorT, ...),
    read through the schema's accessors: unpacking the whole object tree took longer (YOLOv8n-256:
    47 ms, against 32), and a model is read on every command-line call. Only the
    first subgraph, the one npusim runs, is read."""
    m = schema.Model.GetRootAs(buf, 0)
    subgraphs = []
    if m.SubgraphsLength():
        sg = m.Subgraphs(0)
        tensors = []
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            q = t.Quantization()
            if q is not None:
                q = SimpleNamespace(
                    scale=_vector(q, "Scale"),
                    zeroPoint=_vector(q, "ZeroPoint"),
                    quantizedDimension=q.QuantizedDimension(),
                )
            tensors.append(
                SimpleNamespace(
                    shape=_vector(t, "Shape"), type=t.Type(), buffer=t.Buffer(), name=t.Name(), quantization=q
                )
            )
        operators = []
        for j in range(sg.OperatorsLength()):
            o = sg.Operators(j)
            options = schema.BuiltinOptionsCreator(o.BuiltinOptionsType(), o.BuiltinOptions())
            operators.append(
                SimpleNamespace(
                    opcodeIndex=o.OpcodeIndex(),
                    inputs=_vector(o, "Inputs"),
                    outputs=_vector(o, "Outputs"),
                    builtinOptions=options,
                )
            )
        subgraphs.append(
            SimpleNamespace(
                tensors=tensors,
                operators=operators,
                inputs=_vector(sg, "Inputs"),
                outputs=_vector(sg, "Outputs"),
            )
        )
    buffers = []
    for k in range(m.BuffersLength()):
        b = m.Buffers(k)
        buffers.append(SimpleNamespace(data=_vector(b, "Data"), offset=b.Offset()))
    codes = []
    for k in range(m.OperatorCodesLength()):
        c = m.OperatorCodes(k)
        codes.append(
            SimpleNamespace(
                builtinCode=c.BuiltinCode(),
                deprecatedBuiltinCode=c.DeprecatedBuiltinCode(),
                customCode=c.CustomCode(),
            )
        )
    return SimpleNamespace(subgraphs=subgraphs, buffers=buffers, operatorCodes=codes)


def _to_graph(model, where: str, source: Source) -> Graph:
    if not model.subgraphs:
        raise NpusimError(f"{where}: model has no subgraph")
    sg = model.subgraphs[0]
    buffers = model.buffers or []
    tensors = []
    constant_bytes = 0
    for i, t in enumerate(sg.tensors or []):
        name = _name(t) or f"tensor_{i}"
        if t.type not in _DTYPES:
            raise NpusimError(
                f"tensor {i} ({name!r}): type {_TYPE_NAMES.get(t.type, t.type)} is not supported"
            )
        dtype = np.dtype(_DTYPES[t.type])
        shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
        if len(shape) > limits.MAX_RANK:
            raise NpusimError(
                f"tensor {i} ({name!r}): {len(shape)} dimensions, at most {limits.MAX_RANK} are supported"
            )
        if any(d < 0 for d in shape[1:]):
            raise NpusimError(f"tensor {i} ({name!r}): shape {list(shape)} has a negative dimension")
        if shape and shape[0] < 0:
            shape = (1,) + shape[1:]  # dynamic batch: the simulator supplies N itself
        size = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
        if size > limits.MAX_TENSOR_BYTES:
            raise NpusimError(
                f"tensor {i} ({name!r}): shape {list(shape)} needs "
                f"{size} bytes, more than the limit of {limits.MAX_TENSOR_BYTES}"
            )
        data = None
        if t.buffer < 0 or t.buffer >= max(len(buffers), 1) and t.buffer != 0:
            raise NpusimError(
                f"tensor {i} ({name!r}): buffer index {t.buffer} "
                f"out of range (model has {len(buffers)} buffers)"
            )
        buf = buffers[t.buffer] if t.buffer < len(buffers) else None
        if buf is not None and buf.offset > 1:
            raise NpusimError(
                f"tensor {i} ({name!r}): buffer {t.buffer} keeps its data outside the flatbuffer "
                "(offset/size, the >2 GB format), which is not supported"
            )
        if t.buffer > 0 and buf is not None and buf.data is not None and len(buf.data) > 0:
            raw = np.asarray(buf.data, dtype=np.uint8)
            if raw.size != size:
                raise NpusimError(
                    f"tensor {i} ({name!r}): buffer holds {raw.size} bytes, expected {size} for shape "
                    f"{list(shape)} {dtype.name}"
                )
            # Tensors may share a buffer and each gets its own copy: bound the sum, not just each one.
            constant_bytes += size
            if constant_bytes > limits.MAX_TENSOR_BYTES:
                raise NpusimError(
                    f"{where}: constant data exceeds the limit of "
                    f"{limits.MAX_TENSOR_BYTES} bytes at tensor {i} ({name!r})"
                )
            data = raw.view(dtype).reshape(shape).copy()
        tensors.append(Tensor(name=name, shape=shape, dtype=dtype, quant=_quantization(t, dtype), data=data))
    n = len(tensors)

    def check_indices(indices, what, optional=False):
        """Tensor indices in range; -1 (an omitted input) only where the schema allows it."""
        out = [int(k) for k in (indices if indices is not None else [])]
        for k in out:
            if k < (-1 if optional else 0) or k >= n:
                raise NpusimError(f"{what}: tensor index {k} out of range (subgraph has {n} tensors)")
        return out

    codes = model.operatorCodes or []
    ops = []
    for j, op_t in enumerate(sg.operators or []):
        if op_t.opcodeIndex < 0 or op_t.opcodeIndex >= len(codes):
            raise NpusimError(
                f"op {j}: opcode index {op_t.opcodeIndex} out of range ({len(codes)} operator codes)"
            )
        code = codes[op_t.opcodeIndex]
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        kind = _OP_NAMES.get(builtin, f"BUILTIN_{builtin}")
        if kind == "CUSTOM":
            cc = code.customCode
            kind = "CUSTOM:" + (cc.decode("utf-8", "replace") if isinstance(cc, bytes) else str(cc))
        ops.append(
            Op(
                kind=kind,
                inputs=check_indices(op_t.inputs, f"op {j} ({kind}) inputs", optional=True),
                outputs=check_indices(op_t.outputs, f"op {j} ({kind}) outputs"),
                options=_options(op_t),
                index=j,
            )
        )
    inputs = check_indices(sg.inputs, "subgraph inputs")
    outputs = check_indices(sg.outputs, "subgraph outputs")
    if not inputs or not outputs:
        raise NpusimError(f"{where}: subgraph declares no inputs or no outputs")
    return Graph(tensors=tensors, ops=ops, inputs=inputs, outputs=outputs, source=source, origin=where)


def write_model(graph: Graph) -> bytes:
    """Serialize the graph, with its current constant data, back into .tflite bytes.

    The file's own object tree is reused, so quantization parameters, options, metadata and
    everything the simulator does not model are written back untouched.
    """
    if graph.source.model is None:
        raise NpusimError("graph has no source model to write back")
    model = _unpack(graph.source.model, graph.origin)  # afresh: the graph stays reusable and writable again
    sg = model.subgraphs[0]
    _sync_ops(sg, graph)
    _append_new(model, sg, graph)
    users: dict[int, int] = {}
    for t in sg.tensors:
        users[t.buffer] = users.get(t.buffer, 0) + 1
    for t_obj, tensor in zip(sg.tensors, graph.tensors):
        _sync_metadata(t_obj, tensor)
        if tensor.data is None:
            continue
        raw = np.frombuffer(np.ascontiguousarray(tensor.data, dtype=tensor.dtype).tobytes(), dtype=np.uint8)
        old = model.buffers[t_obj.buffer].data
        if old is not None and np.array_equal(np.asarray(old, dtype=np.uint8), raw):
            continue
        if users[t_obj.buffer] > 1:  # a shared buffer: give this tensor its own copy
            users[t_obj.buffer] -= 1
            model.buffers.append(schema.BufferT())
            t_obj.buffer = len(model.buffers) - 1
            users[t_obj.buffer] = 1
        model.buffers[t_obj.buffer].data = raw.copy()
        model.buffers[t_obj.buffer].offset = 0
        model.buffers[t_obj.buffer].size = 0
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _sync_ops(sg, graph: Graph):
    """The file's ops as the graph holds them (op.index: the position in the file): option edits, the
    operands of an op a fresh head rewired (a bias ADD taken into its FULLY_CONNECTED, zo/head.py),
    and the file's ops the graph dropped (that ADD) removed."""
    kept = []
    for op in graph.ops:
        if op.index < len(sg.operators):
            op_t = sg.operators[op.index]
            _sync_options(op_t, op)
            if list(np.asarray(op_t.inputs).tolist()) != op.inputs:
                op_t.inputs = np.asarray(op.inputs, dtype=np.int32)
            if list(np.asarray(op_t.outputs).tolist()) != op.outputs:
                op_t.outputs = np.asarray(op.outputs, dtype=np.int32)
            kept.append(op_t)
    sg.operators[: len(sg.operators)] = kept


def _append_new(model, sg, graph: Graph):
    """Tensors and ops added to the graph after reading (an appended classifier head) become new
    file tables; the subgraph's outputs follow the graph's. Nothing is ever removed."""
    codes = {v: k for k, v in _DTYPES.items()}
    for tensor in graph.tensors[len(sg.tensors) :]:
        t_obj = schema.TensorT()
        t_obj.name, t_obj.type = tensor.name, codes[np.dtype(tensor.dtype).type]
        t_obj.shape = np.asarray(tensor.shape, dtype=np.int32)
        model.buffers.append(schema.BufferT())
        t_obj.buffer = len(model.buffers) - 1
        sg.tensors.append(t_obj)
    for op in graph.ops[len(sg.operators) :]:
        op_t = schema.OperatorT()
        op_t.opcodeIndex = _opcode_index(model, op.kind)
        op_t.inputs = np.asarray(op.inputs, dtype=np.int32)
        op_t.outputs = np.asarray(op.outputs, dtype=np.int32)
        table = "".join(part.title() for part in op.kind.split("_")) + "Options"
        op_t.builtinOptionsType = getattr(schema.BuiltinOptions, table)
        op_t.builtinOptions = getattr(schema, table + "T")()
        _set_options(op_t, op.options)
        sg.operators.append(op_t)
    if list(np.asarray(sg.outputs if sg.outputs is not None else []).tolist()) != list(graph.outputs):
        sg.outputs = np.asarray(graph.outputs, dtype=np.int32)
        # LiteRT's signature runner reads the outputs from the signature, not the subgraph.
        for signature in model.signatureDefs or []:
            if signature.subgraphIndex == 0:
                signature.outputs = []
                for k, t in enumerate(graph.outputs):
                    entry = schema.TensorMapT()
                    entry.name, entry.tensorIndex = "logits" if len(graph.outputs) == 1 else f"output_{k}", t
                    signature.outputs.append(entry)


def _set_options(op_t, options: dict):
    """Builtin options from the graph's plain dict (the inverse of _options)."""
    for key, value in options.items():
        if key == "padding":
            value = getattr(schema.Padding, value)
        elif key == "fused_activation_function":
            value = getattr(schema.ActivationFunctionType, value)
        setattr(op_t.builtinOptions, re.sub(r"_(.)", lambda m: m.group(1).upper(), key), value)


def _sync_options(op_t, op: Op):
    """Carry option edits (a fresh head's activation, a reshape of its logits) into the file's op."""
    if op_t.builtinOptions is None:
        return
    current = _options(op_t)
    changed = {k: v for k, v in op.options.items() if k in current and current[k] != v}
    if changed:
        _set_options(op_t, changed)


def _opcode_index(model, kind: str) -> int:
    builtin = getattr(schema.BuiltinOperator, kind)
    for i, code in enumerate(model.operatorCodes):
        if max(int(code.builtinCode), int(code.deprecatedBuiltinCode)) == builtin:
            return i
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), 1
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _sync_metadata(t_obj, tensor: Tensor):
    """Carry shape and quantization edits (a replaced classifier head) into the file's tensor."""
    shape = np.asarray(t_obj.shape if t_obj.shape is not None else [], dtype=np.int64)
    if tuple(shape.tolist()) != tuple(tensor.shape) and not np.any(shape < 0):
        t_obj.shape = np.asarray(tensor.shape, dtype=np.int32)
        t_obj.shapeSignature = None
    if tensor.quant is None:
        return
    q = t_obj.quantization
    if (
        q is None
        or q.scale is None
        or not np.array_equal(np.asarray(q.scale, dtype=np.float32), tensor.quant.scale)
        or not np.array_equal(
            np.asarray(q.zeroPoint if q.zeroPoint is not None else [], dtype=np.int64),
            tensor.quant.zero_point,
        )
    ):
        q = q or schema.QuantizationParametersT()
        q.scale = tensor.quant.scale.astype(np.float32).tolist()
        q.zeroPoint = tensor.quant.zero_point.astype(np.int64).tolist()
        q.quantizedDimension = tensor.quant.axis
        q.min = q.max = None
        t_obj.quantization = q
