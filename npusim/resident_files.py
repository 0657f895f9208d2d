"""Where the resident server of a call is (npusim/resident.py): its key, its private folder, its
socket, pid file and log; whether one runs, and stopping it. Apart from the server itself, so that
the command line's `npusim server status|stop` can use it without importing the server."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import sys

ENV = "NPUSIM_RESIDENT"
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
# Where npusim keeps its kernel cache when the package is read-only (jit.user_cache_dir).
KEYED_NAMES = ("HOME", "XDG_CACHE_HOME")
DEPENDENCIES = ("numpy", "numba", "llvmlite", "scipy", "click", "flatbuffers")


class Unavailable(Exception):
    """No resident server for this call: the command runs in its own process."""


def server_key(env=os.environ) -> str:
    """What a server must share with the call it serves (npusim/resident.py's docstring)."""
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
    keyed = sorted(
        (k, v)
        for k, v in env.items()
        if (k.startswith(KEYED_PREFIXES) or k in KEYED_NAMES) and not k.startswith(ENV)
    )
    # The CPUs the caller may use: Numba sizes its thread pool from them when it is imported.
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    blob = json.dumps([sys.executable, sys.version, package, sources, deps, keyed, cpus])
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


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_server(pid: int) -> bool:
    """Whether process pid runs and is a resident server (not a number reused by another one)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return not os.path.isdir("/proc") or b"npusim.resident" in _read(f"/proc/{pid}/cmdline")


def running(env=os.environ) -> dict | None:
    """The server that would serve a call under `env`, if one runs: its pid, socket and log."""
    try:
        paths = server_paths(env)
        with open(paths["pid"]) as f:
            pid = int(f.read())
    except (Unavailable, OSError, ValueError):
        return None
    if not _is_server(pid):
        return None  # a stale pid file
    return {"pid": pid, "sock": paths["sock"], "log": paths["log"], "pid_file": paths["pid"]}


def stop(env=os.environ, wait_s: float = 10.0) -> int | None:
    """Stop the server that would serve a call under `env`, if one runs (SIGTERM: it removes its
    socket and pid file on the way out), and wait for it to go; the pid stopped, or None where
    none ran. The calls it is running go on in their own processes."""
    import time

    server = running(env)
    if server is None:
        return None
    pid = server["pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return None
    deadline = time.monotonic() + wait_s
    while _is_server(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid
