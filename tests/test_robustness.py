"""Robustness of inputs and of training state: bad input arrays, corrupt or foreign checkpoints,
resumes against other models or data, a full disk while writing a checkpoint.

Every case ends in a clear one-line error (NpusimError / ZoError through the API; exit code 2 and
one stderr line through the CLIs) and loses no data. Hostile model files: tests/test_fuzz.py.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import npusim
import npusim.app.cli
import zo.cli
import zo.trainer
from npusim import Interpreter, NpusimError
from npusim.formats import limits
from npusim.testing import oracle as O
from zo.errors import ZoError
from zo.trainer import TrainConfig, Trainer

from zo_fixtures import color_dataset, tiny_classifier


def one_line_error(result, *needles):
    """A CliRunner result: exit code 2, exactly one stderr line naming the problem, nothing uncaught."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ----------------------------------------------------------------------------------------------
# Inputs: through the API
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models():
    return {
        "float32": O.quantize_model((1, 4, 3), np.float32, 0.05, 1),
        "uint8": O.quantize_model((1, 4, 3), np.uint8, 0.05, 1, 0.05, 129),
        "int8": tiny_classifier(),
        "two_inputs": O.add_model((1, 3, 4), (1, 3, 4), 0.05, 1, 0.07, -2, 0.1, 0),
    }


def good_input(kind: str, n: int = 2) -> np.ndarray:
    rng = np.random.default_rng(0)
    if kind == "float32":
        return rng.standard_normal((n, 4, 3)).astype(np.float32)
    if kind == "uint8":
        return rng.integers(0, 256, (n, 4, 3)).astype(np.uint8)
    return rng.integers(-128, 128, (n, 4, 4, 3)).astype(np.int8)


def bad_inputs():
    """(model, input, words the message must contain)."""
    f = good_input("float32")
    nan, inf, huge = f.copy(), f.copy(), f.copy()
    nan[1, 2, 0] = np.nan
    inf[0, 0, 0] = -np.inf
    huge[0, 3, 2] = 1e30
    return {
        "nan": ("float32", nan, ["NaN or infinite"]),
        "inf": ("float32", inf, ["NaN or infinite"]),
        "out of range float": ("float32", huge, ["1e+30", "out of range"]),
        "float64 for float32": ("float32", f.astype(np.float64), ["dtype float64, expected float32"]),
        "int8 for uint8": ("uint8", good_input("uint8").astype(np.int8), ["dtype int8, expected uint8"]),
        "int64 for uint8": ("uint8", good_input("uint8").astype(np.int64), ["dtype int64, expected uint8"]),
        "float for uint8": (
            "uint8",
            good_input("uint8").astype(np.float32),
            ["dtype float32, expected uint8"],
        ),
        "missing batch axis": ("float32", f[0], ["shape [4, 3], expected [N, 4, 3]"]),
        "extra axis": ("float32", f[None], ["expected [N, 4, 3]"]),
        "wrong image shape": (
            "int8",
            good_input("int8")[:, :3],
            ["shape [2, 3, 4, 3], expected [N, 4, 4, 3]"],
        ),
        "scalar": ("float32", np.ones((), np.float32), ["expected [N, 4, 3]"]),
        "empty batch": ("float32", f[:0], ["empty batch"]),
        "not an array": ("float32", f.tolist(), ["expected a numpy array"]),
    }


@pytest.mark.parametrize("case", sorted(bad_inputs()))
def test_bad_input_is_a_clear_error(models, case):
    kind, x, needles = bad_inputs()[case]
    interp = Interpreter(models[kind])
    with pytest.raises(NpusimError) as e:
        interp.run(x)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_inputs_that_are_fine(models):
    """Saturation is TFLM's behaviour, not an error; byte order is not a different type."""
    interp = Interpreter(models["float32"])
    x = good_input("float32")
    x[0, 0, 0], x[0, 0, 1] = 1e6, -1e6  # far outside int8 after quantization, inside int32
    y = interp.run(x)
    assert y[0, 0, 0] == 127 and y[0, 0, 1] == -128
    swapped = x.astype(x.dtype.newbyteorder(">"))
    assert np.array_equal(interp.run(swapped), y)


