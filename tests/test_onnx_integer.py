"""ConvInteger and MatMulInteger (npusim/formats/onnx/lower_integer.py) against ONNX Runtime.

One-op static graphs built with onnx.helper: QuantizeLinear -> ConvInteger / MatMulInteger ->
Cast -> Mul by a constant scale [-> Add of a constant bias] -> QuantizeLinear -> DequantizeLinear,
across shapes, strides, pads, groups, dilations, input and weight zero points and per-channel
scales. `--profile onnxruntime` equals ORT bit for bit, optimizations off and on (ORT fuses
nothing of this chain here, so the two agree); `--profile tflm` (a fixed-point multiplier M /
y_scale, the bias rounded into the int32 sum) is within one step. Models quantized by ORT's
quantize_dynamic (DynamicQuantizeLinear) are refused in one line naming the node.
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from click.testing import CliRunner  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import npusim  # noqa: E402
from npusim.app.cli import main  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402

Y_SCALE, Y_ZP = np.float32(0.03), np.uint8(131)


def rng_of(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _model(nodes, x_shape, inits, out="y") -> bytes:
    graph = helper.make_graph(
        nodes,
        "t",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def integer_model(op, x_shape, w, w_zp, m, bias, x_zp, attrs=None, tail="quantize") -> bytes:
    """x -> QuantizeLinear(0.02, x_zp) -> op(w, x_zp, w_zp) -> Cast -> Mul(m) [-> Add(bias)] -> tail."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q_in"),
        helper.make_node(op, ["xq", "w", "xz", "wz"], ["acc"], name="mac", **(attrs or {})),
        helper.make_node("Cast", ["acc"], ["accf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "m"], ["r"], name="rescale"),
    ]
    inits = {"xs": np.float32(0.02), "xz": x_zp, "w": w, "wz": w_zp, "m": m}
    last = "r"
    if bias is not None:
        nodes.append(helper.make_node("Add", ["b", "r"], ["rb"], name="bias"))
        inits["b"], last = bias, "rb"
    if tail == "float output":
        return _model(nodes, x_shape, inits, out=last)
    nodes += [
        helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["yq"], name="q_out"),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="dq_out"),
    ]
    inits.update(ys=Y_SCALE, yz=Y_ZP)
    return _model(nodes, x_shape, inits)


def weights(rng, shape, dtype, zp, axis, wmax=127):
    """Integer weights whose codes minus their zero point stay in [-wmax, wmax] (int8: TFLite's
    symmetric weights)."""
    zp_b = np.asarray(zp, np.int64).reshape([-1 if i == axis else 1 for i in range(len(shape))])
    zp_b = zp_b if np.size(zp) > 1 else np.asarray(zp, np.int64)
    info = np.iinfo(dtype)
    lim = min(wmax, int(np.min(zp)) - info.min, info.max - int(np.max(zp)))  # codes stay in the type
    return (rng.integers(-lim, lim + 1, shape) + zp_b).astype(dtype)


def check(q: bytes, x: np.ndarray, desc: str):
    y_lit, y_opt = oo.run_ort(q, x, optimize=False), oo.run_ort(q, x, optimize=True)
    graph = npusim.load_model(q)
    y_ort = npusim.Interpreter(graph, profile="onnxruntime").run(x)
    assert np.array_equal(y_ort, y_lit), f"{desc}: onnxruntime profile vs ORT (optimizations off)"
    assert np.array_equal(y_ort, y_opt), f"{desc}: onnxruntime profile vs ORT (optimized)"
    y_tflm = npusim.Interpreter(graph, profile="tflm").run(x)
    steps = np.abs(np.rint(y_tflm / Y_SCALE) - np.rint(y_lit / Y_SCALE))
    assert steps.max() <= 1, f"{desc}: tflm {steps.max()} steps from ORT"
    assert (steps == 0).mean() >= 0.9, f"{desc}: tflm equals ORT on {(steps == 0).mean():.3f}"
    # a real test: the rescale does not saturate everything
    assert len(np.unique(y_lit)) > 8, desc


