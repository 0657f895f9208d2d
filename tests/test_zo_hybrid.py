"""zo train's defaults: the classifier's exact forward-only gradient, ZO on the layers below it one
block a step (eps measured per block, the channel-scaling subspace), the model kept on a held-out
tenth, --master none, --keep-head. The ZO machinery as such: tests/test_zo.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from test_zo import assert_resumes_bit_for_bit

from zo.blocks import MIN_CORRELATION, Block, choose_eps, estimated_correlation
from zo.float_suffix import FloatSuffix
from zo.keep import held_out_rows
from zo.trainer import VALIDATION_EVERY, TrainConfig, Trainer


def config(model, data, **kw):
    # the weight-perturbation blocks as such (--estimator weights); the activity estimator: test_zo_tail.py
    base = dict(
        model=str(model), data=str(data), batch=16, budget=600, checkpoint_every=10, eval_every=60,
        estimator="weights",
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def test_exact_head_gradient_is_back_propagation_through_the_head(tiny, tmp_path):
    """The head's forward-only gradient (int8 pass, softmax error times features) points where the
    float back-propagation of zo/float_suffix.py points, coordinate by coordinate, in the trainer's
    units; it differs only by the int8 rounding of the logits."""
    model, data = tiny
    t = Trainer(config(model, data), tmp_path / "run")
    assert t.head is not None and not t.blocks  # last:1: the head alone, no ZO block
    idx = t.batch_indices(0)
    values = {k: v[idx] for k, v in t.train_cache.items()}
    t.model.interp.evaluate(values, t.model.suffix)
    loss, g = t.head.loss_and_gradient(values, t.data.y_train[idx])
    net = FloatSuffix(t.model, np.float64)
    float_loss, grads = net.loss_and_gradient(net.dequantize(t.train_cache, idx), t.data.y_train[idx])
    reference = np.concatenate(
        [(grads[p.tensor] * net.steps[p.tensor] * p.unit).ravel() for p in t.model.params]
    )
    assert abs(loss - float_loss) < 0.05
    assert g @ reference > 0.99 * np.linalg.norm(g) * np.linalg.norm(reference)


def test_defaults_learn_keep_the_best_and_stay_within_the_budget(tiny, tmp_path):
    model, data = tiny
    t = Trainer(config(model, data, trainable="last:2"), tmp_path / "run")
    assert t.head is not None and [b.channel_axis for b in t.blocks] == [0, None]  # conv weights, bias
    assert all(b.eps >= 1 and 0 <= b.correlation <= 1 for b in t.blocks)
    held = set(t.val_rows.tolist())
    assert len(held) == len(held_out_rows(t.data.y_train)) >= -(-len(t.data.y_train) // VALIDATION_EVERY)
    seen = set()
    start = t.test_accuracy()
    result = t.run(on_step=lambda tr, q, loss: seen.update(tr.batch_indices(tr.step - 1).tolist()))
    assert not seen & held  # the held-out images are never trained on
    assert result["forward_passes"] <= 600
    assert t.best is not None and t.kept is not None  # the best held-out model, the start or the last
    chosen = {"best": t.best, "start": t.start_record, "last": t.latest}[t.kept["why"]]  # (zo/keep.py)
    assert result["test_accuracy"] == chosen[1] and t.kept["step"] == chosen[3]
    assert result["test_accuracy"] >= start  # a colour task: the trainer learns
    # the written model is the kept one
    import npusim

    kept = npusim.load_model(str(tmp_path / "run" / "model.tflite"))
    ints = np.concatenate([kept.tensors[p.tensor].data.astype(np.int64).ravel() for p in t.model.params])
    if chosen[2] is not None:  # (the last model's integers are the deployed ones)
        assert np.array_equal(ints, chosen[2])


def test_hybrid_run_resumes_bit_for_bit(tiny, tmp_path):
    """The head's Adam state and the kept model are checkpointed: an interrupted run resumed from
    its checkpoint writes the model of the uninterrupted one."""
    model, data = tiny

    def trainer(out):
        return Trainer(config(model, data, trainable="last:2", q="fixed:2", checkpoint_every=3), out)

    reference = trainer(tmp_path / "reference")
    reference.run()
    assert_resumes_bit_for_bit(trainer, reference, tmp_path, interrupt_at=17)


def test_master_none_keeps_the_values_on_the_integer_grid(tiny, tmp_path):
    model, data = tiny
    t = Trainer(config(model, data, trainable="last:2", master="none", budget=1500), tmp_path / "run")
    assert t.optimizer.momentum == 0.0
    off_grid = []
    t.run(
        on_step=lambda tr, q, loss: off_grid.append(
            np.max(np.abs(tr.master * tr.units - np.rint(tr.master * tr.units)))
        )
    )
    assert off_grid and max(off_grid) < 1e-9


def test_eps_is_the_smallest_that_resolves_the_derivative():
    """d(eps) = signal + rounding noise / eps: the estimate of its correlation with the signal, from
    d(eps) against d(2 eps), picks the smallest eps above MIN_CORRELATION."""
    rng = np.random.default_rng(0)
    signal = rng.normal(size=4000)
    noise = {e: rng.normal(size=4000) * 4.0 / e for e in (1, 2, 4, 8, 16, 32)}
    d = {e: signal + noise[e] for e in noise}
    truth = {e: np.corrcoef(d[e], signal)[0, 1] for e in d}
    for e in (1, 2, 4, 8):
        assert estimated_correlation(d[e], d[2 * e]) == pytest.approx(truth[e], abs=0.05)
    eps, r, _ = choose_eps(d)
    assert eps == min(e for e in (1, 2, 4, 8, 16) if truth[e] >= MIN_CORRELATION + 0.03)
    assert r >= MIN_CORRELATION


def test_channel_block_moves_each_channels_largest_code_by_eps():
    w = np.array([[10, -40, 20], [0, 0, 0], [3, -1, 2]], dtype=np.int64)  # 3 output channels
    block = Block("w", 0, 9, shape=(3, 3), channel_axis=0)
    assert block.dims == 3
    delta = block.delta(np.array([1, 1, -1]), w.ravel(), 4, np.ones(9)).reshape(3, 3)
    assert np.array_equal(np.abs(delta).max(axis=1), [4, 0, 4])
    assert np.array_equal(delta[0], [1, -4, 2])  # w_c / max|w_c| * 4, rounded
    lifted = block.lift(np.array([1.0, 1.0, 1.0]), w.ravel()).reshape(3, 3)
    assert np.allclose(lifted[0], w[0] / 40) and np.allclose(lifted[1], 0)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "zo.cli", *map(str, args)], capture_output=True, text=True)


def test_keep_head_and_the_fresh_head_line(tiny, tmp_path):
    model, data = tiny
    base = ["train", "--model", model, "--data", data, "--budget", "400", "--batch", "16"]
    r = run_cli(*base, "--out", tmp_path / "a")
    assert r.returncode == 0, r.stderr
    assert "a fresh head fitted to the data replaces it (--keep-head keeps the model's own)" in r.stderr
    r = run_cli(*base, "--out", tmp_path / "b", "--keep-head", "--quiet")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    from zo_fixtures import tiny_classifier

    (tmp_path / "three.tflite").write_bytes(tiny_classifier(classes=3))  # 3 classes, the data 4
    r = run_cli(
        *base[:2], tmp_path / "three.tflite", *base[3:], "--out", tmp_path / "c", "--keep-head", "--quiet"
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--keep-head" in r.stderr, r.stderr
    r = run_cli(*base, "--out", tmp_path / "d", "--eps", "zero", "--quiet")
    assert r.returncode == 2 and "--eps 'zero'" in r.stderr and r.stderr.count("\n") == 1, r.stderr
