"""Numba compilation for npusim: a cache keyed by the kernels' sources, and kernels that use
threads only when the work pays for them.

The cache. Numba revalidates a cached function against its own file only, but kernels inline code
from other modules (rounding.py's requantization, the LLVM intrinsics of output_stage.py) and some
are compiled from templates bound to another module's objects (jit.renamed): after an edit or an
upgrade there, a kernel would load stale machine code. So every kernel of the package is cached in
a directory named by a digest of the kernel sources: the files of npusim/kernels/, where every
compiled function and all it inlines live (kernel_sources). An edit there starts a fresh
directory; an edit elsewhere (the operators, graph.py, the interpreter, the command lines, the
STM32N6 view, the test oracles) recompiles nothing. The directory is
npusim/__pycache__/numba-<digest>, or, where the package is read-only, <user
cache>/npusim/numba-<digest>; NUMBA_CACHE_DIR, when set, takes the place of both. Only npusim's own
functions use these locators (per dispatcher): the rest of the process keeps Numba's.

Stale directories. Each process holds a shared lock (flock) on the directory it caches in, for its
whole life. A directory of other sources is removed once nobody holds it and nobody has used it for
STALE_AFTER_S, under an exclusive lock taken without waiting: workers of another version that run
at the same time (or have just started) keep their files.

The threads. A parallel region waits for its slowest thread: on a small machine that other
processes share, a thread that is not scheduled stalls the whole region for a scheduler quantum,
so many small threaded kernels can be tens of times slower than serial ones (measured on ResNet-8
at batch 8: 572 ms threaded, 9.4 ms serial, under load). Each kernel is compiled twice, serial and
threaded, and the call picks by the size of its largest array (or its own measure of work) and,
for the threaded form, by the cores free at the call (host.free_cores: the affinity mask, the
cgroup's CPU quota, the other processes' runnable threads): on one free core, the serial form; on
k, k threads.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import threading
import time
import types
import weakref
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: directories are kept, never pruned
    fcntl = None

import numba as nb
import numpy as np
from llvmlite import binding as ll
from numba.core import caching, codegen, compiler, config
from numba.core.runtime import rtsys

from . import host

KERNELS = Path(__file__).resolve().parent  # npusim/kernels/: the folder whose sources key the cache
PACKAGE = KERNELS.parent  # npusim/
# Work from which a parallel kernel runs threaded: elements of its largest array argument, or what
# its own measure of work (ParallelKernel's `work`) counts in the same units.
PARALLEL_MIN_WORK = 1 << 18
STALE_AFTER_S = 24 * 3600  # a cache directory of other sources, unused this long, may be pruned
_LOCK = ".in-use"  # each process holds a shared flock on this file of the directory it caches in


def kernel_sources(folder: Path = KERNELS) -> list[Path]:
    """The sources a compiled kernel can depend on: the Python files of npusim/kernels/, all of
    them and nothing else. Every Numba and LLVM function of npusim is defined here (tests/test_layout.py
    keeps them out of ops/), and what they inline or bind is here too: the rounding (rounding.py),
    the output-stage kinds (stages.py), the LLVM helpers. The modules imported from outside the
    folder (errors, graph, profiles, quant) serve the Python code that prepares parameters, never a
    compiled body or the LLVM code generation (tests/test_numba_cache.py checks it), so editing
    them, or the operators, the interpreter, the command lines, recompiles nothing."""
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def digest_of(folder: Path = KERNELS) -> str:
    """A digest of the kernel sources (names and contents). Reading and hashing the folder's files
    takes about a millisecond: no memo, no parse."""
    h = hashlib.sha256()
    for p in kernel_sources(folder):
        h.update(str(p.relative_to(folder)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:20]


@functools.cache
def sources_digest() -> str:
    """The digest of npusim's kernel sources, taken once per process: what it compiled its kernels from."""
    return digest_of(KERNELS)


_held: dict = {}  # cache directory -> the descriptor of its lock file, held for the process's life


def _lock_shared(directory: Path) -> int | None:
    """A shared flock on directory's lock file, the directory made if needed; retried when a pruner
    removed the directory between our open and our lock (the file we hold is then unlinked)."""
    for _ in range(3):
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / _LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                os.utime(path)  # its last use, which pruners read
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    return None


