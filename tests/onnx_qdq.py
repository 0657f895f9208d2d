"""QDQ test models for the importer: a float ONNX graph (onnx.helper), calibrated on ORT's own float
run, with QuantizeLinear -> DequantizeLinear after the input and after every node output, and its
Conv / MatMul / Gemm weights stored quantized (int8, uint8, int4 or uint4; per tensor or per output
channel) behind a DequantizeLinear, int32 biases at input scale x weight scale.

This is how ST's and ORT's QDQ exports look (ORT's quantize_static leaves Sub, Div, Neg, HardSwish,
ReduceMean, ... in float, so the tests place the pairs themselves); ONNX Runtime then runs the
result and is the oracle. Activation parameters follow ORT's MinMax calibration: the range widened
to hold 0, scale (max - min) / 255, zero point round(qmin - min / scale).
"""

from __future__ import annotations

import numpy as np

OPSET = 21  # int4 / uint4 weights need opset 21


def _float_ranges(model, feeds) -> dict:
    """min / max of every value of the float model over the feeds (ORT, optimizations off)."""
    import onnx

    from npusim.testing import onnx_oracle as oo

    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = [o for n in m.graph.node for o in n.output]
    known = {o.name for o in m.graph.output}
    for name in names:
        if name not in known:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    sess = oo.session(m.SerializeToString(), optimize=False)
    out_names = [o.name for o in sess.get_outputs()]
    ranges = {}
    for feed in feeds:
        for k, v in feed.items():
            ranges.setdefault(k, []).append(v)
        for name, v in zip(out_names, sess.run(None, feed)):
            ranges.setdefault(name, []).append(v)
    return {k: (float(min(a.min() for a in v)), float(max(a.max() for a in v))) for k, v in ranges.items()}


def activation_params(lo: float, hi: float, dtype: str = "int8"):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
    qmin = -128 if dtype == "int8" else 0
    zp = int(np.clip(np.rint(qmin - lo / scale), qmin, qmin + 255))
    return scale, zp


def weight_codes(w: np.ndarray, bits: int, signed: bool, per_channel: bool, axis: int):
    """Symmetric codes (unsigned types shifted by the middle code) and their scales."""
    qmax = (1 << (bits - 1)) - 1
    red = tuple(i for i in range(w.ndim) if i != axis) if per_channel else None
    peak = np.max(np.abs(w), axis=red) if per_channel else np.max(np.abs(w))
    scale = np.where(peak > 0, peak / qmax, 1.0).astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(w.ndim)] if per_channel else [1] * w.ndim
    q = np.clip(np.rint(w / scale.reshape(shape)), -qmax, qmax).astype(np.int64)
    zp = 0 if signed else 1 << (bits - 1)
    return q + zp, scale, zp


_STORAGE = {(8, True): "INT8", (8, False): "UINT8", (4, True): "INT4", (4, False): "UINT4"}


def qdq(
    model,
    feeds,
    activation: str = "int8",
    weight_bits: int = 8,
    weight_signed: bool = True,
    per_channel: bool = True,
    opset: int = OPSET,
    keep_float=(),
) -> bytes:
    """The QDQ form of a float model (see the module docstring). keep_float: value names left float."""
    from onnx import TensorProto, helper, numpy_helper

    ranges = _float_ranges(model, feeds)
    g = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    act_np = np.int8 if activation == "int8" else np.uint8
    new_inits, nodes, params = [], [], {}

    def qdq_pair(name):
        scale, zp = activation_params(*ranges[name], activation)
        params[name] = (scale, zp)
        new_inits.append(numpy_helper.from_array(np.asarray(scale, np.float32), name + "_s"))
        new_inits.append(numpy_helper.from_array(np.asarray(zp, act_np), name + "_z"))
        nodes.append(helper.make_node("QuantizeLinear", [name, name + "_s", name + "_z"], [name + "_q"]))
        nodes.append(
            helper.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_dq"])
        )

    def dq_weight(name, axis):
        w = inits[name]
        q, scale, zp = weight_codes(w, weight_bits, weight_signed, per_channel, axis)
        dt = getattr(TensorProto, _STORAGE[(weight_bits, weight_signed)])
        new_inits.append(helper.make_tensor(name + "_q", dt, w.shape, q.ravel().tolist()))
        new_inits.append(
            numpy_helper.from_array(scale.reshape(-1) if per_channel else scale.reshape(()), name + "_s")
        )
        zps = np.full(scale.size if per_channel else (), zp)
        new_inits.append(helper.make_tensor(name + "_z", dt, list(np.shape(zps)), np.ravel(zps).tolist()))
        nodes.append(
            helper.make_node(
                "DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_dq"], axis=axis
            )
        )
        return scale

    for inp in g.input:
        if inp.name not in inits:
            qdq_pair(inp.name)
    renamed = {i.name: i.name + "_dq" for i in g.input if i.name not in inits}

    for node in g.node:
        ins = list(node.input)
        if node.op_type in ("Conv", "MatMul", "Gemm") and len(ins) > 1 and ins[1] in inits:
            axis = (
                0
                if node.op_type == "Conv"
                or (node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute))
                else 1
            )
            w_scale = dq_weight(ins[1], axis)
            if len(ins) > 2 and ins[2] in inits:
                x_scale = params[ins[0]][0]
                b = inits[ins[2]]
                bs = (np.float32(x_scale) * w_scale.astype(np.float32)).reshape(-1).astype(np.float32)
                bq = np.rint(b / bs).astype(np.int32)
                new_inits.append(numpy_helper.from_array(bq, ins[2] + "_q"))
                new_inits.append(
                    numpy_helper.from_array(bs if per_channel else bs.reshape(()), ins[2] + "_s")
                )
                new_inits.append(
                    numpy_helper.from_array(
                        np.zeros(bs.shape if per_channel else (), np.int32), ins[2] + "_z"
                    )
                )
                nodes.append(
                    helper.make_node(
                        "DequantizeLinear",
                        [ins[2] + "_q", ins[2] + "_s", ins[2] + "_z"],
                        [ins[2] + "_dq"],
                        axis=0,
                    )
                )
                ins[2] = ins[2] + "_dq"
            ins[1] = ins[1] + "_dq"
        ins = [renamed.get(i, i) for i in ins]
        nodes.append(
            helper.make_node(node.op_type, ins, list(node.output), domain=node.domain, name=node.name)
        )
        nodes[-1].attribute.extend(node.attribute)
        for o in node.output:
            if o and o not in keep_float:
                qdq_pair(o)
                renamed[o] = o + "_dq"

    outputs = []
    for o in g.output:
        outputs.append(helper.make_tensor_value_info(o.name + "_dq", TensorProto.FLOAT, None))
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes, "qdq", list(g.input), outputs, [i for i in g.initializer if i.name in used] + new_inits
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10

    return m.SerializeToString()
