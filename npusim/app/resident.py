"""The `npusim` entry point, and its resident server (on Linux by default; NPUSIM_RESIDENT=0 or 1).

Why a server. A one-shot `npusim run` spends most of its time before the model runs: Python's
start, numpy's and Numba's imports and the loads of the kernels take about 0.7 s of CPU, where a
LiteRT script takes 0.13 s for the whole call (docs/performance.md); Numba's import alone is more
than the LiteRT script. A CI job that checks many models one CLI call at a time would pay that on
every call. So `npusim` is a small client that imports nothing but the standard library: it hands
its call to a server process that has imported everything a call needs, and starts that server
when there is none. The server forks a process for each call, which loads the call's kernels from
the cache, runs the command and exits: calls run side by side (a parallel CI job), and what one
call does to its process (its imports, caches, threads, a crash) never reaches another.

What a call sees is what it would see in its own process: its arguments, working directory,
environment and file mode mask, its own stdin, stdout and stderr (the file descriptors themselves
are passed, not copies of the text), its exit status, and Ctrl-C, which interrupts the command
(exit 130, as in process).

One server per user, Python, installed sources (npusim's and its numeric dependencies') and numeric
environment (the variables of resident_files.KEYED_PREFIXES): a change of any of them starts another
server, and a server exits after NPUSIM_RESIDENT_IDLE_S seconds (default IDLE_S) without a call. Its
socket, pid and log are in $XDG_RUNTIME_DIR/npusim-<uid>/ (else $TMPDIR or /tmp), a directory that
must be this user's alone. Where Unix sockets with descriptor passing are missing (Windows), that
directory is not private or no server answers, the command runs in its own process (with
NPUSIM_RESIDENT=1, after one line saying why). The server itself never runs a kernel, so no thread
pool is started before a fork.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import threading
import time

# Where a server is (its key and files), found and stopped: npusim/app/resident_files.py.
from .resident_files import (  # noqa: F401
    ENV,
    HASH_ENV,
    OtherContext,
    Unavailable,
    environment_hash,
    process_context,
    running,
    securebits,
    server_environment,
    server_key,
    server_paths,
    servers,
    stop,
    stop_all,
)

IDLE_ENV = "NPUSIM_RESIDENT_IDLE_S"
IDLE_S = 600.0
STDIO = (0, 1, 2)
# Where a server is used without NPUSIM_RESIDENT=1: Linux, whose fork keeps a process with Numba
# and LLVM loaded usable (macOS's system libraries do not promise that after fork without exec).
DEFAULT_ON = sys.platform.startswith("linux")
START_TIMEOUT_S = 120.0
BUSY_WAIT_S = 10.0  # a server that has not forked for the call this long: it runs in its own process
SOCKET_CHECK_S = 1.0  # how often an idle server checks that its socket is still there
REAP_EVERY_S = 1.0  # how often a server with running calls collects the ended ones
GONE_GRACE_S = 2.0  # a call whose client has gone ends this long after, if its command has not
REQUEST_TIMEOUT_S = 10.0  # a connection that sends no request within this is closed
_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")


def main() -> int:
    """The `npusim` console script: through the resident server (by default where it is DEFAULT_ON,
    else with NPUSIM_RESIDENT=1), or, with NPUSIM_RESIDENT=0 or where no server can serve, the command
    line in this process. It does not return: the process ends with the command's status."""
    from . import interrupt

    interrupt.exit_on_signal()  # from the first moment: a signal is one line and 130, never a traceback
    code = _command_status()
    # Python's own exit first puts the default handlers back, and a SIGTERM in that window would end
    # the process with no line and no status of its own; everything is written by now (outputs are
    # renamed into place and synced, npusim/app/atomic.py), so the process leaves at once.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what it could not take is lost either way
            pass
    os._exit(code)


def _command_status() -> int:
    switch = os.environ.get(ENV, "")
    if switch not in ("", "0", "1"):
        print(f"error: {ENV}={switch}: expected 0 or 1", file=sys.stderr)
        return 2
    if (switch == "1" or (switch == "" and DEFAULT_ON)) and not _answered_here(sys.argv[1:]):
        try:
            return call(sys.argv[1:])
        except Unavailable as e:
            if switch == "1" and not isinstance(e, OtherContext):  # asked for: say why not
                print(f"npusim: no resident server ({e}); running in this process", file=sys.stderr)
        except ValueError as e:  # a bad NPUSIM_RESIDENT_IDLE_S
            print(f"error: {e}", file=sys.stderr)
            return 2
    from .cli import main as cli_main

    try:
        cli_main(prog_name="npusim")  # the served command's name too, however it was started
    except SystemExit as e:
        return _exit_status(e)
    return 0


