"""The contracts a user meets in the first hour (issue 30): output paths name their format, a model
file npusim does not run says what it is in one line in every command, `inspect` tells how to feed
the model (as LiteRT's get_input_details() and ONNX Runtime's get_inputs() do) and lists ops npusim
lacks, `Interpreter.run` returns every output, and `compare --reference` refuses another batch."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from test_cli_outputs import two_output_model
from test_robustness import one_line_error

import npusim
import npusim.app.cli
import zo.cli
from npusim.ops import KERNELS
from npusim.testing import oracle as O

from shared_paths import SHARED, need
from zo_fixtures import color_dataset, tiny_classifier

MODELS = SHARED / "models"
FLOAT_RESNET = MODELS / "resnet8_cifar10_float.tflite"
# LiteRT's get_input_details() on these is the oracle of inspect's inputs/outputs
TFLITE_MODELS = [
    "resnet8_cifar10_int8.tflite",  # int8 in and out, per-tensor
    "mobilenet_v2_0.35_128_flowers_int8.tflite",  # uint8 in, float32 out
    "stm32n6/yolov8n_256_quant_pc_ii_seg_coco-st.tflite",  # two outputs
    "stm32n6/blazeface_front_128_quant_pc_ff_od_widerface.tflite",  # float32 in, four outputs
]
ONNX_MODELS = ["onnx/yolo26_256_qdq_int8_od_coco-person-st.onnx", "onnx/face_landmarks_v1_192_int8_pc.onnx"]
UNSUPPORTED = "RSQRT"


def npusim_cli(*args):
    return CliRunner().invoke(npusim.app.cli.main, [str(a) for a in args], catch_exceptions=False)


def zo_cli(*args):
    return CliRunner().invoke(zo.cli.main, [str(a) for a in args], catch_exceptions=False)


def legacy_uint8_model() -> bytes:
    """CONV_2D on uint8 activations and uint8 weights (zero point 128): TFLite's legacy quantization."""
    b = O.ModelBuilder()
    x = b.add_tensor((1, 4, 4, 3), np.uint8, 0.05, 128, name="input")
    w = b.add_const(np.full((2, 1, 1, 3), 130, np.uint8), scale=0.02, zero_point=128, name="weights")
    bias = b.add_const(np.zeros(2, np.int32), scale=0.001, zero_point=0, name="bias")
    y = b.add_tensor((1, 4, 4, 2), np.uint8, 0.1, 128, name="output")
    opt = O.schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = O.schema.Padding.SAME, 1, 1
    b.add_op("CONV_2D", [x, w, bias], [y], opt)
    return b.build([x], [y])


def unsupported_op_model() -> bytes:
    """LOGISTIC -> RSQRT (an op npusim lacks) -> TANH: the op after the gap is still planned."""
    assert UNSUPPORTED not in KERNELS, f"{UNSUPPORTED} is now supported: pick another op for this test"
    b = O.ModelBuilder()
    x = b.add_tensor((1, 8), np.int8, 0.05, 0, name="input")
    h = b.add_tensor((1, 8), np.int8, 1 / 256, -128, name="sigmoid")
    b.add_op("LOGISTIC", [x], [h])
    r = b.add_tensor((1, 8), np.int8, 0.05, 0, name="rsqrt")
    b.add_op(UNSUPPORTED, [h], [r], version=2)
    y = b.add_tensor((1, 8), np.int8, 1 / 128, 0, name="output")
    b.add_op("TANH", [r], [y])
    return b.build([x], [y])


