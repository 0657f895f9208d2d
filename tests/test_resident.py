"""The resident server (npusim/app/resident.py, NPUSIM_RESIDENT=1): a call through it writes the same
bytes, prints the same lines and exits with the same status as the command in its own process; it
reads and writes the caller's own files, working directory and streams; Ctrl-C interrupts the
command and the server serves on; calls run side by side, each in a process of its own; one server
serves many calls, and another environment gets another server; it is the default on Linux. Each
test has its own runtime folder and stops its servers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from npusim.app import resident
from npusim.testing import oracle as O

pytestmark = pytest.mark.skipif(not hasattr(socket, "send_fds"), reason="no AF_UNIX descriptor passing here")
ENTRY = [sys.executable, "-m", "npusim.app.resident"]
STARTED = []  # blocked_call's clients, ended by the env fixture


def conv_model() -> bytes:
    b = O.ModelBuilder()
    x = b.add_tensor((1, 6, 6, 3), np.int8, 0.05, -3, name="input")
    w = b.add_const(
        np.arange(-27, 27, dtype=np.int8).reshape(2, 3, 3, 3), scale=0.02, zero_point=0, name="weights"
    )
    bias = b.add_const(np.array([100, -50], np.int32), scale=0.001, zero_point=0, name="bias")
    y = b.add_tensor((1, 6, 6, 2), np.int8, 0.1, 5, name="output")
    opt = O.schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = O.schema.Padding.SAME, 1, 1
    b.add_op("CONV_2D", [x, w, bias], [y], opt)
    return b.build([x], [y])


@pytest.fixture
def env():
    # A short folder of its own (a socket path must stay under 100 bytes; pytest's can be longer).
    runtime = tempfile.mkdtemp(prefix="npr", dir="/tmp")
    e = dict(os.environ, XDG_RUNTIME_DIR=runtime, NPUSIM_RESIDENT="1", NPUSIM_RESIDENT_IDLE_S="120")
    yield e
    while STARTED:  # the clients a test left waiting (one that failed before it ended them)
        STARTED.pop().kill()
    resident.stop_all(e)  # every server of the test's runtime folder, whatever its key
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "conv.tflite").write_bytes(conv_model())
    x = np.random.default_rng(1).integers(-128, 128, (4, 6, 6, 3)).astype(np.int8)
    np.save(tmp_path / "x.npy", x)
    return tmp_path


def npusim(args, env, cwd, **kw):
    return subprocess.run(
        ENTRY + [str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True, **kw
    )


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie that a container's init never reaps has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def server_pid(env) -> int:
    with open(resident.server_paths(env)["pid"]) as f:
        return int(f.read())


def test_a_call_writes_prints_and_exits_as_the_command_in_its_own_process(env, files):
    in_process = dict(env, NPUSIM_RESIDENT="0")
    for args in (
        ["run", "conv.tflite", "--input", "x.npy", "--output", "y.npy"],  # relative: the caller's folder
        ["inspect", "conv.tflite"],
        ["run", "missing.tflite", "--input", "x.npy", "--output", "y.npy"],
        ["run", "conv.tflite", "--input", "x.npy", "--output", "y.txt"],
        ["run", "conv.tflite", "--input", "x.npy"],  # click's usage error
        ["--version"],
    ):
        (files / "y.npy").unlink(missing_ok=True)
        alone = npusim(args, in_process, files)
        y_alone = (files / "y.npy").read_bytes() if (files / "y.npy").exists() else None
        (files / "y.npy").unlink(missing_ok=True)
        served = npusim(args, env, files)
        y_served = (files / "y.npy").read_bytes() if (files / "y.npy").exists() else None
        assert (served.returncode, served.stdout, served.stderr) == (
            alone.returncode,
            alone.stdout,
            alone.stderr,
        ), args
        assert y_served == y_alone, args
    assert server_pid(env) > 0


def test_one_server_serves_many_calls_and_another_environment_gets_its_own(env, files):
    args = ["run", "conv.tflite", "--input", "x.npy", "--output", "y.npy"]
    assert npusim(args, dict(env, NPUSIM_RESIDENT="0"), files).returncode == 0
    alone = (files / "y.npy").read_bytes()
    first = None
    for _ in range(3):  # the later calls run on the kernels the server loaded after the first
        (files / "y.npy").unlink()
        assert npusim(args, env, files).returncode == 0
        assert (files / "y.npy").read_bytes() == alone
        first = first or server_pid(env)
        assert server_pid(env) == first
    other = dict(env, NPUSIM_AVX2="0")  # a numeric switch: another key, another server
    assert resident.server_key(other) != resident.server_key(env)
    assert npusim(args, other, files).returncode == 0
    assert server_pid(other) != first
    assert resident.server_key(env) == resident.server_key(dict(env, UNRELATED="1"))


def test_the_caller_stdin_is_the_command_stdin(env, files):
    # The descriptor passed is the caller's own: /dev/stdin in the server is the caller's file.
    with open(files / "x.npy", "rb") as x:
        done = subprocess.run(
            ENTRY + ["run", "conv.tflite", "--input", "/dev/stdin", "--output", "y.npy"],
            env=env,
            cwd=files,
            stdin=x,
            capture_output=True,
        )
    assert done.returncode == 0, done.stderr
    alone = npusim(
        ["run", "conv.tflite", "--input", "x.npy", "--output", "y2.npy"],
        dict(env, NPUSIM_RESIDENT="0"),
        files,
    )
    assert alone.returncode == 0
    assert (files / "y.npy").read_bytes() == (files / "y2.npy").read_bytes()


def blocked_call(env, files, **kw):
    """A call whose command waits until its input fifo gets a writer (deterministically)."""
    fifo = files / "never-written.npy"
    if not fifo.exists():
        os.mkfifo(fifo)
    STARTED.append(
        subprocess.Popen(
            ENTRY + ["run", "conv.tflite", "--input", str(fifo), "--output", "y.npy"],
            env=env,
            cwd=files,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kw,
        )
    )
    return STARTED[-1]


def call_processes(server: int) -> list:
    """The processes the server has forked for calls still running (not those ended, unreaped yet),
    from whichever of its threads forked them (/proc lists a child under the forking thread)."""
    children = []
    for task in os.listdir(f"/proc/{server}/task"):
        try:
            with open(f"/proc/{server}/task/{task}/children") as f:
                children += [int(p) for p in f.read().split()]
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return [p for p in children if alive(p)]


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def wait_until_blocked(server: int) -> int:
    """The process forked for the one call running, once its command has had time to start and block
    (a Ctrl-C while click still parses the arguments is click's "Aborted!", in any process)."""
    wait_for(lambda: len(call_processes(server)) == 1)
    time.sleep(1.0)
    (forked,) = call_processes(server)
    return forked


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_an_interrupted_call_stops_its_command_and_the_server_serves_on(env, files, how):
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0  # the server is up
    pid = server_pid(env)
    waiting = blocked_call(env, files)
    forked = wait_until_blocked(pid)
    assert waiting.poll() is None
    waiting.send_signal(signal.SIGINT if how == "ctrl-c" else signal.SIGKILL)
    out, err = waiting.communicate(timeout=60)
    if how == "ctrl-c":
        assert (waiting.returncode, err.strip().splitlines()[-1:]) == (130, ["error: interrupted"]), err
    else:  # its client gone, the call ends silently: nothing reaches the caller's stderr
        assert err == "", err
    wait_for(lambda: not alive(forked))  # the call's own process ended with it
    # What the interrupted command did to its process ended with that process: the same server
    # serves the next call.
    done = npusim(["run", "conv.tflite", "--input", "x.npy", "--output", "y.npy"], env, files, timeout=60)
    assert done.returncode == 0, done.stderr
    assert server_pid(env) == pid and alive(pid)
    assert not (files / "never-written.npy.tmp").exists()


def test_calls_run_side_by_side(env, files):
    # A call that waits does not hold the others: they are served while it blocks.
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    waiting = blocked_call(env, files)
    wait_until_blocked(server_pid(env))
    for k in range(3):
        done = npusim(["run", "conv.tflite", "--input", "x.npy", "--output", f"y{k}.npy"], env, files)
        assert done.returncode == 0 and done.stderr == "", done.stderr  # served, not in its own process
    assert waiting.poll() is None
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(timeout=60) == 130


def test_a_call_whose_process_dies_is_one_error_line_and_the_server_serves_on(env, files):
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    pid = server_pid(env)
    waiting = blocked_call(env, files)
    os.kill(wait_until_blocked(pid), signal.SIGKILL)  # as a crash in a kernel would end it
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 1
    assert err.strip().splitlines() == [err.strip()] and "ended without a status" in err
    assert "serves on" in err and "server stopped" not in err
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    assert server_pid(env) == pid
    log = Path(resident.server_paths(env)["log"]).read_text()
    assert "was ended by SIGKILL" in log, log  # what the client's line refers to


def test_a_call_whose_process_dies_after_its_server_is_never_blamed_on_the_server(env, files):
    """The call's own process sends its status: a server that stops (here killed) during the command
    neither loses it nor is the cause when that process is killed too."""
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    pid = server_pid(env)
    waiting = blocked_call(env, files)
    forked = wait_until_blocked(pid)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid))
    assert waiting.poll() is None  # the command goes on without its server
    os.kill(forked, signal.SIGKILL)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 1 and "ended without a status" in err, err
    assert "no longer running" in err and "stopped during the command" not in err, err


