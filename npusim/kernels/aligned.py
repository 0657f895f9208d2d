"""Arrays whose data starts on a 64-byte boundary (one cache line, one ZMM register, one AMX tile row).

The VNNI and AMX kernels load filters, parameters and activations 64 bytes at a time: from an
address that is not 64-byte aligned every such load splits across two cache lines, which made
the same convolution run at half speed or at full speed depending on where malloc put the filters.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
import os
import threading
import weakref

import numpy as np

ALIGN = 64
# Large arrays start on a 2 MB boundary and ask Linux for transparent huge pages (which this
# kernel grants on request only, "madvise" mode): a fresh page costs a fault, about 2 to 7 us in
# this VM, and a 50 MB activation of MobileNetV2 at batch 256 paid 80 ms of 4 KB faults.
# Then the pages are populated before a kernel writes them: page faults taken by two threads of a
# parallel kernel at once serialize in the kernel's memory map (measured: a 50 MB conv output took
# 48 to 93 ms when it faulted inside the kernel, 19 ms when populated first). Only from 16 MB on:
# populating costs a walk of the range even where malloc hands back pages already in memory (40 us
# for 1 MB), and a first run's fresh pages of a few MB took longer populated than faulted in by
# the kernel (ResNet-8 at batch 256, largest activation 4 MB, first run in a fresh process: 63 to
# 72 ms with every array from 256 KB populated, 27 to 28 ms from 16 MB; warm runs 2 to 5% faster
# from 4 MB on than from 256 KB, ResNet-8 and MobileNetV2; /tmp drivers, in turn, 3 processes each).
HUGE_PAGE = 2 << 20
POPULATE_MIN = 16 << 20  # also the least size that asks for huge pages
_MADV_HUGEPAGE, _MADV_POPULATE_WRITE = 14, 23
PAGE = 4096


def _libc_function(name: str):
    """A function of the C library, or None where there is none such (not glibc, not Linux)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def _madvise():
    """madvise(2), looked up on the first large array (not at import), or None."""
    fn = _libc_function("madvise")
    if fn is not None:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


def keep_freed_memory():
    """glibc hands big arrays out as fresh mmap'd pages and unmaps them on free, so every op output
    of a run paid a page fault per 4 KB (about 2 us each here; a ResNet-8 run at batch 256 paid
    several ms). Serving them from the heap and not trimming it lets a run reuse the memory of the
    activations it dropped: resident memory stays at the peak of a run instead of falling back.
    Arrays above malloc's reach come from the pool below from then on. Process-wide, so only
    npusim.tune_process() calls it; NPUSIM_MALLOPT=0 leaves malloc as it is (the pool still serves)."""
    global _pooling
    _pooling = True
    mallopt = _libc_function("mallopt")
    if os.environ.get("NPUSIM_MALLOPT", "1") == "0" or mallopt is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest: bigger arrays stay mmap'd
    mallopt(m_trim_threshold, (1 << 31) - 1)


# Arrays too large for malloc to reuse (glibc maps anything above 32 MB afresh and unmaps it on
# free: the kernel zeroes every page again, 7 ms for a 50 MB activation) come from a pool of
# mappings: when the last view of one dies, its mapping goes back to the pool for the next array
# of that size. The pool keeps at most POOL_LIMIT bytes of free mappings. It holds memory for the
# life of the process, so it serves only after keep_freed_memory() (npusim.tune_process) turned it on.
POOL_MIN = 32 << 20
POOL_LIMIT = 1 << 30
_pooling = False
_pool: list = []  # free (size, mapping), oldest first
_pool_lock = threading.Lock()


def _release(mapping, size):
    """Called as the last view of a pooled array dies. Over POOL_LIMIT, the oldest free mappings
    are dropped, so that a new batch size is not left without a pool by the old one's buffers."""
    with _pool_lock:
        _pool.append((size, mapping))
        total = sum(n for n, _ in _pool)
        while total > POOL_LIMIT and len(_pool) > 1:
            n, old = _pool.pop(0)
            total -= n
            try:
                old.close()  # a free mapping has no views left
            except BufferError:  # its last array is still being torn down: it closes itself then
                pass


def _pooled_bytes(nbytes: int) -> np.ndarray:
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    mapping = None
    with _pool_lock:
        for i in range(len(_pool) - 1, -1, -1):  # the most recently freed first
            if _pool[i][0] == size:
                mapping = _pool.pop(i)[1]
                break
    fresh = mapping is None
    if fresh:
        # Private: Python's default for an anonymous mapping is MAP_SHARED, which Linux backs with
        # shmem, and shmem takes no transparent huge pages here (shmem_enabled "never"): a 52 MB
        # activation then populated as 4 KB pages in 42 to 56 ms, and as 2 MB ones in 6 to 11 ms
        # (one outlier of 78 of 5; fresh processes, in turn).
        private = getattr(mmap, "MAP_PRIVATE", None)
        if private is None:  # not POSIX
            mapping = mmap.mmap(-1, size)
        else:
            mapping = mmap.mmap(-1, size, flags=private | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(mapping, dtype=np.uint8)
    weakref.finalize(raw, _release, mapping, size).atexit = False  # raw lives as long as any view of it
    madvise = _madvise()
    if fresh and madvise is not None:
        madvise(raw.ctypes.data, size, _MADV_HUGEPAGE)
        madvise(raw.ctypes.data, size, _MADV_POPULATE_WRITE)
    return raw[:nbytes]


def empty(shape, dtype) -> np.ndarray:
    # Every op output comes from here, so the common case (small, not pooled) is kept cheap: 3 us
    # where np.prod over the shape and ndarray.ctypes took 12 (a 250-op model allocates ~100 arrays
    # a run).
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < POPULATE_MIN:
        raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
        start = -raw.__array_interface__["data"][0] % ALIGN
        return raw[start : start + nbytes].view(dtype).reshape(shape)
    if nbytes >= POOL_MIN and _pooling:
        return _pooled_bytes(nbytes).view(dtype).reshape(shape)  # page aligned
    madvise = _madvise()
    align = HUGE_PAGE if madvise is not None else ALIGN
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    # Hints: where the kernel refuses them (older Linux), the array is still correct, just slower.
    if align == HUGE_PAGE:
        madvise(raw.ctypes.data + start, nbytes // HUGE_PAGE * HUGE_PAGE, _MADV_HUGEPAGE)
    if madvise is not None:
        first = raw.ctypes.data + start + (-(raw.ctypes.data + start) % PAGE)
        last = (raw.ctypes.data + start + nbytes) // PAGE * PAGE
        madvise(first, last - first, _MADV_POPULATE_WRITE)
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def zeros(shape, dtype) -> np.ndarray:
    a = empty(shape, dtype)
    a.fill(0)
    return a


class Workspace:
    """A scratch buffer that a kernel keeps between calls (fresh pages cost a page fault each,
    about 2 us here: a 3 MB padded copy paid 1.5 ms of faults per call). get() returns an aligned
    view of the requested shape, growing the buffer when needed. Not for use by two threads at once;
    the contents are not kept for the next user (an Interpreter's convolutions share one, as they
    run one at a time)."""

    def __init__(self):
        self._raw = np.empty(0, dtype=np.uint8)

    def get(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if self._raw.size < nbytes:
            self._raw = empty(nbytes, np.uint8)
        return self._raw[:nbytes].view(dtype).reshape(shape)
