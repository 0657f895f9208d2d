"""Ctrl-C, SIGTERM and SIGHUP in the `npusim` and `zo` commands: one `error: interrupted` line and
exit 130, from a KeyboardInterrupt raised at a point where it is safe, never another exception.

The three signals are one: a terminal's Ctrl-C, a CI runner's timeout (SIGTERM) and a closed
terminal or ssh session (SIGHUP) all interrupt the command the same way, and it exits 130 for each
(not 143 or 129: the status says "interrupted", whatever sent it). A signal the caller ignores
(nohup's SIGHUP) stays ignored.

Two handlers. Outside a command's own code (Python's imports, the argument parsing, the resident
server's hand-over) nothing is half done, so exit_on_signal() ends the process at once: the line,
then os._exit(130) (a KeyboardInterrupt there would meet click's own handler, which prints an empty
line and "Aborted!" and exits 1). Inside guarded(), the command's code, the signal becomes a
KeyboardInterrupt, so that what the command has begun is undone on the way out (a temporary file
removed, zo's checkpoint written); a second signal after that KeyboardInterrupt was raised ends the
process at once, as outside.

Why Python's own handler is not enough (numba 0.68, CPython 3.11): a Numba function that returns an
array boxes it in native code, and that code first fetches the ndarray type by calling the Python
function numba.core.serialize._numba_unpickle. A SIGINT that arrived while the kernel ran is handled
at that function's first bytecode; the default handler raises KeyboardInterrupt there, the native
code does not look at the failed call, returns the array (the kernels return their `out` argument,
whose type it does not need) with the exception still set, and CPython reports `SystemError:
CPUDispatcher(<... _conv__...__threaded>) returned a result with an exception set`, the
KeyboardInterrupt as its cause. Setup spends most of its time in such kernels (the frozen prefix
over the whole data set): 1 to 2 Ctrl-C in 8 ended so.

The handler installed here raises KeyboardInterrupt at once, as Python's does, except:
- inside the function that Numba's native code calls (the cause above): the signal is recorded and
  raised at the first Python event outside it (a profile function set until then: the kernel's
  caller returning), or, should a profiler be running, at the next check() (a safe point: between
  chunks of a data set);
- inside deferred() (training, checkpoints, the export, where an exception in the middle of a step
  or a write would leave a state that the checkpoint written on interrupt must not record): the
  signal is recorded, and the training loop's check between steps raises it.
A signal recorded and not yet raised when the outermost guard ends is raised then.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
LINE = b"error: interrupted\n"
EXIT_STATUS = 130


class _State:
    installed = 0  # depth of nested guards; the handler is installed by the outermost
    deferring = 0
    pending = False
    raised = False  # a KeyboardInterrupt is on its way out: the next signal ends the process
    previous: dict = {}
    previous_hook = None
    end = None  # exit_on_signal's callback, called with the status before the process ends
    command = False  # exit_on_signal was called: this process is a command line, not a library's caller


_state = _State()


def _inside_native_callback(frame) -> bool:
    serialize = sys.modules.get("numba.core.serialize")
    callback = getattr(getattr(serialize, "_numba_unpickle", None), "__code__", None)
    while frame is not None and callback is not None:
        if frame.f_code is callback:
            return True
        frame = frame.f_back
    return False


def _raise_once_outside(frame, event, arg):
    """A profile function, set for as long as a signal recorded inside the callback waits: the first
    event of a frame outside it (the kernel's caller returning, the next call) raises it there."""
    if _inside_native_callback(frame) or frame.f_code is _unraisable.__code__:
        return
    sys.setprofile(None)
    if _state.pending and not _state.deferring:
        _state.pending = False
        _state.raised = True
        raise KeyboardInterrupt


def _unraisable(unraisable):
    """sys.unraisablehook within guarded(): a KeyboardInterrupt that Python could not raise (the
    handler ran inside a ctypes callback, llvmlite's object cache notification during a kernel load,
    or a __del__) and would print as "Exception ignored" and drop. It is recorded instead, and raised
    at the first Python event after (as a signal inside Numba's callback is)."""
    if not is_interrupt(unraisable.exc_value):
        (_state.previous_hook or sys.__unraisablehook__)(unraisable)
        return
    _state.raised = False
    _state.pending = True
    if not _state.deferring and sys.getprofile() is None:
        sys.setprofile(_raise_once_outside)


def ignore_further() -> None:
    """From the one line on: a second signal must not cut it, nor raise while the status is set."""
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, signal.SIG_IGN)