def test_a_server_whose_socket_is_removed_exits_and_one_server_runs(env, files):
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    old = server_pid(env)
    os.unlink(resident.server_paths(env)["sock"])
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0  # a new server
    assert server_pid(env) != old
    wait_for(lambda: not alive(old), timeout=30)  # the old one noticed (SOCKET_CHECK_S), not IDLE_S
    assert [s["pid"] for s in resident.servers(env)] == [server_pid(env)]


def test_the_server_is_the_default_on_linux_and_0_turns_it_off(env, files):
    default = {k: v for k, v in env.items() if k != "NPUSIM_RESIDENT"}
    paths = resident.server_paths(default)
    off = npusim(["inspect", "conv.tflite"], dict(default, NPUSIM_RESIDENT="0"), files)
    assert off.returncode == 0 and not os.path.exists(paths["pid"])
    on = npusim(["inspect", "conv.tflite"], default, files)
    assert (on.returncode, on.stdout, on.stderr) == (off.returncode, off.stdout, off.stderr)
    assert os.path.exists(paths["pid"]) == resident.DEFAULT_ON


def test_a_call_creates_files_under_the_callers_file_mode_mask(env, files):
    args = ["run", "conv.tflite", "--input", "x.npy", "--output", "y.npy"]
    for mask in (0o077, 0o022):
        (files / "y.npy").unlink(missing_ok=True)
        done = npusim(args, env, files, preexec_fn=lambda mask=mask: os.umask(mask))
        assert done.returncode == 0, done.stderr
        assert (files / "y.npy").stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_bad_switch_or_idle_time_is_one_error_line(env, files):
    for var, value in (
        ("NPUSIM_RESIDENT", "yes"),
        ("NPUSIM_RESIDENT_IDLE_S", "soon"),
        ("NPUSIM_RESIDENT_IDLE_S", "0"),
    ):
        done = npusim(["inspect", "conv.tflite"], dict(env, **{var: value}), files)
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [done.stderr.strip()] and var in done.stderr
        assert done.stdout == ""


