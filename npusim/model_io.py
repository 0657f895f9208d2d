"""Reading and writing models, whichever the format: a TFLite flatbuffer (tflite_io, the only
flatbuffer code) or an ONNX protobuf (npusim.onnx, which imports `onnx` only when it is used).
The file's content decides, not its name."""

from __future__ import annotations

from pathlib import Path

from .errors import NpusimError
from .graph import Graph


def _read(source) -> tuple[bytes, str]:
    if isinstance(source, (str, Path)):
        try:
            return Path(source).read_bytes(), str(source)
        except OSError as e:
            raise NpusimError(f"{source}: cannot read model file ({e.strerror})") from None
    return bytes(source), "model"


def load_model(source) -> Graph:
    """A .tflite or .onnx model (path or bytes) as a Graph. Every defect ends in NpusimError."""
    from . import tflite_io
    from .onnx.reader import looks_like_onnx

    data, where = _read(source)
    if len(data) >= 8 and data[4:8] == b"TFL3":
        return tflite_io.load_model(data if not isinstance(source, (str, Path)) else source)
    if looks_like_onnx(data):
        from .onnx import load

        return load(data, where)
    raise NpusimError(
        f"{where}: not a TFLite flatbuffer (no 'TFL3' identifier) and not an ONNX model (protobuf), "
        "expected one of the two"
    )


def write_model(graph: Graph) -> bytes:
    """The graph, with its current constants, in the format it was read from (.tflite or .onnx bytes)."""
    from . import tflite_io

    if getattr(graph.source, "format", None) == "onnx":
        from .onnx import write

        return write(graph)
    return tflite_io.write_model(graph)


def model_suffix(graph: Graph) -> str:
    return ".onnx" if getattr(graph.source, "format", None) == "onnx" else ".tflite"
