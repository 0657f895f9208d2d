"""The `npusim` entry point, and its resident server (opt in: NPUSIM_RESIDENT=1).

Why a server. A one-shot `npusim run` spends most of its time before the model runs: Python's
start, numpy's and Numba's imports and the loads of the kernels take about 0.7 s of CPU, where a
LiteRT script takes 0.13 s for the whole call (docs/performance.md). A CI job that checks many
models one CLI call at a time pays that on every call. With NPUSIM_RESIDENT=1, `npusim` is a small
client that imports nothing but the standard library: it hands its call to a server process that
keeps the imports and the loaded kernels, and starts that server when there is none.

What a call sees is what it would see in its own process: its arguments, working directory and
environment, its own stdin, stdout and stderr (the file descriptors themselves are passed, not
copies of the text), its exit status, and Ctrl-C, which interrupts the command (exit 130, as in
process). The server runs one call at a time, in the order they come.

One server per user, Python, installed sources (npusim's and its numeric dependencies') and
numeric environment (the variables of KEYED_PREFIXES): a change of any of them starts another
server, and an old one exits after NPUSIM_RESIDENT_IDLE_S seconds (default IDLE_S) without a call.
Its socket, pid and log are in $XDG_RUNTIME_DIR/npusim-<uid>/ (else $TMPDIR or /tmp), a directory
that must be this user's alone. Where Unix sockets with descriptor passing are missing (Windows)
or that directory is not private, the command runs in its own process, after one line saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import struct
import sys

ENV = "NPUSIM_RESIDENT"
IDLE_ENV = "NPUSIM_RESIDENT_IDLE_S"
IDLE_S = 600.0
# The environment a server's numerics were set up under: Numba's, the BLAS libraries' and npusim's
# own switches, the loader's, Python's (paths, I/O encoding) and the locale (the streams' encoding).
KEYED_PREFIXES = (
    "NPUSIM_",
    "NUMBA_",
    "OMP_",
    "KMP_",
    "OPENBLAS_",
    "MKL_",
    "GOTO",
    "LD_",
    "PYTHON",
    "LC_",
    "LANG",
)
DEPENDENCIES = ("numpy", "numba", "llvmlite", "scipy", "click", "flatbuffers")
STDIO = (0, 1, 2)
START_TIMEOUT_S = 120.0
BUSY_WAIT_S = 2.0  # a server busy with another call this long: the call runs in its own process
_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")


class Unavailable(Exception):
    """No resident server for this call: the command runs in its own process."""


def main() -> int:
    """The `npusim` console script: through the resident server when NPUSIM_RESIDENT=1, else (or when
    no server can serve) the command line in this process."""
    switch = os.environ.get(ENV, "0")
    if switch not in ("0", "1"):
        print(f"error: {ENV}={switch}: expected 0 or 1", file=sys.stderr)
        return 2
    if switch == "1":
        try:
            return call(sys.argv[1:])
        except Unavailable as e:
            print(f"npusim: no resident server ({e}); running in this process", file=sys.stderr)
        except ValueError as e:  # a bad NPUSIM_RESIDENT_IDLE_S
            print(f"error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # before the call reached the server
            print("error: interrupted", file=sys.stderr)
            return 130
    from .cli import main as cli_main

    return cli_main(prog_name="npusim")  # the served command's name too, however it was started


# ---- where the server is ---------------------------------------------------------------------


def idle_seconds(env=os.environ) -> float:
    text = env.get(IDLE_ENV, str(IDLE_S))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{IDLE_ENV}={text}: expected a number of seconds > 0")
    return value


def server_key(env=os.environ) -> str:
    """What a server must share with the call it serves (see the module's docstring)."""
    import importlib.util

    package = os.path.dirname(os.path.abspath(__file__))
    sources = []
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(root, name))
                sources.append(
                    (os.path.relpath(os.path.join(root, name), package), st.st_mtime_ns, st.st_size)
                )
    deps = []
    for name in DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec and spec.origin else ""
        st = os.stat(origin) if origin else None
        deps.append((name, origin, st.st_mtime_ns if st else 0))
    keyed = sorted((k, v) for k, v in env.items() if k.startswith(KEYED_PREFIXES) and not k.startswith(ENV))
    blob = json.dumps([sys.executable, sys.version, package, sources, deps, keyed])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def runtime_dir(env=os.environ) -> str:
    """This user's private folder for the servers' sockets (created, mode 700)."""
    if not hasattr(socket, "AF_UNIX") or not hasattr(socket, "send_fds"):
        raise Unavailable("this platform has no Unix sockets that pass file descriptors")
    base = env.get("XDG_RUNTIME_DIR") or env.get("TMPDIR") or "/tmp"
    path = os.path.join(base, f"npusim-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise Unavailable(f"{path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise Unavailable(
            f"{path}: expected a directory of this user's with mode 700, got mode {st.st_mode & 0o777:o}"
        )
    return path


def server_paths(env=os.environ) -> dict:
    """The socket, pid file, log and start lock of the server that would serve a call under `env`."""
    base = os.path.join(runtime_dir(env), server_key(env))
    paths = {kind: f"{base}.{kind}" for kind in ("sock", "pid", "log", "lock")}
    if len(os.fsencode(paths["sock"])) > 100:  # sun_path holds 104 to 108 bytes
        raise Unavailable(f"{paths['sock']}: a socket path must be at most 100 bytes")
    return paths


# ---- the client --------------------------------------------------------------------------------


def _connect(path: str):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return s
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        return None


def connect_or_start(paths: dict, env=os.environ):
    """A connection to the server at paths["sock"], started first when none answers there, and
    whether it was. One client at a time starts it (an flock), the others then connect to it."""
    s = _connect(paths["sock"])
    if s is not None:
        return s, False
    import fcntl
    import subprocess
    import time

    with open(paths["lock"], "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _connect(paths["sock"])
        if s is not None:
            return s, False
        if os.path.exists(paths["sock"]):  # a server that was killed left its socket
            os.unlink(paths["sock"])
        with open(paths["log"], "ab") as log:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from npusim.resident import serve; serve(sys.argv[1])",
                    paths["sock"],
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=os.path.dirname(paths["sock"]),
                env=dict(env),
                start_new_session=True,  # the terminal's Ctrl-C reaches the client, which forwards it
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            s = _connect(paths["sock"])
            if s is not None:
                return s, True
            if server.poll() is not None:
                raise Unavailable(
                    f"the server exited at start with status {server.returncode}, see {paths['log']}"
                )
            time.sleep(0.005)
        raise Unavailable(f"the server did not listen within {START_TIMEOUT_S:.0f} s, see {paths['log']}")


def _open_stdio() -> list:
    """This process's stdin, stdout and stderr descriptors; a closed one is /dev/null."""
    fds = []
    for fd in STDIO:
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _recv_exactly(conn, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def call(argv: list, env=os.environ) -> int:
    """Run `npusim argv` on the resident server; its exit status."""
    idle_seconds(env)  # a bad value is the caller's error, before a server is started with it
    paths = server_paths(env)
    conn, fresh = connect_or_start(paths, env)
    with conn:
        # The server says when it takes the call. One busy with another (a long run, or a command
        # blocked on a pipe) must not hold this one: past BUSY_WAIT_S it runs in its own process.
        conn.settimeout(START_TIMEOUT_S if fresh else BUSY_WAIT_S)
        try:
            ready = conn.recv(1)
        except TimeoutError:
            raise Unavailable("the server is busy with another call") from None
        if ready != b"R":
            raise Unavailable(f"the server closed the connection, see {paths['log']}")
        conn.settimeout(None)
        header = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "env": dict(env)}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(header))], _open_stdio())
        conn.sendall(header)
        interrupts = []

        def forward(signum, frame):
            # The first Ctrl-C (or TERM, HUP) asks the server to interrupt the command, which then
            # answers 130; a second one leaves at once.
            interrupts.append(signum)
            if len(interrupts) > 1:
                os._exit(130)
            try:
                conn.send(b"\x03")
            except OSError:
                pass

        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, forward)
        status = _recv_exactly(conn, _STATUS.size)
    if len(status) < _STATUS.size:
        print(
            f"error: the resident npusim server stopped during the command (its log: {paths['log']})",
            file=sys.stderr,
        )
        return 1
    return _STATUS.unpack(status)[0]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def stop(env=os.environ) -> bool:
    """Stop the server that would serve a call under `env`, if one runs (SIGTERM); whether one did."""
    try:
        paths = server_paths(env)
        with open(paths["pid"]) as f:
            pid = int(f.read())
        if os.path.isdir("/proc") and b"npusim.resident" not in _read(f"/proc/{pid}/cmdline"):
            return False  # a stale pid file, its number reused by another process
        os.kill(pid, signal.SIGTERM)
    except (Unavailable, OSError, ValueError):
        return False
    for p in (paths["sock"], paths["pid"]):
        try:
            os.unlink(p)
        except OSError:
            pass
    return True