def test_a_runtime_folder_others_can_enter_runs_the_command_in_its_own_process(env, files):
    folder = os.path.join(env["XDG_RUNTIME_DIR"], f"npusim-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    os.chmod(folder, 0o777)
    done = npusim(["inspect", "conv.tflite"], env, files)
    assert done.returncode == 0 and "inputs:" in done.stdout
    assert done.stderr.startswith("npusim: no resident server (") and "its mode is 777" in done.stderr
    assert not os.path.exists(os.path.join(folder, resident.server_key(env) + ".sock"))


@pytest.mark.parametrize("cause", ["owner", "symlink", "dangling symlink", "file"])
def test_a_runtime_folder_refusal_names_its_cause(env, files, cause):
    folder = os.path.join(env["XDG_RUNTIME_DIR"], f"npusim-{os.getuid()}")
    if cause == "owner":
        if os.geteuid() != 0:
            pytest.skip("a folder of another user's needs root to make: not tested here")
        os.mkdir(folder, 0o700)
        os.chown(folder, 12345, 12345)
        expected = "it is owned by uid 12345"
    elif cause == "symlink":
        os.mkdir(folder + "-elsewhere", 0o777)
        os.symlink(folder + "-elsewhere", folder)
        expected = "it is a symbolic link"
    elif cause == "dangling symlink":  # was "File exists"
        os.symlink(folder + "-not-yet", folder)
        expected = "it is a symbolic link"
    else:
        Path(folder).write_text("")
        expected = "it is not a directory"
    done = npusim(["inspect", "conv.tflite"], env, files)
    assert done.returncode == 0 and expected in done.stderr and "got mode" not in done.stderr, done.stderr


def test_a_server_that_died_is_replaced(env, files):
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    pid = server_pid(env)
    os.kill(pid, signal.SIGKILL)  # its socket file stays behind
    for _ in range(200):
        if not alive(pid):
            break
        time.sleep(0.01)
    done = npusim(["inspect", "conv.tflite"], env, files)
    assert done.returncode == 0, done.stderr
    assert server_pid(env) != pid


def test_an_idle_server_exits_and_removes_its_socket(env, files):
    short = dict(env, NPUSIM_RESIDENT_IDLE_S="0.5")
    assert npusim(["inspect", "conv.tflite"], short, files).returncode == 0
    paths = resident.server_paths(short)
    pid = server_pid(short)
    deadline = time.monotonic() + 60
    while os.path.exists(paths["sock"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(paths["sock"]) and not os.path.exists(paths["pid"])
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.05)
    raise AssertionError("the idle server did not exit")


def test_the_client_imports_no_numerics(env, files):
    # What a call through the server costs in its own process: Python and the standard library.
    code = (
        "import sys; from npusim.app import resident; s = resident.call(['inspect', 'conv.tflite']); "
        "print(s, *(m in sys.modules for m in ('numpy', 'numba', 'click', 'npusim.app.cli')))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=files, capture_output=True, text=True)
    assert done.stdout.splitlines()[-1] == "0 False False False False", done.stdout + done.stderr


def test_a_call_from_a_removed_working_directory_runs_in_its_own_process(env, files):
    gone = files / "gone"
    gone.mkdir()
    code = (
        "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
        "from npusim.app.resident import main; sys.argv = ['npusim', 'inspect', sys.argv[2]]; "
        "sys.exit(main())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(gone), str(files / "conv.tflite")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "inputs:" in done.stdout
    why = "the working directory: No such file or directory"
    assert done.stderr.strip() == f"npusim: no resident server ({why}); running in this process"


def test_calls_that_come_together_start_one_server_and_all_run_on_it(env, files):
    calls = [
        subprocess.Popen(
            ENTRY + ["run", "conv.tflite", "--input", "x.npy", "--output", f"y{k}.npy"],
            env=env,
            cwd=files,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(4)
    ]
    for c in calls:
        out, err = c.communicate(timeout=300)
        assert c.returncode == 0 and err == "", err  # none fell back to its own process
    pid = server_pid(env)
    assert alive(pid)
    assert len({(files / f"y{k}.npy").read_bytes() for k in range(4)}) == 1
    paths = resident.server_paths(env)
    pids = [f for f in os.listdir(os.path.dirname(paths["pid"])) if f.endswith(".pid")]
    assert pids == [os.path.basename(paths["pid"])]  # one server


def test_server_status_and_stop_tell_and_end_the_server_and_never_start_one(env, files):
    default = {k: v for k, v in env.items() if k != "NPUSIM_RESIDENT"}
    status = npusim(["server", "status"], default, files)
    assert (status.returncode, status.stdout.strip()) == (1, "npusim server: not running")
    assert resident.running(default) is None  # asking did not start one
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    pid = server_pid(env)
    status = npusim(["server", "status"], default, files)
    assert status.returncode == 0 and f"running, pid {pid}," in status.stdout
    stopped = npusim(["server", "stop"], default, files)
    assert (stopped.returncode, stopped.stdout.strip()) == (0, f"npusim server: stopped pid {pid}")
    wait_for(lambda: not alive(pid))
    assert npusim(["server", "stop"], default, files).returncode == 1


def test_a_closed_stream_is_what_it_is_in_the_commands_own_process(env, files):
    # `npusim ... >&-`: the client's connection must not take the number of the closed stdout.
    code = "import os, sys; os.close(1); from npusim.app.resident import main; sys.exit(main())"
    runs = [
        subprocess.run(
            [sys.executable, "-c", code, "run", "conv.tflite", "--input", "x.npy", "--output", f"y{k}.npy"],
            env=e,
            cwd=files,
            capture_output=True,
            text=True,
        )
        for k, e in enumerate((dict(env, NPUSIM_RESIDENT="0"), env))
    ]
    assert (runs[1].returncode, runs[1].stderr) == (runs[0].returncode, runs[0].stderr)
    assert (files / "y1.npy").read_bytes() == (files / "y0.npy").read_bytes()
    assert server_pid(env) > 0  # it went through the server


def test_a_signal_the_caller_ignores_does_not_interrupt_the_call(env, files):
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    pid = server_pid(env)
    ignore_hup = lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)  # noqa: E731 - as under nohup
    waiting = blocked_call(env, files, preexec_fn=ignore_hup)
    wait_until_blocked(pid)
    waiting.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert waiting.poll() is None
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(timeout=60) == 130


# -- whose context a server serves ----------------------------------------------------------------
# A call is served only where the calling process's context is the server's (npusim/app/resident.py):
# else it runs in its own process, silently, and gives the caller's own result. Whether a call was
# served is seen from outside: the command waits on a fifo for its input; once a process has the fifo
# open for reading, the server has a process for the call (served) or not (its own process).


def call_on_fifo(env, files, command=(), preexec_fn=None, output="y.npy"):
    """Run `npusim run` (after `command`, e.g. unshare) under env and preexec_fn: (whether it was
    served, its exit status, stderr, output bytes). Once its command waits on a fifo (the input of a
    first call, interrupted then), the server has a process for it or not; a second call of the same
    context gives the result."""
    fifo = files / "in.npy"
    if not fifo.exists():
        os.mkfifo(fifo)
    waiting = subprocess.Popen(
        [*command, *ENTRY, "run", "conv.tflite", "--input", str(fifo), "--output", output],
        env=env,
        cwd=files,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=preexec_fn,
    )
    STARTED.append(waiting)
    deadline = time.monotonic() + 120
    while True:
        try:
            # ENXIO until a reader has it open. Held open until the check: a writer closed at once
            # would give the reader its end of file, and the call could end before it is seen.
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert waiting.poll() is None and time.monotonic() < deadline, waiting.communicate()
            time.sleep(0.02)
    served = bool(call_processes(server_pid(env)))
    os.close(writer)
    waiting.kill()
    waiting.wait()
    STARTED.remove(waiting)
    (files / output).unlink(missing_ok=True)
    done = subprocess.run(
        [*command, *ENTRY, "run", "conv.tflite", "--input", "x.npy", "--output", output],
        env=env,
        cwd=files,
        capture_output=True,
        text=True,
        preexec_fn=preexec_fn,
    )
    y = (files / output).read_bytes() if (files / output).exists() else None
    return served, done.returncode, done.stderr, y


@pytest.fixture
def running(env, files):
    """A server started by a call of env's own context; the expected output, from its own process."""
    done = npusim(["run", "conv.tflite", "--input", "x.npy", "--output", "ref.npy"], env, files)
    assert done.returncode == 0
    return (files / "ref.npy").read_bytes()


def test_a_call_of_the_servers_own_context_is_served(env, files, running):
    served, code, err, y = call_on_fifo(env, files)
    assert served and code == 0 and y == running, err


def test_a_call_under_another_ulimit_runs_in_its_own_process_under_it(env, files, running):
    import resource

    def limit(n):
        def apply():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))

        return apply

    served, code, err, y = call_on_fifo(env, files, preexec_fn=limit(100))  # the output is larger
    assert not served and code == 2 and "File too large" in err and y is None
    served, code, err, y = call_on_fifo(env, files, preexec_fn=limit(1 << 20))  # another, room enough
    assert not served and code == 0 and y == running and err == ""


def test_a_call_under_another_umask_or_groups_runs_in_its_own_process(env, files, running):
    served, code, err, y = call_on_fifo(env, files, preexec_fn=lambda: os.umask(0o077))
    assert not served and code == 0 and y == running and err == ""
    assert (files / "y.npy").stat().st_mode & 0o777 == 0o600
    if os.geteuid() == 0:
        served, code, err, y = call_on_fifo(env, files, preexec_fn=lambda: os.setgroups([12345]))
        assert not served and code == 0 and y == running, err


def test_a_call_with_another_environment_runs_in_its_own_process(env, files, running):
    served, code, err, y = call_on_fifo(dict(env, CI_JOB_TOKEN="secret-of-another-job"), files)
    assert not served and code == 0 and y == running and err == ""
    served, *_ = call_on_fifo(dict(env, NPUSIM_RESIDENT_IDLE_S="119"), files)  # the server's own
    assert served  # switches are not the environment's hash


def test_the_server_keeps_no_variable_of_its_starters_environment_but_the_keyed(env, files):
    secret = dict(env, CI_JOB_TOKEN="secret-of-the-starting-job")
    assert npusim(["inspect", "conv.tflite"], secret, files).returncode == 0
    with open(f"/proc/{server_pid(secret)}/environ", "rb") as f:
        assert b"secret-of-the-starting-job" not in f.read()


def can_unshare(flag: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", flag, "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize(
    "flag", ["-m", "-n", "-pf"], ids=["mount namespace", "network namespace", "pid namespace"]
)
def test_a_call_in_another_namespace_runs_in_its_own_process(env, files, running, flag):
    if not can_unshare(flag):
        pytest.skip(f"`unshare {flag}` does not work here (needs root or user namespaces)")
    served, code, err, y = call_on_fifo(env, files, command=["unshare", flag])
    assert not served and code == 0 and y == running, err


@pytest.fixture
def other_cgroup():
    """A fresh cgroup this process may move a child into (cgroup v2's tree, or v1's pids hierarchy),
    removed afterwards; a skip where none can be made (not root, no cgroup file system)."""
    base = Path("/sys/fs/cgroup")
    roots = [base] if (base / "cgroup.controllers").exists() else [base / "pids", base / "cpu"]
    for root in roots:
        group = root / f"npusim-test-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        if (group / "cgroup.procs").exists():
            yield group
            for _ in range(100):  # the moved processes have ended; the kernel lets go of them soon
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
            return
        group.rmdir()
    pytest.skip("no cgroup can be created here (needs root and a cgroup file system)")


def test_a_call_in_another_cgroup_runs_in_its_own_process(env, files, running, other_cgroup):
    """A CI system's cleanup of one job's cgroup must not reach another job's call: a caller in
    another cgroup than the server's is not served."""

    def move():
        (other_cgroup / "cgroup.procs").write_text(str(os.getpid()))

    served, code, err, y = call_on_fifo(env, files, preexec_fn=move)
    assert not served and code == 0 and y == running, err


def test_a_call_in_another_mount_namespace_reads_its_own_files(env, files, running):
    """The file a caller sees is the one it gets: a model mounted in its namespace only."""
    if not can_unshare("-m") or os.geteuid() != 0:
        pytest.skip("no `unshare -m` with mounts here")
    private = files / "private"
    private.mkdir()
    script = (
        f"mount -t tmpfs tmpfs {private} && cp {files}/conv.tflite {private}/m.tflite && "
        f"exec {' '.join(ENTRY)} inspect {private}/m.tflite"
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], env=env, cwd=files, capture_output=True, text=True
    )
    assert done.returncode == 0 and "inputs:" in done.stdout, done.stderr
    assert not (private / "m.tflite").exists()  # not there outside the caller's namespace


def test_help_version_and_server_commands_start_no_server(env, files):
    for args in (["--help"], ["run", "--help"], ["--version"], [], ["server", "status"]):
        npusim(args, env, files)
        assert resident.running(env) is None, args
        assert resident.servers(env) == [], args


def test_server_stop_stops_every_server_of_the_user_and_removes_their_files(env, files):
    other = dict(env, NPUSIM_AVX2="0")  # another key: a second server
    for e in (env, other):
        assert npusim(["inspect", "conv.tflite"], e, files).returncode == 0
    pids = {server_pid(env), server_pid(other)}
    stopped = npusim(["server", "stop"], env, files)
    assert stopped.returncode == 0
    assert {int(line.rsplit(" ", 1)[1]) for line in stopped.stdout.splitlines()} == pids
    wait_for(lambda: not any(alive(p) for p in pids))
    assert os.listdir(os.path.dirname(resident.server_paths(env)["sock"])) == []  # no stale file


def test_a_silent_connection_is_let_go(env, files):
    assert npusim(["inspect", "conv.tflite"], env, files).returncode == 0
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(resident.server_paths(env)["sock"])
    wait_for(lambda: len(call_processes(server_pid(env))) == 1)
    s.settimeout(60)
    assert s.recv(1) == b""  # closed by the server's process for it, after REQUEST_TIMEOUT_S (10 s)
    s.close()
    wait_for(lambda: call_processes(server_pid(env)) == [])


# -- privileges: a caller with fewer is never served by a server that holds more ---------------------
# Each case differs from the test's own process (the server's starter) in one thing the kernel
# decides what a process may do by (npusim/app/resident_files.PRIVILEGE_FIELDS, the LSM label, the nice
# value, the securebits): the first server never serves it; the call gets a server of its own,
# started under its privileges, and its own result.


def setpriv(*args):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: this privilege case is not tested here")
    probe = subprocess.run(["setpriv", *args, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"setpriv {' '.join(args)} does not work here: {probe.stderr.strip()}")
    return ("setpriv", *args)


def allow_all_seccomp_filter():
    """Install a seccomp filter that allows every call (a filter count the server's starter lacks)."""
    import ctypes

    class SockFilter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint),
        ]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    allow = (SockFilter * 1)(SockFilter(0x06, 0, 0, 0x7FFF0000))  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
    prog = SockFprog(1, allow)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: needed without CAP_SYS_ADMIN
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")


def privilege_case(case: str):
    """(command prefix, preexec_fn) of a caller that differs from this process in `case` only."""
    if case == "bounding set (and so CapPrm, CapEff)":
        if os.geteuid() != 0:
            pytest.skip("dropping a capability of a root caller's needs root: not root here")
        return setpriv("--bounding-set", "-dac_override,-dac_read_search"), None
    if case == "inheritable set":
        return setpriv("--inh-caps", "+net_raw"), None
    if case == "ambient set":
        return setpriv("--inh-caps", "+net_raw", "--ambient-caps", "+net_raw"), None
    if case == "NoNewPrivs":
        return setpriv("--no-new-privs"), None
    if case == "securebits":
        if os.geteuid() != 0:
            pytest.skip("setting securebits needs CAP_SETPCAP: not root here")
        return setpriv("--securebits", "+no_setuid_fixup"), None
    if case == "seccomp filter":
        return (), allow_all_seccomp_filter
    if case == "nice":
        if os.getpriority(os.PRIO_PROCESS, 0) >= 19:
            pytest.skip("this process already runs at nice 19: no lower priority to call with")
        return (), lambda: os.nice(1)
    if case == "scheduling policy":  # chrt --idle 0
        return (), lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    if case == "I/O priority":
        if shutil.which("ionice") is None:
            pytest.skip("ionice (util-linux) is not installed: this priority case is not tested here")
        return ("ionice", "-c", "3"), None
    if case == "OOM score adjustment":  # raising it needs no privilege

        def raise_oom_score():
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(min(1000, resident.process_context()["oom_score_adj"] + 100)))

        if resident.process_context()["oom_score_adj"] >= 1000:
            pytest.skip("this process's OOM score adjustment is already 1000: none higher to call with")
        return (), raise_oom_score
    if case == "LSM label":
        label = resident.process_context()["lsm"]
        if not label or shutil.which("runcon") is None and shutil.which("aa-exec") is None:
            pytest.skip("no LSM gives processes a label here (/proc/self/attr/current): not tested")
        pytest.skip(f"changing the LSM label {label!r} needs a policy of this machine's: not tested")
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "bounding set (and so CapPrm, CapEff)",
        "inheritable set",
        "ambient set",
        "NoNewPrivs",
        "securebits",
        "seccomp filter",
        "nice",
        "scheduling policy",
        "I/O priority",
        "OOM score adjustment",
        "LSM label",
    ],
)
def test_a_caller_with_other_privileges_is_not_served_by_the_first_server(env, files, running, case):
    command, preexec_fn = privilege_case(case)
    served, code, err, y = call_on_fifo(env, files, command, preexec_fn)
    assert not served and code == 0 and y == running and err == ""
    assert len(resident.servers(env)) == 2  # its own server, and one only (the second call reused it)


