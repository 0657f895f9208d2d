"""The ONNX importer against ONNX Runtime: one-op QDQ models across the ops of ST's QDQ models
(shapes, strides, pads, groups, dilations, per-channel, uint8 activations, uint8 / int4 / uint4
weights), and QOperator models quantized by ORT's own quantize_static.

The oracle is ORT with its optimizations off (ORT_DISABLE_ALL: DequantizeLinear, the float op and
QuantizeLinear as written, the literal QDQ semantics). npusim (--profile tflm) runs the integer op
TFLite's converter would build; both outputs are compared in output codes: within one step
everywhere (a float op then one rounding against a fixed-point requantization), and equal on most
elements.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_qdq import qdq  # noqa: E402

import npusim  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402


def rng_of(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def model(nodes, inputs, inits=(), opset=17):
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def feeds_for(m, rng, n=6, low=-1.0, high=1.0):
    shapes = oo.input_shapes(m)
    return [{k: rng.uniform(low, high, s).astype(np.float32) for k, s in shapes.items()} for _ in range(n)]


def codes(y, scale, zp):
    return np.rint(np.asarray(y, np.float64) / scale).astype(np.int64) + zp


def check_against_ort(qbytes: bytes, x: np.ndarray, desc: str, min_equal: float = 0.5, steps: int = 1):
    y_ort = oo.run_ort(qbytes, x, optimize=False)
    graph = npusim.load_model(qbytes)
    y_sim = npusim.Interpreter(graph, profile="tflm").run(x)
    assert y_sim.shape == y_ort.shape, desc
    scale, zp = oo.output_quantization(qbytes)
    a, b = codes(y_sim, scale, zp), codes(y_ort, scale, zp)
    diff = np.abs(a - b)
    assert diff.max() <= steps, (
        f"{desc}: {int(diff.max())} steps apart at {np.unravel_index(diff.argmax(), diff.shape)}"
    )
    assert np.mean(diff == 0) >= min_equal, f"{desc}: only {np.mean(diff == 0):.2f} of the codes equal"
    return graph


def run_case(m, desc, rng, min_equal=0.5, low=-1.0, high=1.0, steps=1, **qdq_options):
    feeds = feeds_for(m, rng, low=low, high=high)
    q = qdq(m, feeds, **qdq_options)
    x = np.concatenate([f[next(iter(f))] for f in feeds])
    return check_against_ort(q, x, desc, min_equal, steps)


# (x_shape, out_c, k, stride, dilation, pads, group)
CONVS = [
    ((1, 3, 9, 9), 5, 3, 2, 1, (1, 1, 1, 1), 1),
    ((1, 4, 8, 8), 8, 3, 1, 1, (1, 1, 1, 1), 1),
    ((1, 8, 7, 6), 4, 1, 1, 1, (0, 0, 0, 0), 1),
    ((1, 5, 10, 10), 6, 3, 1, 2, (2, 2, 2, 2), 1),
    ((1, 3, 11, 9), 7, 5, 2, 1, (0, 0, 0, 0), 1),
    ((1, 6, 8, 8), 6, 3, 2, 1, (0, 0, 1, 1), 6),  # depthwise, TFLite SAME
    ((1, 4, 9, 9), 8, 3, 1, 1, (1, 1, 1, 1), 4),  # depthwise, multiplier 2
    ((1, 8, 6, 6), 8, 3, 1, 1, (1, 0, 1, 2), 2),  # grouped, asymmetric pads
]


@pytest.mark.parametrize("weights", ["int8", "uint8", "int4", "uint4", "int8-per-tensor"])
@pytest.mark.parametrize(
    "p", CONVS, ids=lambda p: "x{}o{}k{}s{}d{}p{}g{}".format("x".join(map(str, p[0][1:])), *p[1:])
)
def test_conv(p, weights):
    rng = rng_of("conv", p, weights)
    x_shape, o, k, s, d, pads, g = p
    w = rng.standard_normal((o, x_shape[1] // g, k, k)).astype(np.float32) * 0.3
    b = rng.standard_normal(o).astype(np.float32) * 0.2
    node = helper.make_node(
        "Conv",
        ["x", "w", "b"],
        ["y"],
        kernel_shape=[k, k],
        strides=[s, s],
        dilations=[d, d],
        pads=list(pads),
        group=g,
    )
    m = model([node], [("x", x_shape)], [("w", w), ("b", b)])
    bits, signed = (4 if "4" in weights else 8), not weights.startswith("u")
    run_case(
        m,
        f"Conv {p} {weights}",
        rng,
        weight_bits=bits,
        weight_signed=signed,
        per_channel=weights != "int8-per-tensor",
    )


def test_conv_uint8_activations_and_fused_relu():
    rng = rng_of("conv-relu")
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    m = model(nodes, [("x", (1, 3, 8, 8))], [("w", w)])
    g = run_case(m, "Conv+Relu uint8", rng, activation="uint8")
    assert [op.kind for op in g.ops].count("CONV_2D") == 1
    assert any(op.options.get("fused_activation_function") == "RELU" for op in g.ops)


@pytest.mark.parametrize("kind", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("b_shape", [(1, 4, 5, 6), (1, 4, 1, 1), "const"])
def test_binary(kind, b_shape):
    rng = rng_of("binary", kind, b_shape)
    node = helper.make_node(kind, ["x", "b"], ["y"])
    if b_shape == "const":
        m = model([node], [("x", (1, 4, 5, 6))], [("b", rng.uniform(-1, 1, (1, 4, 1, 1)).astype(np.float32))])
    else:
        m = model([node], [("x", (1, 4, 5, 6)), ("b", b_shape)])
    feeds = feeds_for(m, rng)
    q = qdq(m, feeds)
    xs = [np.concatenate([f[k] for f in feeds]) for k in oo.input_shapes(m)]
    if len(xs) == 1:
        check_against_ort(q, xs[0], f"{kind} {b_shape}")
        return
    y_ort = oo.run_ort(q, xs, optimize=False)
    g = npusim.load_model(q)
    interp = npusim.Interpreter(g)
    vals = interp.evaluate({t: x for t, x in zip(g.inputs, xs)}, keep=set(g.outputs))
    scale, zp = oo.output_quantization(q)
    assert np.abs(codes(vals[g.outputs[0]], scale, zp) - codes(y_ort, scale, zp)).max() <= 1


@pytest.mark.parametrize(
    "kind,attrs",
    [
        ("Sigmoid", {}),
        ("LeakyRelu", {"alpha": 0.1}),
        ("HardSwish", {}),
        ("HardSigmoid", {}),
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
        ("Relu", {}),
        ("Neg", {}),
        ("Softmax", {"axis": -1}),
        ("Softmax", {"axis": 1}),
    ],
)
def test_unary(kind, attrs):
    rng = rng_of("unary", kind, attrs)
    m = model([helper.make_node(kind, ["x"], ["y"], **attrs)], [("x", (1, 6, 5, 7))])
    run_case(m, f"{kind} {attrs}", rng, low=-4, high=4)


def test_clip_and_div():
    rng = rng_of("clip-div")
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["c"]), helper.make_node("Div", ["c", "d"], ["y"])]
    m = model(
        nodes,
        [("x", (1, 3, 4, 5))],
        [("lo", np.float32(-0.5)), ("hi", np.float32(1.5)), ("d", np.float32(3.0))],
    )
    run_case(m, "Clip, Div", rng, low=-2, high=2)


@pytest.mark.parametrize(
    "kind,k,s,pads,ceil",
    [
        ("MaxPool", 2, 2, (0, 0, 0, 0), 0),
        ("MaxPool", 5, 1, (2, 2, 2, 2), 0),
        ("MaxPool", 3, 2, (1, 1, 1, 1), 0),
        ("MaxPool", 3, 2, (0, 0, 0, 0), 1),
        ("AveragePool", 2, 2, (0, 0, 0, 0), 0),
        ("AveragePool", 3, 1, (1, 1, 1, 1), 0),
    ],
)
def test_pool(kind, k, s, pads, ceil):
    rng = rng_of("pool", kind, k, s, pads, ceil)
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=list(pads), ceil_mode=ceil)
    m = model([helper.make_node(kind, ["x"], ["y"], **attrs)], [("x", (1, 4, 10, 9))])
    run_case(m, f"{kind} k{k} s{s} {pads} ceil{ceil}", rng)


def test_global_average_pool_and_reduce_mean():
    rng = rng_of("gap")
    m = model([helper.make_node("GlobalAveragePool", ["x"], ["y"])], [("x", (1, 5, 6, 7))])
    run_case(m, "GlobalAveragePool", rng)
    m = model(
        [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)],
        [("x", (1, 5, 6, 7))],
        [("axes", np.asarray([1]))],
        opset=18,
    )
    run_case(m, "ReduceMean over channels", rng)


# TFLite's int8 bilinear interpolates the codes with weights in 1/1024 and rounds, then the QUANTIZE to
# the QuantizeLinear's scale rounds again: two roundings against ORT's one (docs/onnx.md).
@pytest.mark.parametrize(
    "mode,ct,nm,steps",
    [
        ("nearest", "asymmetric", "floor", 1),
        ("linear", "half_pixel", None, 2),
        ("linear", "align_corners", None, 2),
    ],
)
def test_resize(mode, ct, nm, steps):
    rng = rng_of("resize", mode, ct)
    attrs = dict(mode=mode, coordinate_transformation_mode=ct, **({"nearest_mode": nm} if nm else {}))
    m = model(
        [helper.make_node("Resize", ["x", "", "sc"], ["y"], **attrs)],
        [("x", (1, 3, 5, 6))],
        [("sc", np.asarray([1, 1, 2, 2], np.float32))],
    )
    run_case(m, f"Resize {mode} {ct}", rng, steps=steps)


def test_layout_ops():
    """Concat, Split, Slice, Pad, Transpose, Reshape, Flatten, Squeeze/Unsqueeze and MatMul around a
    Conv (whose NHWC output they read in the declared NCHW layout)."""
    rng = rng_of("layout")
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Split", ["c", "sp"], ["s0", "s1"], axis=1),
        helper.make_node("Slice", ["s1", "st", "en", "ax", "stp"], ["sl"]),
        helper.make_node("Pad", ["sl", "pd"], ["pa"]),
        helper.make_node("Concat", ["s0", "pa"], ["cc"], axis=1),
        helper.make_node("Transpose", ["cc"], ["tr"], perm=[0, 2, 3, 1]),
        helper.make_node("Reshape", ["tr", "shp"], ["rs"]),
        helper.make_node("MatMul", ["rs", "mw"], ["mm"]),
        helper.make_node("Unsqueeze", ["mm", "ua"], ["un"]),
        helper.make_node("Flatten", ["un"], ["y"], axis=1),
    ]
    inits = [
        ("w", w),
        ("sp", np.asarray([3, 5])),
        ("st", np.asarray([1, 0])),
        ("en", np.asarray([5, 99])),
        ("ax", np.asarray([1, 3])),
        ("stp", np.asarray([1, 2])),
        ("pd", np.asarray([0, 0, 0, 0, 0, 1, 0, 4])),
        ("shp", np.asarray([1, 6, -1])),
        ("mw", rng.standard_normal((64, 5)).astype(np.float32) * 0.2),
        ("ua", np.asarray([1])),
    ]
    m = model(nodes, [("x", (1, 3, 6, 8))], inits, opset=17)
    run_case(m, "layout chain", rng, min_equal=0.3)


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_qoperator_small_cnn(activation):
    """A CNN quantized by ORT's quantize_static in QOperator format (QLinearConv, QLinearAdd, MaxPool,
    QLinearGlobalAveragePool, QGemm; uint8 with reduce_range): every layer an ORT integer kernel,
    whose float32 requantization differs from TFLite's fixed-point one by at most a step per layer."""
    m = oo.small_cnn_model(seed=1)
    feeds = oo.random_inputs(m, 8, seed=2)
    q = oo.quantize(
        m,
        fmt="QOperator",
        per_channel=True,
        calibration=feeds,
        activation=activation,
        reduce_range=activation == "uint8",
    )
    assert {"QLinearConv", "QLinearAdd", "QGemm", "QLinearGlobalAveragePool"} <= set(oo.op_types(q))
    x = np.concatenate([f["x"] for f in oo.random_inputs(m, 16, seed=3)])
    check_against_ort(q, x, f"QOperator CNN {activation}", min_equal=0.6)