def _answered_here(argv: list) -> bool:
    """Calls that never start a server: `npusim server ...` (it is about the server), help, the
    version and a bare `npusim` (click answers them before any kernel loads)."""
    return argv[:1] in ([], ["server"]) or any(a in ("--help", "-h", "--version") for a in argv)


def _exit_status(e: SystemExit) -> int:
    """The status Python's exit gives a SystemExit (a message is printed, status 1)."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


def idle_seconds(env=os.environ) -> float:
    text = env.get(IDLE_ENV, str(IDLE_S))
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{IDLE_ENV}={text}: expected a number of seconds > 0")
    return value


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
    whether it is new. One client at a time starts it (an flock), the others then connect to it."""
    s = _connect(paths["sock"])
    if s is not None:
        return s, False
    import fcntl
    import subprocess

    from .resident_files import remove_stale

    folder, key = os.path.split(paths["sock"][: -len(".sock")])
    remove_stale(folder, keep=key)  # the files of servers that have ended, but this key's log
    with open(paths["lock"], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _connect(paths["sock"])
        if s is not None:  # another client has just started it: it may still be loading
            return s, True
        if os.path.exists(paths["sock"]):  # a server that was killed left its socket
            os.unlink(paths["sock"])
        with open(paths["log"], "ab") as log:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-X",
                    "faulthandler",  # a crash of the server's own is in its log, not a silent end
                    "-c",
                    "import sys; from npusim.app.resident import serve; serve(sys.argv[1])",
                    paths["sock"],
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=os.path.dirname(paths["sock"]),
                env=server_environment(env),  # not the caller's tokens: the server outlives it
                start_new_session=True,  # the terminal's Ctrl-C reaches the client, which forwards it
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            s = _connect(paths["sock"])
            if s is not None:
                server.returncode = 0  # not waited for: it outlives this process (no ResourceWarning)
                return s, True
            if server.poll() is not None:
                raise Unavailable(
                    f"the server exited at start with status {server.returncode}, see {paths['log']}"
                )
            time.sleep(0.005)
        raise Unavailable(f"the server did not listen within {START_TIMEOUT_S:.0f} s, see {paths['log']}")


def _open_stdio() -> None:
    """Put /dev/null on a closed stdin, stdout or stderr, before any socket or file could take its
    number (a command run with `>&-` would otherwise print into the connection)."""
    for fd in STDIO:
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


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
    _open_stdio()
    paths = server_paths(env)
    try:
        cwd = os.getcwd()
    except OSError as e:  # removed: the command runs where it is, in its own process
        raise Unavailable(f"the working directory: {e.strerror}") from None
    umask = os.umask(0o022)
    os.umask(umask)
    request = {"argv": list(argv), "cwd": cwd, "env": dict(env), "umask": umask, "securebits": securebits()}
    try:
        conn, fresh = connect_or_start(paths, env)
    except OSError as e:  # the runtime folder full or read-only, no more processes, ...
        raise Unavailable(f"{e.filename}: {e.strerror}" if e.filename else str(e.strerror)) from None
    with conn:
        # The process forked for the call reads the request and says whether it takes the call: "R",
        # or "N" where the caller's context is not the server's (it runs in its own process,
        # silently). A server that does not answer (one stopped, or starting up under load) must not
        # hold the call either.
        conn.settimeout(START_TIMEOUT_S if fresh else BUSY_WAIT_S)
        header = json.dumps(request).encode()
        try:
            socket.send_fds(conn, [_HEADER.pack(len(header))], list(STDIO))
            conn.sendall(header)
            ready = conn.recv(1)
        except (TimeoutError, OSError) as e:  # a server stopping as the call came (its log says why)
            why = "it did not answer" if isinstance(e, TimeoutError) else e.strerror or type(e).__name__
            raise Unavailable(f"the server did not take the call: {why}; see {paths['log']}") from None
        if ready == b"N":
            raise OtherContext()
        if ready != b"R":
            raise Unavailable(f"the server closed the connection, see {paths['log']}")
        conn.settimeout(None)
        interrupts = []

        def forward(signum, frame):
            # The first Ctrl-C (or TERM, HUP) asks the server to interrupt the command, which then
            # answers 130; a second one leaves at once.
            interrupts.append(signum)
            if len(interrupts) > 1:
                os.write(2, b"error: interrupted\n")  # the served process, its client gone, is silent
                os._exit(130)
            try:
                conn.send(b"\x03")
            except OSError:
                pass

        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(s) is not signal.SIG_IGN:  # one the caller ignores (nohup) stays so
                signal.signal(s, forward)
        try:
            status = _recv_exactly(conn, _STATUS.size)
        except OSError:  # the process forked for the call ended without a word
            status = b""
    if len(status) < _STATUS.size:
        # The call's own process sends the status, not the server: only that process's end without
        # one (a signal, a crash) loses it; the server's stopping never does. The server's log names
        # the signal (_reap).
        from .resident_files import running

        server = "the server serves on" if running(env) is not None else "the server is no longer running"
        what = "the process that ran the command in the resident npusim server ended without a status"
        print(f"error: {what} (killed?); {server} (its log: {paths['log']})", file=sys.stderr)
        return 1
    return _STATUS.unpack(status)[0]


# ---- the server --------------------------------------------------------------------------------

# What the calls import, loaded once by the server so that no call pays for it: the command line,
# the interpreter with Numba, every op's module (its kernels are loaded from the cache on a call's
# first use), the readers of both formats and the modules of the other commands.
PRELOADED = (
    "npusim.app.cli",
    "npusim.runtime.interpreter",
    "npusim.formats.model_io",
    "npusim.formats.onnx.reader",
    "npusim.app.golden",
    "npusim.app.compare",
    "npusim.app.validate",
    "npusim.app.inspect_report",
)


# Pure Python (click, flatbuffers, the LiteRT schema, yaml) or the server's own numeric core; not
# SciPy, whose import loads its own OpenBLAS, which starts threads.
LEARNED_PACKAGES = ("npusim", "numba", "llvmlite", "numpy", "click", "flatbuffers", "ai_edge_litert", "yaml")
UNLEARNED = ("numba.np.ufunc.omppool", "numba.np.ufunc.tbbpool", "numba.np.ufunc.workqueue")  # thread pools


def _preload() -> None:
    import importlib

    from ..kernels.tuning import tune_process
    from ..ops import KERNELS

    for name in PRELOADED:
        importlib.import_module(name)
    for kind in KERNELS:
        KERNELS[kind]
    tune_process()  # settings only: no kernel runs here, so no thread starts before a fork


def _enter(request: dict, fds: list) -> None:
    """Make this (forked) process the caller's: its stdin, stdout and stderr, environment, working
    directory, file mode mask and arguments."""
    for fd, theirs in zip(STDIO, fds):
        os.dup2(theirs, fd)
        os.close(theirs)
    enc = sys.__stdout__.encoding if sys.__stdout__ else None
    sys.stdin = open(0, encoding=enc, closefd=False)
    sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, encoding=enc, closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding=enc, errors="backslashreplace", closefd=False)
    os.environ.clear()
    os.environ.update(request["env"])
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    sys.argv = ["npusim", *request["argv"]]


