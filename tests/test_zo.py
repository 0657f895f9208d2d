"""zo: the estimator, the batched probes, determinism, checkpoints, export, the CLI contract and the
device cost of a step (zo.cost)."""

from __future__ import annotations

import csv
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tflite_micro.python.tflite_micro import runtime

import npusim
from npusim.npu import plan_device
from npusim.testing.oracle import run_tflm
from zo.blocks import Block
from zo.cost import format_zo_step_report, zo_step_report
from zo.errors import ZoError
from zo.model import TrainableModel
from zo.perturbation import direction, second_moment
from zo.trainer import TrainConfig, Trainer

from shared_paths import MOBILENET, RESNET, SHARED
from zo_fixtures import color_dataset

ZO = [sys.executable, "-m", "zo.cli"]


def need_shared():
    if not RESNET.exists():
        pytest.skip(f"SHARED DATA MISSING: {SHARED} not found (set NPU_SHARED); real-model test skipped")


def config(model, data, **kw):
    base = dict(
        model=str(model),
        data=str(data),
        trainable="last:1",
        q="fixed:4",
        lr=1.0,
        batch=16,
        budget=400,
        checkpoint_every=10,
        eval_every=80,
        # The ZO machinery as such: the model's own head estimated by ZO, a fixed eps, the last model
        # kept (the defaults' exact head, measured eps and kept best: tests/test_zo_hybrid.py).
        keep_head=True,
        head_gradient="zo",
        eps=1,
        keep="last",
    )
    base.update(kw)
    if base.get("new_head"):
        base["keep_head"] = False
    return TrainConfig(**base)


# -- batched probes --------------------------------------------------------------------------------
def perturbed_overrides(m, groups, rng):
    overrides = {}
    for p in m.params:
        v = m.graph.tensors[p.tensor].data
        step = rng.integers(-3, 4, (groups,) + v.shape) * p.unit
        overrides[p.tensor] = np.clip(v[None].astype(np.int64) + step, -p.bound, p.bound).astype(v.dtype)
    return overrides  # the frozen weights of an op whose bias alone trains: grouped by run_grouped


@pytest.mark.parametrize("trainable", ["last:4", "last:1", "biases"])
def test_grouped_probes_equal_separate_runs(trainable):
    """All G perturbed versions in one call give exactly what G separate full-model runs give."""
    need_shared()
    m = TrainableModel(npusim.load_model(RESNET), trainable)
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (5, 32, 32, 3)).astype(np.int8)
    overrides = perturbed_overrides(m, 3, rng)
    grouped = m.logits(m.boundary_activations(x), overrides)
    for g in range(3):
        single = {t: (a[g] if a.ndim > len(m.graph.tensors[t].shape) else a) for t, a in overrides.items()}
        values = m.interp.run_all(x, single)
        ref = m.logits_scale * (values[m.logits_tensor].astype(np.float64) - m.logits_zero_point)
        assert np.array_equal(grouped[g * 5 : (g + 1) * 5], ref.reshape(5, -1))


# -- the estimator ---------------------------------------------------------------------------------
EPS = 8


