"""The exact tail (zo/tail.py) and activity perturbation (zo/activity.py): `--estimator activity`.

The tail's forward-only gradient is the float back-propagation gradient (zo/float_suffix.py) up to
the int8 rounding of the forward pass; the activity estimate averages to it; both train."""

from __future__ import annotations

import numpy as np
import pytest

from zo.float_suffix import FloatSuffix
from zo.tail import find_tail_ops
from zo.trainer import TrainConfig, Trainer

from shared_paths import SHARED
from zo_fixtures import deep_classifier

RESNET8 = SHARED / "models" / "resnet8_cifar10_int8.tflite"
EUROSAT32 = SHARED / "data" / "eurosat32_subset.npz"


@pytest.fixture
def deep(tmp_path):
    """The tiny classifier with two 1x1 convs: the upper one is the tail, the lower one below it."""
    return deep_classifier(tmp_path)


def trainer(model, data, tmp_path, **kw):
    base = dict(model=str(model), data=str(data), batch=16, budget=600, checkpoint_every=10, eval_every=60)
    base.update(kw)
    return Trainer(TrainConfig(**base), tmp_path / "run")


def float_gradient(t, idx) -> dict:
    """Back-propagation's gradient of each trainable tensor in the trainer's units."""
    net = FloatSuffix(t.model, np.float64)
    _, grads = net.loss_and_gradient(net.dequantize(t.train_cache, idx), t.data.y_train[idx])
    return {p.tensor: (grads[p.tensor] * net.steps[p.tensor] * p.unit).ravel() for p in t.model.params}


def cosine(a, b) -> float:
    """Their cosine; 1 when both are zero (a batch whose ReLUs hold a tensor's every output at zero
    gives it no gradient in either)."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb < 1e-12:
        return 1.0
    return float(a @ b / (na * nb))


def tail_cosines(t, steps) -> list[float]:
    """Per tail tensor and step: cosine of the tail's gradient with back-propagation's."""
    out = []
    for step in steps:
        idx = t.batch_indices(step)
        values = {k: v[idx] for k, v in t.train_cache.items()}
        t.model.interp.evaluate(values, t.model.suffix)
        t.head.loss_and_gradient(values, t.data.y_train[idx])
        g = t.tail.gradient(values, t.head.input_gradient(values))
        ref = float_gradient(t, idx)
        i = 0
        for f in t.tail.layers:
            for tensor in f.op.inputs[1:3]:
                if tensor in ref:
                    out.append(cosine(g[i : i + ref[tensor].size], ref[tensor]))
                    i += ref[tensor].size
        assert i == g.size
    return out


def test_the_tail_is_found_on_the_graph_and_stops_at_a_weighted_layer(deep, tmp_path):
    model, data = deep
    t = trainer(model, data, tmp_path, trainable="last:3")
    names = [f.inputs[1].name for f in t.tail.layers]
    assert names == ["conv1/weights"]  # the upper conv: pool and reshape up to the head
    assert [layer.name for layer in t.activity.layers] == ["conv/weights"]  # below a weighted layer
    assert not t.blocks
    # --estimator weights keeps every tensor below the head in ZO blocks, as before
    w = trainer(model, data, tmp_path / "w", trainable="last:3", estimator="weights", eps=1)
    assert w.tail is None and w.activity is None and len(w.blocks) == 4
    # a tensor read by a weighted layer besides the walk is not exact: its producer is not in the tail
    kernels = t.model.suffix
    head = t.head.op
    spread, layers = find_tail_ops(kernels, head, lambda op: False)
    assert layers == [] and [op.kind for op in spread] == ["AVERAGE_POOL_2D", "RESHAPE"]


def test_tail_gradient_is_back_propagation(deep, tmp_path):
    model, data = deep
    t = trainer(model, data, tmp_path, trainable="last:2")
    # The int8 pass's ReLU masks and softmax differ from the float bound's by rounding (activation
    # scale 0.2 here, coarse): most steps agree to 0.99, a few less.
    cosines = tail_cosines(t, range(6))
    assert np.median(cosines) > 0.99 and min(cosines) > 0.8


def test_tail_gradient_is_back_propagation_on_resnet8(tmp_path):
    if not (RESNET8.exists() and EUROSAT32.exists()):
        pytest.skip(f"SHARED DATA MISSING: {RESNET8} or {EUROSAT32} (set NPU_SHARED)")
    t = Trainer(
        TrainConfig(
            model=str(RESNET8), data=str(EUROSAT32), trainable="last:3", train_size=400, test_size=50
        ),
        tmp_path / "run",
    )
    # found generically: the last block's two convs, joined by ADD, then pool and reshape to the head
    assert [f.op.kind for f in t.tail.layers] == ["CONV_2D", "CONV_2D"]
    assert {op.kind for op in find_tail_ops(t.model.suffix, t.head.op, lambda op: True)[0]} >= {
        "ADD",
        "AVERAGE_POOL_2D",
    }
    cosines = tail_cosines(t, range(3))
    # the int8 pass's ReLU masks and softmax differ from the float ones by rounding only
    assert np.mean(cosines) > 0.95 and min(cosines) > 0.85


def test_activity_estimate_is_unbiased(deep, tmp_path):
    """Averaged over many directions on one batch, the activity estimate of the layer below the tail
    points where back-propagation does."""
    model, data = deep
    t = trainer(model, data, tmp_path, trainable="last:3")
    layer = t.activity.layers[0]

    def layer_gradient(idx):
        ref = float_gradient(t, idx)
        return np.concatenate([ref[tensor] for tensor in layer.op.inputs[1:3] if tensor in ref])

    # the batch of the largest gradient among four: where the fitted head already classifies a batch,
    # its gradient is at the scale of the int8 pass's rounding, which the float bound leaves out
    idx = max((t.batch_indices(b) for b in range(4)), key=lambda i: np.linalg.norm(layer_gradient(i)))
    labels = t.data.y_train[idx]
    values = {k: v[idx] for k, v in t.train_cache.items()}
    t.model.interp.evaluate(values, t.model.suffix)
    reference = layer_gradient(idx)
    one, _ = t.activity.gradient(values, layer, 1, 0, labels)
    mean = np.mean([t.activity.gradient(values, layer, 64, s, labels)[0] for s in range(8)], axis=0)
    assert cosine(mean, reference) > 0.85  # the rest: the int8 pass against the float bound
    assert cosine(mean, reference) > cosine(one, reference)


def test_activity_estimator_trains_and_reports_its_step(deep, tmp_path):
    model, data = deep
    t = trainer(model, data, tmp_path, trainable="last:3", q="fixed:2")
    start = t.test_accuracy()
    passes = []
    t.run(on_step=lambda tr, q, loss: passes.append(tr.last_estimate.suffix_passes))
    e = t.last_estimate
    assert set(passes) == {1 + 2 * 2} and e.estimates.size == 2 * 16  # q directions x batch
    assert e.local_macs > 0 and e.exact_coords == t.exact_coords.size
    assert t.forward_passes <= 600
    assert t.final_accuracy >= start