def small_qdq(activation: str = "int8") -> bytes:
    from npusim.testing import onnx_oracle as X

    return X.quantize(X.small_cnn_model(size=8), "QDQ", activation=activation, weight="int8")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A model and a matching input for each kind, in one folder."""
    d = tmp_path_factory.mktemp("contracts")
    tflite = d / "logistic.tflite"
    tflite.write_bytes(O.logistic_model((1, 5), 0.05, 7))
    np.save(d / "x.npy", np.arange(-20, 20, 4, dtype=np.int8).reshape(2, 5))
    onnx = d / "cnn.onnx"
    onnx.write_bytes(small_qdq())
    np.save(d / "x_onnx.npy", np.random.default_rng(0).uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32))
    paths = {"tflite": (tflite, d / "x.npy"), "onnx": (onnx, d / "x_onnx.npy")}
    bad = {
        "folder": (d / "folder", "a folder, expected a model file (.tflite or .onnx)"),
        "float tflite": (d / "float.tflite", "a float model: npusim runs int8 models; quantize it to int8"),
        "float onnx": (d / "float.onnx", "a float model: npusim runs int8 models; quantize it to int8"),
        "uint8 legacy": (d / "legacy.tflite", "a uint8 model (TFLite's legacy quantization: op 0 (CONV_2D)"),
        "keras h5": (d / "model.h5", "a Keras HDF5 model (.h5): convert it to an int8 .tflite first"),
        "neither": (d / "noise.bin", "not a TFLite flatbuffer (no 'TFL3' identifier) and not an ONNX model"),
    }
    (d / "folder").mkdir()
    bad["float tflite"][0].write_bytes(O.float_model(O.logistic_model((1, 5), 0.05, 7)))
    from npusim.testing import onnx_oracle as X

    bad["float onnx"][0].write_bytes(X.small_cnn_model(size=8).SerializeToString())
    bad["uint8 legacy"][0].write_bytes(legacy_uint8_model())
    bad["keras h5"][0].write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(200))
    bad["neither"][0].write_bytes(b"\xff" * 300)
    np.save(d / "xf.npy", np.zeros((2, 5), np.float32))
    golden = d / "g.npz"
    assert npusim_cli("golden", "record", tflite, "--input", d / "x.npy", "-o", golden).exit_code == 0
    data = d / "data.npz"
    np.savez(data, **color_dataset())
    return dict(dir=d, good=paths, bad=bad, golden=golden, data=data, xf=d / "xf.npy")


# ----------------------------------------------------------------------------------------------
# 1. --output names .npy or .npz
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
@pytest.mark.parametrize("name", ["out.txt", "out", "out.npy.bak"])
def test_run_output_of_another_format_exits_2_and_writes_nothing(files, tmp_path, fmt, name):
    model, x = files["good"][fmt]
    line = one_line_error(npusim_cli("run", model, "--input", x, "--output", tmp_path / name))
    assert (
        line == f"error: --output {tmp_path / name}: expected a path ending in .npy or .npz, nothing written"
    )
    assert os.listdir(tmp_path) == []


def test_golden_record_output_must_be_npz(files, tmp_path):
    model, x = files["good"]["tflite"]
    for name in ("g.npy", "g.txt"):
        line = one_line_error(npusim_cli("golden", "record", model, "--input", x, "-o", tmp_path / name))
        assert line == f"error: -o {tmp_path / name}: expected a path ending in .npz, nothing written"
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_output_is_written_to_exactly_the_path_given(files, tmp_path, fmt):
    """np.save would append .npy to "Y.NPY": the file is the one named, in either case."""
    model, x = files["good"][fmt]
    for name in ("Y.NPY", "y.npz"):
        r = npusim_cli("run", model, "--input", x, "--output", tmp_path / name)
        assert r.exit_code == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["Y.NPY", "y.npz"]
    y = npusim.Interpreter(str(model)).run(np.load(x))
    np.testing.assert_array_equal(np.load(tmp_path / "Y.NPY"), y)
    with np.load(tmp_path / "y.npz") as z:
        np.testing.assert_array_equal(z["output_0"], y)


# ----------------------------------------------------------------------------------------------
# 2. A model npusim does not run: one line, in every command
# ----------------------------------------------------------------------------------------------


def command_lines(files, model):
    d = files["dir"]
    x = d / "x.npy"
    return {
        "run": ("npusim", ["run", model, "--input", x, "--output", d / "never.npy"]),
        "inspect": ("npusim", ["inspect", model]),
        "inspect stm32n6": ("npusim", ["inspect", model, "--target", "stm32n6", "--format", "json"]),
        "golden record": ("npusim", ["golden", "record", model, "--input", x, "-o", d / "never.npz"]),
        "golden check": ("npusim", ["golden", "check", model, files["golden"]]),
        "compare": ("npusim", ["compare", model, "--input", x, "--b", "xnnpack"]),
        "validate": ("npusim", ["validate", model, "--input", files["xf"]]),
        "zo train": ("zo", ["train", "--model", model, "--data", files["data"], "--out", d / "never"]),
        "zo cost": ("zo", ["cost", "--model", model]),
    }


def without_setup_steps(result):
    """zo train says each setup step on stderr ("zo train: reading the model ...") before the step
    that fails: the result with those lines left out, so that the error is the one line left."""
    steps = [line for line in result.stderr.splitlines() if line.startswith("zo train: ")]
    assert len(steps) <= 1, result.stderr  # the model is read first: nothing else ran
    return SimpleNamespace(
        exception=result.exception,
        exit_code=result.exit_code,
        output=result.output,
        stderr="\n".join(line for line in result.stderr.splitlines() if line not in steps),
    )


@pytest.mark.parametrize(
    "kind", ["folder", "float tflite", "float onnx", "uint8 legacy", "keras h5", "neither"]
)
def test_a_model_npusim_does_not_run_says_what_it_is_in_every_command(files, kind):
    path, message = files["bad"][kind]
    for command, (tool, args) in command_lines(files, path).items():
        if command == "inspect" and kind == "uint8 legacy":
            continue  # inspect lists a uint8 model (tests/test_uint8.py); its STM32N6 view refuses it
        result = (npusim_cli if tool == "npusim" else zo_cli)(*args)
        line = one_line_error(without_setup_steps(result))
        assert line.startswith(f"error: {path}: "), (command, line)
        expected = message
        if command == "validate" and kind == "float tflite":  # its INT8_MODEL; a float one goes to --float
            expected = (
                "a float model: npusim runs int8 models; as INT8_MODEL give its int8 model, and this one"
            )
        assert expected in line, (command, line)
    assert not any(p.name.startswith("never") for p in files["dir"].iterdir())


def test_the_shared_float_resnet_names_the_way_out(files, tmp_path):
    line = one_line_error(
        npusim_cli("run", need(FLOAT_RESNET), "--input", files["xf"], "--output", tmp_path / "y.npy")
    )
    assert line == (
        f"error: {FLOAT_RESNET}: a float model: npusim runs int8 models; quantize it to int8, or give it "
        "to `npusim validate --float` as the reference of its int8 model"
    )
    line = one_line_error(npusim_cli("inspect", FLOAT_RESNET))
    assert "a float model: npusim runs int8 models" in line


def test_a_tensorflow_savedmodel_folder_is_named(tmp_path):
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "saved_model.pb").write_bytes(b"")
    line = one_line_error(npusim_cli("inspect", tmp_path / "saved"))
    assert line == (
        f"error: {tmp_path / 'saved'}: a TensorFlow SavedModel folder: convert it to an int8 .tflite "
        "first, expected a model file (.tflite or .onnx)"
    )


def test_int8_models_with_uint8_edges_are_not_legacy(tmp_path):
    """uint8 that enters through QUANTIZE (the shared MobileNetV2, zo's uint8 classifiers) is int8 inside."""
    graph = npusim.load_model(tiny_classifier(input_dtype=np.uint8, input_zero_point=0))
    assert npusim.Interpreter(graph).graph is graph


# ----------------------------------------------------------------------------------------------
# 3. inspect: how to feed the model, and every op listed
# ----------------------------------------------------------------------------------------------


def litert_details(path) -> tuple[list, list]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))

    def one(d):
        q = d["quantization_parameters"]
        scales, zps = [float(s) for s in q["scales"]], [int(z) for z in q["zero_points"]]
        return {
            "name": d["name"],
            "shape": [int(s) for s in d["shape"]],
            "dtype": np.dtype(d["dtype"]).name,
            "scale": None if not scales else scales[0] if len(scales) == 1 else scales,
            "zero_point": None if not scales else zps[0] if len(zps) == 1 else zps,
        }

    return [one(d) for d in interp.get_input_details()], [one(d) for d in interp.get_output_details()]