def _run_command(argv: list) -> int:
    """The command line on argv, as its own process would end it: its exit status."""
    import traceback

    from .cli import main as cli_main

    try:
        cli_main.main(args=argv, prog_name="npusim", standalone_mode=True)
        return 0
    except SystemExit as e:
        return _exit_status(e)
    except BaseException:  # what Python prints and exits 1 with
        traceback.print_exc()
        return 1


def _release_stdio() -> None:
    """Put /dev/null on stdin, stdout and stderr: the caller's streams are let go of."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in STDIO:
        os.dup2(null, fd)
    os.close(null)


class _Server:
    context: dict | None = None  # process_context() of the server, read at its start
    securebits: int | None = None  # and its securebits (no process's are in /proc)
    environment: str | None = None  # environment_hash() of the environment of the client that started it


def _own_context(conn, request: dict) -> bool:
    """Whether the calling process's context is the server's (and so the call's process, forked from
    the server, is as the caller's own would be): the same user (SO_PEERCRED), groups, file mode
    mask, capabilities, NoNewPrivs, seccomp, LSM label, nice value, resource limits, namespaces and
    cgroup (process_context, from /proc), and environment. The securebits are the caller's word (no
    process's are in /proc): they only limit what an exec gains, and the capabilities compared are
    what the process holds."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return False
    pid, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid() or pid <= 0 or _Server.context is None:
        return False  # pid 0: a caller in a pid namespace the server cannot see
    theirs = process_context(pid)
    return (
        theirs == _Server.context
        and request.get("securebits") == _Server.securebits
        and environment_hash(request["env"]) == _Server.environment
    )


def _serve_call(conn) -> None:
    """One call, in a process forked for it: take the caller's descriptors and request, run the
    command, send its exit status back, and let go of the caller's streams."""
    from . import interrupt

    conn.settimeout(REQUEST_TIMEOUT_S)  # a client that connects and says nothing is let go
    msg, fds, _, _ = socket.recv_fds(conn, _HEADER.size, len(STDIO))
    if len(msg) < _HEADER.size or len(fds) != len(STDIO):
        return
    (n,) = _HEADER.unpack(msg)
    request = json.loads(_recv_exactly(conn, n))
    if not _own_context(conn, request):
        conn.sendall(b"N")  # the caller runs the command in its own process
        return
    conn.sendall(b"R")  # taken
    conn.settimeout(None)
    main_thread = threading.get_ident()

    def send_status(code: int) -> None:
        try:
            conn.sendall(_STATUS.pack(code))
        except OSError:  # the client has gone: nobody to tell
            pass

    def watch():
        # A byte from the client (its Ctrl-C, SIGTERM or SIGHUP) interrupts the command as the signal
        # would in its own process (npusim/app/interrupt.py: at once before the command runs, else through
        # a KeyboardInterrupt). The client's end (killed) interrupts it too, silently: nobody reads
        # its line; and, as its own process would have ended with the client, ends it after
        # GONE_GRACE_S should the command not stop (blocked in C), so that it holds none of the
        # caller's files open.
        try:
            byte = conn.recv(1)
        except OSError:
            byte = b""
        if not byte:
            _release_stdio()
        signal.pthread_kill(main_thread, signal.SIGINT)
        if not byte:
            time.sleep(GONE_GRACE_S)
            os._exit(130)

    _enter(request, fds)
    interrupt.exit_on_signal(end=send_status)
    threading.Thread(target=watch, daemon=True).start()
    code = _run_command(request["argv"])
    interrupt.ignore_further()  # a signal from here on would only lose the status
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    _release_stdio()  # the caller's streams are released with the status
    send_status(code)


def _fork_call(conn, listener) -> tuple | None:
    """Fork a process for the call on conn: (its pid, the read end of a pipe on which it names the
    modules the call imported), or None where fork failed (the client, whose connection closes, runs
    the command in its own process)."""
    learned, report = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        print(f"npusim resident: fork failed: {e.strerror}", file=sys.stderr)
        os.close(learned)
        os.close(report)
        return None
    if pid:
        os.close(report)
        os.set_blocking(learned, False)  # a process the command started may hold the other end
        return pid, learned
    # The child: whatever happens, it ends here, and never returns into the server's loop.
    try:
        os.close(learned)
        listener.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        conn.settimeout(None)
        modules = set(sys.modules)
        _serve_call(conn)
        import pickle

        from ..kernels.jit import loaded_serial_kernels

        imported = [m for m in sys.modules if m not in modules and not m.startswith("__")]
        report_of = pickle.dumps((imported, loaded_serial_kernels()))
        os.set_blocking(report, False)  # a report the pipe cannot take is dropped, never waited on
        try:
            os.write(report, report_of)
        except OSError:  # a server that no longer listens to it (stopped, or draining)
            pass
    except BaseException:  # a client that left mid-call, a bug here: into the log (or the caller's stderr)
        import traceback

        try:
            traceback.print_exc()
        except BaseException:
            pass
    finally:
        os._exit(0)


def _learn(learned: int) -> None:
    """Import what an ended call imported and load the serial kernels it loaded (from the cache:
    never a compile), so that later calls do not: its kernels' cache loads pull in parts of Numba, the
    threading layer's module and numpy.ma, and each kernel's load takes milliseconds. The server
    still runs no kernel, and loads no threaded one (jit.SERIAL_KERNELS)."""
    import importlib
    import pickle

    from ..kernels.jit import load_serial_kernel

    data = b""
    try:
        while chunk := os.read(learned, 1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(learned)
    try:
        imported, kernels = pickle.loads(data)  # from a process forked from this one
    except Exception:  # noqa: BLE001 - a call that ended before its report, or one too long
        return
    for name in imported:
        top = name.partition(".")[0]
        # Parts of LEARNED_PACKAGES and the standard library's: not a package new to the server, nor
        # a part of another it has (scipy, matplotlib), whose import may
        # start threads (onnxruntime's does; after a YOLO11n call one did, and the server, no longer
        # fit to fork, stopped) or cost more than it saves. Such calls import them in their own process.
        learnable = top in LEARNED_PACKAGES or top in sys.stdlib_module_names
        if name not in sys.modules and learnable and not name.startswith(UNLEARNED):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a module only a call's own state could import
                pass
    for key, sig in kernels:
        try:
            load_serial_kernel(key, sig)
        except Exception:  # noqa: BLE001 - a kernel this process cannot load: its calls load it
            pass


def _threads() -> int:
    """This process's threads, native ones too where the OS lists them."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _settle() -> int:
    """The server's threads once a fork has run: numpy's BLAS (OpenBLAS) starts threads at import
    and stops them around every fork, so the count to hold is the one after a first fork."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return _threads()


def _fit_to_fork(threads: int) -> bool:
    """No Python thread but the main one, Numba's thread pool not started (a fork does not carry its
    workers over, and the child's first parallel kernel would wait for them forever), and no native
    thread more than the settled count once a fork has run. An OpenBLAS's threads stop around every
    fork: a learned import (numba.np.arraymath, which a call that compiles a kernel imports, imports
    SciPy's BLAS, and its OpenBLAS starts threads) starts them again, and with a cold kernel cache the
    server stopped itself after its first calls; a fork now settles them before they are counted."""
    pool = sys.modules.get("numba.np.ufunc.parallel")
    if threading.active_count() != 1 or (pool is not None and getattr(pool, "_is_initialized", False)):
        return False
    return _threads() <= threads or _settle() <= threads


def _reap(children: dict) -> None:
    """Collect the calls' processes that have ended, and learn their imports and kernels."""
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done and os.WIFSIGNALED(status):  # what the client, left without a status, refers to
            name = signal.Signals(os.WTERMSIG(status)).name
            print(f"npusim resident: the process of a call (pid {pid}) was ended by {name}", file=sys.stderr)
        if done:
            _learn(children.pop(pid))


def _socket_is_mine(path: str, inode: int) -> bool:
    """Whether `path` is still the socket this server listens on (not removed, nor another's)."""
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


def _serve_until_idle(listener, idle: float, threads: int, path: str, inode: int) -> bool:
    """Accept calls and fork for each until `idle` seconds pass without a call or a running one, or
    its socket is removed (no new call can reach it, and a new server may already listen there);
    whether the server is still fit to fork (it stops when it is not: the next call starts another)."""
    children: dict = {}  # pid -> the read end of its report
    last = time.monotonic()
    while True:
        _reap(children)
        if not _socket_is_mine(path, inode):
            print(f"npusim resident: {path} was removed: stopping", file=sys.stderr)
            return True
        if not _fit_to_fork(threads):
            print(
                f"npusim resident: a thread was started in the server, which must not fork "
                f"({_threads()} threads, {threads} at its start): stopping",
                file=sys.stderr,
            )
            return False
        if children:
            last = time.monotonic()
        left = idle - (time.monotonic() - last)
        if left <= 0:
            return True
        listener.settimeout(min(left, REAP_EVERY_S, SOCKET_CHECK_S))
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            forked = _fork_call(conn, listener)
        if forked:
            pid, learned = forked
            children[pid] = learned
        last = time.monotonic()


def _stop_on_sigterm(signum, frame):
    raise SystemExit(0)  # `npusim server stop`: the files are removed on the way out


def serve(path: str) -> None:
    """Listen at `path` (a socket of mode 600) and serve calls, each in a process forked for it,
    until IDLE seconds pass without a call or a running one, or a SIGTERM."""
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
    inode = os.stat(path).st_ino
    pid_path = path[: -len(".sock")] + ".pid"
    _Server.context = process_context()
    _Server.securebits = securebits()
    _Server.environment = os.environ.pop(HASH_ENV, None)
    fit = False
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with open(pid_path, "w") as f:
            f.write(str(os.getpid()))
        _preload()
        threads = _settle()
        # Listening only now: a client that comes while the server loads waits for it as the one
        # that started it does, not the BUSY_WAIT_S of a server that has stopped answering.
        listener.listen(64)
        fit = _serve_until_idle(listener, idle_seconds(), threads, path, inode)
    finally:
        # New clients start a new server from here on (a stop, an idle or an unfit server alike).
        try:
            if os.stat(path).st_ino == inode:
                os.unlink(path)
                os.unlink(pid_path)
        except FileNotFoundError:
            pass
    # Idle: those already queued are served first; an unfit server closes their connections, and
    # they run the command in their own process.
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, OSError):
            break
        with conn:
            forked = _fork_call(conn, listener) if fit else None
        if forked:
            os.close(forked[1])
    listener.close()


if __name__ == "__main__":
    sys.exit(main())
