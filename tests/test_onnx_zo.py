"""zo on ONNX: `zo train --model m.onnx` trains an ORT-quantized QDQ classifier and writes model.onnx,
the same graph with updated integer initializers and every scale unchanged; ONNX Runtime loads it,
and npusim's run of the written file equals npusim's run of the trained Graph."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import numpy_helper  # noqa: E402

import npusim  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402
from zo.trainer import TrainConfig, Trainer  # noqa: E402

from zo_fixtures import color_dataset  # noqa: E402


@pytest.fixture
def onnx_classifier(tmp_path):
    m = oo.small_cnn_model(seed=3, size=8, classes=4)
    pixels = color_dataset(side=8)["x_train"][:16].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    q = oo.quantize(m, fmt="QDQ", per_channel=True, calibration=[{"x": p[None]} for p in pixels])
    path = tmp_path / "cnn.onnx"
    path.write_bytes(q)
    data = tmp_path / "colors.npz"
    np.savez(data, **color_dataset(side=8))
    return path, data


def test_train_writes_model_onnx_that_ort_loads(onnx_classifier, tmp_path):
    model, data = onnx_classifier
    cfg = TrainConfig(
        model=str(model),
        data=str(data),
        trainable="last:1",
        q="fixed:2",
        lr=1.0,
        batch=8,
        budget=60,
        checkpoint_every=10,
        eval_every=40,
        keep_head=True,  # the model's own head: its initializers change, its scales stay
        keep="last",
    )
    trainer = Trainer(cfg, tmp_path / "run")
    trainer.run()
    written = (tmp_path / "run" / "model.onnx").read_bytes()
    assert not (tmp_path / "run" / "model.tflite").exists()
    before, after = onnx.load(str(model)), onnx.load_from_string(written)
    a = {i.name: numpy_helper.to_array(i) for i in before.graph.initializer}
    b = {i.name: numpy_helper.to_array(i) for i in after.graph.initializer}
    assert a.keys() == b.keys()
    changed = [k for k in a if not np.array_equal(a[k], b[k])]
    assert changed, "training changed no initializer"
    assert all(a[k].dtype.kind in "iu" for k in changed), f"a float initializer (a scale) changed: {changed}"
    assert [n.op_type for n in before.graph.node] == [n.op_type for n in after.graph.node]

    x = np.random.default_rng(0).uniform(0, 1, (3, 3, 8, 8)).astype(np.float32)
    oo.run_ort(written, x, optimize=False)  # ORT reads the written file
    from_file = npusim.Interpreter(npusim.load_model(written)).run(x)
    from_graph = npusim.Interpreter(trainer.model.graph).run(x)
    assert np.array_equal(from_file, from_graph)


def _softmax_classifier(tmp_path, classes: int, head: bool = True):
    """small_cnn_model's classifier (Gemm) followed by a Softmax, or (head=False) ending at its
    Flatten's feature vector; quantized by ORT in QDQ, as ORT's quantize_static leaves it (Softmax ->
    QuantizeLinear -> DequantizeLinear at the end)."""
    from onnx import helper

    m = oo.small_cnn_model(seed=3, size=8, classes=classes)
    if head:
        m.graph.node[-1].output[0] = "logits"
        m.graph.node.append(helper.make_node("Softmax", ["logits"], ["y"], axis=-1))
    else:
        del m.graph.node[-1]
        del m.graph.output[:]
        m.graph.output.append(helper.make_tensor_value_info("f", onnx.TensorProto.FLOAT, [1, 16]))
    pixels = color_dataset(side=8)["x_train"][:16].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    q = oo.quantize(m, fmt="QDQ", per_channel=True, calibration=[{"x": p[None]} for p in pixels])
    path = tmp_path / "cnn.onnx"
    path.write_bytes(q)
    data = tmp_path / "colors.npz"
    np.savez(data, **color_dataset(side=8))
    return path, data


def _train(model, data, out, **kw):
    options = dict(trainable="last:1", q="fixed:2", lr=1.0, batch=8, budget=200, checkpoint_every=50)
    cfg = TrainConfig(model=str(model), data=str(data), eval_every=100, **{**options, **kw})
    trainer = Trainer(cfg, out)
    trainer.run()
    return trainer, (out / "model.onnx").read_bytes()


@pytest.mark.parametrize(
    "classes,new_head,head",
    [(4, False, True), (4, True, True), (3, False, True), (4, True, False)],
    ids=["own-head", "new-head", "new-class-count", "appended-head"],
)
def test_softmax_classifier_and_fresh_heads_written_into_onnx(tmp_path, classes, new_head, head):
    """A classifier ending in Softmax -> Q -> DQ is recognised (its logits are the Gemm's, not the
    probabilities); a fresh head (--new-head, a new class count, or appended to a feature output) is
    written into the ONNX graph with its new scales: ORT loads the file, npusim's run of it equals
    the trained Graph's, and npusim's onnxruntime profile equals ORT's own run of it. (The default
    profile's softmax is TFLM's, which may part from ORT's by a logit step: at a trained head's coarse
    logits scale that moves a probability by several hundredths, so only the ORT profile is held to
    ORT.)"""
    from zo.head import find_head

    model, data = _softmax_classifier(tmp_path, classes, head)
    trainer, written = _train(model, data, tmp_path / "run", new_head=new_head)
    graph = trainer.model.graph
    assert graph.ops[trainer.model.suffix[-1].op.index].kind == "FULLY_CONNECTED"  # logits: the head's
    assert find_head(graph) is not None
    x = np.random.default_rng(0).uniform(0, 1, (3, 3, 8, 8)).astype(np.float32)
    from_file = npusim.Interpreter(npusim.load_model(written)).run(x)
    assert np.array_equal(from_file, npusim.Interpreter(graph).run(x))
    y_ort = oo.session(written, optimize=False).run(None, {"x": x[:1]})[0]
    assert y_ort.shape[-1] == 4 and from_file.shape[-1] == 4
    as_ort = npusim.Interpreter(npusim.load_model(written), profile="onnxruntime").run(x[:1])
    assert np.array_equal(as_ort, y_ort)


def test_an_unwritable_head_is_refused_before_training(tmp_path):
    """A head that cannot go into the file is refused before the first step, in one line (here: the
    appended head's features are not a QuantizeLinear's [1, K] output but a 4-D map)."""
    from onnx import helper

    from zo.errors import ZoError

    m = oo.small_cnn_model(seed=3, size=8, classes=4)
    del m.graph.node[-2:]  # end at the GlobalAveragePool: [1, 16, 1, 1]
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("g", onnx.TensorProto.FLOAT, [1, 16, 1, 1]))
    pixels = color_dataset(side=8)["x_train"][:16].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    q = oo.quantize(m, fmt="QDQ", per_channel=True, calibration=[{"x": p[None]} for p in pixels])
    (tmp_path / "m.onnx").write_bytes(q)
    np.savez(tmp_path / "c.npz", **color_dataset(side=8))
    cfg = TrainConfig(model=str(tmp_path / "m.onnx"), data=str(tmp_path / "c.npz"), budget=200, new_head=True)
    with pytest.raises(ZoError, match="could not be written back to ONNX, so nothing is trained"):
        Trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_an_unwritable_head_is_refused_before_any_calibration(tmp_path):
    """The refusal comes from the graph alone, before the interpreter runs a calibration image (on
    a 192x192 landmarks model it came 7-23 s into the setup); without --new-head, a new class count
    on a model whose appended head could not be written says so, not 'pass --new-head'."""
    from onnx import helper

    from zo.errors import ZoError
    from zo.model import TrainableModel

    m = oo.small_cnn_model(seed=3, size=8, classes=4)
    del m.graph.node[-2:]  # end at the GlobalAveragePool: [1, 16, 1, 1]
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("g", onnx.TensorProto.FLOAT, [1, 16, 1, 1]))
    pixels = color_dataset(side=8)["x_train"][:16].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    graph = npusim.load_model(oo.quantize(m, fmt="QDQ", calibration=[{"x": p[None]} for p in pixels]))

    def calibration():
        raise AssertionError("calibration images read before the head's checks")

    with pytest.raises(ZoError, match="could not be written back to ONNX") as e:
        TrainableModel(graph, num_classes=5, new_head=True, calibration=calibration)
    assert "[1, 16, 1, 1]" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ZoError) as e:
        TrainableModel(graph, num_classes=5, calibration=calibration)
    message = str(e.value)
    assert "not a FULLY_CONNECTED classifier for 5 classes" in message
    assert "a head appended with --new-head could not be written back" in message
    assert "pass --new-head" not in message


def test_four_bit_weights_train_within_four_bits_and_are_written(tmp_path):
    """Weights the file stores as int4 train within [-7, 7] (zo/model.FOUR_BIT_BOUND), so that the
    trained codes always go back into their int4 initializer: a large step rate cannot make the
    write fail after the budget."""
    from onnx_qdq import qdq

    m = oo.small_cnn_model(seed=3, size=8, classes=4)
    pixels = color_dataset(side=8)["x_train"][:16].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    q = qdq(m, [{"x": p[None]} for p in pixels], weight_bits=4, weight_signed=True)
    (tmp_path / "m.onnx").write_bytes(q)
    np.savez(tmp_path / "c.npz", **color_dataset(side=8))
    trainer, written = _train(tmp_path / "m.onnx", tmp_path / "c.npz", tmp_path / "run", lr=50.0)
    head = onnx.load_from_string(written)
    w = next(numpy_helper.to_array(i) for i in head.graph.initializer if i.name == "wf_q").astype(int)
    assert w.min() >= -8 and w.max() <= 7
    x = np.random.default_rng(0).uniform(0, 1, (3, 3, 8, 8)).astype(np.float32)
    assert np.array_equal(
        npusim.Interpreter(npusim.load_model(written)).run(x), npusim.Interpreter(trainer.model.graph).run(x)
    )


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_new_class_count_written_into_a_qoperator_head(tmp_path, per_channel):
    """A QOperator classifier (QGemm head) trained for a new class count (3 in the file, 4 in the
    data): the fresh head goes into the QGemm (weights, per-class scales, bias, logits' scale and
    zero point), so ORT runs the written file as npusim's onnxruntime profile does, and npusim's run
    of it equals the trained Graph's (issue 56: it failed with 'trained codes do not fit')."""
    m = oo.small_cnn_model(seed=3, size=8, classes=3)
    pixels = color_dataset(side=8)["x_train"][:16].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    calibration = [{"x": p[None]} for p in pixels]
    q = oo.quantize(m, fmt="QOperator", per_channel=per_channel, calibration=calibration)
    model = tmp_path / "qop.onnx"
    model.write_bytes(q)
    assert "QGemm" in {n.op_type for n in onnx.load_from_string(q).graph.node}
    data = tmp_path / "colors.npz"
    np.savez(data, **color_dataset(side=8))
    trainer, written = _train(model, data, tmp_path / "run", budget=160, checkpoint_every=40)
    x = np.random.default_rng(0).uniform(0, 1, (3, 3, 8, 8)).astype(np.float32)
    from_file = npusim.Interpreter(npusim.load_model(written)).run(x)
    assert from_file.shape[-1] == 4
    assert np.array_equal(from_file, npusim.Interpreter(trainer.model.graph).run(x))
    y_ort = oo.session(written, optimize=False).run(None, {"x": x[:1]})[0]
    as_ort = npusim.Interpreter(npusim.load_model(written), profile="onnxruntime").run(x[:1])
    assert y_ort.shape[-1] == 4 and np.array_equal(as_ort, y_ort)