def ort_details(data: bytes) -> tuple[list, list]:
    """ORT's get_inputs()/get_outputs() (name, shape, type), and the quantization of the file's
    QuantizeLinear reading each input (DequantizeLinear writing each output), read with onnx."""
    import onnx
    import onnxruntime
    from onnx import numpy_helper

    model = onnx.load_from_string(data)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    types = {"tensor(float)": "float32", "tensor(int8)": "int8", "tensor(uint8)": "uint8"}

    def one(arg, node):
        return {
            "name": arg.name,
            "shape": list(arg.shape),
            "dtype": types[arg.type],
            "scale": float(np.float32(consts[node.input[1]])),
            "zero_point": int(consts[node.input[2]]),
        }

    nodes = model.graph.node
    inputs = [
        one(a, next(n for n in nodes if n.op_type == "QuantizeLinear" and n.input[0] == a.name))
        for a in session.get_inputs()
    ]
    outputs = [
        one(a, next(n for n in nodes if n.op_type == "DequantizeLinear" and n.output[0] == a.name))
        for a in session.get_outputs()
    ]
    return inputs, outputs


def inspect_json(path, *extra) -> dict:
    r = npusim_cli("inspect", path, "--format", "json", *extra)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.output)


@pytest.mark.parametrize("name", TFLITE_MODELS)
def test_inspect_inputs_and_outputs_are_litert_details(name):
    path = need(MODELS / name)
    inputs, outputs = litert_details(path)
    for extra in ((), ("--target", "stm32n6")):
        data = inspect_json(path, *extra)
        assert data["inputs"] == inputs and data["outputs"] == outputs, extra
    text = npusim_cli("inspect", path).output.splitlines()
    assert text[0] == "inputs:" and text[1 + len(inputs)] == "outputs:"
    for line, d in zip(text[1 : 1 + len(inputs)] + text[2 + len(inputs) :], inputs + outputs):
        assert line.split()[:3] == [d["name"], d["dtype"], "x".join(map(str, d["shape"]))], line
        if d["scale"] is None:
            assert line.endswith("no quantization"), line
        else:
            assert line.endswith(f"scale {d['scale']:.9g}, zero point {d['zero_point']}"), line