def prune(root: Path, keep: str, now: float | None = None) -> list[Path]:
    """Remove the numba-* directories of root other than `keep` that no process holds and that were
    last used more than STALE_AFTER_S ago; returns the ones removed."""
    if fcntl is None:
        return []
    now = time.time() if now is None else now
    removed = []
    for d in sorted(root.glob("numba-*")):
        if d.name == keep or not d.is_dir():
            continue
        lock = d / _LOCK
        try:
            used = max(d.stat().st_mtime, lock.stat().st_mtime if lock.exists() else 0.0)
            if now - used < STALE_AFTER_S:
                continue
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a process of those sources is running
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    return removed


def use_directory(directory: Path) -> None:
    """Hold directory (a numba-<digest> cache directory) for this process, then prune its stale
    siblings; once per directory and process."""
    key = str(directory)
    if fcntl is None or key in _held:
        return
    try:
        fd = _lock_shared(directory)
    except OSError:
        return
    if fd is None:
        return
    _held[key] = fd
    try:
        prune(directory.parent, directory.name)
    except OSError:
        pass


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
        locator = super().from_function(py_func, py_file)  # None where the directory is not writable
        if locator is not None:
            use_directory(cls.root() / f"numba-{sources_digest()}")
        return locator


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


class _LoadedLibrary(codegen.JITCodeLibrary):
    """A library loaded from npusim's cache whose module for linking, LLVM bitcode, is parsed only when
    a compile links it into another function. Numba parses it on every load, and lists its defined
    symbols from it, for its machine code comes from the object code beside it: in a fresh process
    that parse was most of a kernel's load (MobileNetV2's 13 kernels: 80 ms of parsing, a depthwise
    kernel's 430 KB of bitcode 35 ms). The symbol names are stored at save time instead."""

    _bitcode = None
    _parsed = None

    @property
    def _shared_module(self):
        if self._parsed is None and self._bitcode is not None:
            self._parsed, self._bitcode = ll.parse_bitcode(self._bitcode), None
        return self._parsed

    @_shared_module.setter
    def _shared_module(self, module):
        self._parsed = module

    @classmethod
    def load(cls, codegen_, name, object_code, bitcode, symbols):
        """What codegen's unserialize does with an 'object' library, but the bitcode kept unparsed."""
        self = cls(codegen_, name)
        self.enable_object_caching()
        self._set_compiled_object(object_code)
        self._bitcode = bitcode
        self._finalize_final_module()
        codegen_._engine._defined_symbols.update(symbols)
        return self


def _defined_symbols(module) -> tuple:
    """The names a module defines: what Numba's JIT engine records of a library it loads."""
    values = (*module.functions, *module.global_variables)
    return tuple(v.name for v in values if not v.is_declaration)


# The fields of Numba's CompileResult that rebuild() fills, as Numba 0.68 defines them; a Numba whose
# fields differ loads entries its own way.
_CR_FIELDS = (
    "typing_context", "target_context", "entry_point", "typing_error", "type_annotation", "signature",
    "objectmode", "lifted", "fndesc", "library", "call_helper", "environment", "metadata",
    "reload_init", "referenced_envs",
)  # fmt: skip


@functools.cache
def _lazy_load_fits() -> bool:
    """Whether this Numba has the internals that _LoadedLibrary and rebuild() use, as 0.68 has them."""
    return (
        tuple(getattr(compiler, "CR_FIELDS", ())) == _CR_FIELDS
        and all(hasattr(codegen.JITCodeLibrary, a) for a in ("enable_object_caching", "_set_compiled_object"))
        and hasattr(codegen.JitEngine, "is_symbol_defined")
    )