def test_a_model_with_several_inputs_says_so(models):
    interp = Interpreter(models["two_inputs"])
    with pytest.raises(NpusimError, match="model has 2 inputs, run feeds one"):
        interp.run(np.zeros((2, 3, 4), np.int8))
    with pytest.raises(NpusimError, match="no value for tensor 1 .* every graph input"):
        interp.evaluate({interp.graph.inputs[0]: np.zeros((2, 3, 4), np.int8)})


def test_a_batch_beyond_the_allocation_limit_is_refused_before_running(models, monkeypatch):
    interp = Interpreter(models["int8"])
    need, _ = interp.largest_allocation(100)
    monkeypatch.setattr(limits, "MAX_TENSOR_BYTES", need)
    interp.run(good_input("int8", 100))
    with pytest.raises(NpusimError, match="a batch of 101 needs .* run smaller batches"):
        interp.run(good_input("int8", 101))


# ----------------------------------------------------------------------------------------------
# Inputs and files: through `npusim run`
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path, models):
    paths = {}
    for kind, data in models.items():
        paths[kind] = tmp_path / f"{kind}.tflite"
        paths[kind].write_bytes(data)
    return paths


def npusim_run(*args):
    return CliRunner().invoke(npusim.app.cli.main, ["run", *map(str, args)], catch_exceptions=False)


@pytest.mark.parametrize(
    "case",
    [
        "nan",
        "out of range float",
        "float64 for float32",
        "int8 for uint8",
        "missing batch axis",
        "empty batch",
    ],
)
def test_cli_bad_input_exits_2_with_one_line(files, tmp_path, case):
    kind, x, needles = bad_inputs()[case]
    np.save(tmp_path / "x.npy", x)
    one_line_error(
        npusim_run(files[kind], "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy"), *needles
    )
    assert not (tmp_path / "y.npy").exists()


def test_cli_bad_files_exit_2_with_one_line(files, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, good_input("float32"))
    out = tmp_path / "y.npy"
    archive = tmp_path / "x.npz"
    np.savez(archive, x=good_input("float32"))
    garbage = tmp_path / "garbage.npy"
    garbage.write_bytes(os.urandom(300))
    pickled = tmp_path / "pickled.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    empty = tmp_path / "empty.tflite"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.tflite"
    truncated.write_bytes(files["float32"].read_bytes()[:100])
    cases = [
        ((files["float32"], "--input", archive, "--output", out), ["expected a single .npy array"]),
        ((files["float32"], "--input", garbage, "--output", out), ["cannot read as .npy"]),
        ((files["float32"], "--input", pickled, "--output", out), ["cannot read as .npy"]),
        ((files["float32"], "--input", tmp_path / "missing.npy", "--output", out), ["cannot read as .npy"]),
        ((tmp_path / "missing.tflite", "--input", x, "--output", out), ["cannot read model file"]),
        ((tmp_path, "--input", x, "--output", out), ["a folder, expected a model file (.tflite or .onnx)"]),
        ((empty, "--input", x, "--output", out), ["not a TFLite flatbuffer", "and not an ONNX model"]),
        ((truncated, "--input", x, "--output", out), ["malformed flatbuffer"]),
        ((files["two_inputs"], "--input", x, "--output", out), ["model has 2 inputs"]),
        (
            (files["float32"], "--input", x, "--output", tmp_path / "no" / "such" / "dir" / "y.npy"),
            ["cannot write output"],
        ),
    ]
    for args, needles in cases:
        one_line_error(npusim_run(*args), *needles)


