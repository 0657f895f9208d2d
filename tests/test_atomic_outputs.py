"""Every output file is written whole or not at all (npusim/app/atomic.py): `run --output`, `run --dump`,
`golden record -o`, `validate --report`, zo's metrics.csv, config.json, checkpoint and model. Under a
file-size limit (RLIMIT_FSIZE in the command's process, SIGXFSZ ignored, as a shell's `ulimit -f`
in a CI job gives) and on a full disk (a 64 KiB tmpfs mounted in a mount namespace of the command's
own, where `unshare -m` works; an ENOSPC injected into os.write everywhere): exit 2, one line naming
the file and the cause, the previous file byte for byte, no temporary file left."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from npusim.app import atomic

from zo_fixtures import tiny_classifier

NPUSIM = [sys.executable, "-m", "npusim.app.resident"]


def limited(max_bytes: int):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return limit


@pytest.fixture
def files(tmp_path):
    (tmp_path / "m.tflite").write_bytes(tiny_classifier(side=16, hidden=8))
    x = np.random.default_rng(0).integers(-128, 128, (64, 16, 16, 3), dtype=np.int8)
    np.save(tmp_path / "x.npy", x)
    return tmp_path


def npusim(args, cwd, **kw):
    env = dict(os.environ, NPUSIM_RESIDENT="0")
    return subprocess.run(
        NPUSIM + [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, **kw
    )


def one_error_line(done, *words):
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr
    for w in words:
        assert w in done.stderr, done.stderr


def leftovers(folder) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


OLD = b"the previous output, which must survive"


@pytest.mark.parametrize(
    "args, output",
    [
        (["run", "m.tflite", "--input", "x.npy", "--output", "y.npy"], "y.npy"),
        (["run", "m.tflite", "--input", "x.npy", "--output", "y.npz"], "y.npz"),
        (["golden", "record", "m.tflite", "--input", "x.npy", "-o", "g.npz"], "g.npz"),
    ],
    ids=["run npy", "run npz", "golden"],
)
def test_under_a_file_size_limit_the_old_file_stays_and_the_cause_is_named(files, args, output):
    (files / output).write_bytes(OLD)
    done = npusim(args, files, preexec_fn=limited(200))  # the outputs are about 400 bytes and more
    one_error_line(done, output, "File too large")
    assert (files / output).read_bytes() == OLD
    assert leftovers(files) == []
    whole = npusim(args, files)  # no limit: the file is replaced, whole
    assert whole.returncode == 0, whole.stderr
    assert (files / output).read_bytes() != OLD
    if output.endswith(".npy"):
        assert np.load(files / output).shape == (64, 4)


def test_a_dump_under_a_file_size_limit_is_one_line(files):
    done = npusim(
        ["run", "m.tflite", "--input", "x.npy", "--output", "y.npy", "--dump", "d"],
        files,
        preexec_fn=limited(4000),  # y.npy fits, the input tensor of 49 KB does not
    )
    one_error_line(done, "cannot write output d/0000_input.npy", "File too large")
    assert leftovers(files / "d") == []


def test_a_validate_report_under_a_file_size_limit_is_one_line(files):
    done = npusim(
        ["validate", "m.tflite", "--input", "x.npy", "--report", "r"], files, preexec_fn=limited(2000)
    )
    one_error_line(done, "--report r", "File too large")
    assert leftovers(files / "r") == []


def have_private_mounts() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


FULL_DISK = """
set -e
mount -t tmpfs -o size=64k tmpfs "$DISK"
printf '%s' "$OLD" > "$DISK/y.npy"
head -c 40000 /dev/zero > "$DISK/filler"  # what is left: less than the 49 KB output
set +e
"$@" --output "$DISK/y.npy"
echo "status $?" >&2
cat "$DISK/y.npy" > "$DISK/../kept"
ls -a "$DISK" >&2
"""


@pytest.mark.skipif(not have_private_mounts(), reason="no `unshare -m` (root) here: no private tmpfs")
def test_on_a_full_disk_the_old_file_stays_and_the_cause_is_named(tmp_path):
    (tmp_path / "m.tflite").write_bytes(tiny_classifier(side=16, hidden=8, head=False))
    x = np.random.default_rng(0).integers(-128, 128, (4096, 16, 16, 3), dtype=np.int8)
    np.save(tmp_path / "x.npy", x)
    disk = tmp_path / "disk"
    disk.mkdir()
    env = dict(os.environ, NPUSIM_RESIDENT="0", DISK=str(disk), OLD=OLD.decode())
    command = [*NPUSIM, "run", str(tmp_path / "m.tflite"), "--input", str(tmp_path / "x.npy")]
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", FULL_DISK, "sh", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.splitlines()
    kept = "the previous file is kept"
    assert lines[0] == f"error: cannot write output {disk}/y.npy: No space left on device; {kept}"
    assert lines[1] == "status 2", done.stderr
    assert sorted(lines[2:]) == [".", "..", "filler", "y.npy"]  # no temporary file left
    assert (tmp_path / "kept").read_bytes() == OLD
    assert os.listdir(disk) == []  # the tmpfs was the namespace's own


def test_a_write_that_fails_midway_keeps_the_old_file(tmp_path, monkeypatch):
    """ENOSPC from the n-th os.write (a disk that fills during the write), in-process."""
    path = tmp_path / "y.npz"
    path.write_bytes(OLD)
    real_write, calls = os.write, {"n": 0}

    def filling(fd, data):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", filling)
    with pytest.raises(atomic.WriteFailed) as failed:
        with atomic.replacing(path) as f:
            np.savez(f, a=np.arange(1000), b=np.arange(1000))
    monkeypatch.undo()
    assert str(failed.value) == f"cannot write {path}: No space left on device; the previous file is kept"
    assert path.read_bytes() == OLD and leftovers(tmp_path) == []


def test_a_short_write_is_written_on_not_lost(tmp_path, monkeypatch):
    """os.write may take fewer bytes than given (a signal, a pipe): the rest is written after."""
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    with atomic.replacing(tmp_path / "y.npy") as f:
        np.save(f, np.arange(100))
    monkeypatch.undo()
    assert np.array_equal(np.load(tmp_path / "y.npy"), np.arange(100))


def test_a_device_is_written_in_place_and_a_link_to_a_file_is_refused(tmp_path):
    with atomic.replacing("/dev/null") as f:
        f.write(b"nothing")
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    with pytest.raises(atomic.WriteFailed, match="No space left on device"):
        with atomic.replacing("/dev/full") as f:
            f.write(b"x")
    assert not os.path.isfile("/dev/full")
    (tmp_path / "target.txt").write_text("old")
    (tmp_path / "target.txt").chmod(0o600)
    (tmp_path / "link.txt").symlink_to("target.txt")
    (tmp_path / "dangling.txt").symlink_to("nowhere.txt")
    for link in ("link.txt", "dangling.txt"):
        with pytest.raises(atomic.WriteFailed, match="symbolic link"):
            atomic.write_text(tmp_path / link, "new")
    assert (tmp_path / "target.txt").read_text() == "old" and not (tmp_path / "nowhere.txt").exists()
    assert (tmp_path / "link.txt").is_symlink() and sorted(os.listdir(tmp_path)) == [
        "dangling.txt", "link.txt", "target.txt",
    ]


def test_a_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "y.npy"
    path.write_bytes(OLD)
    path.chmod(0o600)
    atomic.write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o600


def test_the_temporary_file_of_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    """SIGKILL at the fsync leaves `.NAME.PID.XXXX.tmp`: the next write of NAME removes it when its
    writer no longer runs, and leaves a running writer's (and another name's) alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".y.npy.{dead.pid}.0badc0de.tmp"
    live = tmp_path / f".y.npy.{os.getppid()}.0badc0de.tmp"
    other = tmp_path / f".z.npy.{dead.pid}.0badc0de.tmp"
    for f in (stale, live, other):
        f.write_bytes(b"half")
    atomic.write_bytes(tmp_path / "y.npy", b"new")
    assert not stale.exists() and live.exists() and other.exists()


