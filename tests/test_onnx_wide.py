"""Asymmetric weights and int32 sums (kernels/wide.py) against ONNX Runtime.

Generated one-op graphs: MatMulInteger and ConvInteger whose int32 output is the graph's output
(the sums (x - x_zp)(w - w_zp) with no rescale), read from an int8 / uint8 graph input, with weights
over their whole type range and arbitrary zero points (codes minus zero point leave int8); QLinearConv
with uint8 weights of an arbitrary zero point; a ConvInteger rescale chain with such weights. ORT
(optimizations off and on) is the oracle; where ORT refuses (ConvInteger with a zero point per output
channel, which ONNX allows), ONNX's reference evaluator is.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import npusim  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402

ELEM = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
TYPES = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.uint8), (np.int8, np.int8)]


def rng_of(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def codes(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def one_op(node, x_type, x_shape, inits, y_elem=TensorProto.INT32) -> bytes:
    graph = helper.make_graph(
        [node],
        "t",
        [helper.make_tensor_value_info("x", ELEM[x_type], list(x_shape))],
        [helper.make_tensor_value_info("y", y_elem, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m.SerializeToString()


def run_both(data: bytes, x: np.ndarray) -> dict:
    graph = npusim.load_model(data)
    return {p: npusim.Interpreter(graph, profile=p).run(x) for p in ("tflm", "onnxruntime")}


def assert_equal_to_ort(data: bytes, x: np.ndarray):
    """Both profiles equal ORT's int32 sums, optimizations off and on (dtype and shape too)."""
    ys = run_both(data, x)
    for optimize in (False, True):
        sess = oo.session(data, optimize=optimize)
        want = sess.run(None, {"x": x})[0]
        for profile, y in ys.items():
            assert y.dtype == want.dtype and y.shape == want.shape, (profile, optimize)
            np.testing.assert_array_equal(y, want, err_msg=f"{profile}, ORT optimize={optimize}")


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"{t[0].__name__}x{t[1].__name__}")
@pytest.mark.parametrize("case", range(3))
def test_matmul_integer_sums_match_ort(types, case):
    x_type, w_type = types
    rng = rng_of("matmulinteger", x_type.__name__, w_type.__name__, case)
    k, n = int(rng.integers(1, 70)), int(rng.integers(1, 20))
    lead = [(), (3,), (2, 3)][case]
    x_shape = (*lead, int(rng.integers(1, 9)), k) if case else (int(rng.integers(1, 9)), k)
    w = codes(rng, w_type, (k, n))
    w_zp = codes(rng, w_type, (n,) if case % 2 else ())  # per column (ORT allows it) or per tensor
    x_zp = codes(rng, x_type, ())
    node = helper.make_node("MatMulInteger", ["x", "w", "xz", "wz"], ["y"])
    data = one_op(node, x_type, x_shape, dict(w=w, xz=x_zp, wz=w_zp))
    assert_equal_to_ort(data, codes(rng, x_type, x_shape))


CONV = [
    # (in channels, out channels, kernel, attrs)
    (3, 5, 3, dict(pads=[1, 1, 1, 1])),
    (4, 6, 3, dict(strides=[2, 2], pads=[0, 1, 2, 1])),
    (4, 8, 2, dict(group=2, dilations=[2, 1])),
    (6, 6, 3, dict(group=6, pads=[1, 1, 1, 1])),  # depthwise
    (5, 4, 1, dict(auto_pad="SAME_UPPER", strides=[2, 2])),
]


