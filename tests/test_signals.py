"""SIGINT, SIGTERM and SIGHUP sent to real `npusim` processes at random moments of real commands (run,
inspect, validate, golden record, compare), in their own process and through the resident server:
every one ends with exit 130 and the one line `error: interrupted` on stderr, never a traceback, and
leaves no half-written output (npusim/app/interrupt.py, docs/robustness.md).

The moment: the process under test is the real command line with one addition, a few lines that
append a byte to a marker file (named by SIGNAL_TEST_MARK) when main() begins ("S"), when the
interpreter is made ("I") and when its kernels (or validate's float reference) start and end ("K",
"E"), with the time. The test waits for "S" or for the first "K", then sends the signal after a
random delay within the time the command takes from "S" to its end, or its first kernels from "K"
to "E", when nobody stops it (measured per command and mode, then narrowed whenever a signal comes
after the end). What the marker file holds when the signal is sent
says where it landed: inside the kernels (more "K" than "E"), or elsewhere (planning, writing,
exiting). A case whose process had ended before the signal (exit 0, the whole output) is not
counted; each command gets SIGNAL_TIMES counted cases, cycling through the three signals, split
between the two modes.

Served: the test starts the resident server itself, with the marker lines, at the path the clients
look for (a server of the clients' own key), and stops it afterwards; the signal goes to the client,
the `npusim` process the caller started.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from npusim.app import resident
from npusim.testing import oracle as O

from zo_fixtures import tiny_classifier

SIGNAL_TIMES = int(os.environ.get("NPUSIM_SIGNAL_TIMES", "50"))  # per command, both modes together
SERVED_SHARE = 0.8  # served calls are cheap (a fork): most of the cases
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
MARKS = """
import os
import time
import npusim.runtime.interpreter as _i
import npusim.runtime.reference as _f

def _mark(byte):
    path = os.environ.get("SIGNAL_TEST_MARK")
    if path:
        with open(path, "ab") as f:
            f.write(byte + b" %d %.6f\\n" % (os.getpid(), time.monotonic()))

_init = _i.Interpreter.__init__

def _marked_init(self, *args, **kwargs):
    _mark(b"I")
    return _init(self, *args, **kwargs)

def _marked_kernels(method):
    def marked(self, *args, **kwargs):
        _mark(b"K")
        try:
            return method(self, *args, **kwargs)
        finally:
            _mark(b"E")
    return marked

_i.Interpreter.__init__ = _marked_init
_i.Interpreter._walk = _marked_kernels(_i.Interpreter._walk)
_f.FloatInterpreter.run_all = _marked_kernels(_f.FloatInterpreter.run_all)  # validate's float side
"""
# The console script's own lines (`sys.exit(main())`), with a mark once main() has begun: before it,
# a signal meets Python's start-up (its default handlers), in any program.
COMMAND = MARKS + """
import sys
import npusim.app.resident as _r

_status = _r._command_status

def _marked_status():
    _mark(b"S")
    return _status()