CONV_CASES = [
    # (x shape, out channels, kernel, attrs, x zero point, weight type and zero point, per-channel M, bias)
    ((3, 8, 8), 4, 3, dict(pads=[1, 1, 1, 1]), np.uint8(131), (np.int8, 0), True, True),
    ((3, 9, 9), 6, 3, dict(strides=[2, 2], pads=[0, 1, 1, 0]), np.int8(-5), (np.int8, 0), False, False),
    ((4, 10, 10), 5, 3, dict(dilations=[2, 2]), np.uint8(0), (np.int8, 0), True, True),
    ((4, 7, 7), 4, 3, dict(group=4, pads=[1, 1, 1, 1]), np.uint8(128), (np.int8, 0), True, True),
    ((4, 7, 7), 8, 3, dict(group=4, strides=[2, 2]), np.uint8(100), (np.int8, 0), False, True),
    ((4, 6, 6), 6, 3, dict(group=2, pads=[1, 1, 1, 1]), np.uint8(140), (np.int8, 0), True, True),
    ((8, 5, 5), 16, 1, dict(), np.uint8(3), (np.uint8, 128), True, True),
]


@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_conv_integer_matches_ort(case):
    x_shape, o, k, attrs, x_zp, (w_type, w_zp), per_channel, with_bias = CONV_CASES[case]
    rng = rng_of("conv-integer", case)
    c = x_shape[0] // attrs.get("group", 1)
    w = weights(rng, (o, c, k, k), w_type, w_zp, 0)
    shape = (1, o, 1, 1) if per_channel else ()
    m = (np.float32(0.02) * rng.uniform(0.002, 0.01, shape)).astype(np.float32)
    bias = rng.uniform(-0.5, 0.5, (1, o, 1, 1)).astype(np.float32) if with_bias else None
    q = integer_model("ConvInteger", (None, *x_shape), w, w_type(w_zp), m, bias, x_zp, attrs)
    x = rng.uniform(-2.5, 2.5, (4, *x_shape)).astype(np.float32)
    check(q, x, f"ConvInteger case {case}")


MATMUL_CASES = [
    # (A shape without the batch, N, x zero point, weight type, per-column zero points, per-column M,
    # bias, largest |w - w_zp|). uint8 x int8 stays at |w| <= 63: on an AVX2 host (no VNNI) ORT's
    # MLAS sums those pairs in saturating int16 (VPMADDUBSW), not exactly (docs/onnx.md).
    ((16,), 8, np.uint8(120), np.uint8, True, True, True, 127),
    ((24,), 5, np.uint8(120), np.uint8, False, False, False, 127),
    ((4, 16), 8, np.uint8(120), np.uint8, True, True, True, 127),
    ((3, 40), 12, np.int8(-7), np.uint8, False, True, False, 127),
    ((40,), 6, np.int8(5), np.int8, False, True, True, 127),
    ((2, 32), 6, np.uint8(90), np.int8, False, True, True, 63),
]


@pytest.mark.parametrize("case", range(len(MATMUL_CASES)))
def test_matmul_integer_matches_ort(case):
    a_shape, n, x_zp, w_type, per_column_zp, per_column_m, with_bias, wmax = MATMUL_CASES[case]
    rng = rng_of("matmul-integer", case)
    k = a_shape[-1]
    mid = 128 if w_type == np.uint8 else 0
    zp = rng.integers(mid - 8, mid + 9, n).astype(w_type) if per_column_zp else w_type(mid)
    w = weights(rng, (k, n), w_type, zp, 1, wmax)
    # about one output unit per standard deviation of the sums (|x - x_zp| ~ 60 codes here)
    m = (rng.uniform(0.5, 1.5, (n,) if per_column_m else ()) / (np.sqrt(k) * 60 * wmax / 2)).astype(
        np.float32
    )
    bias = rng.uniform(-0.5, 0.5, (n,)).astype(np.float32) if with_bias else None
    q = integer_model("MatMulInteger", (None, *a_shape), w, zp, m, bias, x_zp)
    x = rng.uniform(-2.5, 2.5, (5, *a_shape)).astype(np.float32)
    check(q, x, f"MatMulInteger case {case}")


