"""npusim: a bit-exact INT8 simulator of a Neural-ART-style NPU, with TFLite Micro's integer numerics."""
import os

# Which Numba threading layer: where the MAC ops run on the float32 BLAS (hosts without AVX-512
# VNNI), OpenMP's spin-waiting workers and OpenBLAS's threads steal each other's cores on a small
# machine (measured: several times slower), so the workqueue layer, which sleeps, is used. With the
# VNNI/AMX kernels no BLAS runs, and OpenMP starts each parallel region sooner (measured on the
# batch-16 conv: 1.9 ms against 2.6 ms with workqueue): Numba's default choice is kept. An explicit
# NUMBA_THREADING_LAYER still wins.
# (Importing the kernels compiles nothing: the layer is taken at the first parallel call.)
if "NUMBA_THREADING_LAYER" not in os.environ:
    import numba  # noqa: E402  (numba may already be imported by the caller: set its config too)

    from .ops import vnni as _vnni

    if not _vnni.ENABLED:
        os.environ["NUMBA_THREADING_LAYER"] = "workqueue"
        numba.config.THREADING_LAYER = "workqueue"


def _keep_freed_memory():
    """glibc hands big arrays out as fresh mmap'd pages and unmaps them on free, so every op output
    of a run paid a page fault per 4 KB (about 2 us each here; a ResNet-8 run at batch 256 paid
    several ms). Serving them from the heap and not trimming it lets a run reuse the memory of the
    activations it dropped: resident memory stays at the peak of a run instead of falling back.
    NPUSIM_MALLOPT=0 leaves malloc as it is."""
    if os.environ.get("NPUSIM_MALLOPT", "1") == "0":
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest: bigger arrays stay mmap'd
    mallopt(m_trim_threshold, (1 << 31) - 1)


_keep_freed_memory()

from .errors import NpusimError
from .graph import Graph, Op, Quantization, Tensor
from .interpreter import Interpreter
from .tflite_io import load_model, write_model

__version__ = "0.1.0"
__all__ = ["Graph", "Interpreter", "NpusimError", "Op", "Quantization", "Tensor", "load_model", "write_model", "__version__"]
