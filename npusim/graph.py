"""The model as plain data: tensors and ops, no behaviour.

Everything outside npusim.formats.tflite_io sees only these classes, never flatbuffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Quantization:
    """real = scale * (q - zero_point); per-tensor when scale has one element."""

    scale: np.ndarray  # float32, shape [1] or [channels]
    zero_point: np.ndarray  # int64, same shape as scale
    axis: int = 0  # quantized_dimension, meaningful when per-channel
    # stored code - graph code: 128 where the file stores uint8 and the graph holds the codes shifted
    # to int8 (ONNX import); the onnxruntime profile's float steps see the stored codes.
    offset: int = 0

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    quant: Quantization | None = None
    data: np.ndarray | None = None  # constant (weights, bias, shape operands); None for activations

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def scale(self) -> float:
        return float(self.quant.scale[0]) if self.quant is not None else 1.0

    @property
    def zero_point(self) -> int:
        return int(self.quant.zero_point[0]) if self.quant is not None else 0


@dataclass
class Op:
    kind: str  # builtin operator name as in the TFLite schema, e.g. "CONV_2D"
    inputs: list[int]  # tensor indices; -1 marks an omitted optional input
    outputs: list[int]
    options: dict = field(default_factory=dict)  # builtin options, snake_case keys
    index: int = 0  # position in the file's operator list


@dataclass
class Source:
    """What a reader keeps of the file beside the Graph (Graph.source), so that writing back changes
    only what was edited and reports can name the file's own nodes. Each reader fills the fields of
    its format; the others keep their empty defaults (a Graph built in code has format "")."""

    format: str = ""  # "tflite" or "onnx": the reader that made the Graph, the writer that takes it
    # The file itself: the .tflite bytes (a bytearray the Graph's quantization arrays view, unpacked
    # afresh on each write) or the ONNX ModelProto.
    model: object = None
    # ONNX only, below.
    # Graph tensor -> where its codes live in the file (formats/onnx/writer.py puts trained weights
    # back there; its "storage" is the file's type of the codes).
    weights: dict = field(default_factory=dict)
    # ONNX value name -> (graph tensor, perm): where each activation of the file lives in the Graph
    # (physical = logical.transpose(perm)), for per-layer comparisons against ORT.
    values: dict = field(default_factory=dict)
    storage: dict = field(default_factory=dict)  # tensor -> the file's storage type of a MAC filter
    rebuilt: dict = field(default_factory=dict)  # tensor -> import-time data of MAC weights not the file's
    # plan_only: {"node", "op", "reason", "index"} per node npusim cannot lower (formats/onnx/plan.py);
    # index is the op standing in for it, None where it has none.
    unlowered: list = field(default_factory=list)
    origin: dict = field(default_factory=dict)  # op index -> (ONNX node, consts, layouts): Lowering.origin
    normalized: set = field(default_factory=set)  # the ONNX values a BatchNormalization reads
    # QUANTIZE op index -> the op whose output it requantizes, where the importer wrote that QUANTIZE
    # because TFLite's kernel fixes the op's output quantization (LOGISTIC, SOFTMAX, AVERAGE_POOL_2D,
    # RESIZE_BILINEAR) while the ONNX node rounds once (formats/onnx/context.py Lowering.bind): the
    # single roundings of --profile onnxruntime (profiles/ort_kernels.Plan).
    single_rounding: dict = field(default_factory=dict)
    op_count: int = 0  # ops and tensors the import made (the writer appends what came after)
    tensor_count: int = 0


@dataclass
class Graph:
    tensors: list[Tensor]
    ops: list[Op]
    inputs: list[int]
    outputs: list[int]
    source: Source = field(default_factory=Source)  # what the reader kept of the file
    origin: str = "model"  # the file it was read from ("model" for bytes), for messages that name it

    def input(self, k: int = 0) -> Tensor:
        return self.tensors[self.inputs[k]]

    def output(self, k: int = 0) -> Tensor:
        return self.tensors[self.outputs[k]]

    def producer(self) -> dict[int, Op]:
        return {t: op for op in self.ops for t in op.outputs}

    def consumers(self) -> dict[int, list[Op]]:
        users: dict[int, list[Op]] = {}
        for op in self.ops:
            for t in op.inputs:
                if t >= 0:
                    users.setdefault(t, []).append(op)
        return users


def computes_in_float(graph: Graph) -> bool:
    """A float model: no activation is a quantized integer tensor (an int8 model that takes and
    gives float32 through QUANTIZE and DEQUANTIZE still computes in integers)."""
    constants = {i for i, t in enumerate(graph.tensors) if t.is_constant}
    for op in graph.ops:
        for i in (*op.inputs, *op.outputs):
            t = graph.tensors[i] if i >= 0 and i not in constants else None
            if t is not None and t.quant is not None and np.dtype(t.dtype).kind in "iu":
                return False
    return True


def legacy_uint8(graph: Graph):
    """(op, tensor) of the first op past the graph edges that computes on uint8 codes, as TFLite's
    legacy uint8 quantization does (int8 kernels, TFLM's included, take none); None for an int8
    model, whose uint8 tensors, if any, enter or leave the graph through QUANTIZE or DEQUANTIZE."""
    for op in graph.ops:
        if op.kind in ("QUANTIZE", "DEQUANTIZE"):
            continue
        for i in (*op.inputs, *op.outputs):
            t = graph.tensors[i] if i >= 0 else None
            if t is not None and t.quant is not None and np.dtype(t.dtype) == np.uint8:
                return op, t
    return None