_r._command_status = _marked_status
sys.argv = ["npusim", *sys.argv[1:]]
sys.exit(_r.main())
"""
SERVER = MARKS + "import sys\nfrom npusim.app.resident import serve\nserve(sys.argv[1])\n"
COMMANDS = {
    "run": ["run", "m.tflite", "--input", "x.npy", "--output", "y.npy"],
    "inspect": ["inspect", "deep.tflite", "--target", "stm32n6"],
    "validate": ["validate", "m.tflite", "--input", "x.npy"],
    "golden": ["golden", "record", "m.tflite", "--input", "x.npy", "-o", "g.npz"],
    "compare": ["compare", "m.tflite", "--input", "x.npy", "--a", "tflm", "--b", "single"],
}
OUTPUTS = {"run": "y.npy", "golden": "g.npz"}


def deep_model(depth: int = 400) -> bytes:
    """A chain of `depth` 1x1 convolutions: inspect's work (its planning, the STM32N6 view) grows
    with the ops, so that a signal has time to land inside it."""
    b = O.ModelBuilder()
    x = b.add_tensor((1, 8, 8, 4), np.int8, 0.05, 0, name="input")
    first = x
    for k in range(depth):
        w = b.add_const(np.eye(4, dtype=np.int8).reshape(4, 1, 1, 4), scale=0.02, zero_point=0)
        bias = b.add_const(np.zeros(4, np.int32), scale=0.001, zero_point=0)
        y = b.add_tensor((1, 8, 8, 4), np.int8, 0.05, 0, name=f"conv{k}")
        opt = O.schema.Conv2DOptionsT()
        opt.padding, opt.strideH, opt.strideW = O.schema.Padding.SAME, 1, 1
        b.add_op("CONV_2D", [x, w, bias], [y], opt)
        x = y
    return b.build([first], [x])


@pytest.fixture(scope="module")
def folder():
    """The model (threaded kernels at this size), its input, and a private runtime folder and home."""
    root = tempfile.mkdtemp(prefix="nps", dir="/tmp")  # short: a socket path stays under 100 bytes
    work = os.path.join(root, "w")
    os.makedirs(work)
    with open(os.path.join(work, "m.tflite"), "wb") as f:
        f.write(tiny_classifier(side=48, hidden=32))
    with open(os.path.join(work, "deep.tflite"), "wb") as f:
        f.write(deep_model())
    x = np.random.default_rng(0).integers(-128, 128, (48, 48, 48, 3), dtype=np.int8)
    np.save(os.path.join(work, "x.npy"), x)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def served_env(folder):
    """The clients' environment, with a marked server of their key started here and stopped after."""
    env = dict(os.environ, XDG_RUNTIME_DIR=os.path.join(folder, "run"), NPUSIM_RESIDENT="1")
    env["NPUSIM_RESIDENT_IDLE_S"] = "300"
    paths = resident.server_paths(env)
    # Started as a client starts it (the clients' environment, whose hash it keeps: each call adds
    # the marker's path, the same for every call).
    starter = resident.server_environment(dict(env, SIGNAL_TEST_MARK=os.path.join(folder, "mark")))
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, paths["sock"]],
        env=starter,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(paths["log"], "ab"),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _listening(paths["sock"]):
            assert server.poll() is None and time.monotonic() < deadline, open(paths["log"]).read()
            time.sleep(0.05)
        yield env
    finally:
        resident.stop_all(env)  # and any a client would have started
        if server.poll() is None:
            server.kill()
        server.wait()
        for kind in ("sock", "pid"):
            assert not os.path.exists(paths[kind]) or server.returncode != 0


