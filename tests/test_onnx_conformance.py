"""ONNX's own conformance cases for the quantized ops, read from the installed onnx package
(`onnx.backend.test.case.node`, the generators of onnx/backend/test/data/node: this onnx wheel ships
the generators, not the generated files), run as they are and compared with their expected outputs.

These cases feed scales, zero points and weights as graph inputs. npusim fixes every input but the
first at load (`npusim.formats.onnx.reader.bind_inputs`: an NPU compiler fixes them too), and runs the first,
an int8 / uint8 / float32 activation, under both profiles. Graph inputs and outputs of type int8 and
uint8, int32 outputs (the sums of ConvInteger and MatMulInteger), asymmetric weights (QLinearConv's
uint8 weight of zero point 255) and per-axis QuantizeLinear / DequantizeLinear at the graph's edges
are what these need (docs/onnx.md). All pass; none is left open.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import npusim  # noqa: E402
from npusim.formats.onnx.reader import bind_inputs  # noqa: E402

CASES = [
    "test_qlinearconv",
    "test_qlinearmatmul_2D_uint8_float32",
    "test_qlinearmatmul_3D_uint8_float32",
    "test_qlinearmatmul_2D_int8_float32",
    "test_qlinearmatmul_3D_int8_float32",
    "test_qlinearmatmul_2D_uint8_float16",
    "test_qlinearmatmul_3D_uint8_float16",
    "test_qlinearmatmul_2D_int8_float16",
    "test_qlinearmatmul_3D_int8_float16",
    "test_matmulinteger",
    "test_convinteger_with_padding",
    "test_convinteger_without_padding",
    "test_quantizelinear",
    "test_quantizelinear_axis",
    "test_dequantizelinear",
    "test_dequantizelinear_axis",
]


def _cases() -> dict:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators of other ops warn about their own values
        found = {c.name: c for c in collect_testcases(None) if c.name in CASES}
    return found


@pytest.fixture(scope="module")
def cases():
    return _cases()


def test_every_named_case_is_in_the_package(cases):
    assert sorted(cases) == sorted(CASES)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("profile", ["tflm", "onnxruntime"])
def test_conformance_case(cases, name, profile):
    case = cases[name]
    for inputs, expected in case.data_sets:
        names = [i.name for i in case.model.graph.input]
        data = bind_inputs(case.model.SerializeToString(), dict(zip(names[1:], inputs[1:])))
        graph = npusim.load_model(data)
        y = npusim.Interpreter(graph, profile=profile).run(inputs[0])
        assert y.dtype == expected[0].dtype and y.shape == expected[0].shape, name
        np.testing.assert_array_equal(y, expected[0], err_msg=name)


def test_bind_inputs_refuses_a_wrong_value(cases):
    case = cases["test_quantizelinear"]
    data = case.model.SerializeToString()
    with pytest.raises(npusim.NpusimError, match="no graph input 'nope'"):
        bind_inputs(data, {"nope": np.zeros(1, np.float32)})
    with pytest.raises(npusim.NpusimError, match="value for graph input 'y_scale' is float64"):
        bind_inputs(data, {"y_scale": np.float64(0.5)})
    assert re.search("y_scale", str([i.name for i in onnx.load_from_string(data).graph.input]))


@pytest.mark.parametrize("activation", ["int8", "uint8"])
def test_integer_graph_input_and_output_against_ort(activation):
    """A QDQ Conv whose graph input is the quantized codes (no QuantizeLinear in the file) and whose
    output is the QuantizeLinear's codes (no DequantizeLinear): ORT's literal run on the same codes
    is the oracle; --profile onnxruntime equal, tflm within one step."""
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    from onnx_qdq import qdq
    from test_onnx_import import feeds_for, model, rng_of

    from npusim.testing import onnx_oracle as oo

    rng = rng_of("integer-io", activation)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    m = onnx.load_from_string(
        qdq(
            model([node], [("x", (1, 3, 6, 6))], [("w", w)]),
            feeds_for(model([node], [("x", (1, 3, 6, 6))], [("w", w)]), rng),
            activation=activation,
        )
    )
    elem = TensorProto.INT8 if activation == "int8" else TensorProto.UINT8
    q_in = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    m.graph.node.remove(q_in)
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info(q_in.output[0], elem, [1, 3, 6, 6]))
    dq_out = next(n for n in m.graph.node if n.output[0] == m.graph.output[0].name)
    m.graph.node.remove(dq_out)
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info(dq_out.input[0], elem, [1, 4, 6, 6]))
    data = m.SerializeToString()
    dtype = np.int8 if activation == "int8" else np.uint8
    x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (1, 3, 6, 6), endpoint=True).astype(dtype)
    sess = oo.session(data, optimize=False)
    y_ort = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    graph = npusim.load_model(data)
    y = npusim.Interpreter(graph, profile="onnxruntime").run(x)
    assert y.dtype == y_ort.dtype == dtype
    np.testing.assert_array_equal(y, y_ort)
    y_tflm = npusim.Interpreter(graph, profile="tflm").run(x)
    assert np.abs(y_tflm.astype(int) - y_ort.astype(int)).max() <= 1


@pytest.mark.parametrize("where", ["input", "output"])
def test_a_four_bit_graph_input_or_output_is_refused_naming_why(where):
    """int4 graph inputs/outputs: ONNX allows them, but neither numpy nor ORT's Python API has a type
    to feed or return them (docs/onnx.md); refused in one line that says so, never as 'a float model'."""
    from onnx import TensorProto, helper

    if where == "input":
        x = helper.make_tensor_value_info("x", TensorProto.INT4, [1, 4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
        node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
        y = helper.make_tensor_value_info("y", TensorProto.INT4, [1, 4])
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    init = [
        helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("z", TensorProto.INT4, [], [0]),
    ]
    m = helper.make_model(
        helper.make_graph([node], "g", [x], [y], init), opset_imports=[helper.make_opsetid("", 21)]
    )
    m.ir_version = 10
    with pytest.raises(npusim.NpusimError, match=f"graph {where} '[xy]' is int4, .*no numpy type holds them"):
        npusim.load_model(m.SerializeToString())
