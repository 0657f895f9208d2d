"""Arrays whose data starts on a 64-byte boundary (one cache line, one ZMM register, one AMX tile row).

The VNNI and AMX kernels load filters, parameters and activations 64 bytes at a time: from an
address that is not 64-byte aligned every such load splits across two cache lines, which made
the same convolution run at half speed or at full speed depending on where malloc put the filters.
"""
from __future__ import annotations

import numpy as np

ALIGN = 64


def empty(shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


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
