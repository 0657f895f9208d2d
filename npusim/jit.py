"""Numba kernels that use threads only when the work pays for them.

A parallel region waits for its slowest thread: on a small machine that other processes share,
a thread that is not scheduled stalls the whole region for a scheduler quantum, so many small
threaded kernels can be tens of times slower than serial ones (measured on ResNet-8 at batch 8:
572 ms threaded, 9.4 ms serial, under load). Each kernel is compiled twice, serial and threaded,
and the call picks by the size of its largest array.
"""
from __future__ import annotations

import hashlib
import types
from pathlib import Path

import numba as nb
import numpy as np

PARALLEL_MIN_WORK = 1 << 18  # elements of the largest array argument


def drop_stale_cache(package: Path = Path(__file__).resolve().parent) -> bool:
    """Numba revalidates a cached function against its own file only, but kernels inline code from
    other modules (quant.py's rounding, the LLVM intrinsics of ops/output_stage.py): after an edit
    or an upgrade there, a kernel would load stale machine code. So the whole package's cache is
    dropped whenever any of its sources changed (a hash of them kept beside the cache). Returns
    whether it was dropped. Only Numba's default cache location is managed."""
    sources = sorted(package.rglob("*.py"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    stamp = package / "__pycache__" / "numba-sources.sha256"
    try:
        if stamp.read_text() == digest:
            return False
    except OSError:
        pass
    for cached in list(package.rglob("__pycache__/*.nbi")) + list(package.rglob("__pycache__/*.nbc")):
        cached.unlink(missing_ok=True)
    try:
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: Numba then cannot cache there either
        pass
    return True


drop_stale_cache()


class ParallelKernel:
    def __init__(self, fn):
        self.serial = nb.njit(cache=True)(fn)
        # Numba's cache is keyed by the function's qualified name and signature, not its flags: the
        # two twins of one function would load each other's machine code. A copy of the function
        # under another name gets its own cache entry.
        twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        twin.__qualname__ = fn.__qualname__ + "__threaded"
        self.threaded = nb.njit(cache=True, parallel=True)(twin)
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __call__(self, *args):
        work = max((a.size for a in args if isinstance(a, np.ndarray)), default=0)
        return (self.threaded if work >= PARALLEL_MIN_WORK else self.serial)(*args)


def parallel_kernel(fn) -> ParallelKernel:
    """Decorator for a function written with numba.prange (a plain range when compiled serially)."""
    return ParallelKernel(fn)
