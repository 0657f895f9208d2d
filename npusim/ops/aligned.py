"""Arrays whose data starts on a 64-byte boundary (one cache line, one ZMM register, one AMX tile row).

The VNNI and AMX kernels load filters, parameters and activations 64 bytes at a time: from an
address that is not 64-byte aligned every such load splits across two cache lines, which made
the same convolution run at half speed or at full speed depending on where malloc put the filters.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

ALIGN = 64
# Large arrays start on a 2 MB boundary and ask Linux for transparent huge pages (which this
# kernel grants on request only, "madvise" mode): a fresh page costs a fault, about 2 to 7 us in
# this VM, and a 50 MB activation of MobileNetV2 at batch 256 paid 80 ms of 4 KB faults.
# Then the pages are populated before a kernel writes them: page faults taken by two threads of a
# parallel kernel at once serialize in the kernel's memory map (measured: a 50 MB conv output took
# 48 to 93 ms when it faulted inside the kernel, 19 ms when populated first).
HUGE_PAGE = 2 << 20
HUGE_MIN = 2 * HUGE_PAGE
POPULATE_MIN = 256 << 10
_MADV_HUGEPAGE, _MADV_POPULATE_WRITE = 14, 23
PAGE = 4096


def _madvise():
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_madvise_fn = _madvise()


def empty(shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    align = HUGE_PAGE if nbytes >= HUGE_MIN and _madvise_fn is not None else ALIGN
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    # Hints: where the kernel refuses them (older Linux), the array is still correct, just slower.
    if align == HUGE_PAGE:
        _madvise_fn(raw.ctypes.data + start, nbytes // HUGE_PAGE * HUGE_PAGE, _MADV_HUGEPAGE)
    if nbytes >= POPULATE_MIN and _madvise_fn is not None:
        first = raw.ctypes.data + start + (-(raw.ctypes.data + start) % PAGE)
        last = (raw.ctypes.data + start + nbytes) // PAGE * PAGE
        _madvise_fn(first, last - first, _MADV_POPULATE_WRITE)  # already-mapped pages cost nothing
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def zeros(shape, dtype) -> np.ndarray:
    a = empty(shape, dtype)
    a.fill(0)
    return a


class Workspace:
    """A scratch buffer that a kernel keeps between calls (fresh pages cost a page fault each,
    about 2 us here: a 3 MB padded copy paid 1.5 ms of faults per call). get() returns an aligned
    view of the requested shape, growing the buffer when needed. One per kernel; not for use by two
    threads at once."""

    def __init__(self):
        self._raw = np.empty(0, dtype=np.uint8)

    def get(self, shape, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._raw.size < nbytes:
            self._raw = empty(nbytes, np.uint8)
        return self._raw[:nbytes].view(dtype).reshape(shape)
