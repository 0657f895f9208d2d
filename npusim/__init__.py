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


from .ops import aligned as _aligned  # noqa: E402

_aligned.keep_freed_memory()

from .errors import NpusimError
from .graph import Graph, Op, Quantization, Tensor
from .interpreter import Interpreter
from .tflite_io import load_model, write_model

__version__ = "0.1.0"
__all__ = ["Graph", "Interpreter", "NpusimError", "Op", "Quantization", "Tensor", "load_model", "write_model", "__version__"]
