"""Every op that touches axis 0 (issue 26 item 1, the whole op family): in a model exported at
batch 1, each works across axis 0 on its declared shapes, sets crosses_batch, and the Interpreter
runs the model image by image; bit for bit with TFLM (one image per invoke) and with LiteRT where
it has the op. An op fed through O.behind_reshape sees a declared axis 0 of 2 or more, as the ops
after YOLO11's attention reshape [1, 2, 64, 32] -> [2, 64, 32] do."""

from __future__ import annotations

import numpy as np
import pytest

import npusim
from npusim.testing import oracle as O

R = O.behind_reshape
C = np.random.default_rng(7).integers(-128, 128, (3, 4, 5))  # constants, cut to shape below


def const(*shape):
    return C.reshape(-1)[: int(np.prod(shape))].reshape(shape)


# name: (model, why: the op's own crosses_batch, LiteRT reference kernels agree)
MODELS = {
    "SLICE": (R(O.slice_model((3, 4, 2), [1, 0, 1], [2, 4, 1], 0.1, 3)), "slices axis 0 (1:3 of 3)", True),
    "UNPACK": (R(O.unpack_model((3, 4, 2), 0, 0.1, 3)), "unpacks along axis 0", True),
    "SQUEEZE": (
        O.squeeze_model((1, 5, 1), [], 0.1, 3),
        "moves elements across axis 0 ([1, 5, 1] into [5])",
        True,
    ),
    "EXPAND_DIMS": (
        R(O.expand_dims_model((3, 5, 2), 0, 0.1, 3)),
        "moves elements across axis 0 ([3, 5, 2] into [1, 3, 5, 2])",
        True,
    ),
    "GATHER": (R(O.gather_model((3, 4, 2), [2, 0, 2, 1], 0, 0.1, 3)), "gathers along axis 0", True),
    "GATHER batch 1": (O.gather_model((1, 4, 2), [0, 0, 0], 0, 0.1, 3), "gathers along axis 0", True),
    "SPLIT": (R(O.split_model((4, 3, 2), 0, 2, 0.1, 3)), "splits axis 0", True),
    "SPLIT_V": (R(O.split_v_model((4, 3, 2), [1, -1], 0, 0.1, 3)), "splits axis 0", True),
    "PACK": (O.pack_model((1, 3, 2), 2, 0, 0.1, 3), "packs along axis 0", True),
    "STRIDED_SLICE shrink": (
        O.strided_slice_model((1, 4, 3), [0, 1, 0], [1, 3, 3], [1, 1, 1], 0.1, 3, shrink_axis_mask=1),
        "slices axis 0 (begin 0, end 1, stride 1)",
        True,
    ),
    "STRIDED_SLICE reversed": (
        R(O.strided_slice_model((3, 4, 3), [-1, 1, 0], [-4, 3, 3], [-1, 1, 2], 0.1, 3)),
        "slices axis 0 (begin -1, end -4, stride -1)",
        True,
    ),
    "MEAN": (
        R(O.mean_model((3, 4, 2), 0.1, 3, 0.07, -2, axes=(0, 2), keep_dims=False)),
        "reduces axis 0",
        True,
    ),
    "MEAN batch 1": (O.mean_model((1, 4, 2), 0.1, 3, 0.07, -2, axes=(0,)), "reduces axis 0", True),
    # LiteRT's reference SUM requantizes otherwise than TFLM's (not an axis-0 matter)
    "SUM": (R(O.mean_model((3, 4, 2), 0.1, 3, 0.3, -2, axes=(0,), kind="SUM")), "reduces axis 0", False),
    "REDUCE_MAX": (
        R(O.mean_model((3, 4, 2), 0.1, 3, 0.1, 3, axes=(0,), keep_dims=False, kind="REDUCE_MAX")),
        "reduces axis 0",
        True,
    ),
    "ADD": (
        O.binary_model("ADD", (1, 3), (2, 3), 0.05, 0, 0.05, 1, 0.1, 0, const2=const(2, 3)),
        "takes constant 'const2' of shape [2, 3] along axis 0",
        True,
    ),
    "MUL": (
        O.binary_model("MUL", (1, 3, 1), (2, 3, 4), 0.05, 0, 0.05, 1, 0.1, 0, const2=const(2, 3, 4)),
        "takes constant 'const2' of shape [2, 3, 4] along axis 0",
        True,
    ),
    "SUB activations": (
        R(O.binary_model("SUB", (2, 3), (1, 3), 0.05, 0, 0.05, 1, 0.1, 0)),
        "broadcasts activation 'input2' of shape [1, 3] along axis 0",
        True,
    ),
    "MAXIMUM": (
        O.plain_binary_model("MAXIMUM", (1, 3), (2, 3), (0.1, 0), (0.1, 0), (0.1, 0), const2=const(2, 3)),
        "takes constant 'const2' of shape [2, 3] along axis 0",
        True,
    ),
    # LiteRT's PRELU wants the input's shape for the output (activations.cc HaveSameShapes)
    "PRELU": (
        O.plain_binary_model("PRELU", (1, 3), (2, 3), (0.1, 0), (0.05, 2), (0.1, 0), const2=const(2, 3)),
        "takes constant 'const2' of shape [2, 3] along axis 0",
        False,
    ),
    "BATCH_MATMUL": (
        O.batch_matmul_model((1, 3, 4), (2, 4, 5), (0.1, 0), (0.1, 0), (0.3, 1), rhs_const=const(2, 4, 5)),
        "takes constant 'rhs' of shape [2, 4, 5] along axis 0",
        True,
    ),
    "BATCH_MATMUL rank 2": (
        R(O.batch_matmul_model((3, 4), (4, 5), (0.1, 0), (0.1, 0), (0.3, 1), rhs_const=const(4, 5))),
        "broadcasts activation 'lhs' of shape [3, 4] to [3, 5]",
        True,
    ),
}


