"""Writing an imported graph back to .onnx: the file's own ModelProto with each weight and bias
initializer replaced by the graph's current codes (a trainer's updated weights), laid out back in the
file's order (OIHW, [O, 1, kh, kw], [K, N]), shifted back by the file's zero point and stored in the
file's element type (int4 / uint4 packed two per byte again). Scales, zero points, every other
node and initializer are written as read.

A fresh classifier head (zo's `--new-head`, zo/head.py) replaces the head's weights, its bias and
its logits' quantization, and may change the class count: those are written too. The weight and
bias DequantizeLinears and the logits' QuantizeLinear / DequantizeLinear get new scale and zero
point initializers (new names, so that nothing else sharing the old ones changes), the initializers
their new shapes, the graph output its class count; value_info (optional shape hints) is dropped.
"""

from __future__ import annotations

import numpy as np

from ...errors import NpusimError

_TYPES = {
    "int8": (np.int8, -128, 127),
    "uint8": (np.uint8, 0, 255),
    "int4": (np.int8, -8, 7),
    "uint4": (np.uint8, 0, 15),
    "int32": (np.int32, -(2**31), 2**31 - 1),
}


def file_layout(kind: str, data: np.ndarray) -> np.ndarray:
    """The graph's layout of a weight (lower_conv.py) back to the file's."""
    if kind == "conv":  # OHWI -> OIHW
        return data.transpose(0, 3, 1, 2)
    if kind == "depthwise":  # [1, kh, kw, O] -> [O, 1, kh, kw]
        return data[0].transpose(2, 0, 1)[:, None]
    if kind == "dense_kn":  # [N, K] -> [K, N]
        return data.T
    return data  # dense_nk, bias


def write_onnx(graph) -> bytes:
    src = graph.source
    appended = [op for op in graph.ops if op.index >= src.op_count]
    merged = _merged_head(graph)
    if (
        len(graph.tensors) < src.tensor_count
        or len(graph.ops) - len(appended) + (merged is not None) != src.op_count
        or (appended and [op.kind for op in appended] != ["FULLY_CONNECTED"])
    ):
        raise NpusimError(
            "the graph has ops added after import other than one classifier head; writing them into the "
            "ONNX graph is not supported, expected the imported graph with updated weights"
        )
    for index, data in src.rebuilt.items():
        if not np.array_equal(graph.tensors[index].data, data):
            raise NpusimError(
                f"weight {graph.tensors[index].name!r} was rebuilt at import (a folded BatchNormalization, "
                "a filter scale widened for its bias, a split group or Gemm's alpha): its trained codes "
                "cannot be written back into the file's initializer"
            )
    model = type(src.model)()
    model.CopyFrom(src.model)
    inits = {t.name: t for t in model.graph.initializer}
    requantized = _requantized(graph, model, inits)
    for index, where in src.weights.items():
        data = graph.tensors[index].data
        init = inits.get(where["init"])
        if init is None or data is None:
            continue
        codes = file_layout(where["kind"], np.asarray(data)).astype(np.int64)
        zp = np.asarray(where["zero_point"], np.int64).reshape(-1)
        if zp.size > 1:
            shape = [1] * codes.ndim
            shape[where["axis"]] = -1
            zp = zp.reshape(shape)
        if index in requantized:  # a fresh head: symmetric codes, one zero point for every class
            zp = np.full(1, int(zp.ravel()[0]) if zp.size and len(set(zp.ravel().tolist())) == 1 else -1)
            if zp[0] not in (0, 128, 8):
                raise NpusimError(f"initializer {where['init']!r}: a fresh head needs a symmetric zero point")
            _requantize_dq(model, inits, where, graph.tensors[index], int(zp[0]))
        codes = codes + (zp if zp.size > 1 else int(zp[0]) if zp.size else 0)
        storage = where["storage"]
        _, lo, hi = _TYPES[storage]
        if (
            index not in requantized
            and codes.shape != tuple(where["shape"])
            or codes.size
            and (codes.min() < lo or codes.max() > hi)
        ):
            raise NpusimError(
                f"initializer {where['init']!r}: trained codes do not fit {storage} {list(where['shape'])}"
            )
        init.CopyFrom(_codes_tensor(init.name, storage, codes))
    if merged is not None:
        _write_merged_head(graph, model, inits, merged)
    if requantized:
        _write_logits(graph, model, inits, requantized)
    if appended:
        _append_head(graph, model, inits, appended[0])
    return model.SerializeToString()