def _matmul_add_classifier(fmt: str, per_channel: bool, classes: int = 3) -> bytes:
    """small_cnn_model with its Gemm as MatMul + Add, quantized by ORT: QLinearMatMul + QLinearAdd in
    QOperator (FULLY_CONNECTED without a bias then ADD of a constant at import), MatMul -> Q -> DQ ->
    Add in QDQ."""
    from onnx import helper

    m = oo.small_cnn_model(seed=3, size=8, classes=classes)
    wf = next(i for i in m.graph.initializer if i.name == "wf")
    wf.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(wf).T), "wf"))
    gemm = m.graph.node[-1]
    assert gemm.op_type == "Gemm"
    m.graph.node.remove(gemm)
    m.graph.node.extend(
        [helper.make_node("MatMul", ["f", "wf"], ["mm"]), helper.make_node("Add", ["mm", "bf"], ["y"])]
    )
    pixels = color_dataset(side=8)["x_train"][:16].astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    return oo.quantize(m, fmt=fmt, per_channel=per_channel, calibration=[{"x": p[None]} for p in pixels])


@pytest.mark.parametrize(
    "fmt,per_channel",
    [("QOperator", False), ("QOperator", True), ("QDQ", True)],
    ids=["qoperator-per-tensor", "qoperator-per-channel", "qdq"],
)
def test_a_fresh_head_is_written_over_a_matmul_add_head(tmp_path, fmt, per_channel):
    """`zo train` of a classifier whose head is MatMul + Add (QLinearMatMul + QLinearAdd) on data of
    a new class count (3 in the file, 4 in the data; issue 56: refused before the first step, and
    before that 'trained codes do not fit' after the budget): the fresh head is one FULLY_CONNECTED
    with a bias, written as one QGemm (QDQ: Gemm on DequantizeLinear'd weights and bias) in place of
    the pair, which ORT runs as npusim's onnxruntime profile does, element for element."""
    import subprocess
    import sys

    q = _matmul_add_classifier(fmt, per_channel)
    before = [n.op_type for n in onnx.load_from_string(q).graph.node]
    pair = ["QLinearMatMul", "QLinearAdd"] if fmt == "QOperator" else ["MatMul", "Add"]
    assert all(k in before for k in pair)
    (tmp_path / "m.onnx").write_bytes(q)
    np.savez(tmp_path / "c.npz", **color_dataset(side=8))  # 4 classes
    run = tmp_path / "run"
    args = ["--model", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "c.npz"), "--out", str(run)]
    tiny = ["--budget", "120", "--trainable", "last:1", "--batch", "8", "--eval-every", "60"]
    done = subprocess.run(
        [sys.executable, "-m", "zo.cli", "train", *args, *tiny], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    written = (run / "model.onnx").read_bytes()
    after = onnx.load_from_string(written)
    onnx.checker.check_model(after)
    kinds = [n.op_type for n in after.graph.node]
    assert kinds.count("QGemm" if fmt == "QOperator" else "Gemm") == 1 and pair[0] not in kinds
    assert kinds.count(pair[1]) == before.count(pair[1]) - 1  # the model's residual Add stays
    x = np.random.default_rng(0).uniform(0, 1, (6, 3, 8, 8)).astype(np.float32)
    from_file = npusim.load_model(written)
    as_ort = npusim.Interpreter(from_file, profile="onnxruntime").run(x)
    y_ort = np.concatenate(
        [oo.session(written, optimize=False).run(None, {"x": x[i : i + 1]})[0] for i in range(6)]
    )
    assert y_ort.shape == (6, 4) and np.array_equal(as_ort, y_ort)
    assert len(np.unique(y_ort)) > 1  # a trained head, not the zero one
