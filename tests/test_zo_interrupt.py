"""Ctrl-C and --resume in `zo train`: exit 130 and one line at any moment, nothing lost, and the
command the message suggests is the one that continues the run.

Every test sends a real SIGINT to a real `zo train` process (or, for the mechanism, to a process
running real threaded Numba kernels), after a marker the process prints: timing decides nothing. A
few tests slow one function down in the child (a sleep inside a step, inside a checkpoint write), so
that the signal lands exactly there every time; the numerics are untouched."""

from __future__ import annotations

import csv
import json
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

import zo.cli
from zo.progress import StatusLine
from zo.trainer import TrainConfig, Trainer

from zo_fixtures import color_dataset, tiny_classifier

ZO = [sys.executable, "-m", "zo.cli"]
NOT_STARTED = "error: interrupted before the first step; nothing to resume"


def train_args(model, data, out, *extra):
    return [
        "train",
        *("--model", str(model), "--data", str(data), "--out", str(out)),
        *("--q", "fixed:2", "--lr", "1.0", "--batch", "16", "--budget", "600"),
        *("--checkpoint-every", "5", "--eval-every", "100", "--trainable", "last:1"),  # the API's default
        *extra,
    ]


def child(patch: str, args: list) -> subprocess.Popen:
    """`python -m zo.cli ARGS` in a fresh process, after the Python lines `patch` (may be empty)."""
    code = f"{patch}\nimport runpy, sys\nsys.argv = ['zo', *{args!r}]\n"
    code += "runpy.run_module('zo.cli', run_name='__main__', alter_sys=True)\n"
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def interrupt_after(proc: subprocess.Popen, marker: str, pause: float = 0.0) -> tuple[str, str]:
    """Read stderr up to a line holding marker, send SIGINT, and return (stdout, all of stderr)."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if marker in line:
            break
    else:
        proc.wait(timeout=60)
        pytest.fail(f"no {marker!r} line before exit {proc.returncode}: {''.join(seen)}")
    time.sleep(pause)
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=300)
    return out, "".join(seen) + rest


def assert_one_interrupt_line(proc, out: str, err: str) -> str:
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "SystemError" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    assert out == ""
    return errors[0]


def suggested_command(line: str) -> list[str]:
    match = re.search(r"continue with: (.+)$", line)
    assert match, line
    words = shlex.split(match.group(1))
    assert words[:3] == ["zo", "train", "--resume"], words
    return ZO + words[1:]


def finished_reference(model, data, tmp_path):
    reference = tmp_path / "reference"
    done = subprocess.run(ZO + train_args(model, data, reference, "--quiet"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return reference


def metrics(run) -> list[dict]:
    """metrics.csv without its wall-time column (the only one that depends on the machine)."""
    with open(run / "metrics.csv") as f:
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in csv.DictReader(f)]


def assert_same_run(run, reference):
    assert (run / "model.tflite").read_bytes() == (reference / "model.tflite").read_bytes()
    assert metrics(run) == metrics(reference)


# -- the mechanism ---------------------------------------------------------------------------------------
KERNEL_LOOP = """
import sys
import numpy as np
import npusim
from npusim.app import interrupt
from zo_fixtures import tiny_classifier
npusim.tune_process()
sim = npusim.Interpreter(tiny_classifier(side=64, hidden=32))
x = np.random.default_rng(0).integers(-128, 128, (64, 64, 64, 3), dtype=np.int8)  # threaded kernels
sim.run(x)
for _ in range({rounds}):
    try:
        with interrupt.guarded(defer={defer}):
            print("running", flush=True)
            while True:
                sim.run(x)
                interrupt.check(between_steps=True)
    except BaseException as e:
        print(type(e).__name__, flush=True)
