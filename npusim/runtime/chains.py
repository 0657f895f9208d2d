"""Chains of elementwise ops over one 8-bit activation, run as one table lookup (Interpreter.run).

YOLO's SiLU is LOGISTIC(x) and then MUL(x, s): two kernels and three passes over memory, yet the
output byte depends on x's byte alone. So does the output of any chain of elementwise kernels
(Kernel.elementwise: the output at a position is a function of the inputs at that position) whose
activation inputs all derive from one int8 or uint8 tensor x, with scalar constants beside: x takes
256 values, so prepare runs the chain's own kernels once on a batch holding every code of x, and a
run gathers table[x]. Bit-identical by construction, for every profile: the table holds what the
kernels compute, element by element. A chain is taken only where its intermediate tensors are read
by nothing else and are no graph outputs, so that dropping them changes no result a caller sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BYTE_TYPES = (np.int8, np.uint8)


@dataclass(frozen=True)
class Chain:
    root: int  # the 8-bit tensor every activation input of the chain derives from
    output: int  # the chain's last tensor, the one read outside it
    kernels: tuple  # the chain's kernels, in plan order (the last computes output)
    table: np.ndarray  # [256] of output's dtype, indexed by root's byte


def _scalar_constant(t) -> bool:
    return t.data is not None and t.data.size == 1


def find_chains(graph, kernels) -> list[Chain]:
    """The chains of two kernels or more in the plan, each as long as its intermediates allow."""
    tensors = graph.tensors
    root = {}  # tensor -> the 8-bit activation it is a byte function of
    members = {}  # tensor -> the kernels (plan positions) that compute it from its root
    for position, k in enumerate(kernels):
        if not k.elementwise or len(k.op.outputs) != 1:
            continue
        y = tensors[k.op.outputs[0]]
        if y.dtype not in BYTE_TYPES:
            continue
        sources, ok = set(), True
        for t in k.op.inputs:
            if t < 0 or _scalar_constant(tensors[t]):
                continue
            x = tensors[t]
            if x.is_constant or x.dtype not in BYTE_TYPES or tuple(x.shape) != tuple(y.shape):
                ok = False
                break
            sources.add(root.get(t, t))
        if ok and len(sources) == 1:
            r = sources.pop()
            root[k.op.outputs[0]] = r
            inner = set().union(*(members.get(t, set()) for t in k.op.inputs if root.get(t) == r))
            members[k.op.outputs[0]] = inner | {position}
    readers = {}
    for position, k in enumerate(kernels):
        for t in k.op.inputs:
            readers.setdefault(t, set()).add(position)
    chains, taken = [], set()
    for y in sorted(members, key=lambda t: -max(members[t])):  # the longest chains first
        chain = members[y]
        if len(chain) < 2 or chain & taken:
            continue
        inner = [kernels[p].op.outputs[0] for p in chain if kernels[p].op.outputs[0] != y]
        if any(t in graph.outputs or not readers.get(t, set()) <= chain for t in inner):
            continue
        taken |= chain
        plan = tuple(kernels[p] for p in sorted(chain))
        chains.append(Chain(root[y], y, plan, _table(graph, plan, root[y], y)))
    return chains


def _table(graph, plan, root: int, output: int) -> np.ndarray:
    """Run the chain's kernels on a batch whose elements, in order, are root's 256 codes (repeated
    to fill whole images), and read the output at those positions."""
    tensors = graph.tensors
    x = tensors[root]
    per_image = int(np.prod(x.shape[1:], dtype=np.int64))
    images = -(-256 // per_image)
    codes = np.resize(np.arange(256, dtype=np.uint8), images * per_image).view(x.dtype)
    values = {root: codes.reshape((images,) + tuple(x.shape[1:]))}
    for k in plan:
        args = [None if t < 0 else values[t] if t in values else tensors[t].data for t in k.op.inputs]
        values[k.op.outputs[0]] = k(*args)
    return np.ascontiguousarray(values[output].reshape(-1)[:256])
