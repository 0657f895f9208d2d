"""Ctrl-C during a zo run: a KeyboardInterrupt at a point where it is safe, never another exception.

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

import signal
import sys
import threading


class _State:
    installed = 0  # depth of nested guards; the handler is installed by the outermost
    deferring = 0
    pending = False
    previous = None


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
    if _inside_native_callback(frame):
        return
    sys.setprofile(None)
    if _state.pending and not _state.deferring:
        _state.pending = False
        raise KeyboardInterrupt


def _handler(signum, frame):
    if _state.deferring:
        _state.pending = True
    elif _inside_native_callback(frame):
        _state.pending = True
        if sys.getprofile() is None:  # else (a profiler runs) the next check() raises it
            sys.setprofile(_raise_once_outside)
    else:
        raise KeyboardInterrupt


def check(between_steps: bool = False):
    """A safe point: raise the interrupt recorded since the last one. Inside deferred(), only the
    training loop's own point (between_steps) raises; a chunk of an evaluation in the middle of a
    step leaves it to that point."""
    if _state.pending and (between_steps or not _state.deferring):
        _state.pending = False
        raise KeyboardInterrupt


class guarded:
    """Within: SIGINT goes through this module's handler (main thread only: signals are delivered
    there). defer=True records every interrupt for check(). On leaving the outermost guard the
    previous handler is back, and an interrupt recorded but not yet raised is raised."""

    def __init__(self, defer: bool = False):
        self.defer = defer
        self.active = threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.active:
            if _state.installed == 0:
                _state.previous = signal.signal(signal.SIGINT, _handler)
                _state.pending = False
            _state.installed += 1
            _state.deferring += self.defer
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.active:
            return False
        _state.deferring -= self.defer
        _state.installed -= 1
        if _state.installed == 0:
            previous = _state.previous
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
            if sys.getprofile() is _raise_once_outside:
                sys.setprofile(None)
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