def _listening(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def start(args, env, cwd, mark):
    return subprocess.Popen(
        [sys.executable, "-c", COMMAND, *args],
        env=dict(env, SIGNAL_TEST_MARK=mark),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def read(path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def case_marks(proc, mark) -> list:
    """This case's marks: from its process's "S" on, those of processes that made an interpreter
    after it ("I": the process itself, or the one the server forked for this call). A served process
    of an earlier case may still be winding down and write to the same file (the path is part of
    the server's key, so it is the same for every call): its marks must not start this case's clock,
    or a signal could reach the new process in Python's start-up, before its handlers exist."""
    lines = [line.split() for line in read(mark).splitlines()]
    starts = [k for k, (byte, pid, _) in enumerate(lines) if byte == b"S" and pid == b"%d" % proc.pid]
    if not starts:
        return []
    own = lines[starts[0] :]
    ours = {pid for byte, pid, _ in own if byte in (b"S", b"I")}
    return [byte for byte, pid, _ in own if pid in ours]


def wait_for_mark(proc, mark, byte=b"S", timeout=120.0) -> bool:
    deadline = time.monotonic() + timeout
    while byte not in case_marks(proc, mark):
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def one_case(args, env, cwd, mark, start_mark, delay, signum) -> tuple:
    """Start the command, send signum `delay` s after its start_mark: (exit status, stdout, stderr,
    where the signal landed)."""
    for name in (mark, *OUTPUTS.values()):
        if os.path.exists(os.path.join(cwd, name)):
            os.unlink(os.path.join(cwd, name))
    proc = start(args, env, cwd, mark)
    try:
        if not wait_for_mark(proc, mark, start_mark):
            out, err = proc.communicate(timeout=120)
            return proc.returncode, out, err.decode(errors="replace"), "ended"
        time.sleep(delay)
        marks = case_marks(proc, mark)
        where = "kernel" if marks.count(b"K") > marks.count(b"E") else "other"
        if proc.poll() is None:
            proc.send_signal(signum)
        else:
            where = "ended"
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err.decode(errors="replace"), where


def reference(command, env, cwd, mark):
    """The command run to its end (served or not, as asked): its status, stdout, outputs, and the
    windows of its marks ("S":
    from main()'s start to the end; "K": the first kernels, from their start to their end). The
    marks carry the time (CLOCK_MONOTONIC, one clock for every process)."""
    if os.path.exists(mark):
        os.unlink(mark)
    proc = start(COMMANDS[command], env, cwd, mark)
    out, err = proc.communicate(timeout=300)
    end = time.monotonic()
    assert proc.returncode == 0, err.decode()
    marks = [line.split() for line in read(mark).splitlines()]
    first, pids = {}, {}
    for byte, pid, t in marks:
        first.setdefault(byte, float(t))
        pids.setdefault(byte, pid)
    # Served: main() ran in the client, the command in the process the server forked for it.
    assert (pids[b"I"] != pids[b"S"]) == (env["NPUSIM_RESIDENT"] == "1"), (pids, env["NPUSIM_RESIDENT"])
    took = {b"S": end - first[b"S"]}
    if b"K" in first:
        took[b"K"] = first[b"E"] - first[b"K"]
    files = {name: read(os.path.join(cwd, name)) for name in OUTPUTS.values()}
    return out, files, took


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_signal_at_any_moment_is_one_line_and_exit_130(folder, served_env, command):
    unserved_env = dict(served_env, NPUSIM_RESIDENT="0")
    rng = random.Random(f"signals {command}")
    counts = {"kernel": 0, "other": 0, "ended": 0}
    wanted = {"served": round(SIGNAL_TIMES * SERVED_SHARE)}
    wanted["own process"] = SIGNAL_TIMES - wanted["served"]
    for mode, env in (("served", served_env), ("own process", unserved_env)):
        cwd = os.path.join(folder, "w")
        mark = os.path.join(folder, "mark")
        reference(command, env, cwd, mark)  # the first run of a mode may load more (kernels, files)
        out_ref, files_ref, took = reference(command, env, cwd, mark)
        took[b"S"] *= 0.7  # a signal late in the last 30% mostly misses
        interrupted = tries = 0
        while interrupted < wanted[mode]:
            tries += 1
            assert tries <= 4 * wanted[mode], f"{mode}: only {interrupted} of {tries} signals came in time"
            signum = SIGNALS[tries % len(SIGNALS)]
            start_mark = rng.choice(sorted(took))  # from main()'s start, or from the kernels'
            delay = rng.uniform(0.0, took[start_mark])
            args = COMMANDS[command]
            code, out, err, where = one_case(args, env, cwd, mark, start_mark, delay, signum)
            name = signal.Signals(signum).name
            case = f"{mode}, {name} {delay * 1000:.0f} ms after mark {start_mark} ({where})"
            if where == "ended" or code == 0:
                assert code == 0 and out == out_ref and err == "", case + ": " + err
                counts["ended"] += 1
                took[start_mark] *= 0.8  # the window follows how long the command takes now
            else:
                assert (code, err) == (130, "error: interrupted\n"), case + ": " + err
                interrupted += 1
                counts[where] += 1
                took[start_mark] *= 1.05
            for name, expected in files_ref.items():  # never half a file: the whole output or none
                written = read(os.path.join(cwd, name))
                assert written in (b"", expected), f"{case}: {name} half-written ({len(written)} bytes)"
    print(f"{command}: {counts}")  # with -s: where the signals landed
    # Where the signals landed: a share of them inside the kernels (inspect runs none).
    assert counts["kernel"] >= (0 if command == "inspect" else SIGNAL_TIMES // 5), counts
