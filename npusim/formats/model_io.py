"""Reading and writing models, whichever the format: a TFLite flatbuffer (tflite_io, the only
flatbuffer code) or an ONNX protobuf (npusim.formats.onnx, which imports `onnx` only when it is used).
The file's content decides, not its name."""

from __future__ import annotations

from pathlib import Path

from ..errors import NpusimError
from ..graph import Graph

# Files users mistake for a model npusim reads, by their first bytes: what each is and what to do.
_FOREIGN = {
    b"\x89HDF\r\n\x1a\n": "a Keras HDF5 model (.h5): convert it to an int8 .tflite first",
    b"PK\x03\x04": "a zip archive (a .keras or PyTorch file?): export it to an int8 .tflite or .onnx first",
}


def _read(source) -> tuple[bytes, str]:
    if isinstance(source, (str, Path)):
        if Path(source).is_dir():
            what = (
                "a TensorFlow SavedModel folder: convert it to an int8 .tflite first"
                if (Path(source) / "saved_model.pb").is_file()
                else "a folder"
            )
            raise NpusimError(f"{source}: {what}, expected a model file (.tflite or .onnx)")
        try:
            return Path(source).read_bytes(), str(source)
        except OSError as e:
            raise NpusimError(f"{source}: cannot read model file ({e.strerror})") from None
    return bytes(source), "model"


def load_model(source, plan_only: bool = False) -> Graph:
    """The .tflite or .onnx model at `source` (a path, or the file's bytes) as a Graph: plain data,
    its tensors, ops and quantization, int8 or float alike (an Interpreter refuses float and legacy
    uint8 models, npusim.app.validate takes a float one). Every defect ends in NpusimError. plan_only
    (`npusim inspect`): an ONNX node npusim cannot lower is listed, not refused (formats/onnx/plan.py)."""
    from . import tflite_io
    from .onnx.reader import looks_like_onnx

    data, where = _read(source)
    if len(data) >= 8 and data[4:8] == b"TFL3":
        return tflite_io.load_model(data if not isinstance(source, (str, Path)) else source)
    if looks_like_onnx(data):
        from .onnx import load

        return load(data, where, plan_only)
    for magic, what in _FOREIGN.items():
        if data.startswith(magic):
            raise NpusimError(f"{where}: {what}, expected a .tflite or .onnx model")
    raise NpusimError(
        f"{where}: not a TFLite flatbuffer (no 'TFL3' identifier) and not an ONNX model (protobuf), "
        "expected one of the two"
    )


def write_model(graph: Graph) -> bytes:
    """The graph, with its current constants, in the format it was read from (.tflite or .onnx bytes)."""
    from . import tflite_io

    if graph.source.format == "onnx":
        from .onnx import write

        return write(graph)
    return tflite_io.write_model(graph)


def model_suffix(graph: Graph) -> str:
    return ".onnx" if graph.source.format == "onnx" else ".tflite"