@pytest.mark.parametrize("name", [*ONNX_MODELS, "uint8 activations"])
def test_inspect_onnx_inputs_and_outputs_are_ort_and_its_edge_nodes(name, tmp_path):
    if name == "uint8 activations":  # the file's uint8 zero point, not the graph's shifted int8 one
        path = tmp_path / "u8.onnx"
        path.write_bytes(small_qdq("uint8"))
    else:
        path = need(MODELS / name)
    inputs, outputs = ort_details(open(path, "rb").read())
    data = inspect_json(path)
    assert data["inputs"] == inputs and data["outputs"] == outputs
    if name == "uint8 activations":
        assert all(0 <= d["zero_point"] <= 255 for d in inputs + outputs) and inputs[0]["dtype"] == "float32"
    text = npusim_cli("inspect", path).output.splitlines()
    d = inputs[0]
    assert text[1].split()[:3] == [d["name"], "float32", "x".join(map(str, d["shape"]))]
    assert text[1].endswith(f"its QuantizeLinear: scale {d['scale']:.9g}, zero point {d['zero_point']}")


def test_inspect_reports_per_channel_quantization_as_lists():
    from npusim.app.inspect_report import io_details
    from npusim.graph import Graph, Quantization, Tensor

    q = Quantization(np.array([0.5, 0.25], np.float32), np.array([1, -2]), axis=1)
    t = Tensor("x", (1, 2), np.dtype(np.int8), q)
    inputs, _ = io_details(Graph([t], [], [0], [0]))
    assert inputs == [
        {"name": "x", "shape": [1, 2], "dtype": "int8", "scale": [0.5, 0.25], "zero_point": [1, -2]}
    ]