"""


@pytest.mark.parametrize("defer", [False, True], ids=["setup", "run"])
def test_ctrl_c_inside_threaded_numba_kernels_is_a_keyboard_interrupt(defer):
    """Under Python's own handler most of these end in `SystemError: CPUDispatcher(...) returned a
    result with an exception set` (the signal is handled inside Numba's boxing callback,
    npusim/app/interrupt.py); under zo's, every one is a KeyboardInterrupt."""
    rounds = 6
    tests_dir = str(__import__("pathlib").Path(__file__).parent)
    code = f"import sys; sys.path.insert(0, {tests_dir!r})\n" + KERNEL_LOOP.format(rounds=rounds, defer=defer)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x.strip()) for x in proc.stdout], daemon=True).start()

    def line(within=120.0):
        # a lost signal leaves the child looping: fail, never hang the suite
        try:
            return lines.get(timeout=within)
        except queue.Empty:
            return "(no answer)"

    caught = []
    try:
        for _ in range(rounds):
            assert line() == "running"
            time.sleep(0.3)  # inside the kernel loop: most of its time is spent in threaded kernels
            proc.send_signal(signal.SIGINT)
            caught.append(line())
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert caught == ["KeyboardInterrupt"] * rounds


# -- zo train, from outside ----------------------------------------------------------------------------
ENDLESS_CACHING = """
import zo.model
real = zo.model.TrainableModel.boundary_activations
def endless(self, x, chunk=256):
    while True:
        real(self, x, chunk)
zo.model.TrainableModel.boundary_activations = endless
"""


@pytest.mark.parametrize("pause", [0.0, 0.5])
def test_ctrl_c_in_setup_exits_130_with_one_line(tmp_path, pause):
    """While the frozen prefix runs over the data set (threaded kernels: 32x32 images), made endless
    so that the signal lands there every time."""
    model, data = tmp_path / "m.tflite", tmp_path / "d.npz"
    model.write_bytes(tiny_classifier(side=32))
    np.savez(data, **color_dataset(side=32))
    proc = child(ENDLESS_CACHING, train_args(model, data, tmp_path / "run"))
    out, err = interrupt_after(proc, "running the frozen prefix", pause)
    assert assert_one_interrupt_line(proc, out, err) == NOT_STARTED
    assert not (tmp_path / "run" / "checkpoints").exists()


SLOW_STEP = """
import time, zo.trainer
real = zo.trainer.Trainer.train_step
def slow(self, q, batches=1):
    if self.step == 20:
        print("in step 20", file=__import__("sys").stderr, flush=True)
        time.sleep(1.0)
    return real(self, q, batches)
zo.trainer.Trainer.train_step = slow
"""

SLOW_CHECKPOINT = """
import os, sys, time
real = os.fsync
def slow(fd):
    # Every output is synced (npusim/app/atomic.py): config.json and metrics.csv too; the checkpoint's
    # temporary file is .last.npz.*.tmp.
    if ".last.npz." in os.readlink(f"/proc/self/fd/{fd}"):
        print("writing a checkpoint", file=sys.stderr, flush=True)
        time.sleep(1.0)
    real(fd)
os.fsync = slow
"""


@pytest.mark.parametrize(
    "where, patch, marker",
    [
        ("in a step", SLOW_STEP, "in step 20"),
        ("in a checkpoint write", SLOW_CHECKPOINT, "writing a checkpoint"),
    ],
)
def test_ctrl_c_in_training_checkpoints_and_the_suggested_command_finishes_the_run(
    tiny, tmp_path, where, patch, marker
):
    """The step or the write finishes, a checkpoint of that state is written, and `zo train --resume
    DIR`, as the message says it, ends with the weights and metrics of a run never interrupted."""
    model, data = tiny
    reference = finished_reference(model, data, tmp_path)
    run = tmp_path / "run"
    proc = child(patch, train_args(model, data, run))
    out, err = interrupt_after(proc, marker)
    line = assert_one_interrupt_line(proc, out, err)
    assert line.startswith("error: interrupted at step ") and f"{run / 'checkpoints' / 'last.npz'}" in line
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.npz"]
    resumed = subprocess.run(suggested_command(line), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(run, reference)


def test_sigint_twice_in_a_row_still_exits_130_with_one_line(tiny, tmp_path):
    model, data = tiny
    proc = child(SLOW_CHECKPOINT, train_args(model, data, tmp_path / "run"))
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "writing a checkpoint" in line:
            break
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=300)
    assert_one_interrupt_line(proc, out, "".join(seen) + rest)


# -- --resume DIR ------------------------------------------------------------------------------------------
@pytest.fixture
def half_run(tiny, tmp_path):
    """A run stopped at 200 of its 600 forward passes (its checkpoint and config.json written)."""
    model, data = tiny
    run = tmp_path / "run"
    config = TrainConfig(
        model=str(model),
        data=str(data),
        q="fixed:2",
        lr=1.0,
        batch=16,
        budget=200,
        checkpoint_every=5,
        eval_every=100,
    )
    Trainer(config, run).run()
    return model, data, run


def invoke(*args):
    return CliRunner().invoke(zo.cli.main, [str(a) for a in args], catch_exceptions=False)


def stopped_run(model, data, run, at: int):
    """A run of 600 forward passes stopped (as by Ctrl-C) once `at` passes are spent."""

    def stop(trainer, q, loss):
        if trainer.forward_passes >= at:
            raise KeyboardInterrupt

    config = TrainConfig(
        model=str(model), data=str(data), q="fixed:2", lr=1.0, batch=16, budget=600,
        checkpoint_every=5, eval_every=100,
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        Trainer(config, run).run(on_step=stop)


def test_resume_alone_continues_with_the_recorded_options(tiny, tmp_path):
    model, data = tiny
    run = tmp_path / "run"
    stopped_run(model, data, run, at=200)
    reference = finished_reference(model, data, tmp_path)
    result = invoke("train", "--resume", run, "--quiet")
    assert result.exit_code == 0, result.stderr
    assert_same_run(run, reference)
    again = invoke("train", "--resume", run, "--quiet")  # finished: nothing left, same model
    assert again.exit_code == 0 and "600 forward passes" in again.stdout, again.stderr
    assert_same_run(run, reference)


def test_a_larger_budget_on_resume_is_the_new_total_and_recorded(half_run):
    """--budget beside --resume is the total (not more passes), recorded for the next resume. Schedules
    relative to the budget (the head's cosine) stretch to it from the checkpoint on, so the run is not
    the one a budget of 600 from the start would have made."""
    model, data, run = half_run
    result = invoke("train", "--resume", run, "--budget", "600", "--quiet")
    assert result.exit_code == 0, result.stderr
    assert json.loads((run / "config.json").read_text())["budget"] == 600
    assert "600 forward passes" in result.stdout
    rows = metrics(run)
    assert int(rows[-1]["forward_passes"]) <= 600 and int(rows[-1]["forward_passes"]) > 500


@pytest.mark.parametrize(
    "given, message",
    [
        (["--seed", "7"], "--seed 7 differs from the run's --seed 0"),
        (["--lr", "2"], "--lr 2.0 differs from the run's --lr 1.0"),
        (["--trainable", "biases"], "--trainable biases differs from the run's --trainable last:1"),
        (["--q", "fixed:4"], "--q fixed:4 differs from the run's --q fixed:2"),
        (["--new-head"], "--new-head: the run was started without it"),
    ],
)
def test_an_option_beside_resume_that_differs_exits_2_naming_it(half_run, given, message):
    model, data, run = half_run
    before = (run / "checkpoints" / "last.npz").read_bytes()
    result = invoke("train", "--resume", run, *given)
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: --resume {run}: {message} ({run / 'config.json'}); leave it out to continue the run as "
        "recorded\n"
    )
    assert (run / "checkpoints" / "last.npz").read_bytes() == before


def test_an_option_beside_resume_with_the_recorded_value_is_fine(half_run):
    model, data, run = half_run
    result = invoke(
        "train",
        "--resume",
        run,
        "--out",
        run,
        "--model",
        model,
        "--data",
        data,
        "--seed",
        "0",
        "--lr",
        "1",
        "--q",
        "fixed:2",
        "--quiet",
    )
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--resume", "{tmp}/nowhere"],
            "error: --resume {tmp}/nowhere: no {tmp}/nowhere/config.json: "
            "not the directory of a zo train run",
        ),
        (
            ["--data", "{tmp}/d.npz", "--out", "{tmp}/run"],
            "error: --model is required to start a run (or --resume DIR to continue one)",
        ),
        (
            ["--model", "{tmp}/m.tflite", "--data", "{tmp}/d.npz"],
            "error: --out is required to start a run (or --resume DIR to continue one)",
        ),
    ],
)
def test_a_run_without_its_options_exits_2_with_one_line(tmp_path, args, message):
    result = invoke("train", *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2
    assert result.stderr == message.format(tmp=tmp_path) + "\n"


# -- what a run shows ------------------------------------------------------------------------------------
class Stream:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


class FakeTrainer:
    def __init__(self):
        self.step, self.forward_passes, self.last_eval_passes, self.final_accuracy = 0, 0, -1, float("nan")

    @property
    def spent(self):  # a run budgeted in passes: Trainer.spent is its forward passes
        return self.forward_passes


def drive(tty: bool, steps: int = 100, dt: float = 0.01):
    """A run of `steps` steps of 10 passes, one every dt seconds, evaluated every 250 passes."""
    now = [0.0]
    stream, t = Stream(tty), FakeTrainer()
    status = StatusLine(1000, stream, clock=lambda: now[0])
    for _ in range(steps):
        t.step, t.forward_passes = t.step + 1, t.forward_passes + 10
        if t.forward_passes % 250 == 0:
            t.last_eval_passes, t.final_accuracy = t.forward_passes, t.forward_passes / 1000 * 0.9
        now[0] += dt
        status.update(t, 2, 1.5)
    status.close()
    return stream.text


def test_the_status_line_redraws_at_most_4_times_a_second_on_a_terminal():
    text = drive(tty=True, steps=100, dt=0.01)  # 100 steps in one second
    assert 4 <= text.count("\r") <= 5  # 4 a second, and the last step always
    last = text.split("\r")[-1]
    assert last.rstrip().endswith("ETA 0:00") and "1000/1000 passes" in last and "test 90.0%" in last


def test_the_status_line_is_one_line_per_evaluation_off_a_terminal():
    text = drive(tty=False, steps=100, dt=1.0)
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 4  # evaluations at 250, 500, 750, 1000 passes
    assert lines[0].startswith("zo train  25%  250/1000 passes  step 25  q 2  loss 1.5000  test 22.5%")
    assert lines[0].endswith("ETA 1:15")  # 240 passes in 24 s after the first step: 750 more in 75 s


def test_a_system_error_caused_by_a_keyboard_interrupt_is_an_interrupt():
    """The form Python's own handler gives inside a Numba callback, should another handler be installed."""
    from npusim.app.interrupt import is_interrupt

    def numba_like():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise SystemError("CPUDispatcher(<function f>) returned a result with an exception set") from e

    with pytest.raises(SystemError) as caught:
        numba_like()
    assert is_interrupt(caught.value) and is_interrupt(KeyboardInterrupt())
    assert not is_interrupt(SystemError("a real one")) and not is_interrupt(ValueError())