# ---- the server --------------------------------------------------------------------------------


class _Call:
    """One call's process state: what the server swaps in for it and back (restore is idempotent)."""

    def __init__(self, request: dict, fds: list):
        self.request, self.fds = request, fds
        self.active = False  # whether a forwarded Ctrl-C interrupts (read by the SIGINT handler)
        self.interrupted = False  # a Ctrl-C that came before the command started
        self.dirty = False  # interrupted or crashed: its state may be half made (caches, imports)
        self.saved = None
        import threading

        self.lock = threading.Lock()

    def enter(self):
        self.saved = (
            [os.dup(fd) for fd in STDIO],
            dict(os.environ),
            os.getcwd(),
            sys.argv,
            sys.stdin,
            sys.stdout,
            sys.stderr,
        )
        for fd, theirs in zip(STDIO, self.fds):
            os.dup2(theirs, fd)
            os.close(theirs)
        self.fds = []
        enc = sys.__stdout__.encoding if sys.__stdout__ else None
        sys.stdin = open(0, encoding=enc, closefd=False)
        sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, encoding=enc, closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding=enc, errors="backslashreplace", closefd=False)
        os.environ.clear()
        os.environ.update(self.request["env"])
        os.chdir(self.request["cwd"])
        sys.argv = ["npusim", *self.request["argv"]]

    def restore(self):
        self.active = False
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.saved is None:
            return
        fds, env, cwd, sys.argv, stdin, stdout, stderr = self.saved
        self.saved = None
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
        for fd, mine in zip(STDIO, fds):
            os.dup2(mine, fd)
            os.close(mine)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)