class _CacheImpl(caching.CompileResultCacheImpl):
    """Numba's cache of compile results, with each library's defined symbols saved beside it
    (_LoadedLibrary)."""

    _locator_classes = [_GivenDirLocator, _PackageLocator, _UserLocator]

    def reduce(self, cres):
        payload = super().reduce(cres)
        name, kind, data = payload[0]
        if kind != "object":
            return payload
        symbols = _defined_symbols(cres.library._get_module_for_linking())
        return ((name, "object+symbols", (*data, symbols)), *payload[1:])

    def rebuild(self, target_context, payload):
        name, kind, data = payload[0]
        if kind != "object+symbols":
            return super().rebuild(target_context, payload)
        if len(payload) != 9 or not _lazy_load_fits():  # another Numba's internals: its own load
            return super().rebuild(target_context, ((name, "object", data[:-1]), *payload[1:]))
        _, fndesc, env, signature, objectmode, lifted, typeann, reload_init, envs = payload
        # numba.core.compiler.CompileResult._rebuild, with the library loaded as _LoadedLibrary.
        for fn in reload_init or ():
            fn()
        library = _LoadedLibrary.load(target_context.codegen(), name, *data)
        cres = compiler.CompileResult(
            target_context=target_context,
            typing_context=target_context.typing_context,
            library=library,
            environment=env,
            entry_point=target_context.get_executable(library, fndesc, env),
            fndesc=fndesc,
            type_annotation=typeann,
            signature=signature,
            objectmode=objectmode,
            lifted=lifted,
            typing_error=None,
            call_helper=None,
            metadata=None,
            reload_init=reload_init,
            referenced_envs=envs,
        )
        for e in envs:
            library.codegen.set_env(e.env_name, e)
        return cres


class _FunctionCache(caching.FunctionCache):
    """Numba's FunctionCache, loading without setting up the whole target.

    Numba refreshes its CPU target before every cache load: that imports and installs all its
    lowering registries (numba.np.arraymath, numba.typed, the cpython implementations...), about
    0.4 s of CPU in a fresh process, which only compiling needs. Machine code loaded from the cache
    needs the runtime (NRT) alone. So a load initializes NRT; a miss, which Numba's compiler follows,
    sets the full target up first (set_up_target, with its cheaper BLAS check)."""

    _impl_class = _CacheImpl

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        cres = None  # also where the guard swallows an error (Windows: EACCES)
        with self._guard_against_spurious_io_errors():
            cres = self._load_overload(sig, target_context)
        if cres is None:
            set_up_target()
        return cres

    def save_overload(self, sig, data):
        """A cache that cannot be written (a full disk, a file-size limit, a read-only folder) is no
        cache: the compiled kernel runs, and the next process compiles again. Numba lets such an
        OSError out of the call that compiled, which would end a run for its cache's sake."""
        try:
            super().save_overload(sig, data)
        except OSError:
            pass


class _LazyCache:
    """A dispatcher's _FunctionCache, made when the dispatcher first compiles or loads: making one
    finds its directory and tries a file in it, 0.4 ms each, and a run calls a fraction of the 60
    kernels that its ops' modules define."""

    def __init__(self, fn):
        self._fn = fn

    @functools.cached_property
    def _cache(self):
        return _FunctionCache(self._fn)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_fn":  # copy and pickle probe before __init__ ran
            raise AttributeError(name)
        return getattr(self._cache, name)


# The serial kernels defined so far, by "module:qualname": what a process that forks for its work
# (npusim/app/resident.py) may load before it forks. A threaded kernel's load starts Numba's thread pool,
# which a fork does not carry over, so those are not listed.
SERIAL_KERNELS = weakref.WeakValueDictionary()


def njit(fn=None, **flags):
    """numba.njit with npusim's cache (as cache=True, in the directory of the sources' digest)."""

    def decorate(f):
        dispatcher = nb.njit(**flags)(f)
        dispatcher._cache = _LazyCache(f)  # what Dispatcher.enable_caching does, with our locators
        # The digest of the sources as they are when the kernel is defined, not at its first call:
        # a source edited in between (a notebook) must not key the old code's machine code.
        sources_digest()
        if not flags.get("parallel"):
            SERIAL_KERNELS[f"{f.__module__}:{f.__qualname__}"] = dispatcher
        return dispatcher

    return decorate if fn is None else decorate(fn)


def loaded_serial_kernels() -> list:
    """(key, signature) of every serial kernel's loaded machine code in this process."""
    return [(key, sig) for key, d in list(SERIAL_KERNELS.items()) for sig in list(d.overloads)]


def load_serial_kernel(key: str, sig) -> bool:
    """Load a serial kernel's machine code for sig from the cache as its first call would, never
    compiling; whether it is loaded (False: no such kernel defined here, or not in the cache)."""
    from numba.core.compiler_lock import global_compiler_lock

    dispatcher = SERIAL_KERNELS.get(key)
    if dispatcher is None:
        return False
    with global_compiler_lock:
        if tuple(sig) in dispatcher.overloads:
            return True
        cres = dispatcher._cache.load_overload(sig, dispatcher.targetctx)
        if cres is None:
            return False
        dispatcher.targetctx.insert_user_function(cres.entry_point, cres.fndesc, [cres.library])
        dispatcher.add_overload(cres)  # what Dispatcher.compile does with a cache hit
    return True


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