@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"{t[0].__name__}x{t[1].__name__}")
@pytest.mark.parametrize("case", range(len(CONV)))
def test_conv_integer_sums_match_ort(types, case):
    x_type, w_type = types
    c, o, k, attrs = CONV[case]
    rng = rng_of("convinteger", x_type.__name__, w_type.__name__, case)
    w = codes(rng, w_type, (o, c // attrs.get("group", 1), k, k))
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)
    x_shape = (2, c, int(rng.integers(5, 10)), int(rng.integers(5, 10)))
    inits = dict(w=w, xz=codes(rng, x_type, ()), wz=codes(rng, w_type, ()))  # ORT: per tensor only
    assert_equal_to_ort(one_op(node, x_type, x_shape, inits), codes(rng, x_type, x_shape))


@pytest.mark.parametrize("group", [1, 3])
def test_conv_integer_per_channel_zero_points_match_the_reference(group):
    """ONNX allows a weight zero point per output channel; ORT's CPU kernel refuses it, so ONNX's
    reference evaluator is the oracle."""
    from onnx.reference import ReferenceEvaluator

    rng = rng_of("convinteger-per-channel", group)
    w = codes(rng, np.uint8, (6, 6 // group, 3, 3))
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], group=group, pads=[1, 0, 1, 2])
    inits = dict(w=w, xz=np.uint8(37), wz=codes(rng, np.uint8, (6,)))
    data = one_op(node, np.uint8, (1, 6, 7, 6), inits)
    x = codes(rng, np.uint8, (1, 6, 7, 6))
    want = ReferenceEvaluator(onnx.load_from_string(data)).run(None, {"x": x})[0]
    for profile, y in run_both(data, x).items():
        assert y.dtype == want.dtype and y.shape == want.shape, profile
        np.testing.assert_array_equal(y, want, err_msg=profile)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize(
    "types", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)], ids=["u8u8", "u8s8", "s8s8"]
)
def test_qlinearconv_asymmetric_weights_match_ort(types, per_channel):
    """Weights over their whole range with arbitrary zero points (codes minus zero point leave int8;
    the pairs of types ORT's QLinearConv has): --profile onnxruntime equals ORT, tflm (its fixed-point
    multiplier) is within one step."""
    x_type, w_type = types
    rng = rng_of("qlinearconv-asymmetric", x_type.__name__, w_type.__name__, per_channel)
    o, c = 6, 4
    w = codes(rng, w_type, (o, c, 3, 3))
    w_zp = codes(rng, w_type, (o,) if per_channel else ())
    w_scale = rng.uniform(0.002, 0.01, (o,) if per_channel else ()).astype(np.float32)
    b = rng.integers(-3000, 3000, o).astype(np.int32)
    x_zp = codes(rng, x_type, ())
    y_zp = x_type(128 if x_type == np.uint8 else 0)  # the sums' offsets span both signs
    node = helper.make_node(
        "QLinearConv",
        ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
        ["y"],
        pads=[1, 1, 1, 1],
        strides=[1, 2],
    )
    inits = dict(xs=np.float32(0.02), xz=x_zp, w=w, ws=w_scale, wz=w_zp, ys=np.float32(0.4), yz=y_zp, b=b)
    data = one_op(node, x_type, (2, c, 8, 9), inits, ELEM[x_type])
    x = codes(rng, x_type, (2, c, 8, 9))
    want = oo.session(data, optimize=False).run(None, {"x": x})[0]
    assert len(np.unique(want)) > 16  # the rescale does not saturate everything
    ys = run_both(data, x)
    assert ys["onnxruntime"].dtype == want.dtype and ys["onnxruntime"].shape == want.shape
    np.testing.assert_array_equal(ys["onnxruntime"], want)
    assert np.abs(ys["tflm"].astype(int) - want.astype(int)).max() <= 1


def test_conv_integer_rescale_chain_with_asymmetric_weights_matches_ort():
    """The rescaled ConvInteger (Cast, Mul, Add, QuantizeLinear) with uint8 weights of zero point 250."""
    from test_onnx_integer import check, integer_model

    rng = rng_of("convinteger-chain-asymmetric")
    w = codes(rng, np.uint8, (5, 3, 3, 3))
    m = (np.float32(0.02) * rng.uniform(0.0005, 0.002, (1, 5, 1, 1))).astype(np.float32)
    bias = rng.uniform(-0.5, 0.5, (1, 5, 1, 1)).astype(np.float32)
    q = integer_model(
        "ConvInteger", (None, 3, 8, 8), w, np.uint8(250), m, bias, np.uint8(131), dict(pads=[1, 1, 1, 1])
    )
    check(q, rng.uniform(-2.5, 2.5, (4, 3, 8, 8)).astype(np.float32), "asymmetric ConvInteger chain")


def test_integer_sums_read_by_another_op_are_refused():
    """int32 sums that feed anything but the rescale chain or the graph's output: one line."""
    node = helper.make_node("MatMulInteger", ["x", "w"], ["s"], name="mm")
    relu = helper.make_node("Relu", ["s"], ["y"], name="relu")
    graph = helper.make_graph(
        [node, relu],
        "t",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(np.ones((4, 3), np.uint8), "w")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    with pytest.raises(npusim.NpusimError, match=r"^node 'mm' \(MatMulInteger\): .*int32 sums") as e:
        npusim.load_model(m.SerializeToString())
    assert "\n" not in str(e.value)
