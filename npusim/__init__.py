"""npusim: a bit-exact INT8 simulator of a Neural-ART-style NPU, with TFLite Micro's integer numerics.

Importing npusim leaves the process as it was (no environment variables, malloc settings or OS
permissions change); a program that runs npusim for a long time calls tune_process() once (the
`npusim` and `zo` command lines and the benchmark do).
"""

from .errors import NpusimError
from .graph import Graph, Op, Quantization, Tensor
from .interpreter import Interpreter
from .model_io import load_model, write_model
from .tuning import tune_process

__version__ = "0.1.0"
__all__ = [
    "Graph",
    "Interpreter",
    "NpusimError",
    "Op",
    "Quantization",
    "Tensor",
    "load_model",
    "tune_process",
    "write_model",
    "__version__",
]
