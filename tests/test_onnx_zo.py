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