def test_an_interrupted_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "y.npy"
    path.write_bytes(OLD)
    with pytest.raises(KeyboardInterrupt):
        with atomic.replacing(path) as f:
            f.write(b"half")
            raise KeyboardInterrupt
    assert path.read_bytes() == OLD and leftovers(tmp_path) == []


def test_a_report_with_a_math_tensor_name_is_written_whole(tmp_path):
    """A `$...$` name is drawn as it is, not parsed as mathtext (which raised), and index.html is there."""
    from npusim.testing import oracle as O

    b = O.ModelBuilder()
    x = b.add_tensor((1, 4, 6), np.int8, 0.1, -3, name="input")
    y = b.add_tensor((1, 4, 6), np.int8, 1.0 / 256, -128, name=r"$\frac{a}{$x^")
    b.add_op("LOGISTIC", [x], [y])
    (tmp_path / "m.tflite").write_bytes(b.build([x], [y]))
    np.save(tmp_path / "x.npy", np.random.default_rng(0).integers(-128, 128, (8, 4, 6), dtype=np.int8))
    done = npusim(["validate", "m.tflite", "--input", "x.npy", "--report", "r"], tmp_path)
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert written == ["error_0.png", "index.html", "sqnr.png", "worst.png"]


KILLED_AT_FSYNC = """
import os, signal, sys
import numpy as np

def killed(fd):  # SIGKILL as the data is synced: the whole temporary file stays behind
    os.kill(os.getpid(), signal.SIGKILL)

os.fsync = killed
if sys.argv[1] == "output":  # what `npusim run --output` writes through
    from npusim.app import atomic
    with atomic.replacing(sys.argv[2]) as f:
        np.save(f, np.zeros((64, 10), np.int8))
else:  # zo's metrics.csv
    from zo.metrics import MetricsLog
    log = MetricsLog(sys.argv[2])
    log.open()
    log.write({"step": 1, "train_loss": 0.5})
    log.flush()
"""


@pytest.mark.parametrize("what", ["output", "metrics"])
def test_a_writer_killed_at_the_fsync_leaves_a_temporary_file_the_next_write_removes(tmp_path, what):
    """The issue's leftovers, made by a real SIGKILL: `.y.npy.*.tmp` of `run --output` and
    `.metrics.csv.*.tmp` of zo, each removed by the next write of that path."""
    path = tmp_path / ("y.npy" if what == "output" else "metrics.csv")
    done = subprocess.run([sys.executable, "-c", KILLED_AT_FSYNC, what, str(path)], capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    left = leftovers(tmp_path)
    assert len(left) == 1 and left[0].startswith(f".{path.name}."), left
    if what == "output":
        atomic.write_bytes(path, b"new")
    else:
        from zo.metrics import MetricsLog

        log = MetricsLog(path)
        log.open()
        log.flush()
    assert leftovers(tmp_path) == [] and path.exists()