@pytest.mark.parametrize("kind", ["rademacher", "gaussian"])
def test_estimator_points_along_true_gradient(tiny, tmp_path, kind):
    """The mean of many ZO estimates matches the gradient of the int8 loss.

    True gradient: central differences along each coordinate, with the same eps, on the same batch.
    Tolerance from the estimator's own variance: the squared error of the mean of n estimates is
    about trace(Cov)/n (measured from the estimates themselves); we allow 3x. eps is 8 steps so that
    the int8 staircase of the logits is small against the perturbation (at eps 2 the rounding of the
    logits biases both sides and the error is 5x the variance).
    """
    model, data = tiny
    t = Trainer(config(model, data, direction=kind, eps=EPS, trainable="last:1"), tmp_path / "run")
    idx = t.batch_indices(0)
    d = t.master.size
    block = Block("all", 0, d, eps=EPS)  # one block over every coordinate
    base = np.concatenate([v.astype(np.int64).ravel() for v in t.model.values()])

    def loss_at(ints):
        overrides = t.grouped_overrides(ints[None])
        logits = t.model.logits({k: v[idx] for k, v in t.train_cache.items()}, overrides)
        from zo.loss import group_losses

        return group_losses(logits, t.data.y_train[idx], 1)[0]

    steps = (t.config.eps * t.units).astype(np.int64)
    true = np.empty(d)
    for j in range(d):
        e = np.zeros(d, np.int64)
        e[j] = steps[j]
        true[j] = (loss_at(base + e) - loss_at(base - e)) / (2 * t.config.eps)
    q, n_steps = 8, 300
    estimates = np.empty((n_steps, d))
    for s in range(n_steps):
        t.step = s  # fresh directions, same weights and batch
        lp, lm = t.probe_losses(q, idx, block)
        estimates[s] = t.gradient(q, (lp - lm) / (2 * t.config.eps), block)
    mean = estimates.mean(axis=0)
    # The estimator's own variance: the squared error of the mean is about trace(Cov) / n_steps.
    mean_sq_error = estimates.var(axis=0, ddof=1).sum() / n_steps
    error = np.sum((mean - true) ** 2)
    assert error < 3 * mean_sq_error
    assert mean @ true > 0.9 * np.linalg.norm(mean) * np.linalg.norm(true)


def test_directions_are_regenerated_from_seeds():
    a = direction(3, 7, 1, 1000)
    assert np.array_equal(a, direction(3, 7, 1, 1000))
    assert not np.array_equal(a, direction(3, 7, 2, 1000))
    assert set(np.unique(a)) == {-1, 1}
    g = direction(3, 7, 1, 200000, "gaussian").astype(np.float64)
    assert abs(np.mean(g * g) - second_moment("gaussian")) < 0.02


# -- training, determinism, checkpoints ------------------------------------------------------------
def read_metrics(run: Path) -> list[dict]:
    with open(run / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in csv.DictReader(f)]


def test_training_learns_and_same_seed_same_result(tiny, tmp_path):
    model, data = tiny
    results = []
    for name in ("a", "b"):
        t = Trainer(config(model, data, budget=1200, q="qscheduler"), tmp_path / name)
        before = t.test_accuracy()
        results.append(t.run())
    assert results[1]["test_accuracy"] > max(before + 0.2, 0.6)
    assert (tmp_path / "a" / "model.tflite").read_bytes() == (tmp_path / "b" / "model.tflite").read_bytes()
    assert read_metrics(tmp_path / "a") == read_metrics(tmp_path / "b")