def test_a_caller_without_dac_override_cannot_read_through_the_server_what_it_cannot_read(env, files):
    """The issue's probe: root without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH may not read another
    user's mode-600 input, served or not."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a file of another user's, and capabilities to drop)")
    command = setpriv("--bounding-set", "-dac_override,-dac_read_search")
    secret = files / "secret"
    secret.mkdir()
    shutil.copy(files / "x.npy", secret / "in.npy")
    os.chown(secret / "in.npy", 12345, 12345)
    os.chmod(secret / "in.npy", 0o600)
    args = ["run", "conv.tflite", "--input", "secret/in.npy", "--output", "y.npy"]
    assert npusim(args, env, files).returncode == 0  # a server of the full set is running
    for _ in range(2):  # the first call starts its own server, the second is served by it
        done = subprocess.run([*command, *ENTRY, *args], env=env, cwd=files, capture_output=True, text=True)
        assert done.returncode == 2 and "secret/in.npy" in done.stderr, done.stderr
        assert "Permission denied" in done.stderr or "not readable" in done.stderr, done.stderr


def test_a_caller_of_another_lsm_label_is_neither_served_nor_keyed_with_the_server(env, files, monkeypatch):
    """Where no LSM labels processes (the end-to-end case above skips), the comparison itself: a
    caller whose /proc/PID/attr/current differs from the server's is refused by _own_context and
    has another server key."""
    mine = resident.process_context()
    try:  # the label is read as the kernel gives it ("" where no LSM labels processes: EINVAL)
        with open("/proc/self/attr/current", "rb") as f:
            assert mine["lsm"] == f.read().rstrip(b"\0\n").decode()
    except OSError:
        assert mine["lsm"] == ""
    key = resident.server_key(env)
    labelled = dict(mine, lsm="system_u:system_r:confined_t:s0")
    monkeypatch.setattr(resident._Server, "context", labelled)
    monkeypatch.setattr(resident._Server, "securebits", resident.securebits())
    monkeypatch.setattr(resident._Server, "environment", resident.environment_hash(env))
    a, b = socket.socketpair()
    with a, b:  # SO_PEERCRED of a socketpair is this process: its /proc is read as a caller's
        request = {"env": env, "securebits": resident.securebits()}
        assert not resident._own_context(a, request)
        monkeypatch.setattr(resident._Server, "context", mine)
        assert resident._own_context(a, request)  # the same context is served: only the label differed
    import npusim.app.resident_files as rf

    monkeypatch.setattr(rf, "process_context", lambda pid="self": labelled)
    assert rf.server_key(env) != key


CHROOTED_CALL = """
import os, sys
from npusim.app import resident
connect = resident.connect_or_start
def connect_then_chroot(paths, env=os.environ):
    conn = connect(paths, env)  # the socket is reached from the real root, then the root changes
    os.chroot(sys.argv[1])
    return conn