_FORMS = threading.local()  # .both, set by both_forms() in this thread only


class ParallelKernel:
    """fn compiled serially and threaded; a call takes the threaded form from PARALLEL_MIN_WORK of
    work: by default the size of the largest array argument, which measures element-wise kernels
    but not a convolution, whose work per output grows with its reduction (a 16x16x64 3x3 layer at
    batch 8 has small arrays and 75 MMAC): `work(args)`, if given, measures it instead."""

    def __init__(self, fn, work=None):
        self.work = work
        self.serial = njit(fn)
        self.threaded = njit(renamed(fn, "threaded"), parallel=True)  # its own cache entry (renamed)
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __call__(self, *args):
        # Every kernel call of a run passes here (some 250 a YOLOv8n run): a plain loop, where a
        # generator under max() took 4.7 us of a 6.7 us call.
        if _FORMS.__dict__.get("both"):
            self.threaded(*args)
            return self.serial(*args)
        if self.work is not None:
            work = self.work(args)
        else:
            work = 0
            for a in args:
                if isinstance(a, np.ndarray) and a.size > work:
                    work = a.size
        if work < PARALLEL_MIN_WORK:
            return self.serial(*args)
        # Threads only on cores free now (affinity, cgroup quota, the run queue): a region with
        # more threads than free cores waits at its end for a descheduled one.
        # The caller's numba.set_num_threads stays the ceiling.
        ceiling = nb.get_num_threads()
        threads = min(host.free_cores(), ceiling)
        if threads < 2:
            return self.serial(*args)
        if threads == ceiling:
            return self.threaded(*args)
        nb.set_num_threads(threads)
        try:
            return self.threaded(*args)
        finally:
            nb.set_num_threads(ceiling)


@contextlib.contextmanager
def both_forms():
    """Within it, every parallel kernel called by this thread runs in both its forms, threaded then
    serial, and so loads both (Interpreter's warm-up: a small batch then loads what a large one
    calls). Other threads' calls are not affected."""
    before = getattr(_FORMS, "both", False)
    _FORMS.both = True
    try:
        yield
    finally:
        _FORMS.both = before


def parallel_kernel(fn) -> ParallelKernel:
    """Decorator for a function written with numba.prange (a plain range when compiled serially)."""
    return ParallelKernel(fn)


_BLAS_CHECK = "scipy.linalg.cython_blas"


@functools.cache
def set_up_target() -> None:
    """Set up Numba's CPU target once, before the first kernel compiles (a cache miss calls it).

    Numba does it on the first compiled function a process loads, and on the way imports
    numba.np.arraymath, which imports scipy.linalg.cython_blas only to learn whether BLAS is there
    for np.dot: that import runs scipy.linalg's package, about 0.3 s of a one-shot `npusim run`'s
    1.8 s of CPU (docs/performance.md). npusim's kernels call no BLAS from compiled code, so the
    check is given the extension module loaded by itself, and the entry is taken out of sys.modules
    again afterwards: the process is left with less imported than Numba alone would leave, and a
    later np.dot in compiled code (the caller's own) imports scipy.linalg in full as it always does.
    Where the module is not found, Numba's own check runs."""
    import importlib.machinery
    import importlib.util
    import sys

    if "numba.np.arraymath" in sys.modules or _BLAS_CHECK in sys.modules:
        return
    scipy = importlib.util.find_spec("scipy")
    folders = list(scipy.submodule_search_locations or ()) if scipy else []
    paths = [
        Path(folder, "linalg", "cython_blas" + suffix)
        for folder in folders
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    ]
    path = next((p for p in paths if p.is_file()), None)
    module = None
    if path is not None:
        try:
            spec = importlib.util.spec_from_file_location(_BLAS_CHECK, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[_BLAS_CHECK] = module
        except Exception:  # noqa: BLE001 - any failure: Numba's own import decides, as without this
            module = None
    try:
        from numba.core.registry import cpu_target

        cpu_target.target_context.refresh()
    finally:
        ours = module is not None and sys.modules.get(_BLAS_CHECK) is module
        if ours and "scipy.linalg" not in sys.modules:
            del sys.modules[_BLAS_CHECK]
