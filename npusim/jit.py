"""Numba kernels that use threads only when the work pays for them.

A parallel region waits for its slowest thread: on a small machine that other processes share,
a thread that is not scheduled stalls the whole region for a scheduler quantum, so many small
threaded kernels can be tens of times slower than serial ones (measured on ResNet-8 at batch 8:
572 ms threaded, 9.4 ms serial, under load). Each kernel is compiled twice, serial and threaded,
and the call picks by the size of its largest array.
"""
from __future__ import annotations

import types

import numba as nb
import numpy as np

PARALLEL_MIN_WORK = 1 << 18  # elements of the largest array argument


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