resident.connect_or_start = connect_then_chroot
try:
    print("status", resident.call(["inspect", sys.argv[2]]))
except resident.OtherContext:
    print("not served")
"""


def test_a_caller_in_another_root_directory_is_not_served(env, files, running):
    """A chroot'ed caller that can reach the server's socket (a bind mount of its folder would do)
    must not have its paths resolved from the server's root: it runs in its own process."""
    if os.geteuid() != 0:
        pytest.skip("chroot needs root (CAP_SYS_CHROOT): not tested here")
    jail = files / "jail"
    jail.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", CHROOTED_CALL, str(jail), str(files / "conv.tflite")],
        env=env,
        cwd=files,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split("\n")[-2:] == ["not served", ""], done.stdout + done.stderr


LEARN_ARRAYMATH = """
import os, pickle
from npusim.app import resident
resident._preload()
threads = resident._settle()
read, write = os.pipe()
os.write(write, pickle.dumps((["numba.np.arraymath"], [])))
os.close(write)
resident._learn(read)  # what a call that compiled a kernel reports (a cold kernel cache)
print("fit", resident._fit_to_fork(threads), resident._threads() >= threads)
"""


def test_a_learned_import_that_starts_blas_threads_leaves_the_server_fit_to_fork(env):
    """numba.np.arraymath imports SciPy's BLAS, whose OpenBLAS starts threads; they stop around a
    fork, so the server may fork on (it stopped itself: 'a thread was started in the server')."""
    done = subprocess.run([sys.executable, "-c", LEARN_ARRAYMATH], env=env, capture_output=True, text=True)
    assert done.stdout.strip().splitlines()[-1:] == ["fit True True"], done.stdout + done.stderr


def test_with_a_cold_kernel_cache_one_server_serves_every_call(env, files, tmp_path):
    """The issue's probe: an empty NUMBA_CACHE_DIR and three calls (the first compiles, and the
    server learns the compiler's imports from it): one server serves all three."""
    cold = dict(env, NUMBA_CACHE_DIR=str(tmp_path / "cold-cache"))
    args = ["run", "conv.tflite", "--input", "x.npy", "--output", "y.npy"]
    pids = []
    for _ in range(3):
        done = npusim(args, cold, files, timeout=600)
        assert done.returncode == 0 and done.stderr == "", done.stderr  # served each time
        pids.append(server_pid(cold))
        time.sleep(2 * resident.REAP_EVERY_S)  # the server has reaped the call and learned from it
    assert len(set(pids)) == 1 and alive(pids[0]), pids
    log = Path(resident.server_paths(cold)["log"]).read_text()
    assert "a thread was started" not in log, log