def _append_head(graph, model, inits, head):
    """A classifier head appended to a model whose output is an int8 feature vector [1, K]: DQ of the
    features, Gemm (transB) on the DequantizeLinear'd int8 weights [C, K] and int32 bias, then a
    QuantizeLinear at the logits' quantization, the new graph output (int8 logits, as npusim's)."""
    from onnx import TensorProto, helper

    src, t = graph.source, graph.tensors
    x, w, b, y = t[head.inputs[0]], t[head.inputs[1]], t[head.inputs[2]], t[head.outputs[0]]
    names = [
        n for n, (i, perm) in src.values.items() if i == head.inputs[0] and perm == tuple(range(len(perm)))
    ]
    producers = {o for n in model.graph.node if n.op_type == "QuantizeLinear" for o in n.output}
    feature = next((n for n in names if n in producers), None)
    if feature is None or len(x.shape) != 2:
        raise NpusimError(
            f"the appended head reads {x.name!r} {list(x.shape)}, expected the output of a QuantizeLinear of "
            "shape [1, K] in the file"
        )
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and feature in n.output)
    zo = "zo_head"
    w_codes = _new_init(model, inits, f"{zo}/weights", np.asarray(w.data, np.int8))
    w_scale = _new_init(model, inits, f"{zo}/weights_scale", w.quant.scale.astype(np.float32))
    w_zp = _new_init(model, inits, f"{zo}/weights_zero_point", np.zeros(w.shape[0], np.int8))
    b_codes = _new_init(model, inits, f"{zo}/bias", np.asarray(b.data, np.int32))
    b_scale = _new_init(model, inits, f"{zo}/bias_scale", b.quant.scale.astype(np.float32))
    b_zp = _new_init(model, inits, f"{zo}/bias_zero_point", np.zeros(w.shape[0], np.int32))
    y_scale = _new_init(model, inits, f"{zo}/logits_scale", np.asarray(y.quant.scale[0], np.float32))
    y_zp = _new_init(model, inits, f"{zo}/logits_zero_point", np.asarray(int(y.quant.zero_point[0]), np.int8))
    nodes = [
        helper.make_node("DequantizeLinear", [feature, q.input[1], *q.input[2:3]], [f"{zo}/features"]),
        helper.make_node("DequantizeLinear", [w_codes, w_scale, w_zp], [f"{zo}/w"], axis=0),
        helper.make_node("DequantizeLinear", [b_codes, b_scale, b_zp], [f"{zo}/b"], axis=0),
        helper.make_node("Gemm", [f"{zo}/features", f"{zo}/w", f"{zo}/b"], [f"{zo}/logits_float"], transB=1),
        helper.make_node("QuantizeLinear", [f"{zo}/logits_float", y_scale, y_zp], [f"{zo}/logits"]),
    ]
    model.graph.node.extend(nodes)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(f"{zo}/logits", TensorProto.INT8, list(y.shape)))
    del model.graph.value_info[:]


def _dq_of(model, init_name: str):
    return next(
        (n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == init_name), None
    )


# QOperator nodes: {op type: {input position of the integer operand: (its scale's, its zero point's)}}
# and {op type: (the output scale's position, the output zero point's)}.
_QOP_INPUTS = {
    "QLinearConv": {0: (1, 2), 3: (4, 5)},
    "QLinearMatMul": {0: (1, 2), 3: (4, 5)},
    "QGemm": {0: (1, 2), 3: (4, 5)},
}
_QOP_OUTPUTS = {"QLinearConv": (6, 7), "QLinearMatMul": (6, 7), "QGemm": (7, 8)}


def _params_of(model, init_name: str):
    """(node, scale position, zero point position) of the node that holds an initializer's
    quantization: its DequantizeLinear (1, 2), or the QOperator node that reads it (QLinearConv's,
    QLinearMatMul's or QGemm's weights); None for neither (a QOperator bias: its scale is implicit)."""
    dq = _dq_of(model, init_name)
    if dq is not None:
        return dq, 1, 2
    for n in model.graph.node:
        for k, positions in _QOP_INPUTS.get(n.op_type, {}).items():
            if len(n.input) > k and n.input[k] == init_name:
                return (n, *positions)
    return None


def _file_scale(model, inits, init_name: str) -> np.ndarray | None:
    from onnx import numpy_helper

    params = _params_of(model, init_name)
    if params is None or len(params[0].input) <= params[1] or params[0].input[params[1]] not in inits:
        return None
    return numpy_helper.to_array(inits[params[0].input[params[1]]]).astype(np.float32).ravel()


