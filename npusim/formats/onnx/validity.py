"""Whether an ONNX file is a valid model at all, before anything is lowered: what ONNX Runtime
refuses, npusim refuses too, in one line.

`onnx.checker` with its full check (strict shape and type inference) finds most of it: duplicate
names (an initializer given twice, which ORT resolves one way and a reader could resolve the
other), ops or opsets it has no schema for, attributes its inference rejects (strides or
dilations of 0, an axis outside the tensor's rank), operands whose types a schema binds together
(a DequantizeLinear of int4 codes with a uint4 zero point), an IR version beyond the checker's.

ORT refuses more than the checker; npusim's own limits cover what it met (tests/test_fuzz_onnx.py):
- initializer data whose size does not match its shape and type (an int8 tensor relabelled int4,
  int4 raw_data one byte long): `check_data_size`, called where every constant is read;
- an ai.onnx opset newer than the installed onnx knows, a com.microsoft opset other than 1;
- nodes of domains ORT has no kernels in (`DOMAINS`).

The checker asks one thing ORT does not: a shape on every graph input and output. ORT runs a model
whose output declares only its type (tools built on onnx.helper write them), so such a value is
given the shape ONNX's own inference finds for it before the check, and nothing else changes.
"""

from __future__ import annotations

import numpy as np

from ...errors import NpusimError

# Domains with kernels in ONNX Runtime's CPU provider; a node of any other domain makes ORT refuse.
DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")

# Element types whose values pack two to a byte (int4, uint4, float4e2m1).
PACKED_4BIT = (21, 22, 23)


def check_model(model, data: bytes, where: str, order: list) -> None:
    """Raise NpusimError (one line) if onnx.checker or npusim's own limits refuse the model. order:
    the nodes in an execution order (reader.execution_order), which the checker is given if the
    file's own is not one (ORT sorts the nodes itself; the checker asks the file to)."""
    import onnx

    _check_opsets(model, where)
    for node in model.graph.node:
        if node.domain not in DOMAINS:
            raise NpusimError(
                f"{where}: node {node.name or node.op_type!r} ({node.op_type}) is of domain "
                f"{node.domain!r}, which ONNX Runtime has no kernels for; expected one of {DOMAINS}"
            )
    target = _with_io_shapes(model, order) or data
    try:
        onnx.checker.check_model(target, full_check=True)
    except Exception as e:  # ValidationError, InferenceError and the C++ binding's own types
        detail = " ".join(str(e).split())[:240] or type(e).__name__
        raise NpusimError(f"{where}: the ONNX checker refuses the model: {detail}") from None


def _check_opsets(model, where: str) -> None:
    import onnx

    newest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version > newest:
            raise NpusimError(
                f"{where}: opset {o.version} of ai.onnx is newer than the {newest} the installed onnx "
                "knows (ONNX Runtime refuses it too)"
            )
        if o.domain == "com.microsoft" and o.version != 1:
            raise NpusimError(
                f"{where}: opset {o.version} of com.microsoft, expected 1 (the only one ONNX Runtime has)"
            )


def _with_io_shapes(model, order: list):
    """A copy with its nodes in execution order whose shapeless graph inputs and outputs carry the
    shapes ONNX inference gives them, or None when the file is checked as it is."""
    import onnx

    def shapeless(vi):
        return vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")

    g = model.graph
    sorted_ = all(a is b for a, b in zip(order, g.node))
    if sorted_ and not any(shapeless(vi) for vi in list(g.input) + list(g.output)):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if not sorted_:
        del copy.graph.node[:]
        copy.graph.node.extend(order)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy)  # lenient: the strict pass is the checker's
        known = {vi.name: vi for vi in list(inferred.graph.input) + list(inferred.graph.output)}
    except Exception:
        known = {}
    for vi in list(copy.graph.input) + list(copy.graph.output):
        if not shapeless(vi):
            continue
        found = known.get(vi.name)
        if found is not None and found.type.tensor_type.HasField("shape"):
            vi.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)
        else:  # inference does not know it either (after an op onnx has no schema for), so the
            # strict pass will not compare it with anything: an empty shape satisfies the rule
            vi.type.tensor_type.shape.SetInParent()
    return copy


def check_data_size(proto, where: str) -> None:
    """An initializer's (or Constant's) stored data holds exactly as many values as its shape and
    element type say, as ORT checks when it reads one (an int8 tensor relabelled int4 holds twice
    the bytes; an int4 tensor's raw_data of one byte holds two values)."""
    from onnx import TensorProto, helper

    n = int(np.prod([int(d) for d in proto.dims], dtype=np.float64))
    packed = proto.data_type in PACKED_4BIT
    if proto.data_type == TensorProto.STRING:
        return
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(proto.data_type)).itemsize
    except Exception:
        raise NpusimError(
            f"{where}: initializer {proto.name!r} has element type {proto.data_type}, "
            "which ONNX does not define"
        ) from None
    if proto.raw_data:
        expected, held, unit = ((n + 1) // 2 if packed else n * itemsize), len(proto.raw_data), "bytes"
    else:
        field = {
            TensorProto.FLOAT: "float_data",
            TensorProto.DOUBLE: "double_data",
            TensorProto.INT64: "int64_data",
            TensorProto.UINT32: "uint64_data",
            TensorProto.UINT64: "uint64_data",
            TensorProto.COMPLEX64: "float_data",
            TensorProto.COMPLEX128: "double_data",
        }.get(proto.data_type, "int32_data")
        per_value = 2 if proto.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128) else 1
        expected, held, unit = ((n + 1) // 2 if packed else n * per_value), len(getattr(proto, field)), field
    if held != expected:
        kind = helper.tensor_dtype_to_string(proto.data_type).split(".")[-1].lower()
        raise NpusimError(
            f"{where}: initializer {proto.name!r} ({kind}, shape "
            f"{list(proto.dims)}) holds {held} {unit}, its shape and type need {expected}"
        )
