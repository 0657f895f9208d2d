"""npusim: a bit-exact INT8 simulator of a Neural-ART-style NPU, with TFLite Micro's integer numerics."""
import os

# Numba's OpenMP layer spin-waits between parallel regions, and so do OpenBLAS's threads between
# GEMMs: on a 2-core machine the two pools then steal each other's cores (measured: several times
# slower). The workqueue layer sleeps instead. An explicit NUMBA_THREADING_LAYER still wins.
if "NUMBA_THREADING_LAYER" not in os.environ:
    os.environ["NUMBA_THREADING_LAYER"] = "workqueue"
    import numba  # noqa: E402  (numba may already be imported by the caller: set its config too)

    numba.config.THREADING_LAYER = "workqueue"

from .errors import NpusimError
from .graph import Graph, Op, Quantization, Tensor
from .interpreter import Interpreter
from .tflite_io import load_model, write_model

__version__ = "0.1.0"
__all__ = ["Graph", "Interpreter", "NpusimError", "Op", "Quantization", "Tensor", "load_model", "write_model", "__version__"]
