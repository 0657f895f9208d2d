"""ONNX models (QDQ and QOperator) lowered to npusim's format-independent Graph; `onnx` is imported
only when a model is read (docs/onnx.md)."""

from __future__ import annotations


def load(data: bytes, where: str, plan_only: bool = False):
    from .importer import load_onnx

    return load_onnx(data, where, plan_only)


def write(graph) -> bytes:
    from .writer import write_onnx

    return write_onnx(graph)