def test_inspect_lists_an_op_npusim_lacks_and_run_refuses_it(tmp_path):
    path = tmp_path / "gap.tflite"
    path.write_bytes(unsupported_op_model())
    data = inspect_json(path)
    assert [(o["op"], o["supported"]) for o in data["ops"]] == [
        ("LOGISTIC", True),
        (UNSUPPORTED, False),
        ("TANH", True),
    ]
    assert data["ops"][1]["macs"] is None and data["ops"][1]["outputs"] == [[1, 8]]
    assert data["unsupported"] == [{"index": 1, "op": UNSUPPORTED}]
    assert data["inputs"][0]["name"] == "input" and data["outputs"][0]["name"] == "output"
    r = npusim_cli("inspect", path)
    assert r.exit_code == 0, r.stderr
    assert f"{UNSUPPORTED} (unsupported)" in r.output
    assert r.output.splitlines()[-1] == (
        f"1 op npusim lacks, `npusim run` refuses the model, the totals leave them out: op 1 ({UNSUPPORTED})"
    )
    r = npusim_cli("inspect", path, "--target", "stm32n6")
    assert r.exit_code == 0, r.stderr
    assert r.output.splitlines()[-1] == f"1 op npusim lacks, left out of this estimate: op 1 ({UNSUPPORTED})"
    device = inspect_json(path, "--target", "stm32n6")
    assert device["unsupported"] == [{"index": 1, "op": UNSUPPORTED}]
    assert [o["kind"] for o in device["ops"]] == ["LOGISTIC", "TANH"]
    np.save(tmp_path / "x.npy", np.zeros((2, 8), np.int8))
    line = one_line_error(
        npusim_cli("run", path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    )
    assert line == f"error: op 1 ({UNSUPPORTED}): operator is not supported"
    planned = npusim.Interpreter(str(path), plan_only=True)
    with pytest.raises(npusim.NpusimError, match=rf"^op 1 \({UNSUPPORTED}\): operator is not supported$"):
        planned.run(np.zeros((2, 8), np.int8))


# ----------------------------------------------------------------------------------------------
# 4. Interpreter.run: every output
# ----------------------------------------------------------------------------------------------


def test_run_returns_every_output_in_graph_order():
    model = two_output_model()
    x = np.random.default_rng(1).integers(-128, 128, (3, 4, 6), dtype=np.int8)
    got = npusim.Interpreter(model).run(x)
    expected = O.run_tflm_outputs(model, x)
    assert isinstance(got, list) and len(got) == 2
    for k in range(2):
        O.assert_same(expected[k], got[k], f"output {k}")
    one = npusim.Interpreter(O.logistic_model((1, 5), 0.05, 7)).run(np.zeros((2, 5), np.int8))
    assert isinstance(one, np.ndarray) and one.shape == (2, 5)


def test_run_on_yolov8n_seg_returns_both_outputs():
    interp = npusim.Interpreter(need(MODELS / "stm32n6/yolov8n_256_quant_pc_ii_seg_coco-st.tflite"))
    x = np.random.default_rng(0).integers(-128, 128, (1, 256, 256, 3), dtype=np.int8)
    got = interp.run(x)
    values = interp.run_all(x)
    assert [y.shape for y in got] == [(1, 116, 1344), (1, 64, 64, 32)]
    for k, t in enumerate(interp.graph.outputs):
        np.testing.assert_array_equal(got[k], values[t])


# ----------------------------------------------------------------------------------------------
# 5. compare --reference of another batch
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["tflite", "onnx"])
def test_compare_reference_of_another_batch_exits_2_naming_both_shapes(files, tmp_path, fmt):
    model, x_path = files["good"][fmt]
    x = np.load(x_path)
    dump = tmp_path / "dump"
    r = npusim_cli("run", model, "--input", x_path, "--output", tmp_path / "y.npz", "--dump", dump)
    assert r.exit_code == 0, r.stderr
    same = npusim_cli("compare", model, "--input", x_path, "--reference", dump)
    assert same.exit_code == 0 and "no difference" in same.output, same.output + same.stderr
    np.save(tmp_path / "x3.npy", np.concatenate([x, x[:1]]))
    line = one_line_error(npusim_cli("compare", model, "--input", tmp_path / "x3.npy", "--reference", dump))
    dumped = [2, *x.shape[1:]]
    assert f"shape {dumped}, this run's tensor" in line and f"is {[3, *x.shape[1:]]}" in line, line
    assert line.endswith("expected the dump of the same model on the same --input"), line
