"""Prepare once, evaluate many times: the plan of a graph and its execution on a batch.

The plan is the graph's ops in execution order, each with its prepared kernel. Running it is a
walk over the kernels with a dict of tensor values; constants come from the model unless a caller
overrides them (the trainer's perturbed weights).
"""
from __future__ import annotations

import numpy as np

from .errors import NpusimError
from .graph import Graph
from .ops import KERNELS
from .quant import profile_id
from .tflite_io import load_model

# Layers whose weights may carry a leading group axis (many weight versions in one call).
GROUPED_KINDS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def execution_order(graph: Graph) -> list:
    """The ops in file order, checked to be a valid schedule: every input is a constant, a graph input
    or produced by an earlier op (which also rules out cycles)."""
    ready = {i for i, t in enumerate(graph.tensors) if t.is_constant} | set(graph.inputs)
    for op in graph.ops:
        for t in op.inputs:
            if t >= 0 and t not in ready:
                raise NpusimError(f"op {op.index} ({op.kind}): input tensor {t} ({graph.tensors[t].name!r}) is read before any op produces it")
        for t in op.outputs:
            if t in ready:
                raise NpusimError(f"op {op.index} ({op.kind}): output tensor {t} ({graph.tensors[t].name!r}) is written twice or is a constant")
            ready.add(t)
    for t in graph.outputs:
        if t not in ready:
            raise NpusimError(f"graph output tensor {t} ({graph.tensors[t].name!r}) is never produced")
    return list(graph.ops)


class Interpreter:
    """A prepared model. `run(x)` evaluates a batch: x has the model input's shape with N on axis 0."""

    def __init__(self, graph: Graph | str | bytes, profile: str = "tflm"):
        self.graph = graph if isinstance(graph, Graph) else load_model(graph)
        self.profile = profile
        pid = profile_id(profile)
        self.kernels = []
        for op in execution_order(self.graph):
            if op.kind not in KERNELS:
                raise NpusimError(f"op {op.index} ({op.kind}): operator is not supported")
            if not op.outputs:
                raise NpusimError(f"op {op.index} ({op.kind}): operator has no output")
            self.kernels.append(KERNELS[op.kind](op, self.graph, pid))

    # -- inputs -------------------------------------------------------------------------------
    def check_input(self, x: np.ndarray, k: int = 0) -> np.ndarray:
        t = self.graph.input(k)
        if not isinstance(x, np.ndarray):
            raise NpusimError(f"input {k}: expected a numpy array, got {type(x).__name__}")
        if x.dtype != t.dtype:
            raise NpusimError(f"input {k} ({t.name!r}): dtype {x.dtype.name}, expected {t.dtype.name}")
        if x.ndim != len(t.shape) or tuple(x.shape[1:]) != tuple(t.shape[1:]):
            expected = ["N"] + list(t.shape[1:])
            raise NpusimError(f"input {k} ({t.name!r}): shape {list(x.shape)}, expected {expected}".replace("'N'", "N"))
        if x.shape[0] == 0:
            raise NpusimError(f"input {k} ({t.name!r}): empty batch, expected at least one input")
        if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
            raise NpusimError(f"input {k} ({t.name!r}): holds NaN or infinite values")
        return np.ascontiguousarray(x)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, values: dict, kernels=None, overrides: dict | None = None, shared_batch: int | None = None) -> dict:
        """Run kernels (default: all) on a dict {tensor index: array}, adding their outputs to it.

        overrides maps constant tensor indices to replacement arrays. Weights of CONV_2D,
        DEPTHWISE_CONV_2D and FULLY_CONNECTED may carry a leading group axis G (see ops/conv.py):
        many weight versions in one call. With shared_batch=B, an activation of batch B is shared by
        all groups (computed once) and one of batch G*B holds one slice per group; an op meeting both
        sees the shared one repeated, and a grouped layer reading a shared input runs all groups as
        one wide GEMM.
        """
        tensors = self.graph.tensors
        for kernel in self.kernels if kernels is None else kernels:
            args = []
            for t in kernel.op.inputs:
                if t < 0:
                    args.append(None)
                elif overrides is not None and t in overrides:
                    args.append(overrides[t])
                elif t in values:
                    args.append(values[t])
                else:
                    args.append(tensors[t].data)
            if shared_batch is None:
                result = kernel(*args)
            else:
                result = self._call_grouped(kernel, args, shared_batch)
            if len(kernel.op.outputs) == 1:
                values[kernel.op.outputs[0]] = result
            else:
                values.update(zip(kernel.op.outputs, result))
        return values

    def _call_grouped(self, kernel, args, shared_batch):
        tensors = self.graph.tensors
        acts = [i for i, t in enumerate(kernel.op.inputs) if t >= 0 and not tensors[t].is_constant]
        if kernel.kind in GROUPED_KINDS and args[1].ndim == len(tensors[kernel.op.inputs[1]].shape) + 1:
            return kernel(*args, shared=args[0].shape[0] == shared_batch)
        largest = max(args[i].shape[0] for i in acts)
        if largest != shared_batch:
            for i in acts:
                if args[i].shape[0] == shared_batch:
                    args[i] = np.concatenate([args[i]] * (largest // shared_batch))
        return kernel(*args)

    def run_all(self, x: np.ndarray, overrides: dict | None = None) -> dict:
        """Every activation tensor's value for the batch x, keyed by tensor index."""
        values = {self.graph.inputs[0]: self.check_input(x)}
        return self.evaluate(values, overrides=overrides)

    def run(self, x: np.ndarray, overrides: dict | None = None) -> np.ndarray:
        return self.run_all(x, overrides)[self.graph.outputs[0]]

    def macs(self) -> int:
        return sum(k.macs() for k in self.kernels)