def test_qdq_by_quantize_static():
    m = oo.small_cnn_model(seed=4)
    feeds = oo.random_inputs(m, 8, seed=5)
    q = oo.quantize(m, fmt="QDQ", per_channel=True, calibration=feeds)
    x = np.concatenate([f["x"] for f in oo.random_inputs(m, 4, seed=6)])
    check_against_ort(q, x, "quantize_static QDQ CNN", min_equal=0.5)


def conv_qdq(weights="int8"):
    rng = rng_of("conv-qdq", weights)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    m = model([node], [("x", (1, 3, 6, 6))], [("w", w), ("b", np.zeros(4, np.float32))])
    bits, signed = (4 if "4" in weights else 8), not weights.startswith("u")
    return qdq(m, feeds_for(m, rng), weight_bits=bits, weight_signed=signed)


def hostile(kind: str) -> bytes:
    m = onnx.load_from_string(conv_qdq())
    if kind == "missing initializer":
        m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "w_q"))
    elif kind == "cycle":
        m.graph.node[0].input[0] = m.graph.node[-1].output[0]
    elif kind == "huge declared shape":
        m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 1 << 40
    elif kind == "unsupported op":
        conv = next(n for n in m.graph.node if n.op_type == "Conv")
        conv.op_type, conv.name = "Erf", "my_erf"  # a valid Erf: one input, no attributes
        del conv.input[1:]
        del conv.attribute[:]
    data = m.SerializeToString()
    return data[: len(data) // 2] if kind == "truncated protobuf" else data


@pytest.mark.parametrize(
    "kind,message",
    [
        ("missing initializer", "'w_q', which no node, input or initializer defines"),
        ("cycle", "the graph has a cycle"),
        ("huge declared shape", "more than the limit"),
        ("truncated protobuf", "not a valid ONNX protobuf"),
    ],
)
def test_hostile_files_exit_2_in_one_line(tmp_path, kind, message):
    from click.testing import CliRunner

    from npusim.app.cli import main

    f = tmp_path / "m.onnx"
    f.write_bytes(hostile(kind))
    res = CliRunner().invoke(main, ["inspect", str(f)])
    assert res.exit_code == 2 and message in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


def test_inspect_lists_a_node_npusim_cannot_lower_and_run_refuses_it(tmp_path):
    """As for a .tflite op npusim lacks (docs/inspect.md): inspect exits 0 with the node listed
    ("supported": false, and in "unsupported" with its node name and reason), run exits 2 naming it."""
    import json

    from click.testing import CliRunner

    from npusim.app.cli import main

    f = tmp_path / "m.onnx"
    f.write_bytes(hostile("unsupported op"))
    reason = "node 'my_erf' (Erf): operator is not supported (docs/onnx.md lists the ops npusim lowers)"
    res = CliRunner().invoke(main, ["inspect", str(f), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    erf = [o for o in data["ops"] if o["op"] == "Erf"]
    assert len(erf) == 1 and erf[0]["supported"] is False and erf[0]["macs"] is None
    assert erf[0]["outputs"] == [[1, 3, 6, 6]]  # ONNX shape inference: Erf keeps its input's shape
    assert all(o["supported"] for o in data["ops"] if o["op"] != "Erf")
    assert data["unsupported"] == [
        {"index": erf[0]["index"], "op": "Erf", "node": "my_erf", "reason": reason}
    ]
    assert data["outputs"][0]["shape"] == [1, 3, 6, 6]
    res = CliRunner().invoke(main, ["inspect", str(f)])
    assert res.exit_code == 0, res.output
    assert "Erf (unsupported)" in res.output
    assert res.output.splitlines()[-1] == (
        f"1 node npusim cannot lower, `npusim run` refuses the model, the totals leave them out: {reason}"
    )
    res = CliRunner().invoke(main, ["inspect", str(f), "--target", "stm32n6", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["unsupported"] == data["unsupported"]
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 6, 6), np.float32))
    res = CliRunner().invoke(
        main, ["run", str(f), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]
    )
    assert res.exit_code == 2 and res.output.strip() == f"error: {reason}", res.output
    with pytest.raises(npusim.NpusimError, match=r"^node 'my_erf' \(Erf\): operator is not supported"):
        npusim.load_model(hostile("unsupported op"))


def test_plan_only_undoes_a_lowering_that_stops_halfway():
    """A Conv whose 9x9 kernel does not fit its 6x6 input is refused after its input's layout change
    was emitted; the plan takes that back (the graph is the one without the node), and the node that
    reads its output is listed too, saying why."""
    m = onnx.load_from_string(conv_qdq())
    graph = npusim.load_model(m.SerializeToString())
    w9 = numpy_helper.from_array(np.ones((2, 3, 9, 9), np.int8), "w9")
    m.graph.initializer.append(w9)
    extra = [
        helper.make_node("DequantizeLinear", ["w9", "x_s"], ["w9_dq"], name="dq_w9"),
        helper.make_node("Conv", ["x_dq", "w9_dq"], ["big"], name="big_conv"),
        helper.make_node("QuantizeLinear", ["big", "y_s", "y_z"], ["big_q"], name="q_big"),
    ]
    for k, n in enumerate(extra):  # before the file's Conv, so that its layout change comes first
        m.graph.node.insert(4 + k, n)
    planned = npusim.load_model(m.SerializeToString(), plan_only=True)
    assert [e["node"] for e in planned.source.unlowered] == ["big_conv", "q_big"]
    assert "kernel 9x9 does not fit the input 6x6" in planned.source.unlowered[0]["reason"]
    assert "'big' is not available" in planned.source.unlowered[1]["reason"]
    assert [op.kind for op in planned.ops] == [op.kind for op in graph.ops]
    assert len(planned.tensors) == len(graph.tensors)
    with pytest.raises(npusim.NpusimError, match=r"^node 'big_conv' \(Conv\): kernel 9x9 does not fit"):
        npusim.load_model(m.SerializeToString())


def test_an_asymmetric_weight_zero_point_runs_as_ort():
    """uint8 weights of zero point 100 with codes up to 250 (codes minus zero point leave int8): once
    refused, now a CONV_2D that keeps the zero point (kernels/wide.py); --profile onnxruntime equals
    ORT (optimizations off), tflm is within one output step."""
    m = onnx.load_from_string(conv_qdq("uint8"))
    z = next(i for i in m.graph.initializer if i.name == "w_z")
    z.CopyFrom(
        helper.make_tensor("w_z", TensorProto.UINT8, list(z.dims), [100] * max(1, int(np.prod(z.dims))))
    )
    w = next(i for i in m.graph.initializer if i.name == "w_q")
    codes = rng_of("asymmetric-weights").integers(0, 256, int(np.prod(w.dims)))
    w.CopyFrom(helper.make_tensor("w_q", TensorProto.UINT8, list(w.dims), codes.tolist()))
    data = m.SerializeToString()
    x = rng_of("asymmetric-weights", "x").uniform(-1, 1, (2, 3, 6, 6)).astype(np.float32)
    want = oo.run_ort(data, x, optimize=False)
    graph = npusim.load_model(data)
    conv = next(op for op in graph.ops if op.kind == "CONV_2D")
    assert np.any(graph.tensors[conv.inputs[1]].quant.zero_point)  # the zero point stays in the layer
    np.testing.assert_array_equal(npusim.Interpreter(graph, profile="onnxruntime").run(x), want)
    y_scale = graph.tensors[conv.outputs[0]].quant.scale[0]
    tflm = npusim.Interpreter(graph, profile="tflm").run(x)
    assert np.abs(tflm - want).max() <= y_scale * 1.001


@pytest.mark.parametrize("weights", ["int8", "uint8", "int4", "uint4"])
def test_write_model_round_trip_keeps_every_initializer(weights):
    """An imported graph written back unchanged gives the file's own initializers (layouts, zero
    points and int4 packing restored), and ORT runs it with the same outputs."""
    q = conv_qdq(weights)
    again = npusim.write_model(npusim.load_model(q))
    a, b = onnx.load_from_string(q), onnx.load_from_string(again)
    for x, y in zip(a.graph.initializer, b.graph.initializer):
        assert x.name == y.name and np.array_equal(numpy_helper.to_array(x), numpy_helper.to_array(y)), x.name
    xin = np.random.default_rng(0).uniform(-1, 1, (2, 3, 6, 6)).astype(np.float32)
    assert np.array_equal(oo.run_ort(q, xin, optimize=False), oo.run_ort(again, xin, optimize=False))


def test_batchnorm_folded_into_conv():
    """Conv -> BatchNormalization (float between them, as exporters leave it) -> QuantizeLinear: one
    CONV_2D, the BN's factors in the filter scales (negative ones flip the codes) and the bias."""
    rng = rng_of("bn")
    o = 6
    w = rng.standard_normal((o, 3, 3, 3)).astype(np.float32) * 0.3
    gamma = rng.uniform(0.5, 1.5, o).astype(np.float32) * np.where(np.arange(o) % 2, -1, 1).astype(np.float32)
    inits = [
        ("w", w),
        ("b", rng.standard_normal(o).astype(np.float32) * 0.1),
        ("g", gamma),
        ("be", rng.standard_normal(o).astype(np.float32) * 0.1),
        ("mu", rng.standard_normal(o).astype(np.float32) * 0.1),
        ("var", rng.uniform(0.5, 2, o).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["y"], epsilon=1e-3),
    ]
    m = model(nodes, [("x", (1, 3, 7, 7))], inits)
    feeds = feeds_for(m, rng)
    q = qdq(m, feeds, keep_float=("c",))
    g = check_against_ort(q, np.concatenate([f["x"] for f in feeds]), "Conv + BatchNormalization")
    assert [op.kind for op in g.ops] == ["QUANTIZE", "TRANSPOSE", "CONV_2D", "TRANSPOSE", "DEQUANTIZE"]


def test_standalone_batchnorm_is_refused_naming_the_node():
    rng = rng_of("bn-alone")
    inits = [(k, np.ones(3, np.float32)) for k in ("g", "be", "mu", "var")]
    m = model(
        [helper.make_node("BatchNormalization", ["x", "g", "be", "mu", "var"], ["y"], name="bn")],
        [("x", (1, 3, 4, 4))],
        inits,
    )
    with pytest.raises(npusim.NpusimError, match=r"node 'bn' \(BatchNormalization\)"):
        npusim.load_model(qdq(m, feeds_for(m, rng)))


@pytest.mark.parametrize("op", ["Conv", "Gemm"])
def test_bias_near_the_int32_limit_widens_the_filter_scale(op):
    """A channel with tiny weights and a bias whose int32 code sits near -2^31 (ORT's quantizer
    saturates such biases; ST's YOLO26 has two): int32 accumulation would wrap. TFLite's converter
    widens that channel's filter scale until the bias fits the middle half of int32
    (AdjustWeightsForBiasScale); npusim then stays within one step of ORT, which adds it in float."""
    rng = rng_of("bias-limit", op)
    b = np.asarray([-0.005, -0.05, 0.05, 0.1], np.float32)  # channel 0: replaced by a code near -2^31
    if op == "Conv":
        w = rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.3
        w[0] *= 1e-7
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        m = model([node], [("x", (1, 8, 6, 6))], [("w", w), ("b", b)])
        kind, peak = "CONV_2D", np.max(np.abs(w[0]))
    else:
        w = rng.standard_normal((72, 4)).astype(np.float32) * 0.3
        w[:, 0] *= 1e-7
        m = model([helper.make_node("Gemm", ["x", "w", "b"], ["y"])], [("x", (1, 72))], [("w", w), ("b", b)])
        kind, peak = "FULLY_CONNECTED", np.max(np.abs(w[:, 0]))
    feeds = feeds_for(m, rng)
    q = onnx.load_from_string(qdq(m, feeds))
    bias = next(i for i in q.graph.initializer if i.name == "b_q")
    codes = numpy_helper.to_array(bias).copy()
    codes[0] = -2147400000  # 83,648 above the limit: an accumulator of 72 products crosses it
    bias.CopyFrom(numpy_helper.from_array(codes, "b_q"))
    x = np.concatenate([f["x"] for f in feeds])
    g = check_against_ort(q.SerializeToString(), x, f"{op} with a bias near -2^31")
    mac = next(op for op in g.ops if op.kind == kind)
    assert g.tensors[mac.inputs[1]].quant.scale[0] > 1.9 * peak / 127  # widened about twofold
    assert abs(int(g.tensors[mac.inputs[2]].data[0])) <= 2**30 + 2**20  # the middle half of int32
    npusim.write_model(g)  # untrained: the file as it was
    g.tensors[mac.inputs[1]].data = g.tensors[mac.inputs[1]].data // 2  # "trained"
    with pytest.raises(npusim.NpusimError, match="rebuilt at import"):
        npusim.write_model(g)  # its codes are at the widened scale, not the file's
