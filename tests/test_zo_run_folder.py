"""`zo train`'s run folder on a shared machine: one writer at a time (a second exits 2 naming the
first's pid), never its own input model as output, and metrics.csv with one line end, after a
resume too (zo/run_lock.py, zo/metrics.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from zo.run_lock import LOCK_NAME, lock_run, release_run

ZO = [sys.executable, "-m", "zo.cli"]


def zo(*args, **kw):
    return subprocess.run([*ZO, *map(str, args)], capture_output=True, text=True, timeout=600, **kw)


def train(model, data, out, *extra):
    return zo(
        "train",
        *("--model", model, "--data", data, "--out", out, "--q", "fixed:2", "--batch", "16"),
        *("--checkpoint-every", "5", "--quiet"),
        *extra,
    )


def one_error_line(done, *words):
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_a_second_writer_of_a_run_folder_exits_2_naming_the_first(tiny, tmp_path):
    model, data = tiny
    run = tmp_path / "run"
    lock_run(run)  # this process is "the first zo train" on the folder
    try:
        one_error_line(train(model, data, run, "--budget", "100"), f"(pid {os.getpid()})", "another zo train")
        one_error_line(zo("train", "--resume", run), f"(pid {os.getpid()})")
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # the second wrote nothing
    finally:
        release_run(run)
    done = train(model, data, run, "--budget", "100")  # free again: the lock went with its holder
    assert done.returncode == 0, done.stderr


def test_the_lock_goes_with_a_killed_process(tiny, tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from zo.run_lock import lock_run; lock_run(sys.argv[1]); "
         "print('locked', flush=True); time.sleep(600)", str(run)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(Exception, match=f"pid {holder.pid}"):
            lock_run(run)
    finally:
        holder.kill()
        holder.wait()
    lock_run(run)  # no stale lock: the kernel dropped it with the process
    release_run(run)


def test_an_output_folder_that_holds_the_input_model_is_refused(tiny, tmp_path):
    model, data = tiny
    run = tmp_path / "run"
    run.mkdir()
    inside = run / "model.tflite"  # what the run's export would overwrite
    shutil.copy(model, inside)
    before = inside.read_bytes()
    one_error_line(train(inside, data, run, "--budget", "100"), "holds the input model", str(inside))
    assert inside.read_bytes() == before
    one_error_line(train(model, data, tmp_path, "--budget", "100"), "holds the input model")  # a parent


def test_metrics_csv_has_one_line_end_after_a_resume(tiny, tmp_path):
    model, data = tiny
    run = tmp_path / "run"
    first = train(model, data, run, "--budget", "200")
    assert first.returncode == 0, first.stderr
    # A run of an older zo wrote "\r\n" rows: a resume keeps them with one line end, as the new ones.
    rows = (run / "metrics.csv").read_bytes()
    (run / "metrics.csv").write_bytes(rows.replace(b"\n", b"\r\n"))
    resumed = zo("train", "--resume", run, "--budget", "400")
    assert resumed.returncode == 0, resumed.stderr
    text = (run / "metrics.csv").read_bytes()
    assert b"\r" not in text and text.endswith(b"\n")
    assert text.startswith(rows)  # the rows up to the checkpoint, as they were
    assert len(text.splitlines()) > len(rows.splitlines())
