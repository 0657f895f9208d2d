"""Where the resident server of a call is (npusim/app/resident.py): its key, its private folder, its
socket, pid file and log; whether one runs, and stopping it. Apart from the server itself, so that
the command line's `npusim server status|stop` can use it without importing the server."""

from __future__ import annotations

import errno
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
# Every package the server imports (npusim.app.resident.PRELOADED and what those import; checked by
# tests/test_resident_context.py): an upgrade of any of them is another server.
DEPENDENCIES = ("numpy", "numba", "llvmlite", "scipy", "click", "flatbuffers", "ai_edge_litert", "yaml")
# What a call's context is besides the key (npusim/app/resident.py): the server serves a call only when
# the calling process's is its own, read from /proc for both (never taken from the caller's word).
NAMESPACES = ("mnt", "pid", "net")
# Everything else the kernel decides what a process may do by (docs/robustness.md#the-resident-server):
# its capability sets, whether it may gain privileges on exec, its seccomp filters. The LSM label
# (/proc/PID/attr/current) and the nice value are read too (process_context).
PRIVILEGE_FIELDS = (
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
)
STATUS_FIELDS = ("Uid", "Gid", "Groups", "Umask", *PRIVILEGE_FIELDS)
# What the process runs at (process_context): a caller that asked for less is never served at more.
PRIORITY_FIELDS = ("nice", "rt_priority", "policy", "ioprio", "oom_score_adj")
PR_GET_SECUREBITS = 27
# Variables a shell changes from one command to the next without changing what a command does (the
# working directory is passed to the server itself): left out of the environment's hash.
UNHASHED = ("PWD", "OLDPWD", "_", "SHLVL")


HASH_ENV = "NPUSIM_RESIDENT_ENV_HASH"  # how a server learns the hash of its starter's environment
# What a server's own environment keeps of its starter's: the keyed variables and these. Not the rest
# (a CI job's tokens): the server outlives the job that started it by its idle time.
KEPT_NAMES = ("PATH", "TMPDIR", "XDG_RUNTIME_DIR")


class Unavailable(Exception):
    """No resident server for this call: the command runs in its own process."""


class OtherContext(Unavailable):
    """The server's context is not the caller's: the command runs in its own process, silently."""


def server_key(env=os.environ) -> str:
    """What a server must share with the call it serves (npusim/app/resident.py's docstring)."""
    import importlib.util

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    variables = sorted((k, v) for k, v in env.items() if keyed(k))
    # The CPUs the caller may use: Numba sizes its thread pool from them when it is imported.
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    # The caller's privileges and priority: a caller with fewer (dropped capabilities, NoNewPrivs,
    # a seccomp filter, a nice value) gets a server of its own, started by it and so holding no more
    # than it does, and identical callers share one. The server checks them from /proc too.
    privilege = privilege_context()
    blob = json.dumps([sys.executable, sys.version, package, sources, deps, variables, cpus, privilege])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def keyed(name: str) -> bool:
    return (name.startswith(KEYED_PREFIXES) or name in KEYED_NAMES) and not name.startswith(ENV)


def server_environment(env) -> dict:
    """The environment a server is started with: what its numerics depend on, and the hash of the
    rest (npusim/app/resident.py)."""
    kept = {k: v for k, v in env.items() if keyed(k) or k in KEPT_NAMES or k.startswith(ENV)}
    return {**kept, HASH_ENV: environment_hash(env)}


def environment_hash(env) -> str:
    """A hash of the whole environment (but UNHASHED, and the server's own switches): the server keeps
    only this of the environment it was started in, and serves callers whose environment hashes the
    same."""
    items = sorted((k, v) for k, v in env.items() if k not in UNHASHED and not k.startswith(ENV))
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def securebits() -> int | None:
    """This process's securebits (prctl; /proc shows no process's): None where prctl is not there."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        bits = libc.prctl(PR_GET_SECUREBITS, 0, 0, 0, 0)
    except (OSError, AttributeError):
        return None
    return bits if bits >= 0 else None


def privilege_context() -> dict | None:
    """This process's privileges and priority, as process_context reads them, and its securebits:
    part of the server's key (server_key)."""
    context = process_context()
    if context is None:
        return None
    return {
        **{name: context[name] for name in (*PRIVILEGE_FIELDS, *PRIORITY_FIELDS, "lsm")},
        "securebits": securebits(),
    }


# ioprio_get(2)'s number where it is known (glibc has no wrapper), IOPRIO_WHO_PROCESS.
IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "i686": 290, "armv7l": 315, "ppc64le": 274, "s390x": 283}
IOPRIO_WHO_PROCESS = 1


def _ioprio(pid) -> int | None:
    """The process's I/O priority (ionice), None where ioprio_get is not known here."""
    import ctypes
    import platform

    number = IOPRIO_GET.get(platform.machine()) if sys.platform.startswith("linux") else None
    if number is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall(number, IOPRIO_WHO_PROCESS, 0 if pid == "self" else int(pid))
    if value < 0:
        raise OSError(ctypes.get_errno(), "ioprio_get")
    return value


