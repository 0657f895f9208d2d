"""Local losses below the exact tail (zo/local.py): `--estimator local` and `--estimator guided`.

The forward-only local gradient is the gradient of the local loss (the auxiliary head's
cross-entropy on the block's pooled output) as float arithmetic gives it: checked against central
differences of that loss computed in float64 from the layer's cached input, through the layer, the
chain of elementwise ops after it, the pool and the auxiliary head."""

from __future__ import annotations

import numpy as np
import pytest

from zo.float_suffix import FloatSuffix
from zo.loss import cross_entropy
from zo.trainer import TrainConfig, Trainer

from shared_paths import SHARED
from zo_fixtures import deep_classifier

RESNET8 = SHARED / "models" / "resnet8_cifar10_int8.tflite"
EUROSAT32 = SHARED / "data" / "eurosat32_subset.npz"


def real(t, values, index):
    tensor = t.model.graph.tensors[index]
    return float(tensor.scale) * (values[index].astype(np.float64) - int(tensor.zero_point))


def local_loss(t, layer, values, labels, net, w_real) -> float:
    """The local loss in float64 at the layer's weights w_real, from its cached int8 input."""
    f = layer.f
    args = [real(t, values, f.op.inputs[0]), w_real]
    if len(f.op.inputs) > 2 and f.op.inputs[2] >= 0:
        args.append(net.params.get(f.op.inputs[2], net.constants.get(f.op.inputs[2])))
    floats = {layer.out: np.clip(f.forward(args)[0], *f.clamp) if f.clamp else f.forward(args)[0]}
    for op in layer.chain:
        a = [floats[i] if i in floats else real(t, values, i) for i in op.op.inputs]
        y = op.forward(a)[0]
        floats[op.op.outputs[0]] = np.clip(y, *op.clamp) if op.clamp else y
    aux = layer.aux
    x = floats[aux.tensor]
    feats = x.reshape(len(x), -1, aux.channels).mean(axis=1)
    return float(np.mean(cross_entropy(feats @ aux.w.T + aux.b, labels)))


def check_local_gradient(t, steps, directions=12, h=1e-3):
    """Per layer: the forward-only gradient's directional derivatives against central differences
    of the float local loss, along random directions over its weights (trainer units)."""
    net = FloatSuffix(t.model, np.float64)
    local = t.local
    rng = np.random.default_rng(0)
    out = {}
    for step in steps:
        idx = t.batch_indices(step)
        labels = t.data.y_train[idx]
        values = {k: v[idx] for k, v in t.train_cache.items()}
        t.model.interp.evaluate(values, t.model.suffix)
        for layer in local.layers:
            err = layer.aux.error(layer.aux.features(values), labels)
            g = local.weight_gradient(values, layer, local.output_gradient(values, layer, err))
            w = layer.op.inputs[1]
            gw = g[: net.params[w].size]
            step_real = np.broadcast_to(net.steps[w], net.params[w].shape)
            analytic, numeric = [], []
            for _ in range(directions):
                u = rng.standard_normal(net.params[w].shape)
                plus = local_loss(t, layer, values, labels, net, net.params[w] + h * u * step_real)
                minus = local_loss(t, layer, values, labels, net, net.params[w] - h * u * step_real)
                numeric.append((plus - minus) / (2 * h))
                analytic.append(float(gw @ u.ravel()))
            out.setdefault(layer.name, []).append((np.array(analytic), np.array(numeric)))
    return out


def agreement(pairs) -> float:
    a = np.concatenate([p[0] for p in pairs])
    n = np.concatenate([p[1] for p in pairs])
    return float(a @ n / (np.linalg.norm(a) * np.linalg.norm(n) + 1e-300))


def test_local_gradient_is_the_local_loss_gradient(tmp_path):
    model, data = deep_classifier(tmp_path)
    t = Trainer(
        TrainConfig(
            model=str(model), data=str(data), trainable="last:3", estimator="local", batch=16, budget=600
        ),
        tmp_path / "run",
    )
    assert t.activity is None and [layer.name for layer in t.local.layers] == ["conv/weights"]
    assert t.local.layers[0].aux.lr > 0  # ridge-fitted, not zero
    for name, pairs in check_local_gradient(t, range(3)).items():
        # float's clamp masks against the int8 pass's differ by rounding only
        assert agreement(pairs) > 0.98, name


def test_local_gradient_through_a_residual_add_on_resnet8(tmp_path):
    if not (RESNET8.exists() and EUROSAT32.exists()):
        pytest.skip(f"SHARED DATA MISSING: {RESNET8} or {EUROSAT32} (set NPU_SHARED)")
    t = Trainer(
        TrainConfig(
            model=str(RESNET8), data=str(EUROSAT32), trainable="last:6", estimator="local",
            train_size=400, test_size=50, new_head=True,
        ),
        tmp_path / "run",
    )  # fmt: skip
    layers = t.local.layers
    assert len(layers) == 3 and len(t.local.aux) == 2  # the two convs into one ADD share its head
    assert [len(layer.chain) for layer in layers] == [1, 1, 0]
    for name, pairs in check_local_gradient(t, range(2), directions=6).items():
        assert agreement(pairs) > 0.95, name


@pytest.mark.parametrize("estimator", ["local", "guided"])
def test_local_estimators_train_and_resume(tmp_path, estimator):
    model, data = deep_classifier(tmp_path)
    cfg = dict(model=str(model), data=str(data), trainable="last:3", estimator=estimator, batch=16)
    t = Trainer(TrainConfig(budget=400, checkpoint_every=5, **cfg), tmp_path / "run")
    start = t.test_accuracy()
    w0 = t.master.copy()
    result = t.run()
    assert result["steps"] > 0 and np.any(t.master[t.local.coords] != w0[t.local.coords])
    assert result["test_accuracy"] >= start - 0.05
    # the auxiliary heads are in the checkpoint and come back
    r = Trainer(TrainConfig(budget=400, checkpoint_every=5, **cfg), tmp_path / "run")
    r.load_checkpoint(tmp_path / "run")
    np.testing.assert_array_equal(r.local.state(), t.local.state())
