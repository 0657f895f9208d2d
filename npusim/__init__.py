"""npusim: a bit-exact INT8 simulator of a Neural-ART-style NPU, with TFLite Micro's integer numerics.

Importing npusim leaves the process as it was (no environment variables, malloc settings or OS
permissions change); a program that runs npusim for a long time calls tune_process() once (the
`npusim` and `zo` command lines and the benchmark do). Importing it is cheap too: the names below
load their modules (and Numba, with the interpreter) when first used, so reading npusim.registry
or npusim.errors imports no kernel.
"""

import importlib

from .errors import NpusimError

__version__ = "0.1.0"
_LAZY = {
    "Graph": "graph",
    "Op": "graph",
    "Quantization": "graph",
    "Tensor": "graph",
    "Interpreter": "runtime.interpreter",
    "load_model": "formats.model_io",  # .tflite or .onnx, by the file's content
    "write_model": "formats.model_io",
    "tune_process": "kernels.tuning",
}
__all__ = ["NpusimError", "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'npusim' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