def _lsm_label(base: str) -> str:
    """The process's LSM label (SELinux, AppArmor, Smack), "" where no LSM gives one (EINVAL)."""
    try:
        with open(f"{base}/attr/current", "rb") as f:
            return f.read().rstrip(b"\0\n").decode(errors="replace")
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOENT):
            return ""
        raise


def process_context(pid="self") -> dict | None:
    """What the resident server must share with a process it serves, read from /proc/PID: its user,
    groups and file mode mask, capability sets, NoNewPrivs and seccomp mode and filter count, LSM
    label, scheduling and I/O priority and OOM score adjustment, root directory, resource limits,
    mount, pid and network namespaces and cgroup. None where /proc does not tell (another system,
    or a process gone)."""
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        context = {name: status.get(name, "").split() for name in STATUS_FIELDS}
        context["lsm"] = _lsm_label(base)
        with open(f"{base}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # proc(5)'s fields from the 3rd on
        # The scheduling priority: the nice value, the real-time priority and the policy (fields
        # 19, 40, 41: `chrt --idle` and `nice -n 19` alike), and the I/O priority (ionice).
        context["nice"], context["rt_priority"], context["policy"] = (int(fields[i]) for i in (16, 37, 38))
        context["ioprio"] = _ioprio(pid)
        with open(f"{base}/oom_score_adj") as f:  # who the OOM killer takes first
            context["oom_score_adj"] = int(f.read())
        # The root directory (chroot): the folder paths resolve from.
        context["root"] = os.readlink(f"{base}/root")
        with open(f"{base}/limits") as f:
            context["limits"] = f.read()
        with open(f"{base}/cgroup") as f:
            context["cgroup"] = f.read()
        for name in NAMESPACES:
            context[name] = os.readlink(f"{base}/ns/{name}")
    except (OSError, ValueError):
        return None
    return context


def runtime_dir(env=os.environ) -> str:
    """This user's private folder for the servers' sockets (created, mode 700)."""
    if not hasattr(socket, "AF_UNIX") or not hasattr(socket, "send_fds"):
        raise Unavailable("this platform has no Unix sockets that pass file descriptors")
    base = env.get("XDG_RUNTIME_DIR") or env.get("TMPDIR") or "/tmp"
    path = os.path.join(base, f"npusim-{os.getuid()}")
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:  # a folder made before, or something else of that name: seen below
            pass
        st = os.lstat(path)  # never through a link (a dangling one was "File exists")
    except OSError as e:
        raise Unavailable(f"{path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        cause = "it is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        cause = "it is not a directory"
    elif st.st_uid != os.getuid():
        cause = f"it is owned by uid {st.st_uid}, not this user ({os.getuid()})"
    elif st.st_mode & 0o077:
        cause = f"its mode is {st.st_mode & 0o777:o}, others may enter it"
    else:
        return path
    raise Unavailable(f"{path}: expected a private directory of this user's (mode 700), but {cause}")


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
    return not os.path.isdir("/proc") or b"npusim.app.resident" in _read(f"/proc/{pid}/cmdline")


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


def servers(env=os.environ) -> list[dict]:
    """Every server of this user's runtime folder that runs (any key: an older source tree's, another
    numeric environment's), with its pid, socket and log; the files of servers that no longer run
    are removed on the way (remove_stale)."""
    try:
        folder = runtime_dir(env)
    except Unavailable:
        return []
    remove_stale(folder)
    found = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pid"):
            base = os.path.join(folder, name[: -len(".pid")])
            try:
                pid = int(_read(base + ".pid"))
            except ValueError:
                continue
            if _is_server(pid):
                found.append({"pid": pid, **{k: f"{base}.{k}" for k in ("sock", "log")}})
    return found


def remove_stale(folder: str, keep: str | None = None) -> None:
    """Remove the socket, pid file, start lock and log of every key whose server no longer runs and
    that no client is starting (its start lock free), but `keep`'s: the key a client is about to
    start a server for, whose log then goes on (it says why the last one stopped). A server that
    exits removes its socket and pid file; the lock and the log stay until here."""
    import fcntl

    keys = {name.rsplit(".", 1)[0] for name in os.listdir(folder) if "." in name} - {keep}
    for key in keys:
        base = os.path.join(folder, key)
        try:
            pid = int(_read(base + ".pid") or b"0")
        except ValueError:
            pid = 0
        if pid and _is_server(pid):
            continue
        try:
            lock = open(base + ".lock", "a")
        except OSError:
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a client is starting this key's server
                continue
            for kind in ("sock", "pid", "log", "lock"):
                try:
                    os.unlink(f"{base}.{kind}")
                except OSError:
                    pass


def stop_all(env=os.environ, wait_s: float = 10.0) -> list[int]:
    """Stop every server of this user's (servers()); the pids stopped. Their running calls finish."""
    import time

    stopped = []
    for server in servers(env):
        try:
            os.kill(server["pid"], signal.SIGTERM)
            stopped.append(server["pid"])
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    while any(_is_server(pid) for pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        remove_stale(runtime_dir(env))
    except Unavailable:
        pass
    return stopped


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