def batch_of(model, n, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-128, 128, (n, *shape[1:])).astype(np.int8) for shape, _ in O.model_inputs(model)]
    return xs[0] if len(xs) == 1 else xs


@pytest.mark.parametrize("name", list(MODELS))
def test_op_across_axis_zero_as_tflm_and_litert(name):
    model, why, litert = MODELS[name]
    interp = npusim.Interpreter(npusim.load_model(model))
    assert interp.batch.by_image
    assert [k.crosses_batch for k in interp.kernels][-1] == why
    x = batch_of(model, 4, len(name))
    got = O.run_npusim(model, x)
    O.assert_same(O.run_tflm(model, x), got, f"{name} vs TFLM")
    assert got.shape[0] == 4 * interp.graph.tensors[interp.graph.outputs[0]].shape[0]
    if litert:
        O.assert_same(O.run_litert(model, x, "REF"), got, f"{name} vs LiteRT reference kernels")
        O.assert_same(O.run_litert(model, x, "AUTO"), O.run_npusim(model, x, "xnnpack"), f"{name} LiteRT")


def test_tile_across_axis_zero_as_litert():
    """TILE is not in the PyPI TFLM: LiteRT's reference kernel is its oracle (test_ops_shapes.py)."""
    model = O.tile_model((1, 2, 3), [2, 1, 2], 0.1, 0)
    interp = npusim.Interpreter(npusim.load_model(model))
    assert interp.batch.why == "op 0 (TILE) tiles axis 0 2 times"
    x = batch_of(model, 3, 0)
    O.assert_same(O.run_litert(model, x, "REF"), O.run_npusim(model, x), "TILE vs LiteRT")


def test_expand_dims_in_front_of_a_batch_of_one_keeps_the_whole_batch():
    """[1, 5, 2] -> [1, 1, 5, 2] leaves one image per row of axis 0: no run image by image."""
    model = O.expand_dims_model((1, 5, 2), 0, 0.1, 3)
    assert not npusim.Interpreter(npusim.load_model(model)).batch.by_image
    x = batch_of(model, 3, 1)
    O.assert_same(O.run_tflm(model, x), O.run_npusim(model, x), "EXPAND_DIMS at 0")


def test_float_reference_runs_a_constant_across_axis_zero_image_by_image():
    """The float forms (pairwise, BATCH_MATMUL, MEAN) say crosses_batch as their kernels do."""
    from npusim.runtime.reference import FloatInterpreter

    for name in ("ADD", "BATCH_MATMUL", "MEAN batch 1"):
        model = MODELS[name][0]
        ref = FloatInterpreter(npusim.load_model(model))
        assert ref.batch.why == f"op 0 ({name.split()[0]}) {MODELS[name][1]}"
        shape = O.model_inputs(model)[0][0]
        x = np.random.default_rng(0).uniform(-3, 3, (3, *shape[1:])).astype(np.float32)
        assert np.array_equal(ref.run(x), np.concatenate([ref.run(x[i : i + 1]) for i in range(3)]))


def onnx_across(node, extra_inits=(), fmt="QOperator"):
    """A float ONNX graph Conv 1x1 -> `node` (on the Conv's output 'c', or on 'x' alone, giving
    'y'), quantized by ORT's quantize_static (fmt: QOperator or QDQ)."""
    from onnx import helper, numpy_helper

    from npusim.testing import onnx_oracle as oo

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.5, "cw")]
    inits = inits[: "c" in node.input] + [numpy_helper.from_array(np.asarray(v), k) for k, v in extra_inits]
    conv = helper.make_node("Conv", ["x", "cw"], ["c"], kernel_shape=[1, 1])
    m = oo._model(
        [conv, node] if "c" in node.input else [node],
        [oo._value("x", (1, 4, 4, 6))],
        [oo._value("y", None)],
        inits,
    )
    return oo.quantize(m, fmt=fmt, seed=1), m


