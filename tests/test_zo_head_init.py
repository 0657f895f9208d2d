"""zo's forward-only initialization of a fresh head (zo/head_init.py): where it starts, what it
costs in the budget, resume, the zero head as before, and the CLI's refusal of a bad value."""

from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest
from test_zo import assert_resumes_bit_for_bit

from zo.head_init import fit_head, fit_temperature
from zo.trainer import TrainConfig, Trainer

ZO = [sys.executable, "-m", "zo.cli"]


def config(model, data, **kw):
    base = dict(
        model=str(model),
        data=str(data),
        trainable="last:1",
        q="fixed:2",
        batch=16,
        budget=400,
        checkpoint_every=5,
        eval_every=80,
        new_head=True,
        # the head's initialization under the ZO machinery as such (tests/test_zo_hybrid.py: defaults)
        head_gradient="zo",
        eps=1,
        keep="last",
    )
    base.update(kw)
    return TrainConfig(**base)


def full_batch_loss(t: Trainer) -> float:
    return float(t.losses_at(t.deployed()[None], np.arange(len(t.data.y_train)))[0])


@pytest.mark.parametrize("method", ["ridge", "imprint"])
def test_initialized_head_starts_below_ln_c(tiny, tmp_path, method):
    model, data = tiny
    zero = Trainer(config(model, data, head_init="zero"), tmp_path / "zero")
    t = Trainer(config(model, data, head_init=method), tmp_path / method)
    classes = t.model.num_classes
    assert full_batch_loss(zero) == pytest.approx(np.log(classes))  # the zero head: every class equal
    assert full_batch_loss(t) < 0.8 * np.log(classes)
    assert t.test_accuracy() > zero.test_accuracy() + 0.2
    assert not np.all(t.model.values()[0] == 0)


def test_initialized_weights_fit_the_head_scales(tiny, tmp_path):
    """Per class the probe rule's scale, or a coarser one that holds the fitted weights unclamped."""
    model, data = tiny
    zero = Trainer(config(model, data, head_init="zero"), tmp_path / "zero")
    t = Trainer(config(model, data), tmp_path / "ridge")
    head = t.model.head_op
    probe = zero.model.graph.tensors[zero.model.head_op.inputs[1]].quant.scale
    w = t.model.graph.tensors[head.inputs[1]]
    b = t.model.graph.tensors[head.inputs[2]]
    assert np.all(w.quant.scale >= probe) and t.head_clamped == 0.0
    assert np.all(np.abs(w.data).max(axis=1)[w.quant.scale > probe] == 127)
    in_scale = np.float64(t.model.graph.tensors[head.inputs[0]].scale)
    assert np.allclose(b.quant.scale, in_scale * w.quant.scale.astype(np.float64), rtol=1e-6)


def test_temperature_minimizes_the_cross_entropy():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 300)
    logits = np.eye(3)[labels] + 0.8 * rng.standard_normal((300, 3))
    s = fit_temperature(logits, labels, logit_range=8.0)

    def ce(scale):
        z = scale * logits
        z = z - z.max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(300), labels])

    assert ce(s) <= min(ce(0.9 * s), ce(1.1 * s)) + 1e-9
    w, b = fit_head(rng.standard_normal((50, 4)), rng.integers(0, 3, 50), 3, "ridge")
    assert w.shape == (3, 4) and b.shape == (3,)


def metrics(run):
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_initialization_passes_are_charged_to_the_budget(tiny, tmp_path):
    model, data = tiny
    budget = 400
    init = Trainer(config(model, data, budget=budget), tmp_path / "ridge")
    zero = Trainer(config(model, data, budget=budget, head_init="zero"), tmp_path / "zero")
    passes = -(-len(init.data.y_train) // 16)  # one per mini-batch of the training set
    assert init.forward_passes == passes and zero.forward_passes == 0
    a, b = init.run(), zero.run()
    for result, rows in ((a, metrics(tmp_path / "ridge")), (b, metrics(tmp_path / "zero"))):
        # the run stops when the next step (2q = 4 passes) would overspend the same total
        assert budget - 4 < result["forward_passes"] <= budget
        assert int(rows[-1]["forward_passes"]) == result["forward_passes"]
    assert int(metrics(tmp_path / "ridge")[0]["forward_passes"]) == passes  # the first evaluation
    assert a["steps"] == (budget - passes) // 4 and b["steps"] == budget // 4


def test_resume_after_initialization_is_bit_identical(tiny, tmp_path):
    model, data = tiny

    def trainer(out):
        return Trainer(config(model, data, budget=600), out)

    reference = trainer(tmp_path / "reference")
    reference.run()
    assert_resumes_bit_for_bit(trainer, reference, tmp_path, interrupt_at=12)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_seconds"} for r in rows]  # noqa: E731
    assert strip(metrics(tmp_path / "run")) == strip(metrics(tmp_path / "reference"))


def test_zero_head_init_is_the_uninitialized_head(tiny, tmp_path):
    """--head-init zero: the head is zero, nothing is charged, and the deployed scales are the probe
    rule's (the initialized head may coarsen them)."""
    model, data = tiny
    zero = Trainer(config(model, data, head_init="zero"), tmp_path / "zero")
    assert all(np.all(v == 0) for v in zero.model.values())
    assert zero.init_passes == 0 and zero.forward_passes == 0
    ridge = Trainer(config(model, data), tmp_path / "ridge")
    assert all(np.array_equal(u, np.zeros_like(u)) for u in ridge.uninitialized)


def test_bad_head_init_exits_2_with_one_line(tiny, tmp_path):
    model, data = tiny
    r = subprocess.run(
        ZO
        + ["train", "--model", str(model), "--data", str(data), "--new-head", "--head-init", "mean"]
        + ["--budget", "400", "--out", str(tmp_path / "run"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip() == "error: --head-init 'mean': expected one of ridge, imprint, zero"
