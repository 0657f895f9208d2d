"""What every op module provides: prepare once in __init__, evaluate many times in __call__."""
from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..graph import Graph, Op, Tensor


class Kernel:
    """Prepare (TFLM's Prepare, fills the op data) in __init__; Eval in __call__.

    __call__ receives the op's input arrays in op.inputs order (None for an omitted optional input);
    activations carry a leading batch axis N, constants come as stored in the model.
    It returns one array per op output (a single array when the op has one output).
    """

    kind = ""

    def __init__(self, op: Op, graph: Graph, profile: int):
        self.op = op
        self.graph = graph
        self.profile = profile
        self.inputs: list[Tensor | None] = [graph.tensors[i] if i >= 0 else None for i in op.inputs]
        self.outputs: list[Tensor] = [graph.tensors[i] for i in op.outputs]

    def error(self, message: str) -> NpusimError:
        return NpusimError(f"op {self.op.index} ({self.kind}): {message}")

    def require_int8(self, *tensors: Tensor):
        for t in tensors:
            if t.dtype != np.int8:
                raise self.error(f"tensor {t.name!r} has type {np.dtype(t.dtype).name}, expected int8")
            if t.quant is None:
                raise self.error(f"tensor {t.name!r} has no quantization parameters, expected int8 with scale and zero point")

    def macs(self) -> int:
        """Multiply-accumulates per image (for inspect and the cost model)."""
        return 0

    def __call__(self, *inputs: np.ndarray):
        raise NotImplementedError