def _requantized(graph, model, inits) -> set:
    """The weight and bias tensors whose quantization or shape differ from the file's (a fresh head)."""
    out = set()
    for index, where in graph.source.weights.items():
        t = graph.tensors[index]
        scale = _file_scale(model, inits, where["init"])
        if int(np.prod(t.shape)) != int(np.prod(where["shape"])):
            out.add(index)  # a new class count (a QOperator bias too, whose scale is implicit)
        if t.quant is None or scale is None:
            continue
        same = scale.size in (1, t.quant.scale.size) and np.array_equal(
            np.broadcast_to(scale, t.quant.scale.shape), t.quant.scale.astype(np.float32)
        )
        if not same or int(np.prod(t.shape)) != int(np.prod(where["shape"])):
            out.add(index)
    return out


def _codes_tensor(name: str, storage: str, codes: np.ndarray):
    """An initializer of integer codes in the file's element type: int4 / uint4 packed by onnx's own
    helper (numpy has no 4-bit type), every other type as its numpy array."""
    from onnx import TensorProto, helper, numpy_helper

    if storage in ("int4", "uint4"):
        return helper.make_tensor(
            name, getattr(TensorProto, storage.upper()), codes.shape, codes.ravel().tolist()
        )
    return numpy_helper.from_array(np.asarray(codes).astype(_TYPES[storage][0]), name)


def _new_init(model, inits, name: str, array, storage: str | None = None):
    k = 0
    while f"{name}_zo{k}" in inits:
        k += 1
    if storage is None:
        from onnx import numpy_helper

        t = numpy_helper.from_array(np.asarray(array), f"{name}_zo{k}")
    else:
        t = _codes_tensor(f"{name}_zo{k}", storage, np.asarray(array))
    model.graph.initializer.append(t)
    inits[t.name] = model.graph.initializer[-1]
    return t.name


def _set_params(model, inits, node, scale, zero_point, storage: str, at=(1, 2)):
    """node (a QuantizeLinear or DequantizeLinear; a QOperator node with at, the positions of the
    scale and zero point) reads new scale and zero point initializers; the zero point in the element
    type of the codes it goes with (the checker refuses an int8 zero point beside int4 codes)."""
    si, zi = at
    node.input[si] = _new_init(model, inits, node.input[si], np.asarray(scale, np.float32))
    zp = np.asarray(zero_point)
    if len(node.input) > zi and node.input[zi]:
        node.input[zi] = _new_init(model, inits, node.input[zi], zp, storage)
    else:
        node.input.append(_new_init(model, inits, node.input[si] + "_zero_point", zp, storage))


def _requantize_dq(model, inits, where, tensor, zero_point: int):
    from onnx import helper

    params = _params_of(model, where["init"])
    if params is None:  # a QOperator bias: its scale is the input's times the weights'
        return
    dq = params[0]
    scale = tensor.quant.scale.astype(np.float32).ravel()
    per_axis = scale.size > 1
    zp = np.full(scale.size, zero_point) if per_axis else np.asarray(zero_point)
    _set_params(model, inits, dq, scale if per_axis else scale.reshape(()), zp, where["storage"], params[1:])
    if per_axis and where["kind"] in ("dense_nk", "dense_kn") and dq.op_type == "DequantizeLinear":
        for a in list(dq.attribute):
            if a.name == "axis":
                dq.attribute.remove(a)
        dq.attribute.append(helper.make_attribute("axis", 0 if where["kind"] == "dense_nk" else 1))


def _write_logits(graph, model, inits, requantized: set):
    """The fresh head's logits: the QuantizeLinear after the head's output (and the DequantizeLinear
    that reads it) at the graph's new logits quantization; the graph output's class count."""
    src = graph.source
    head = next(op for op in graph.ops if op.kind == "FULLY_CONNECTED" and op.inputs[1] in requantized)
    quant = graph.tensors[head.outputs[0]].quant
    names = [n for n, (t, _) in src.values.items() if t == head.outputs[0]]
    qs = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in names]
    at = (1, 2)
    if not qs:  # a QOperator head holds its output's quantization
        qs = [n for n in model.graph.node if n.op_type in _QOP_OUTPUTS and n.output[0] in names]
        at = _QOP_OUTPUTS[qs[0].op_type] if qs else at
    if len(qs) != 1:
        raise NpusimError(
            "the fresh head's logits: expected one QuantizeLinear (or QOperator head) after the head to "
            "write them"
        )
    storage = "uint8" if quant.offset else "int8"
    zp = int(quant.zero_point[0]) + quant.offset
    _set_params(model, inits, qs[0], quant.scale[0], zp, storage, at)
    for dq in (
        n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == qs[0].output[0]
    ):
        _set_params(model, inits, dq, quant.scale[0], zp, storage)
    classes = graph.tensors[head.outputs[0]].shape[-1]
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        if dims and dims[-1].HasField("dim_value"):
            dims[-1].dim_value = classes
    del model.graph.value_info[:]