def _run_command(argv: list, current: _Call) -> int:
    """The command line on argv, as its own process would end it: its exit status."""
    import traceback
    import warnings

    from .cli import main as cli_main

    try:
        with current.lock:
            current.active = True
            if current.interrupted:
                raise KeyboardInterrupt
        with warnings.catch_warnings():  # each call warns as a fresh process would, once
            cli_main.main(args=argv, prog_name="npusim", standalone_mode=True)
        return 0
    except SystemExit as e:
        current.dirty = current.dirty or e.code == 130  # the command line's own "interrupted"
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        current.dirty = True
        print("error: interrupted", file=sys.stderr)
        return 130
    except BaseException:  # what Python prints and exits 1 with
        current.dirty = True
        traceback.print_exc()
        return 1
    finally:
        current.active = False


def _serve_one(conn, state: dict) -> None:
    import threading

    conn.sendall(b"R")  # taken (the client may have left: then what follows reads nothing)
    msg, fds, _, _ = socket.recv_fds(conn, _HEADER.size, len(STDIO))
    current = _Call(None, list(fds))
    try:
        if len(msg) < _HEADER.size or len(fds) != len(STDIO):
            return
        (n,) = _HEADER.unpack(msg)
        current.request = json.loads(_recv_exactly(conn, n))
        main_thread = threading.get_ident()
        lock = current.lock

        def watch():
            # A byte from the client (its Ctrl-C) or its end (killed) interrupts the command.
            try:
                conn.recv(1)
            except OSError:
                pass
            with lock:
                if current.active:
                    signal.pthread_kill(main_thread, signal.SIGINT)
                else:
                    current.interrupted = True

        current.enter()
        state["current"] = current
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        code = _run_command(current.request["argv"], current)
        with lock:
            current.active = False
        current.restore()
        conn.sendall(_STATUS.pack(code))
        conn.shutdown(socket.SHUT_RDWR)  # wakes the watcher
        watcher.join()
    finally:
        current.restore()
        state["current"] = None
        state["dirty"] = state.get("dirty") or current.dirty


def _serve_safely(conn, state: dict) -> None:
    """One call; whatever goes wrong in it (a client that left mid-call, a bug here) goes to the log.
    After a call that was interrupted or crashed the server exits (state["dirty"]): its imports and
    caches may be half made, which a process of its own would not pass on."""
    import traceback

    try:
        _serve_one(conn, state)
    except BaseException as e:
        if isinstance(e, SystemExit):
            raise
        state["dirty"] = True
        traceback.print_exc()


def serve(path: str) -> None:
    """Listen at `path` (a socket of mode 600) and serve calls until IDLE seconds pass without one."""
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # never the caller's folder's modules
    if os.path.basename(path) != server_key() + ".sock":  # its imports are not the client's sources
        print(f"npusim resident: {path}: this Python imports other npusim sources", file=sys.stderr)
        return
    old = os.umask(0o077)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
    except OSError as e:
        print(f"npusim resident: cannot listen at {path}: {e.strerror}", file=sys.stderr)
        return
    finally:
        os.umask(old)
    listener.listen(64)
    inode = os.stat(path).st_ino
    pid_path = path[: -len(".sock")] + ".pid"
    with open(pid_path, "w") as f:
        f.write(str(os.getpid()))
    state = {"current": None, "dirty": False}

    def interrupt(signum, frame):
        current = state["current"]
        if current is not None and current.active:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    # What every call would import: the command line, the interpreter with Numba, the settings.
    from . import cli, interpreter  # noqa: F401
    from .tuning import tune_process

    tune_process()
    listener.settimeout(idle_seconds())
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            break
        with conn:
            conn.settimeout(None)
            _serve_safely(conn, state)
        if state.get("dirty"):
            break
    # Idle: new clients start a new server from here on; those already queued are served first.
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
            os.unlink(pid_path)
    except FileNotFoundError:  # stop() took them
        pass
    listener.setblocking(False)
    while not state.get("dirty"):  # queued clients of a dirty server run in their own process
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, OSError):
            break
        with conn:
            conn.setblocking(True)
            _serve_safely(conn, state)
    listener.close()


if __name__ == "__main__":
    sys.exit(main())