def test_cli_in_a_real_process_has_no_traceback(files, tmp_path):
    x = good_input("float32")
    x[0, 0, 0] = np.nan
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "npusim.app.cli",
            "run",
            str(files["float32"]),
            "--input",
            str(tmp_path / "x.npy"),
            "--output",
            str(tmp_path / "y.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "NaN" in r.stderr


# ----------------------------------------------------------------------------------------------
# Training: checkpoints
# ----------------------------------------------------------------------------------------------


def train_config(model, data, **kw):
    base = dict(
        model=str(model),
        data=str(data),
        trainable="last:1",
        q="fixed:2",
        lr=1.0,
        batch=16,
        budget=200,
        checkpoint_every=5,
        eval_every=100,
    )
    base.update(kw)
    return TrainConfig(**base)


def train_args(model, data, out, *extra):
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
        "200",
        "--checkpoint-every",
        "5",
        "--eval-every",
        "100",
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished tiny run (model, data set, run directory) that each test copies before damaging it."""
    root = tmp_path_factory.mktemp("zo")
    model, data = root / "tiny.tflite", root / "colors.npz"
    model.write_bytes(tiny_classifier())
    np.savez(data, **color_dataset())
    Trainer(train_config(model, data), root / "run").run()
    return model, data, root / "run"


@pytest.fixture
def run(finished_run, tmp_path):
    model, data, run = finished_run
    shutil.copytree(run, tmp_path / "run")
    return model, data, tmp_path / "run"


def checkpoint(run: Path) -> Path:
    return run / "checkpoints" / "last.npz"


def npz_bytes(**arrays) -> bytes:
    b = io.BytesIO()
    np.savez(b, **arrays)
    return b.getvalue()


def resume(model, data, run, *extra):
    return CliRunner().invoke(
        zo.cli.main, train_args(model, data, run, "--resume", str(run), *extra), catch_exceptions=False
    )


def damaged_checkpoints(good: bytes) -> dict[str, bytes]:
    z = dict(np.load(io.BytesIO(good)))
    return {
        "random bytes": np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "one bit flipped": bytes(good[:200]) + bytes([good[200] ^ 0x10]) + bytes(good[201:]),
        "foreign npz": npz_bytes(weights=np.zeros(3), labels=np.arange(4)),
        "meta not json": npz_bytes(**{**z, "meta": np.frombuffer(b"\xff\xfe{", np.uint8)}),
        "meta not an object": npz_bytes(**{**z, "meta": np.frombuffer(b"[1, 2]", np.uint8)}),
    }


@pytest.mark.parametrize(
    "damage",
    [
        "random bytes",
        "truncated",
        "empty",
        "one bit flipped",
        "foreign npz",
        "meta not json",
        "meta not an object",
    ],
)
def test_corrupt_or_foreign_checkpoint_exits_2_and_is_left_alone(run, damage):
    model, data, run = run
    bad = damaged_checkpoints(checkpoint(run).read_bytes())[damage]
    checkpoint(run).write_bytes(bad)
    metrics = (run / "metrics.csv").read_bytes()
    one_line_error(resume(model, data, run), "damaged or not a zo checkpoint")
    assert checkpoint(run).read_bytes() == bad  # nothing overwritten: the user can still inspect it
    assert (run / "metrics.csv").read_bytes() == metrics


def zo_like_checkpoints(good: bytes) -> dict[str, bytes]:
    """Files that decode as a zo checkpoint but hold the wrong things (another version, hand edits)."""
    z = dict(np.load(io.BytesIO(good)))
    meta = json.loads(bytes(z["meta"]).decode())

    def with_meta(**changes):
        m = {k: v for k, v in {**meta, **changes}.items() if v is not ...}
        return npz_bytes(**{**z, "meta": np.frombuffer(json.dumps(m).encode(), np.uint8)})

    return {
        "meta without fingerprint": with_meta(fingerprint=...),
        "wall is null": with_meta(wall=None),
        "scheduler state of another kind": with_meta(scheduler="garbage"),
        "optimizer state missing": npz_bytes(**{k: v for k, v in z.items() if not k.startswith("opt_")}),
        "optimizer state of another size": npz_bytes(**{**z, "opt_m": np.zeros(3)}),
        "master copy not numbers": npz_bytes(**{**z, "master": np.array(["a"] * z["master"].size)}),
        "master copy NaN": npz_bytes(**{**z, "master": np.full_like(z["master"], np.nan)}),
    }


@pytest.mark.parametrize(
    "damage",
    [
        "meta without fingerprint",
        "wall is null",
        "scheduler state of another kind",
        "optimizer state missing",
        "optimizer state of another size",
        "master copy not numbers",
        "master copy NaN",
    ],
)
def test_checkpoint_with_wrong_contents_exits_2(run, damage):
    model, data, run = run
    bad = zo_like_checkpoints(checkpoint(run).read_bytes())[damage]
    checkpoint(run).write_bytes(bad)
    one_line_error(resume(model, data, run), "damaged or not a zo checkpoint")
    assert checkpoint(run).read_bytes() == bad


def test_resume_with_another_model_or_data_exits_2(run, tmp_path):
    model, data, run = run
    other_model = tmp_path / "other.tflite"
    other_model.write_bytes(tiny_classifier(seed=1))
    one_line_error(
        CliRunner().invoke(
            zo.cli.main, train_args(other_model, data, run, "--resume", str(run)), catch_exceptions=False
        ),
        "--model (the model file's sha256) differs from the run's",
    )
    other_data = tmp_path / "other.npz"
    np.savez(other_data, **color_dataset(seed=3))
    one_line_error(
        CliRunner().invoke(
            zo.cli.main, train_args(model, other_data, run, "--resume", str(run)), catch_exceptions=False
        ),
        "--data (the data file's sha256, or the folder) differs from the run's",
    )
    one_line_error(resume(model, data, run, "--seed", "7"), "--seed 7 differs from the run's --seed 0")
    good = checkpoint(run).read_bytes()
    Trainer(train_config(model, data), run).load_checkpoint(
        run
    )  # the checkpoint is untouched and still loads
    assert checkpoint(run).read_bytes() == good


@pytest.mark.parametrize("failure", ["savez", "fsync", "replace"])
def test_full_disk_while_writing_a_checkpoint_keeps_the_previous_one(run, monkeypatch, failure):
    model, data, run = run
    previous = checkpoint(run).read_bytes()
    t = Trainer(train_config(model, data), run)
    t.load_checkpoint(run)
    t.step += 1  # a later state, so that a successful write would change the file
    t.wall = lambda: t.wall_offset  # set by run(), which calls save_checkpoint

    def no_space(*args, **kwargs):
        if failure == "savez":  # half a file reaches the disk, then the disk is full
            args[0].write(b"PK\x03\x04" + b"\0" * 1000)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = {
        "savez": (zo.trainer.np, "savez"),
        "fsync": (os, "fsync"),
        "replace": (os, "replace"),
    }[failure]
    monkeypatch.setattr(*target, no_space)
    with pytest.raises(
        ZoError, match="cannot write checkpoint .*No space left on device.*previous checkpoint is kept"
    ):
        t.save_checkpoint()
    monkeypatch.undo()
    assert checkpoint(run).read_bytes() == previous
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "last.npz"
    ]  # no partial file left behind
    Trainer(train_config(model, data), run).load_checkpoint(run)


def test_full_disk_during_training_exits_2_and_resume_continues(run, monkeypatch):
    """Through the CLI: the run stops with one line, and --resume later finishes it from the last good
    checkpoint."""
    model, data, run = run
    shutil.rmtree(run)
    calls = {"n": 0}
    real_savez = np.savez

    def savez_then_full(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_savez(*args, **kwargs)

    monkeypatch.setattr(zo.trainer.np, "savez", savez_then_full)
    one_line_error(
        CliRunner().invoke(zo.cli.main, train_args(model, data, run), catch_exceptions=False),
        "cannot write checkpoint",
        "No space left on device",
    )
    kept = Trainer(train_config(model, data), run)
    kept.load_checkpoint(run)
    assert kept.step == 10  # the second checkpoint (every 5 steps) survived the failed third
    monkeypatch.undo()
    result = resume(model, data, run)
    assert result.exit_code == 0, result.stderr
    assert (run / "model.tflite").exists()


def test_weights_edited_in_place_are_not_served_stale():
    """Conv and depthwise kernels keep their prepared weights between calls; an edit of the
    model's weight arrays in place (as a trainer may do) must show in the next run."""
    from shared_paths import MOBILENET, need

    model = Path(need(MOBILENET)).read_bytes()
    sim = npusim.Interpreter(model)
    x = np.random.default_rng(0).integers(0, 256, (2, *sim.graph.input(0).shape[1:])).astype(np.uint8)
    before = sim.run(x)
    for kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        kernel = next(k for k in sim.kernels if k.kind == kind)
        w = sim.graph.tensors[kernel.op.inputs[1]].data
        w[...] = np.clip(w.astype(np.int16) // 2 + 3, -127, 127).astype(np.int8)  # in place
    after = sim.run(x)
    fresh = npusim.Interpreter(sim.graph).run(x)
    np.testing.assert_array_equal(after, fresh)
    assert not np.array_equal(after, before)
