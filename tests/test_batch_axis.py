"""Models that move elements across axis 0 (issue 26): YOLO11n-pose's attention reshapes
[1, 2, 64, 32] into [2, 64, 32]. Their ops hold at the declared batch only, so the Interpreter runs
them image by image (chunks of the declared batch), decided once at prepare time, and says so in
`inspect`; bit for bit with TFLM (which runs the file's batch per invoke) and with LiteRT."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_cli_contracts import npusim_cli

import npusim
from npusim.testing import oracle as O
from zo.model import TrainableModel

WHY = "op 0 (RESHAPE) moves elements across axis 0 ([1, 4, 8, 6] into [2, 16, 6])"


def images(n, seed=0, batch=1):
    return np.random.default_rng(seed).integers(-128, 128, (n, 4, 8, 6)).astype(np.int8)


def tflm_by_chunks(model: bytes, x: np.ndarray, chunk: int) -> np.ndarray:
    from tflite_micro.python.tflite_micro import runtime

    it = runtime.Interpreter.from_bytes(bytes(model), arena_size=4 << 20)
    outs = []
    for i in range(0, len(x), chunk):
        it.set_input(np.ascontiguousarray(x[i : i + chunk]), 0)
        it.invoke()
        outs.append(np.array(it.get_output(0), copy=True))
    return np.concatenate(outs)


@pytest.mark.parametrize("heads", [2, 4])
@pytest.mark.parametrize("seed", [3, 11])
def test_attention_head_runs_image_by_image_as_tflm_and_litert(heads, seed):
    model = O.batch_axis_head_model(seed, heads)
    x = images(5, seed)
    interp = npusim.Interpreter(npusim.load_model(model))
    assert interp.batch.as_dict()["runs"] == "image by image"
    expected = O.run_tflm(model, x)  # batch 1 per invoke
    O.assert_same(expected, interp.run(x), "tflm")
    O.assert_same(O.run_litert(model, x, "REF"), O.run_npusim(model, x, "tflm"), "LiteRT reference kernels")
    O.assert_same(O.run_litert(model, x, "AUTO"), O.run_npusim(model, x, "xnnpack"), "LiteRT default")
    # one image at a time through npusim gives the same: the batch axis stays outside the graph
    O.assert_same(np.concatenate([interp.run(x[i : i + 1]) for i in range(5)]), interp.run(x), "per image")


@pytest.mark.parametrize("anchors", [21, 84])
def test_yolov8n_dfl_head_across_the_batch_axis_as_tflm_and_litert(anchors):
    """The DFL head of the shared YOLOv8n models, its RESHAPE written across axis 0."""
    model = O.dfl_across_batch_model(anchors=anchors)
    x = np.random.default_rng(anchors).integers(-128, 128, (4, 64, anchors)).astype(np.int8)
    why = npusim.Interpreter(npusim.load_model(model)).batch.why
    assert why == f"op 0 (RESHAPE) moves elements across axis 0 ([1, 64, {anchors}] into [4, 16, {anchors}])"
    O.assert_same(O.run_tflm(model, x), O.run_npusim(model, x), "tflm")
    O.assert_same(O.run_litert(model, x, "REF"), O.run_npusim(model, x, "tflm"), "LiteRT reference kernels")
    O.assert_same(O.run_litert(model, x, "AUTO"), O.run_npusim(model, x, "xnnpack"), "LiteRT default")


def test_declared_batch_two_runs_in_chunks_of_two():
    model = O.batch_axis_head_model(5, batch=2)
    x = images(6, 1)
    interp = npusim.Interpreter(npusim.load_model(model))
    assert interp.batch.as_dict() == {
        "declared": 2,
        "runs": "image by image",
        "why": "op 0 (RESHAPE) moves elements across axis 0 ([2, 4, 8, 6] into [4, 16, 6])",
    }
    O.assert_same(tflm_by_chunks(model, x, 2), interp.run(x), "chunks of 2")
    with pytest.raises(npusim.NpusimError) as e:
        interp.run(x[:3])
    assert str(e.value) == (
        "input 0 ('input'): a batch of 3, expected a multiple of the model's declared batch 2 (it runs "
        "image by image: op 0 (RESHAPE) moves elements across axis 0 ([2, 4, 8, 6] into [4, 16, 6]))"
    )


def test_ordinary_model_runs_the_whole_batch():
    interp = npusim.Interpreter(npusim.load_model(O.reshape_model((1, 4, 6), (1, 24), 0.1, 0)))
    assert interp.batch.as_dict() == {"declared": 1, "runs": "whole batch"}
    assert not interp.batch.by_image


def test_reshape_whose_element_count_differs_is_refused(tmp_path):
    b = O.ModelBuilder()
    x = b.add_tensor((1, 4, 6), np.int8, 0.1, 0, name="input")
    y = b.add_tensor((2, 24), np.int8, 0.1, 0, name="output")
    b.add_op("RESHAPE", [x, b.add_const(np.asarray([2, 24], np.int32))], [y])
    model = b.build([x], [y])
    path = tmp_path / "bad.tflite"
    path.write_bytes(model)
    np.save(tmp_path / "x.npy", np.zeros((1, 4, 6), np.int8))
    r = npusim_cli("run", path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert r.exit_code == 2
    assert r.output == "error: op 0 (RESHAPE): cannot reshape [1, 4, 6] (24 elements) into [2, 24]\n"


@pytest.mark.parametrize(
    "make",
    [
        lambda: O.transpose_model((1, 3, 4, 2), (1, 0, 2, 3), 0.1, 3),
        lambda: O.concat_model([(1, 3, 4), (2, 3, 4)], 0, 0.1, 3, [None, np.arange(24) - 12]),
        lambda: O.pad_model((1, 3, 4, 2), [[1, 2], [0, 0], [1, 0], [0, 0]], 0.1, 3),
    ],
    ids=["transpose", "concatenation", "pad"],
)
def test_movement_across_axis_zero_as_tflm(make):
    model = make()
    x = np.random.default_rng(0).integers(-128, 128, (3, 3, 4, 2)[: len(O.model_inputs(model)[0][0])])
    x = x.astype(np.int8)
    assert npusim.Interpreter(npusim.load_model(model)).batch.by_image
    O.assert_same(O.run_tflm(model, x), O.run_npusim(model, x), "across axis 0")


def test_every_command_on_a_model_run_image_by_image(tmp_path):
    model = O.batch_axis_head_model(3)
    path = tmp_path / "head.tflite"
    path.write_bytes(model)
    x = images(3, 2)
    np.save(tmp_path / "x.npy", x)
    r = npusim_cli("inspect", path)
    assert r.exit_code == 0 and r.output.count("runs image by image") == 1
    assert f"batch: declared 1, runs image by image: {WHY}\n" in r.output
    for target in ([], ["--target", "stm32n6"]):
        data = json.loads(npusim_cli("inspect", path, "--format", "json", *target).output)
        assert data["batch"] == {"declared": 1, "runs": "image by image", "why": WHY}
    # MACs per image: BATCH_MATMUL [2, 16, 6] x [2, 16, 6]^T is 2 x 16 x 16 x 6
    ops = json.loads(npusim_cli("inspect", path, "--format", "json").output)["ops"]
    assert ops[1]["macs"] == 2 * 16 * 16 * 6
    r = npusim_cli("run", path, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz")
    assert r.exit_code == 0, r.output
    O.assert_same(O.run_tflm(model, x), np.load(tmp_path / "y.npz")["output_0"], "run --output .npz")
    golden = tmp_path / "head.golden.npz"
    assert npusim_cli("golden", "record", path, "--input", tmp_path / "x.npy", "-o", golden).exit_code == 0
    r = npusim_cli("golden", "check", path, golden)
    assert r.exit_code == 0 and r.output.startswith("OK: 9 tensors match the golden"), r.output
    r = npusim_cli("compare", path, "--input", tmp_path / "x.npy", "--a", "tflm", "--b", "tflm")
    assert r.exit_code == 0 and "A and B agree on all 9 compared tensors" in r.output, r.output
    r = npusim_cli("compare", path, "--input", tmp_path / "x.npy", "--a", "tflm", "--b", "xnnpack")
    differ = int(np.sum(O.run_npusim(model, x, "tflm") != O.run_npusim(model, x, "xnnpack")))
    assert r.exit_code == 0 and f"'output' from op 7 (ADD): {differ} of 288 elements differ" in r.output
    r = npusim_cli("validate", path, "--input", tmp_path / "x.npy", "--format", "json")
    assert r.exit_code == 0, r.output
    assert [layer["op"] for layer in json.loads(r.output)["layers"]] == list(range(8))


def test_validate_float_reference_runs_image_by_image():
    """The float reference splits the batch as the integer run does: per image, the same values."""
    from npusim.runtime.reference import FloatInterpreter

    ref = FloatInterpreter(npusim.load_model(O.batch_axis_head_model(3)))
    x = np.random.default_rng(4).uniform(-5, 5, (4, 4, 8, 6)).astype(np.float32)
    whole = ref.run(x)
    assert whole.shape == (4, 96)
    assert np.array_equal(whole, np.concatenate([ref.run(x[i : i + 1]) for i in range(4)]))


@pytest.mark.parametrize("trainable", ["last:1", "biases"])
def test_zo_grouped_probes_equal_separate_runs(trainable):
    """zo's forward (boundary activations once, G perturbed versions in one call) on a model run
    image by image: the boundary tensor [2, 16, 1, 6] holds 2 rows per image."""
    m = TrainableModel(npusim.load_model(O.batch_axis_head_model(7)), trainable)
    x = images(4, 5)
    rng = np.random.default_rng(0)
    grouped = {}
    for p in m.params:
        v = m.graph.tensors[p.tensor].data
        step = rng.integers(-3, 4, (3,) + v.shape) * p.unit
        grouped[p.tensor] = np.clip(v[None].astype(np.int64) + step, -p.bound, p.bound).astype(v.dtype)
    logits = m.logits(m.boundary_activations(x), grouped)
    assert logits.shape == (3 * 4, 96)
    for g in range(3):
        values = m.interp.run_all(x, {t: a[g] for t, a in grouped.items()})
        ref = m.logits_scale * (values[m.logits_tensor].astype(np.float64) - m.logits_zero_point)
        assert np.array_equal(logits[g * 4 : (g + 1) * 4], ref)
    preds = m.predict(m.boundary_activations(x))
    assert np.array_equal(preds, np.argmax(m.interp.run(x), axis=1))


def test_onnx_reshape_across_the_batch_axis_as_onnxruntime():
    """The ONNX importer lowers a Reshape [1, 4, 4, 6] -> [2, 8, 6] as it is (it refused it before):
    ORT's quantize_static QOperator model, run image by image under --profile onnxruntime, gives
    ORT's output bit for bit."""
    pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    from npusim.testing import onnx_oracle as oo

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Reshape", ["c", "s1"], ["r"]),  # across axis 0
        helper.make_node("MatMul", ["r", "w"], ["m"]),  # the new leading axis as rows
        helper.make_node("Reshape", ["m", "s2"], ["y"]),  # back
    ]
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.5, "cw"),
        numpy_helper.from_array(np.asarray([2, 8, 6], np.int64), "s1"),
        numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(np.asarray([1, 80], np.int64), "s2"),
    ]
    m = oo._model(nodes, [oo._value("x", (1, 4, 4, 6))], [oo._value("y", None)], inits)
    q = oo.quantize(m, fmt="QOperator", seed=1)
    x = np.concatenate([f["x"] for f in oo.random_inputs(m, 5, seed=3)])
    interp = npusim.Interpreter(npusim.load_model(q), profile="onnxruntime")
    assert interp.batch.why == "op 4 (RESHAPE) moves elements across axis 0 ([1, 4, 4, 6] into [2, 8, 6])"
    O.assert_same(oo.run_ort(q, x), interp.run(x), "QOperator model vs ORT")
