"""`zo train --budget-ms`: the budget as estimated STM32N6 time, each step's fixed Cortex-M55 work
(directions, perturbed and written-back codes, the loss, the head's outer product) charged beside
its forward passes (zo/cost.step_overhead_seconds)."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner
from test_zo import assert_resumes_bit_for_bit

import zo.cli
from zo.cost import step_overhead_seconds
from zo.trainer import TrainConfig, Trainer


def config(model, data, **kw):
    base = dict(model=str(model), data=str(data), batch=16, trainable="last:2", checkpoint_every=10)
    return TrainConfig(**(base | kw))


def last_row(run) -> dict:
    with open(run / "metrics.csv") as f:
        return list(csv.DictReader(f))[-1]


def test_a_device_time_budget_is_spent_with_each_steps_fixed_work(tiny, tmp_path):
    model, data = tiny
    t = Trainer(config(model, data, budget_ms=3000.0), tmp_path / "run")
    per_pass = t.device_seconds_per_pass
    assert t.total == pytest.approx(3.0 / per_pass)
    result = t.run()
    device = float(last_row(tmp_path / "run")["device_seconds"])
    assert t.overhead_seconds > 0
    assert device == pytest.approx(result["forward_passes"] * per_pass + t.overhead_seconds, abs=1e-4)
    # within the budget, and short of it by less than a step and the last evaluation
    last_step = t.step_passes(1, 1) * per_pass + t.step_overhead(1, 1)
    assert 3.0 - last_step - t.validation_passes() * per_pass - 1e-6 <= device <= 3.0 + 1e-9
    # the same budget in passes alone buys more passes: the fixed work is not free
    assert result["forward_passes"] < t.total


def test_a_larger_q_amortises_what_a_step_pays_once():
    """Per forward pass, the fixed work of a step shrinks with q where the write-back of the
    trainable values dominates (here 100,000 of them), and the directions' part does not."""
    per_pass = {}
    for q in (1, 2, 4, 8):
        passes = 1 + 2 * q
        s = step_overhead_seconds(q, 1, 64, 4096, 100_000, passes, logits=320, head_macs=32 * 10 * 64)
        per_pass[q] = s / passes
    assert per_pass[1] > per_pass[2] > per_pass[4] > per_pass[8] > 0
    only_directions = [step_overhead_seconds(q, 1, 64, 0, 0, 0, 0, 0) for q in (1, 2, 4)]
    assert only_directions[1] == pytest.approx(2 * only_directions[0])
    assert only_directions[2] == pytest.approx(4 * only_directions[0])


def test_a_device_time_run_resumes_bit_for_bit(tiny, tmp_path):
    model, data = tiny

    def trainer(out):
        return Trainer(config(model, data, budget_ms=2500.0), out)

    reference = trainer(tmp_path / "reference")
    reference.run()
    assert_resumes_bit_for_bit(trainer, reference, tmp_path, interrupt_at=25)


def test_budget_and_budget_ms_together_exit_2(tiny, tmp_path):
    model, data = tiny
    args = ["train", "--model", model, "--data", data, "--out", tmp_path / "run"]
    result = CliRunner().invoke(zo.cli.main, [str(a) for a in args + ["--budget", 100, "--budget-ms", 50]])
    assert result.exit_code == 2
    assert (
        result.stderr
        == "error: --budget and --budget-ms: expected one of them (passes, or device milliseconds)\n"
    )
    result = CliRunner().invoke(zo.cli.main, [str(a) for a in args + ["--budget-ms", -1]])
    assert result.exit_code == 2 and "--budget-ms -1.0: expected a positive number" in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_too_small_device_budget_names_what_it_buys(tiny, tmp_path):
    model, data = tiny
    with pytest.raises(
        zo.cli.ZoError, match=r"--budget-ms 5 \(\d+ forward passes of [\d.]+ ms\): below one step"
    ):
        Trainer(config(model, data, budget_ms=5.0), tmp_path / "run")


def test_a_hybrid_step_is_charged_its_priced_parts(tmp_path):
    """--estimator activity (the default) under --budget-ms: a step costs zo/cost.step_parts for the
    layer it perturbs (the suffix passes on the N6, the local weight gradients, the head's outer
    product and the write-back on the M55), and a step that measures the rate rule's spread pays the
    perturbed layer's local gradient once more."""
    import numpy as np

    from zo.cost import m55_mac_seconds, step_parts

    from zo_fixtures import color_dataset, tiny_classifier

    model, data = tmp_path / "deep.tflite", tmp_path / "colors.npz"
    model.write_bytes(tiny_classifier(convs=2))
    np.savez(data, **color_dataset())
    t = Trainer(config(model, data, trainable="last:3", q="fixed:3", budget_ms=4000.0), tmp_path / "run")
    assert t.activity is not None and t.tail is not None and not t.blocks
    layer = t.activity.layers[0]
    position = next(i for i, k in enumerate(t.model.interp.kernels) if k.op is layer.op)
    tensors = [p.tensor for p in t.model.params]
    parts = step_parts(t.model.interp, tensors, 3, 16, layer=position)
    per_pass = t.device_seconds_per_pass
    step_seconds = t.step_passes(3, 1) * per_pass + t.step_overhead(3, 1)
    assert step_seconds == pytest.approx(parts["total_s"])
    assert parts["fixed"]["local_gradients"] > 0 and parts["fixed"]["head_outer"] > 0
    result = t.run()
    device = float(last_row(tmp_path / "run")["device_seconds"])
    setup = t.init_passes + 2 * t.validation_passes()
    assert device == pytest.approx(result["forward_passes"] * per_pass + t.overhead_seconds, abs=1e-4)
    assert device <= 4.0 + 1e-9 and device > setup * per_pass + t.step * parts["fixed_s"]
    # the rate rule's measuring step forms the layer's gradient twice and pays for it
    r = Trainer(config(model, data, trainable="last:3", q="rate", budget_ms=4000.0), tmp_path / "rate")
    r.step = r.scheduler.every - 1  # a step the rule measures at
    extra = r.step_overhead(2, 1) - (step_parts(r.model.interp, tensors, 2, 16, layer=position)["total_s"]
                                     - r.step_passes(2, 1) * per_pass)  # fmt: skip
    assert extra == pytest.approx(m55_mac_seconds(16 * layer.macs_per_image, "fp32"))