def test_onnxruntime_profile_refuses_conv_integer_of_int8_inputs_and_uint8_weights():
    """ORT 1.32's ConvInteger does not give the exact sums for this pair (measured: thousands off);
    the tflm profile runs the exact integer layer, the onnxruntime profile says it has no model."""
    rng = rng_of("conv-integer-s8u8")
    w = weights(rng, (4, 3, 3, 3), np.uint8, 128, 0)
    q = integer_model("ConvInteger", (None, 3, 6, 6), w, np.uint8(128), np.float32(1e-4), None, np.int8(-5))
    graph = npusim.load_model(q)
    npusim.Interpreter(graph, profile="tflm").run(np.zeros((1, 3, 6, 6), np.float32))
    with pytest.raises(npusim.NpusimError) as e:
        npusim.Interpreter(graph, profile="onnxruntime")
    assert str(e.value) == (
        "op 2 (CONV_2D): ConvInteger of int8 inputs with uint8 weights: ONNX Runtime's CPU kernel does not "
        "compute the exact sums for this pair of types (docs/onnx.md), and npusim has no model of it"
    )


def _conv_q(**kw) -> bytes:
    rng = rng_of("conv-integer-refusal")
    w = weights(rng, (4, 3, 3, 3), np.int8, 0, 0)
    args = dict(m=np.float32(1e-4), bias=np.zeros((1, 4, 1, 1), np.float32), x_zp=np.uint8(128))
    args.update(kw)
    return integer_model("ConvInteger", (1, 3, 6, 6), w, np.int8(0), **args)


def test_refuses_a_rescale_that_is_no_integer_layer_naming_the_node():
    with pytest.raises(npusim.NpusimError) as e:
        npusim.load_model(_conv_q(tail="float output"))
    assert str(e.value) == (
        "node 'mac' (ConvInteger): its int32 sums must be rescaled as Cast(to float) -> Mul by a constant "
        "scale [-> Add of a constant bias] -> QuantizeLinear (a static layer); found 'rb' read by no "
        "QuantizeLinear (a float graph output or a runtime scale is not an integer layer)"
    )


def test_refuses_another_input_zero_point_than_its_quantizelinear():
    m = onnx.load_from_string(_conv_q())
    m.graph.node[1].input[2] = "zp_other"
    m.graph.initializer.append(numpy_helper.from_array(np.uint8(100), "zp_other"))
    with pytest.raises(npusim.NpusimError) as e:
        npusim.load_model(m.SerializeToString())
    assert str(e.value) == (
        "node 'mac' (ConvInteger): input zero point [100] is not 128, the zero point of 'xq': expected the "
        "QuantizeLinear's own"
    )


def dynamic_model(tmp_path, kind: str) -> str:
    """A float MatMul or Conv quantized by ORT's quantize_dynamic (DynamicQuantizeLinear + *Integer)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = rng_of("dynamic", kind)
    if kind == "MatMul":
        node, x_shape = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), (2, 16)
        w = rng.standard_normal((16, 8)).astype(np.float32)
    else:
        node, x_shape = (
            helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
            (1, 3, 6, 6),
        )
        w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    f, q = tmp_path / "f.onnx", tmp_path / "q.onnx"
    f.write_bytes(_model([node], x_shape, {"w": w}))
    quantize_dynamic(str(f), str(q), weight_type=QuantType.QInt8)
    assert "DynamicQuantizeLinear" in {n.op_type for n in onnx.load(str(q)).graph.node}
    return str(q)


@pytest.mark.parametrize("kind", ["MatMul", "Conv"])
def test_quantize_dynamic_models_are_refused_in_one_line(tmp_path, kind):
    q = dynamic_model(tmp_path, kind)
    reason = (
        "node 'x_QuantizeLinear' (DynamicQuantizeLinear): its scale and zero point are computed from each "
        "run's input range (over the whole batch): a per-run scale is not a deployed integer graph; "
        "quantize the model statically (quantize_static)"
    )
    shape = (2, 16) if kind == "MatMul" else (1, 3, 6, 6)
    np.save(tmp_path / "x.npy", np.zeros(shape, np.float32))
    res = CliRunner().invoke(
        main, ["run", q, "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]
    )
    assert res.exit_code == 2 and res.output.strip() == f"error: {reason}", res.output
    res = CliRunner().invoke(main, ["inspect", q, "--format", "json"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)["unsupported"]
    assert listed[0]["node"] == "x_QuantizeLinear" and listed[0]["reason"] == reason