def end_now(signum=None, frame=None):
    """End the process at once: further signals ignored, the one line, the callback of
    exit_on_signal (the resident server's: the status to its client), exit 130."""
    ignore_further()
    try:
        os.write(2, LINE)
    except OSError:
        pass
    if _state.end is not None:
        try:
            _state.end(EXIT_STATUS)
        except BaseException:  # noqa: BLE001 - the process ends whatever the callback meets
            pass
    os._exit(EXIT_STATUS)


def end_command() -> None:
    """After a command has handled its interrupt (its temporary files removed): if this process is
    the command line (exit_on_signal was its first act), the one line, the status and exit 130 at
    once (end_now), stdout flushed first; else return (a library caller of the command gets the
    usual SystemExit). Why not Python's own exit: it first frees the frames the KeyboardInterrupt
    unwound, and one such frame may hold an array that a Numba kernel interrupted on its way out left
    with a wrong reference count; freeing it aborted the process after the line ("free(): double free
    detected", SIGABRT, once in several hundred signals into the kernels)."""
    if not _state.command:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: what it could not take is lost either way
            pass
    end_now()


def exit_on_signal(end=None) -> None:
    """The command line's first act: from here, a signal outside guarded() ends the process at once
    (end_now), after calling end(status) if given. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    _state.end, _state.command = end, True
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, end_now)


def _handler(signum, frame):
    if _state.raised:
        end_now()
    if _state.deferring:
        _state.pending = True
    elif _inside_native_callback(frame):
        _state.pending = True
        if sys.getprofile() is None:  # else (a profiler runs) the next check() raises it
            sys.setprofile(_raise_once_outside)
    else:
        _state.raised = True
        raise KeyboardInterrupt


def check(between_steps: bool = False):
    """A safe point: raise the interrupt recorded since the last one. Inside deferred(), only the
    training loop's own point (between_steps) raises; a chunk of an evaluation in the middle of a
    step leaves it to that point."""
    if _state.pending and (between_steps or not _state.deferring):
        _state.pending = False
        raise KeyboardInterrupt


class guarded:
    """Within: SIGINT, SIGTERM and SIGHUP (those not ignored) go through this module's handler (main
    thread only: signals are delivered there). defer=True records every interrupt for check(). On
    leaving the outermost guard the previous handlers are back, and an interrupt recorded but not
    yet raised is raised."""

    def __init__(self, defer: bool = False):
        self.defer = defer
        self.active = threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.active:
            if _state.installed == 0:
                taken = [s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
                _state.previous = {s: signal.signal(s, _handler) for s in taken}
                _state.pending = _state.raised = False
                _state.previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable
            _state.installed += 1
            _state.deferring += self.defer
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.active:
            return False
        _state.deferring -= self.defer
        _state.installed -= 1
        if _state.installed == 0:
            for s, previous in _state.previous.items():
                if signal.getsignal(s) is _handler:  # one set to SIG_IGN on the way out stays so
                    signal.signal(s, signal.SIG_DFL if previous is None else previous)
            if sys.getprofile() is _raise_once_outside:
                sys.setprofile(None)
            if sys.unraisablehook is _unraisable:
                sys.unraisablehook = _state.previous_hook or sys.__unraisablehook__
        if exc_type is None:
            check()
        return False


def deferred() -> guarded:
    return guarded(defer=True)


def is_interrupt(exc: BaseException) -> bool:
    """A KeyboardInterrupt, or an exception caused by one (the SystemError of the module docstring,
    should a handler other than this module's be installed)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
