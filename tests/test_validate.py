"""`npusim validate` (issue 24): the done-when tests on the shared float/int8 ResNet-8 pair, the
contract's output shapes, structural matching and bad input.

The per-output metrics are checked against this test's own computation from the reference
runtimes (LiteRT's float run of the float model, TFLM's int8 run of the int8 model), never against
npusim's own runs.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from test_metrics import direct

from npusim.app.cli import main
from npusim.app.metrics import NAMES
from npusim.app.validate import split_inputs
from npusim.errors import NpusimError
from npusim.formats import tflite_io
from npusim.formats.tflite_io import load_model
from npusim.testing import oracle as O

from shared_paths import RESNET, SHARED, need

FLOAT_RESNET = SHARED / "models" / "resnet8_cifar10_float.tflite"
SAMPLES = 16


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(int8 path, float path, samples .npy, labels .npy, the samples, the labels)."""
    int8, flt = need(RESNET), need(FLOAT_RESNET)
    data = np.load(need(SHARED / "data" / "cifar10_subset.npz"))
    x = data["x_test"][:SAMPLES].astype(np.float32)
    y = data["y_test"][:SAMPLES]
    d = tmp_path_factory.mktemp("pair")
    np.save(d / "x.npy", x)
    np.save(d / "y.npy", y)
    return int8, flt, str(d / "x.npy"), str(d / "y.npy"), x, y


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# ----------------------------------------------------------------------------------------------
# Done when