@pytest.mark.parametrize(
    "make, why, fmt",
    [
        (
            lambda h: (h.make_node("Transpose", ["c"], ["y"], perm=[1, 0, 2, 3]), ()),
            "permutation [3, 0, 1, 2] moves axis 0",
            "QOperator",
        ),
        (
            lambda h: (h.make_node("Pad", ["x", "p"], ["y"]), [("p", np.asarray([1, 0, 0, 0, 0, 0, 0, 1]))]),
            "pads axis 0 by [1, 0]",
            "QDQ",
        ),
        (  # ORT's QOperator Pad pads with a uint8 code (the zero point), not a real value
            lambda h: (h.make_node("Pad", ["c", "p"], ["y"]), [("p", np.asarray([1, 0, 0, 0, 0, 0, 0, 1]))]),
            "pads axis 0 by [1, 0]",
            "QOperator",
        ),
        (
            lambda h: (
                h.make_node("Slice", ["c", "s", "e", "a"], ["y"]),
                [("s", np.asarray([0])), ("e", np.asarray([1])), ("a", np.asarray([0]))],
            ),
            None,
            "QOperator",
        ),
    ],
    ids=["transpose", "pad qdq", "pad qoperator", "slice whole"],
)
def test_onnx_across_axis_zero_as_onnxruntime(make, why, fmt):
    """Transpose moving axis 0 (a TRANSPOSE where the layout is needed), Pad of axis 0: lowered as
    they are (the importer refused them), run image by image, ORT's output bit for bit."""
    pytest.importorskip("onnxruntime")
    from onnx import helper

    from npusim.testing import onnx_oracle as oo

    node, inits = make(helper)
    q, m = onnx_across(node, [(k, v.astype(np.int64)) for k, v in inits], fmt)
    x = np.concatenate([f["x"] for f in oo.random_inputs(m, 3, seed=3)])
    interp = npusim.Interpreter(npusim.load_model(q), profile="onnxruntime")
    assert interp.batch.why is None if why is None else interp.batch.why.endswith(why)
    O.assert_same(oo.run_ort(q, x), interp.run(x), f"{fmt} model vs ORT")


def test_onnx_slice_of_axis_zero_as_onnxruntime():
    """Reshape [1, 4, 4, 6] -> [4, 4, 6], then Slice rows 1:3 of axis 0 (a STRIDED_SLICE across it)."""
    pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    from npusim.testing import onnx_oracle as oo

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Reshape", ["c", "s1"], ["r"]),
        helper.make_node("Slice", ["r", "b", "e", "a"], ["y"]),
    ]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.5, "cw")]
    inits += [
        numpy_helper.from_array(np.asarray(v, np.int64), k)
        for k, v in (("s1", [4, 4, 6]), ("b", [1]), ("e", [3]), ("a", [0]))
    ]
    m = oo._model(nodes, [oo._value("x", (1, 4, 4, 6))], [oo._value("y", None)], inits)
    q = oo.quantize(m, fmt="QOperator", seed=1)
    x = np.concatenate([f["x"] for f in oo.random_inputs(m, 3, seed=4)])
    interp = npusim.Interpreter(npusim.load_model(q), profile="onnxruntime")
    kinds = {k.kind: k.crosses_batch for k in interp.kernels}
    assert kinds["STRIDED_SLICE"] == "slices axis 0 (begin 1, end 3, stride 1)"
    O.assert_same(oo.run_ort(q, x), interp.run(x), "QOperator model vs ORT")


@pytest.mark.parametrize("keepdims", [0, 1])
def test_onnx_reduce_mean_of_axis_zero_as_onnxruntime(keepdims):
    """Q, Reshape [1, 4, 4, 6] -> [4, 4, 6], ReduceMean over axis 0, Q, written as QDQ by hand (ORT's
    quantizer leaves ReduceMean float): a MEAN across axis 0, run image by image, equal to ORT's
    literal QDQ semantics (optimizations off) bit for bit."""
    pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    from npusim.testing import onnx_oracle as oo

    def qdq(src, dst, scale):
        return [
            helper.make_node("QuantizeLinear", [src, scale, "zp"], [dst + "_q"]),
            helper.make_node("DequantizeLinear", [dst + "_q", scale, "zp"], [dst]),
        ]

    nodes = [
        *qdq("x", "xq", "s_in"),
        helper.make_node("Reshape", ["xq", "shape"], ["r"]),
        helper.make_node("ReduceMean", ["r", "axes"], ["m"], keepdims=keepdims),
        *qdq("m", "y", "s_out"),
    ]
    consts = {"s_in": np.float32(0.05), "s_out": np.float32(0.03), "zp": np.int8(3)}
    consts |= {"shape": np.asarray([4, 4, 6], np.int64), "axes": np.asarray([0], np.int64)}
    m = oo._model(
        nodes,
        [oo._value("x", (1, 4, 4, 6))],
        [oo._value("y", None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
        opset=18,
    )
    q = m.SerializeToString()
    x = np.random.default_rng(5).uniform(-6, 6, (3, 4, 4, 6)).astype(np.float32)
    interp = npusim.Interpreter(npusim.load_model(q), profile="onnxruntime")
    assert interp.batch.by_image
    O.assert_same(oo.run_ort(q, x, optimize=False), interp.run(x), "QDQ ReduceMean over axis 0 vs ORT")
