"""Numba compilation for npusim: a cache keyed by the package's sources, and kernels that use
threads only when the work pays for them.

The cache. Numba revalidates a cached function against its own file only, but kernels inline code
from other modules (quant.py's rounding, the LLVM intrinsics of engines/output_stage.py): after an edit
or an upgrade there, a kernel would load stale machine code. So every kernel of the package is
cached in a directory named by a digest of all its sources: a change anywhere starts a fresh
directory, and nothing is ever deleted, so processes of different versions (or concurrent workers
of one) never remove each other's files. The directory is npusim/__pycache__/numba-<digest>, or,
where the package is read-only, <user cache>/npusim/numba-<digest>; NUMBA_CACHE_DIR, when set,
takes the place of both. Only npusim's own functions use these locators (per dispatcher): the
rest of the process keeps Numba's.

The threads. A parallel region waits for its slowest thread: on a small machine that other
processes share, a thread that is not scheduled stalls the whole region for a scheduler quantum,
so many small threaded kernels can be tens of times slower than serial ones (measured on ResNet-8
at batch 8: 572 ms threaded, 9.4 ms serial, under load). Each kernel is compiled twice, serial and
threaded, and the call picks by the size of its largest array.
"""

from __future__ import annotations

import functools
import hashlib
import os
import types
from pathlib import Path

import numba as nb
import numpy as np
from numba.core import caching, config

PACKAGE = Path(__file__).resolve().parent
PARALLEL_MIN_WORK = 1 << 18  # elements of the largest array argument


def digest_of(package: Path) -> str:
    """A digest of every source file under package (names and contents)."""
    h = hashlib.sha256()
    for p in sorted(package.rglob("*.py")):
        h.update(str(p.relative_to(package)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:20]


@functools.cache
def sources_digest() -> str:
    """npusim's digest, taken once per process: the sources it compiled its kernels from."""
    return digest_of(PACKAGE)


def user_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "npusim"


class _DigestLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Caches a function of the package under root/numba-<digest>/<its module's folder>. The
    source stamp is the digest too: within a directory every entry belongs to these sources."""

    package = PACKAGE

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        folder = Path(py_file).resolve().parent.relative_to(self.package)
        self._cache_path = str(self.root() / f"numba-{sources_digest()}" / folder)

    @classmethod
    def root(cls) -> Path:
        raise NotImplementedError

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return sources_digest()

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            Path(py_file).resolve().relative_to(cls.package)
        except ValueError:
            return None
        return super().from_function(py_func, py_file)  # None where the directory is not writable


class _GivenDirLocator(_DigestLocator):
    @classmethod
    def root(cls):
        return Path(config.CACHE_DIR) / "npusim"

    @classmethod
    def from_function(cls, py_func, py_file):
        return super().from_function(py_func, py_file) if config.CACHE_DIR else None


class _PackageLocator(_DigestLocator):
    @classmethod
    def root(cls):
        return cls.package / "__pycache__"


class _UserLocator(_DigestLocator):
    @classmethod
    def root(cls):
        return user_cache_dir()


class _CacheImpl(caching.CompileResultCacheImpl):
    _locator_classes = [_GivenDirLocator, _PackageLocator, _UserLocator]


class _FunctionCache(caching.FunctionCache):
    _impl_class = _CacheImpl


def njit(fn=None, **flags):
    """numba.njit with npusim's cache (as cache=True, in the directory of the sources' digest)."""

    def decorate(f):
        dispatcher = nb.njit(**flags)(f)
        dispatcher._cache = _FunctionCache(f)  # what Dispatcher.enable_caching does, with our locators
        return dispatcher

    return decorate if fn is None else decorate(fn)


def renamed(fn, suffix: str, **globals_):
    """A copy of fn whose qualified name ends in __suffix, with the given global names bound to other
    objects (the rest of its module's globals as they are now). Numba's cache is keyed by a
    function's qualified name and signature, not by its flags or by what its globals hold: two
    compilations of one function would load each other's machine code, the copy gets its own entry."""
    namespace = dict(fn.__globals__, **globals_) if globals_ else fn.__globals__
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = f"{fn.__qualname__}__{suffix}"
    copy.__doc__ = fn.__doc__
    return copy


class ParallelKernel:
    def __init__(self, fn):
        self.serial = njit(fn)
        self.threaded = njit(renamed(fn, "threaded"), parallel=True)  # its own cache entry (renamed)
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __call__(self, *args):
        work = max((a.size for a in args if isinstance(a, np.ndarray)), default=0)
        return (self.threaded if work >= PARALLEL_MIN_WORK else self.serial)(*args)


def parallel_kernel(fn) -> ParallelKernel:
    """Decorator for a function written with numba.prange (a plain range when compiled serially)."""
    return ParallelKernel(fn)
