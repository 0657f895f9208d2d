"""FULLY_CONNECTED whose weights are an activation (the attention blocks of YOLO11 as ST's N6 models
write them: `op 280 (FULLY_CONNECTED): weights ... is not a constant` before), and QUANTIZE to a uint8
output (a uint8 model around an int8 graph): bit-exact with TFLM on generated models.

The weights come from a second graph input through a RESHAPE [1, O*K] -> [O, K], as in the attention
(where they come from the block's own activations): TFLM runs each image, npusim runs the model
image by image (the weights' axis 0 is their units, not the batch).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tflite_micro")

from ai_edge_litert import schema_py_generated as schema  # noqa: E402

import npusim  # noqa: E402
from npusim.testing import runners  # noqa: E402
from npusim.testing.builder import ModelBuilder, bias_scale, f32  # noqa: E402

ACTIVATIONS = {"NONE": 0, "RELU": 1, "RELU6": 3}


def fc_model(m, k, o, qx, qw, qy, bias: bool, activation: str, keep_num_dims: bool) -> bytes:
    b = ModelBuilder()
    x = b.add_tensor((1, m, k) if keep_num_dims else (m, k), np.int8, *qx, name="x")
    wf = b.add_tensor((1, o * k), np.int8, *qw, name="w_flat")
    shape = b.add_const(np.asarray([o, k], np.int32), name="shape")
    w = b.add_tensor((o, k), np.int8, *qw, name="w")
    opt = schema.ReshapeOptionsT()
    opt.newShape = [o, k]
    b.add_op("RESHAPE", [wf, shape], [w], opt)
    bt = -1
    if bias:
        codes = np.random.default_rng(o * k).integers(-5000, 5000, o).astype(np.int32)
        bt = b.add_const(codes, scale=bias_scale(qx[0], np.atleast_1d(f32(qw[0]))), zero_point=[0], name="b")
    y = b.add_tensor((1, m, o) if keep_num_dims else (m, o), np.int8, *qy, name="y")
    fc = schema.FullyConnectedOptionsT()
    fc.keepNumDims = keep_num_dims
    fc.fusedActivationFunction = ACTIVATIONS[activation]
    b.add_op("FULLY_CONNECTED", [x, w, bt], [y], fc)
    return b.build([x, wf], [y])


CASES = [
    # m, k, o, weight zero point, bias, activation, keep_num_dims
    (4, 16, 5, 3, True, "NONE", True),
    (7, 32, 7, -20, True, "RELU", True),
    (1, 8, 3, 0, False, "NONE", True),
    (16, 64, 16, 11, True, "RELU6", True),
    (1, 24, 6, -128, True, "NONE", False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "m{}k{}o{}zw{}{}{}{}".format(*c))
def test_fully_connected_with_activation_weights_equals_tflm(case):
    m, k, o, zw, bias, activation, keep = case
    model = fc_model(m, k, o, (0.02, -3), (0.015, zw), (0.05, 4), bias, activation, keep)
    rng = np.random.default_rng(m * 1000 + k)
    n = 3 if keep else 1  # [m, k] without keep_num_dims: axis 0 is already the rows
    x = rng.integers(-128, 128, ((n, m, k) if keep else (m, k))).astype(np.int8)
    w = rng.integers(-128, 128, (n, o * k)).astype(np.int8)
    expected = runners.run_tflm(model, [x, w])
    graph = npusim.load_model(model)
    interp = npusim.Interpreter(graph)
    got = interp.evaluate({graph.inputs[0]: x, graph.inputs[1]: w})[graph.outputs[0]]
    np.testing.assert_array_equal(got, expected)
    assert interp.batch.by_image  # the weights' axis 0 is no batch


def uint8_around_int8(q_in, q_mid, q_out) -> bytes:
    """uint8 input -> QUANTIZE -> int8 LEAKY_RELU -> QUANTIZE -> uint8 output."""
    b = ModelBuilder()
    x = b.add_tensor((1, 6, 6, 3), np.uint8, *q_in, name="x")
    xi = b.add_tensor((1, 6, 6, 3), np.int8, *q_mid, name="x_int8")
    b.add_op("QUANTIZE", [x], [xi])
    h = b.add_tensor((1, 6, 6, 3), np.int8, *q_mid, name="h")
    opt = schema.LeakyReluOptionsT()
    opt.alpha = 0.1
    b.add_op("LEAKY_RELU", [xi], [h], opt)
    y = b.add_tensor((1, 6, 6, 3), np.uint8, *q_out, name="y")
    b.add_op("QUANTIZE", [h], [y])
    return b.build([x], [y])


@pytest.mark.parametrize(
    "q",
    [
        ((0.02, 128), (0.02, 0), (0.02, 128)),
        ((0.02, 100), (0.03, -5), (0.011, 7)),
        ((0.5, 3), (0.25, -128), (0.7, 250)),
    ],
)
def test_quantize_to_uint8_output_equals_tflm(q):
    model = uint8_around_int8(*q)
    x = np.random.default_rng(0).integers(0, 256, (4, 6, 6, 3)).astype(np.uint8)
    expected = runners.run_tflm(model, x)
    got = npusim.Interpreter(npusim.load_model(model)).run(x)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, expected)


def test_inspect_lists_an_op_npusim_refuses_and_run_stops_at_it(tmp_path):
    """A known op in a form npusim refuses (here activation weights quantized per channel) is
    listed by inspect with the line `run` stops at, not a refusal of the whole model."""
    import json

    from click.testing import CliRunner

    from npusim.app.cli import main

    b = ModelBuilder()
    x = b.add_tensor((1, 8), np.int8, 0.02, 0, name="x")
    w = b.add_tensor((3, 8), np.int8, [0.01, 0.02, 0.03], [0, 0, 0], name="w")
    y = b.add_tensor((1, 3), np.int8, 0.05, 0, name="y")
    b.add_op("FULLY_CONNECTED", [x, w, -1], [y], schema.FullyConnectedOptionsT())
    z = b.add_tensor((1, 3), np.int8, 0.05, 0, name="z")
    opt = schema.LeakyReluOptionsT()
    opt.alpha = 0.1
    b.add_op("LEAKY_RELU", [y], [z], opt)
    f = tmp_path / "m.tflite"
    f.write_bytes(b.build([x, w], [z]))
    res = CliRunner().invoke(main, ["inspect", str(f), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    (entry,) = data["unsupported"]
    assert entry["index"] == 0 and entry["op"] == "FULLY_CONNECTED"
    assert entry["reason"].startswith("op 0 (FULLY_CONNECTED): weights 'w' are an activation")
    assert [o["supported"] for o in data["ops"]] == [False, True]
    res = CliRunner().invoke(main, ["inspect", str(f)])
    assert res.exit_code == 0 and entry["reason"] in res.output.splitlines()[-1], res.output
    np.save(tmp_path / "x.npy", np.zeros((1, 8), np.int8))
    res = CliRunner().invoke(
        main, ["run", str(f), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]
    )
    assert res.exit_code == 2 and entry["reason"] in res.output, res.output


def test_float_form_with_activation_weights_runs_image_by_image():
    """The float form (validate's reference) takes activation weights too, image by image as the
    kernel: close to the int8 run on the same inputs."""
    from npusim.runtime.reference import FloatInterpreter, dequantize

    model = fc_model(4, 16, 5, (0.02, -3), (0.015, 3), (0.05, 4), True, "NONE", True)
    graph = npusim.load_model(model)
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (3, 4, 16)).astype(np.int8)
    w = rng.integers(-128, 128, (3, 80)).astype(np.int8)
    got = npusim.Interpreter(graph).evaluate({graph.inputs[0]: x, graph.inputs[1]: w})[graph.outputs[0]]
    forms = FloatInterpreter(graph)
    assert forms.batch.by_image
    real = {t: dequantize(graph.tensors[t], v) for t, v in zip(graph.inputs, (x, w))}
    ref = np.clip(
        forms.evaluate(real)[graph.outputs[0]], 0.05 * (-128 - 4), 0.05 * (127 - 4)
    )  # int8 saturates
    assert np.abs(ref - dequantize(graph.tensors[graph.outputs[0]], got)).max() <= 0.05 / 2 + 1e-6