def _merged_head(graph):
    """The fresh head that took in its bias ADD (zo/head.py bias_add: ONNX's MatMul + Add, or
    QLinearMatMul + QLinearAdd): a FULLY_CONNECTED of the file whose bias the file does not hold;
    None for none."""
    src = graph.source
    for op in graph.ops:
        if (
            op.kind == "FULLY_CONNECTED"
            and op.index < src.op_count
            and op.inputs[1] in src.weights
            and len(op.inputs) > 2
            and op.inputs[2] >= src.tensor_count
        ):
            return op
    return None


def _write_merged_head(graph, model, inits, head):
    """The MatMul + Add pair of a merged fresh head (_merged_head) as one node that writes the Add's
    output: QGemm (ORT's QOperator Gemm, com.microsoft) in place of QLinearMatMul + QLinearAdd, Gemm
    on a DequantizeLinear'd int32 bias in place of MatMul -> Q -> DQ -> Add in a QDQ graph. Its
    weights and their scales are already written (the MatMul's [K, N] initializer); the logits'
    scale and zero point follow (_write_logits)."""
    from onnx import helper

    src, t = graph.source, graph.tensors
    where = src.weights[head.inputs[1]]
    params = _params_of(model, where["init"])
    matmul = params[0] if params is not None else None
    if matmul is not None and matmul.op_type == "DequantizeLinear":
        matmul = next(
            (n for n in model.graph.node if n.op_type == "MatMul" and matmul.output[0] in n.input), None
        )
    names = {n for n, (i, _) in src.values.items() if i == head.outputs[0]}
    chain, add = _bias_add_chain(model, matmul, names)
    if add is None or where["kind"] != "dense_kn":
        raise NpusimError(
            f"the fresh head on {where['init']!r}: expected the file's MatMul + Add (QLinearMatMul + "
            "QLinearAdd) that it replaces, to write it as one Gemm"
        )
    bias = t[head.inputs[2]]
    codes = _new_init(model, inits, f"{where['init']}_bias", np.asarray(bias.data, np.int32))
    if matmul.op_type == "QLinearMatMul":
        # A, B and their scales and zero points as the QLinearMatMul reads them (B's already the head's);
        # y_scale, y_zero_point: _write_logits gives them the logits' quantization
        inputs = [*matmul.input[:6], codes, *matmul.input[6:8]]
        node = helper.make_node("QGemm", inputs, [add.output[0]], domain="com.microsoft", transB=0)
    else:
        scale = _new_init(model, inits, f"{where['init']}_bias_scale", bias.quant.scale.astype(np.float32))
        zp = _new_init(model, inits, f"{where['init']}_bias_zero_point", np.zeros(bias.shape[0], np.int32))
        dq = helper.make_node("DequantizeLinear", [codes, scale, zp], [f"{codes}/float"], axis=0)
        node = helper.make_node("Gemm", [*matmul.input[:2], dq.output[0]], [add.output[0]])
        model.graph.node.insert(list(model.graph.node).index(matmul), dq)
    if not any(o.domain == "com.microsoft" for o in model.opset_import) and node.domain:
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    model.graph.node.insert(list(model.graph.node).index(matmul), node)
    # the old bias's DequantizeLinear (QDQ) goes too, when only the Add read it
    fed = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] in add.input]
    for n in chain + [
        n
        for n in fed
        if n not in chain and not any(n.output[0] in m.input for m in model.graph.node if m is not add)
    ]:
        model.graph.node.remove(n)


def _bias_add_chain(model, matmul, names: set):
    """(the nodes from the MatMul to its bias Add, the Add) when the Add writes one of names: the
    QLinearAdd that reads a QLinearMatMul's output, or the Add that reads a MatMul's output through
    QuantizeLinear -> DequantizeLinear; ([], None) otherwise."""
    if matmul is None:
        return [], None
    readers = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    chain, value = [matmul], matmul.output[0]
    while True:
        users = readers.get(value, [])
        if len(users) != 1:
            return [], None
        n = users[0]
        chain.append(n)
        if n.op_type in ("QLinearAdd", "Add"):
            return (chain, n) if n.output[0] in names else ([], None)
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            return [], None
        value = n.output[0]