def assert_resumes_bit_for_bit(trainer, reference, tmp_path, interrupt_at: int):
    """A run of trainer(dir) interrupted after step interrupt_at and resumed from its checkpoint ends
    with the scheduler state and the exported model of the uninterrupted reference."""

    def stop(t, q, loss):
        if t.step == interrupt_at:
            raise KeyboardInterrupt

    interrupted = trainer(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        interrupted.run(on_step=stop)
    resumed = trainer(tmp_path / "run")
    resumed.load_checkpoint(tmp_path / "run")
    resumed.run()
    assert resumed.scheduler.state() == reference.scheduler.state()
    assert (tmp_path / "run" / "model.tflite").read_bytes() == (
        tmp_path / "reference" / "model.tflite"
    ).read_bytes()


def test_paired_steps_probe_two_batches_and_resume_bit_for_bit(tiny, tmp_path):
    """SignalToNoise's paired steps: the same q directions on a second mini-batch, 4q passes; its
    decisions and the weights are the same after an interrupt and a resume from the checkpoint."""
    from zo.schedulers import SignalToNoise

    model, data = tiny

    def trainer(out):
        t = Trainer(config(model, data, budget=2000, checkpoint_every=7, q="snr"), out)
        t.scheduler = SignalToNoise(q_init=2, q_max=16, every=2, window=5)
        return t

    reference = trainer(tmp_path / "reference")
    seen = []
    reference.run(on_step=lambda t, q, loss: seen.append((t.step, q, t.forward_passes)))
    steps = dict((s, (q, p)) for s, q, p in seen)
    paired = [s for s in steps if s % 2 == 0]
    assert paired and all(steps[s][1] - steps.get(s - 1, (0, 0))[1] == 4 * steps[s][0] for s in paired[1:])
    assert reference.scheduler.baseline is not None

    assert_resumes_bit_for_bit(trainer, reference, tmp_path, interrupt_at=23)


def test_taylor_terms_along_an_update(tiny, tmp_path):
    """The first-order term, measured with one stochastically rounded probe, averages to -g . update
    from the coordinate-wise central-difference gradient on the same batch; the second-order term
    is positive on average: a fresh head's loss (cross-entropy of logits linear in the weights) is
    convex in it."""
    model, data = tiny
    # The zero head, as the rest of this test's figures were set for (the staircase at that point).
    t = Trainer(
        config(model, data, eps=EPS, trainable="last:1", new_head=True, head_init="zero"), tmp_path / "run"
    )
    idx = t.second_batch_indices(t.step)
    t.second_batch_indices = lambda step: idx  # hold the batch; each step gives a fresh rounding
    base = t.deployed()
    steps = (EPS * t.units).astype(np.int64)
    d = t.master.size
    true = np.empty(d)
    for j in range(d):
        e = np.zeros(d, np.int64)
        e[j] = steps[j]
        plus, minus = t.losses_at(np.stack([base + e, base - e]), idx)
        true[j] = (plus - minus) / (2 * EPS)
    update = np.random.default_rng(0).normal(size=d) * 0.01 - 0.02 * true / np.abs(true).max()
    first, second = [], []
    for s in range(200):
        t.step = s
        a, c = t.taylor_terms(t.master, update)
        first.append(a)
        second.append(c)
    first, second = np.array(first), np.array(second)
    expected = -true @ update
    assert expected > 0
    # Both are finite differences over the int8 logits' staircase, at other points (eps along each
    # coordinate, RMS eps along the update): they agree to that staircase, not to the last digit.
    assert abs(first.mean() - expected) < 3 * first.std(ddof=1) / np.sqrt(first.size) + 0.15 * expected
    assert second.mean() > 3 * second.std(ddof=1) / np.sqrt(second.size)


def test_efficiency_test_measures_its_steps_and_resumes_bit_for_bit(tiny, tmp_path):
    """EfficiencyTest: 3 passes per measurement on top of the steps' 2q, decisions taken, and the
    same state and weights after an interrupt and a resume."""
    from zo.schedulers import EfficiencyTest

    model, data = tiny

    def trainer(out):
        t = Trainer(config(model, data, budget=3000, checkpoint_every=7, q="efficiency"), out)
        # z = 0: decide on the point estimates, so that this short run takes decisions
        t.scheduler = EfficiencyTest(q_init=1, q_max=8, window=20, overhead=0.2, z=0.0)
        return t

    reference = trainer(tmp_path / "reference")
    seen = []
    reference.run(on_step=lambda t, q, loss: seen.append((t.step, q, t.forward_passes)))
    passes = {s: p for s, _, p in seen}
    measured = [s for s, q, p in seen if s > 1 and p - passes[s - 1] == 2 * q + 3]
    assert measured and reference.scheduler.changes

    assert_resumes_bit_for_bit(trainer, reference, tmp_path, interrupt_at=33)


def test_export_runs_in_tflm_with_original_quantization(tiny, tmp_path):
    model, data = tiny
    t = Trainer(config(model, data, trainable="last:2"), tmp_path / "run")
    t.run()
    exported = (tmp_path / "run" / "model.tflite").read_bytes()
    original, trained = npusim.load_model(model), npusim.load_model(exported)
    changed = 0
    for a, b in zip(original.tensors, trained.tensors):
        assert a.shape == b.shape
        if a.quant is not None:
            assert np.array_equal(a.quant.scale, b.quant.scale) and np.array_equal(
                a.quant.zero_point, b.quant.zero_point
            )
        if a.data is not None:
            changed += not np.array_equal(a.data, b.data)
            if b.dtype == np.int8:
                assert b.data.min() >= -127
    assert changed > 0
    x = t.model.interp.check_input((color_dataset()["x_test"][:16].astype(np.int16) - 128).astype(np.int8))
    assert np.array_equal(run_tflm(exported, x), npusim.Interpreter(exported).run(x))


def test_head_replacement_for_new_classes_runs_in_tflm(tmp_path):
    """MobileNetV2's 5-class flower head becomes a 10-class head; the file still runs in TFLM."""
    need_shared()
    g = npusim.load_model(MOBILENET)
    m = TrainableModel(g, "last:1", num_classes=10)
    assert m.num_classes == 10 and m.graph.output().shape == (1, 10)
    m.set_values([np.random.default_rng(0).integers(-127, 128, v.shape) for v in m.values()])
    data = npusim.write_model(m.graph)
    x = np.random.default_rng(1).integers(0, 256, (2, 128, 128, 3)).astype(np.uint8)
    ti = runtime.Interpreter.from_bytes(data, arena_size=8_000_000)
    for i in range(2):
        ti.set_input(x[i : i + 1], 0)
        ti.invoke()
        assert np.array_equal(ti.get_output(0)[0], npusim.Interpreter(data).run(x[i : i + 1])[0])
    reread = npusim.load_model(data)
    for a, b in zip(g.tensors, reread.tensors):  # every tensor outside the head keeps its quantization
        if a.quant is not None and a.shape == b.shape:
            assert np.array_equal(a.quant.scale, b.quant.scale)


def run_cli(args, **kw):
    return subprocess.run(ZO + args, capture_output=True, text=True, timeout=300, **kw)


def cli_args(model, data, out, *extra):
    return [
        "train",
        "--model",
        str(model),
        "--data",
        str(data),
        "--trainable",
        "last:1",
        "--q",
        "fixed:2",
        "--lr",
        "1.0",
        "--batch",
        "16",
        "--budget",
        "600",
        "--checkpoint-every",
        "5",
        "--eval-every",
        "100",
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]


def test_sigkill_and_resume_ends_with_identical_weights(tiny, tmp_path):
    model, data = tiny
    reference = tmp_path / "reference"
    assert run_cli(cli_args(model, data, reference)).returncode == 0
    run = tmp_path / "killed"
    proc = subprocess.Popen(
        ZO + cli_args(model, data, run), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ckpt = run / "checkpoints" / "last.npz"
    deadline = time.time() + 120
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = run_cli(cli_args(model, data, run, "--resume", str(run)))
    assert resumed.returncode == 0, resumed.stderr
    assert (run / "model.tflite").read_bytes() == (reference / "model.tflite").read_bytes()
    assert read_metrics(run) == read_metrics(reference)


# -- bad input through the CLI --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "problem, message",
    [
        ("shape", "x_train"),
        ("labels", "label"),
        ("empty", "empty"),
        ("name", "no trainable layer named"),
        ("budget", "below one step"),
        ("q", "--q"),
        ("resume-other-data", "--data (the data file's sha256, or the folder) differs from the run's"),
    ],
)
def test_bad_input_exits_2_with_one_line(tiny, tmp_path, problem, message):
    model, data = tiny
    d = dict(np.load(data))
    args = cli_args(model, data, tmp_path / "run")
    if problem == "shape":
        d["x_train"] = d["x_train"][..., :2]
    elif problem == "labels":
        d["y_train"] = d["y_train"] + 10
    elif problem == "empty":
        d["x_train"], d["y_train"] = d["x_train"][:0], d["y_train"][:0]
    elif problem == "name":
        args[args.index("--trainable") + 1] = "no/such/layer"
    elif problem == "budget":
        args[args.index("--budget") + 1] = "3"
    elif problem == "q":
        args[args.index("--q") + 1] = "fixed:0"
    elif problem == "resume-other-data":
        assert run_cli(args).returncode == 0
        other = dict(d)
        other["x_train"] = 255 - d["x_train"]
        np.savez(tmp_path / "other.npz", **other)
        args[args.index("--data") + 1] = str(tmp_path / "other.npz")
        args += ["--resume", str(tmp_path / "run")]
    if problem in ("shape", "labels", "empty"):
        np.savez(tmp_path / "bad.npz", **d)
        args[args.index("--data") + 1] = str(tmp_path / "bad.npz")
    r = run_cli(args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cost_report_and_device_time_column(tiny, tmp_path):
    model, data = tiny
    r = run_cli(["cost", "--model", str(model), "--trainable", "last:2", "--q", "4", "--batch", "8"])
    assert r.returncode == 0, r.stderr
    assert "memory, ZO" in r.stdout and "back-propagation" in r.stdout and "time per step" in r.stdout
    assert run_cli(["cost", "--model", str(model), "--trainable", "nope"]).returncode == 2
    t = Trainer(config(model, data, budget=80), tmp_path / "run")
    t.run()
    rows = read_metrics(tmp_path / "run")
    seconds = [float(r["device_seconds"]) for r in rows]
    assert seconds == sorted(seconds) and seconds[-1] > 0  # accumulates with the forward passes
    # the device model of `npusim inspect --target stm32n6`: forward passes x its latency for a batch,
    # and each step's fixed M55 work (zo/cost.step_overhead_seconds)
    per_pass = plan_device(t.model.interp).latency_s(batch=t.config.batch)
    last = rows[-1]
    expected = int(last["forward_passes"]) * per_pass + t.overhead_seconds
    assert t.overhead_seconds > 0
    assert float(last["device_seconds"]) == pytest.approx(expected, abs=1e-4)
    # --calibration refits it as `npusim inspect --calibration` does: a board twice as slow on every
    # model doubles the step time
    from npusim.npu import CostModel
    from npusim.npu.calibration import estimate_ms
    from npusim.npu.cost import device_structure

    need_shared()
    rows = []
    for path in (Path(model), Path(RESNET)):
        (tmp_path / path.name).write_bytes(path.read_bytes())
        ms = 2 * estimate_ms(device_structure(npusim.Interpreter(str(path))), CostModel())
        rows.append(f"{path.name},{ms}")
    (tmp_path / "cal.csv").write_text("file,npu_ms\n" + "\n".join(rows) + "\n")

    def zo_ms(*extra):
        out = run_cli(["cost", "--model", str(model), "--q", "1", "--batch", "1", *extra])
        assert out.returncode == 0, out.stderr
        return float(re.search(r"time per step: ZO ([\d.]+) ms", out.stdout).group(1))

    assert zo_ms("--calibration", str(tmp_path / "cal.csv")) == pytest.approx(2 * zo_ms(), rel=0.05)
    (tmp_path / "one.csv").write_text("file,npu_ms\n" + rows[0] + "\n")
    bad = run_cli(["cost", "--model", str(model), "--calibration", str(tmp_path / "one.csv")])
    assert bad.returncode == 2 and "cannot fit 2 constants" in bad.stderr  # one model, two constants


# -- ZO step against back-propagation ----------------------------------------------------------------


def test_zo_step_report_resnet_head():
    need_shared()
    interp = npusim.Interpreter(str(RESNET))
    fc = next(k for k in interp.kernels if k.op.kind == "FULLY_CONNECTED")
    trainable = [t for t in fc.op.inputs[1:] if t >= 0]
    r = zo_step_report(interp, trainable, q=4, batch=8)
    params = sum(interp.graph.tensors[t].data.size for t in trainable)
    assert r["trainable_params"] == params == 650
    assert r["forward_passes"] == 2 * 4 and r["image_passes"] == 2 * 4 * 8
    assert r["zo_seconds"] == pytest.approx(64 * plan_device(interp).latency_s(1))
    assert r["zo_seconds_suffix_cached"] < r["zo_seconds"]
    assert r["suffix_cache_bytes"] == 8 * 64  # the FC's 64-wide int8 input, for 8 images
    zo, bp = r["zo_memory"], r["bp_memory"]
    assert zo["master_bytes"] == 4 * params and zo["seed_bytes"] == 4 * 12
    # one image at a time, laid out as the NPU compiler does (`npusim inspect --target stm32n6`)
    dev = plan_device(interp)
    assert zo["arena_bytes"] == dev.memory.internal_bytes + dev.memory.external_bytes
    held = zo_step_report(interp, trainable, q=4, batch=8, resident_images=8)
    assert 7 * zo["arena_bytes"] < held["zo_memory"]["arena_bytes"] <= 8 * zo["arena_bytes"] + 64
    assert held["zo_seconds"] == r["zo_seconds"]
    assert bp["optimizer_bytes"] == 2 * 4 * params and bp["gradient_bytes"] == 4 * params
    # the step rule's momentum buffer is ZO memory too (none of either with --master none)
    assert zo["momentum_bytes"] == 4 * params
    assert zo["total_bytes"] == (
        zo["arena_bytes"] + zo["weight_bytes"] + zo["seed_bytes"] + zo["master_bytes"] + zo["momentum_bytes"]
    )
    lean = zo_step_report(interp, trainable, q=4, batch=8, master="none")["zo_memory"]
    assert lean["master_bytes"] == lean["momentum_bytes"] == 0
    assert lean["total_bytes"] == zo["total_bytes"] - 8 * params
    assert bp["total_bytes"] > zo["total_bytes"]
    text = format_zo_step_report(r)
    assert "ZO step on STM32N6: q=4, batch=8" in text and "back-propagation" in text


def test_zo_step_report_whole_network_stores_more_activations():
    need_shared()
    interp = npusim.Interpreter(str(RESNET))
    weights = sorted(
        {
            t
            for k in interp.kernels
            for t in k.op.inputs[1:]
            if t >= 0 and interp.graph.tensors[t].is_constant and k.op.kind in ("CONV_2D", "FULLY_CONNECTED")
        }
    )
    head = [t for t in interp.kernels[-2].op.inputs[1:] if t >= 0]
    full, small = zo_step_report(interp, weights, q=2, batch=4), zo_step_report(interp, head, q=2, batch=4)
    assert full["bp_memory"]["stored_activation_bytes"] > small["bp_memory"]["stored_activation_bytes"]
    assert full["suffix_first_op"] == 0 and full["zo_seconds_suffix_cached"] == pytest.approx(
        full["batch"] * full["forward_s"] * (1 + 2 * full["q"])
    )
    assert full["bp_memory"]["total_bytes"] > full["zo_memory"]["total_bytes"]


def test_zo_step_report_rejects_activations():
    need_shared()
    interp = npusim.Interpreter(str(RESNET))
    x = interp.graph.inputs[0]
    not_constant = f"tensor {x} is not a constant tensor of the model, so it cannot be trained"
    with pytest.raises(ZoError, match=f"^{not_constant}$"):
        zo_step_report(interp, [x], q=1, batch=1)
    activation = interp.graph.ops[0].outputs[0]  # an op's output: computed, not a weight
    with pytest.raises(ZoError, match=f"^tensor {activation} is not a constant tensor"):
        zo_step_report(interp, [activation], q=1, batch=1)
    with pytest.raises(ZoError, match=f"^tensor {len(interp.graph.tensors)} is not a constant tensor"):
        zo_step_report(interp, [len(interp.graph.tensors)], q=1, batch=1)  # past the last tensor
    weight = next(t for t in interp.kernels[0].op.inputs[1:] if t >= 0)
    assert interp.graph.tensors[weight].is_constant
    for q, batch, resident in ((0, 1, 1), (1, 0, 1), (1, 1, 0)):
        bad = f"q={q}, batch={batch}, resident_images={resident}"
        with pytest.raises(ZoError, match=f"^q, batch and resident_images must be at least 1, got {bad}$"):
            zo_step_report(interp, [weight], q=q, batch=batch, resident_images=resident)
