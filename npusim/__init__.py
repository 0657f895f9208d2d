"""npusim: a bit-exact INT8 simulator of a Neural-ART-style NPU, with TFLite Micro's integer numerics."""
from .errors import NpusimError
from .graph import Graph, Op, Quantization, Tensor
from .interpreter import Interpreter
from .tflite_io import load_model, write_model

__version__ = "0.1.0"
__all__ = ["Graph", "Interpreter", "NpusimError", "Op", "Quantization", "Tensor", "load_model", "write_model", "__version__"]