def test_output_metrics_equal_the_reference_runtimes(pair):
    """The per-output metrics equal this test's computation from LiteRT's float run and TFLM's
    int8 run. The int8 side is bit-exact (npusim is TFLM's arithmetic); the float side differs
    from LiteRT's by float32 summation order (below 1e-6 on the softmax, tests/test_float_forms.py),
    so the metrics agree to 1e-4 relative."""
    int8, flt, xp, yp, x, y = pair
    int8_bytes, float_bytes = open(int8, "rb").read(), open(flt, "rb").read()
    graph = load_model(int8_bytes)
    t_in, t_out = graph.input(0), graph.output(0)
    q_in = np.clip(np.round(x / t_in.scale) + t_in.zero_point, -128, 127).astype(np.int8)
    q_out = O.run_tflm(int8_bytes, q_in)
    got = t_out.scale * (q_out.astype(np.float64) - t_out.zero_point)
    ref = O.run_litert(float_bytes, x)
    expected = direct(ref, got)
    result = cli("validate", int8, "--input", xp, "--float", flt, "--labels", yp, "--format", "json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)["outputs"][0]
    for k in NAMES:
        assert out[k] == pytest.approx(float(expected[k]), rel=1e-4, abs=1e-7), k
    acc = json.loads(result.output)["accuracy"]
    assert acc["int8"] == pytest.approx(np.mean(got.argmax(1) == y))
    assert acc["reference"] == pytest.approx(np.mean(ref.argmax(1) == y))
    assert acc["agreement"] == pytest.approx(np.mean(got.argmax(1) == ref.argmax(1)))


@pytest.mark.parametrize("op_index", [2, 7, 9])
def test_a_shrunk_scale_is_blamed_on_its_layer(pair, op_index, tmp_path):
    """A copy of the int8 model with one mid-network tensor's scale shrunk 16x: that tensor's op has
    the worst local SQNR, against the float model and against the int8 graph in float alike."""
    int8, flt, xp, *_ = pair
    graph = load_model(int8)
    t = graph.tensors[graph.ops[op_index].outputs[0]]
    t.quant.scale = (t.quant.scale / 16).astype(np.float32)
    bad = tmp_path / "shrunk.tflite"
    bad.write_bytes(tflite_io.write_model(graph))
    for extra in ([], ["--float", flt]):
        result = cli("validate", bad, "--input", xp, "--format", "json", *extra)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        layers = doc["layers"]
        worst = min(layers, key=lambda r: r["local"]["sqnr_db"] if r["local"]["sqnr_db"] is not None else 1e9)
        assert worst["op"] == op_index, (extra, [(r["op"], r["local"]["sqnr_db"]) for r in layers])
        # the propagated error grows most there too, and the shrunk range saturates
        assert doc["breaks_first"]["op"] == op_index, (extra, doc["breaks_first"])
        assert layers[op_index]["saturated"] > 0


def test_report_renders(pair, tmp_path):
    import matplotlib.image

    int8, flt, xp, yp, *_ = pair
    d = tmp_path / "report"
    result = cli("validate", int8, "--input", xp, "--float", flt, "--labels", yp, "--report", d)
    assert result.exit_code == 0, result.output
    page = (d / "index.html").read_text()
    for png in ("sqnr.png", "error_0.png", "worst.png"):
        assert f"src='{png}'" in page
        image = matplotlib.image.imread(d / png)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert "<table>" in page and "Top-1 accuracy" in page
    # what the text report says beyond the metrics: where it breaks first, agreement, the layers'
    # error in output steps, scale, range seen and saturation
    assert "Breaks first: op " in page and "Top-1 agreement of int8 and reference" in page
    for column in ("propagated rmse (output steps)", "scale", "range seen", "saturated"):
        assert f"<th>{column}</th>" in page


# ----------------------------------------------------------------------------------------------
# The contract's outputs


QUANT_KEYS = ("scale", "zero_point", "range", "saturated", "elements")


def test_json_has_exactly_the_contract_keys(pair):
    int8, flt, xp, *_ = pair
    result = cli("validate", int8, "--input", xp, "--float", flt, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) == {"outputs", "layers", "accuracy", "breaks_first", "agreement", "notes"}
    assert doc["accuracy"] is None and 0 <= doc["agreement"] <= 1 and doc["notes"] == []
    assert set(doc["breaks_first"]) == {"op", "kind", "tensor", "sqnr_db_before", "sqnr_db", "drop_db"}
    assert set(doc["outputs"][0]) == {"index", "name", *NAMES}
    graph = load_model(int8)
    assert [r["op"] for r in doc["layers"]] == [op.index for op in graph.ops]
    for r, op in zip(doc["layers"], graph.ops):
        assert set(r) == {"op", "kind", "tensor", "local", "propagated", "propagated_steps", *QUANT_KEYS}
        assert r["saturated"] <= r["elements"] and r["range"][0] <= r["range"][1]
        steps = r["propagated_steps"]
        assert steps["max_abs"] == pytest.approx(r["propagated"]["max_abs"] / r["scale"])
        assert r["kind"] == op.kind and r["tensor"] == graph.tensors[op.outputs[0]].name
        assert set(r["local"]) == set(NAMES) and set(r["propagated"]) == set(NAMES)


def test_csv_has_one_row_per_layer_and_text_ranks_by_local_sqnr(pair):
    int8, _, xp, *_ = pair
    result = cli("validate", int8, "--input", xp, "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = result.output.strip().split("\n")
    assert rows[0].startswith("op,kind,tensor,local_rmse") and len(rows) == 1 + len(load_model(int8).ops)
    text = cli("validate", int8, "--input", xp)
    assert text.exit_code == 0 and "by local SQNR" in text.output
    doc = json.loads(cli("validate", int8, "--input", xp, "--format", "json").output)
    ranked = sorted(
        doc["layers"], key=lambda r: r["local"]["sqnr_db"] if r["local"]["sqnr_db"] is not None else 1e9
    )
    table = text.output.split("by local SQNR")[1].split("\n")[2:5]
    assert [int(line.split()[0]) for line in table] == [r["op"] for r in ranked[:3]]


def test_the_int8_graph_in_float_is_the_default_reference(pair):
    """Without --float, every layer has a propagated record (the graph's own tensors), and no note
    speaks of a --float model (the int8 graph's own int8 weights are no dynamic-range model)."""
    int8, _, xp, *_ = pair
    doc = json.loads(cli("validate", int8, "--input", xp, "--format", "json").output)
    assert all(r["propagated"] is not None for r in doc["layers"])
    assert doc["outputs"][0]["sqnr_db"] > 10
    assert doc["notes"] == []


# ----------------------------------------------------------------------------------------------
# Structural matching


def chain(dtype, with_reshape=True, boundary=False, extra_tanh=False, seed=0) -> bytes:
    """CONV_2D -> [RESHAPE] -> FULLY_CONNECTED -> [TANH], int8 (optionally between a QUANTIZE of a
    float input and a DEQUANTIZE to a float output) or float32 with the same real weights."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (4, 3, 3, 3))
    fw = rng.integers(-127, 128, (5, 144))
    q = np.dtype(dtype) == np.int8
    b = O.ModelBuilder()

    def act(shape, scale, zp, name):
        return b.add_tensor(shape, dtype, scale if q else None, zp if q else None, name=name)

    def const(data, scale, name):
        if q:
            return b.add_const(np.asarray(data, np.int8), scale=scale, zero_point=0, name=name)
        return b.add_const(np.asarray(data * scale, np.float32), name=name)

    x = b.add_tensor((1, 6, 6, 3), np.float32, name="input") if boundary or not q else None
    xq = act((1, 6, 6, 3), 0.05, 0, "input_q") if q else x
    if boundary:
        b.add_op("QUANTIZE", [x], [xq])
    conv_out = act((1, 6, 6, 4), 0.1, -128, "conv")
    opt = O.schema.Conv2DOptionsT()
    opt.padding, opt.fusedActivationFunction = O._PADDING["SAME"], O._ACTIVATION["RELU"]
    opt.strideH = opt.strideW = 1
    b.add_op("CONV_2D", [xq, const(w, 0.01, "w"), -1], [conv_out], opt)
    fc_in = conv_out
    if with_reshape:
        fc_in = act((1, 144), 0.1, -128, "flat")
        b.add_op("RESHAPE", [conv_out, b.add_const(np.array([1, 144], np.int32))], [fc_in])
    y = act((1, 5), 0.5, 0, "logits")
    b.add_op("FULLY_CONNECTED", [fc_in, const(fw, 0.002, "fw"), -1], [y], O.schema.FullyConnectedOptionsT())
    if extra_tanh:
        t = act((1, 5), 1 / 128, 0, "tanh")
        b.add_op("TANH", [y], [t])
        y = t
    if boundary:
        yf = b.add_tensor((1, 5), np.float32, name="output")
        b.add_op("DEQUANTIZE", [y], [yf])
        y = yf
    return b.build([x if x is not None else xq], [y])


def run(tmp_path, int8: bytes, flt: bytes, x: np.ndarray):
    (tmp_path / "q.tflite").write_bytes(int8)
    (tmp_path / "f.tflite").write_bytes(flt)
    np.save(tmp_path / "x.npy", x)
    return cli(
        "validate",
        tmp_path / "q.tflite",
        "--input",
        tmp_path / "x.npy",
        "--float",
        tmp_path / "f.tflite",
        "--format",
        "json",
    )


def test_boundary_quantize_and_dequantize_are_skipped(tmp_path):
    x = np.random.default_rng(3).uniform(-3, 3, (4, 6, 6, 3)).astype(np.float32)
    result = run(tmp_path, chain(np.int8, boundary=True), chain(np.float32), x)
    assert result.exit_code == 0, result.output
    layers = json.loads(result.output)["layers"]
    assert [r["kind"] for r in layers] == ["QUANTIZE", "CONV_2D", "RESHAPE", "FULLY_CONNECTED", "DEQUANTIZE"]
    assert all(r["propagated"] is not None for r in layers)
    # The boundary QUANTIZE against the float input: the input's quantization error alone.
    assert layers[0]["propagated"]["max_abs"] <= 0.025 + 1e-6


def test_unmatched_layers_are_listed_never_paired(tmp_path):
    """The float model lacks the int8 model's RESHAPE: RESHAPE gets no propagated record while
    CONV_2D and FULLY_CONNECTED are paired. A float model with a TANH the int8 model lacks: the
    TANH is listed as unmatched and the DEQUANTIZE (standing for the float output, which TANH
    computes) is paired with nothing."""
    x = np.random.default_rng(4).uniform(-3, 3, (4, 6, 6, 3)).astype(np.float32)
    int8 = chain(np.int8, boundary=True)
    result = run(tmp_path, int8, chain(np.float32, with_reshape=False), x)
    assert result.exit_code == 0, result.output
    layers = {r["kind"]: r for r in json.loads(result.output)["layers"]}
    assert layers["RESHAPE"]["propagated"] is None
    assert layers["CONV_2D"]["propagated"] is not None and layers["FULLY_CONNECTED"]["propagated"] is not None
    result = run(tmp_path, int8, chain(np.float32, extra_tanh=True), x)
    layers = {r["kind"]: r for r in json.loads(result.output)["layers"]}
    assert layers["DEQUANTIZE"]["propagated"] is None and layers["FULLY_CONNECTED"]["propagated"] is not None
    text = cli(
        "validate", tmp_path / "q.tflite", "--input", tmp_path / "x.npy", "--float", tmp_path / "f.tflite"
    )
    assert text.exit_code == 0 and "float model ops matched to no int8 op: 3 (TANH)" in text.output


def test_names_decide_between_equal_structures():
    """Two float CONV_2D of one shape where the int8 model has one: the one whose output name
    agrees is paired."""
    from npusim.app.validate import match_ops

    def model(names, dtype):
        b = O.ModelBuilder()
        q = np.dtype(dtype) == np.int8
        x = first = b.add_tensor((1, 4, 4, 2), dtype, 0.1 if q else None, 0 if q else None, name="in")
        for name in names:
            w = b.add_const(
                np.ones((2, 1, 1, 2), dtype), scale=0.1 if q else None, zero_point=0 if q else None
            )
            y = b.add_tensor((1, 4, 4, 2), dtype, 0.1 if q else None, 0 if q else None, name=name)
            opt = O.schema.Conv2DOptionsT()
            opt.padding, opt.strideH, opt.strideW = O._PADDING["SAME"], 1, 1
            b.add_op("CONV_2D", [x, w, -1], [y], opt)
            x = y
        return load_model(b.build([first], [x]))

    int8 = model(["second"], np.int8)
    flt = model(["first", "second"], np.float32)
    pairs = match_ops(int8, flt)
    assert {i: flt.tensors[op.outputs[0]].name for i, op in pairs.items()} == {0: "second"}


# ----------------------------------------------------------------------------------------------
# Bad input: exit 2, one line


def test_inputs_are_quantized_or_dequantized():
    graph = load_model(chain(np.int8))
    t = graph.input(0)
    x = np.array([[[[0.025, -0.025, 0.074]] * 6] * 6], np.float32)
    q, real = split_inputs(x, graph)
    assert q.dtype == np.int8 and real is x
    np.testing.assert_array_equal(q[0, 0, 0], [1, -1, 1])  # half away from zero, as TfLiteRound
    codes = np.full((2, 6, 6, 3), 7, np.int8)
    q, real = split_inputs(codes, graph)
    assert q is codes and real.dtype == np.float32 and np.allclose(real, t.scale * (7 - t.zero_point))
    with pytest.raises(NpusimError, match="dtype float64, expected float32 .* or int8"):
        split_inputs(x.astype(np.float64), graph)


@pytest.mark.parametrize(
    "case,message",
    [
        ("float64", "dtype float64, expected float32"),
        ("shape", "shape [2, 5, 6, 3], expected [N, 6, 6, 3]"),
        ("float_as_int8", "f.tflite: a float model: npusim runs int8 models; as INT8_MODEL give its int8"),
        ("int8_as_float", "--float: the model computes in integers"),
        ("other_model", "the model pair does not correspond: input 0"),
        ("labels", "--labels: int64 [3], expected 2 integer class labels"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, case, message):
    int8, flt = tmp_path / "q.tflite", tmp_path / "f.tflite"
    int8.write_bytes(chain(np.int8))
    flt.write_bytes(chain(np.float32))
    x = np.zeros((2, 6, 6, 3), np.float32)
    args = [int8, "--input", tmp_path / "x.npy", "--float", flt]
    if case == "float64":
        x = x.astype(np.float64)
    elif case == "shape":
        x = np.zeros((2, 5, 6, 3), np.float32)
    elif case == "float_as_int8":
        args = [flt, "--input", tmp_path / "x.npy"]
    elif case == "int8_as_float":
        args[-1] = int8
    elif case == "other_model":
        other = tmp_path / "other.tflite"
        other.write_bytes(O.float_model(O.softmax_model((1, 10), 0.1, 0)))
        args[-1] = other
    elif case == "labels":
        np.save(tmp_path / "y.npy", np.zeros(3, np.int64))
        args += ["--labels", tmp_path / "y.npy"]
    np.save(tmp_path / "x.npy", x)
    result = cli("validate", *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().split("\n")
    assert len(lines) == 1 and message in lines[0], result.output


def test_chunks_give_the_result_of_the_whole(monkeypatch):
    """A batch validated in chunks (here of one sample) accumulates to the metrics of one pass. The
    int8 side is exact; the float side is float32 GEMMs whose rounding depends on the number of rows
    (BLAS blocking), so the metrics agree to float32 precision of the values (logits up to ~20)."""
    import npusim.app.validate as v

    x = np.random.default_rng(6).uniform(-3, 3, (7, 6, 6, 3)).astype(np.float32)
    labels = np.arange(7) % 5
    whole = v.validate(chain(np.int8, boundary=True), x, chain(np.float32), labels)
    monkeypatch.setattr(v, "CHUNK_BYTES", 1)
    assert v.chunk_size([load_model(chain(np.int8))], 7) == 1
    parts = v.validate(chain(np.int8, boundary=True), x, chain(np.float32), labels)
    assert parts.accuracy == whole.accuracy
    pairs = list(zip(parts.outputs, whole.outputs))
    pairs += [(a[key], b[key]) for a, b in zip(parts.layers, whole.layers) for key in ("local", "propagated")]
    for a, b in pairs:
        for k in NAMES:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), k


def test_a_float_model_loads_and_the_integer_interpreter_refuses_it():
    from npusim.runtime.interpreter import Interpreter
    from npusim.runtime.reference import FloatInterpreter

    graph = load_model(need(FLOAT_RESNET))
    assert FloatInterpreter(graph).graph is graph
    message = (
        "resnet8_cifar10_float.tflite: a float model: npusim runs int8 models; quantize it to int8, "
        "or give it to `npusim validate --float`"
    )
    with pytest.raises(NpusimError, match=re.escape(message)):
        Interpreter(graph)
    result = cli("run", FLOAT_RESNET, "--input", "x.npy", "--output", "y.npy")
    assert result.exit_code == 2 and message in result.output


def test_a_float_model_whose_shapes_lie_is_refused_in_one_line(tmp_path):
    """The float interpreter checks what each op computes against the declared shapes (the integer
    Interpreter's Prepare does it for int8 graphs)."""
    b = O.ModelBuilder()
    x = b.add_tensor((1, 6, 6, 3), np.float32, name="input")
    w = b.add_const(np.ones((4, 3, 3, 3), np.float32), name="w")
    y = b.add_tensor((1, 5, 5, 4), np.float32, name="output")  # SAME padding gives 6 x 6
    opt = O.schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = O._PADDING["SAME"], 1, 1
    b.add_op("CONV_2D", [x, w, -1], [y], opt)
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b.build([x], [y]))
    from npusim.runtime.reference import FloatInterpreter

    with pytest.raises(NpusimError, match=r"op 0 \(CONV_2D\): computed \[2, 6, 6, 4\], the model declares"):
        FloatInterpreter(load_model(bad)).run(np.zeros((2, 6, 6, 3), np.float32))
