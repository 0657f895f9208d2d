"""The activation memory of a plan on the device.

Activation memory is planned like TFLM's GreedyMemoryPlanner: each activation tensor lives from
the op that produces it (graph inputs from the start) to its last reader (graph outputs to the
end); tensors are placed largest first at the lowest offset that does not overlap, in memory, any
already placed tensor whose lifetime overlaps (first fit), at ARENA_ALIGNMENT bytes. The arena
peak is the highest end offset; the naive sum gives every tensor its own buffer. Kernel scratch
buffers, which TFLM also places in its arena, and ST's own buffer placement across the N6 memory
banks are not modelled. Weight memory is the bytes of every constant tensor the ops read (int8
weights, int32 biases, shape operands), each counted once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import NpusimError

ARENA_ALIGNMENT = 16  # bytes, as TFLM aligns arena buffers


def tensor_elements(t) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) if t is not None else 0


def tensor_bytes(t) -> int:
    return tensor_elements(t) * np.dtype(t.dtype).itemsize


def weight_storage(graph, t: int) -> str:
    """How the model file stores constant tensor t: an ONNX MAC filter's own type (int4, uint4, int8,
    uint8; graph.Source.storage), whether or not the graph's codes are the file's;
    otherwise the graph's dtype."""
    storage = graph.source.storage.get(t) or graph.source.weights.get(t, {}).get("storage")
    return storage or np.dtype(graph.tensors[t].dtype).name


def constant_bytes(graph, t: int) -> int:
    """The bytes a constant tensor takes in the weights' memory: an ONNX weight the file stores as
    int4 or uint4 packs two values per byte (the graph holds one per int8 byte to compute on)."""
    if weight_storage(graph, t) in ("int4", "uint4"):
        return (tensor_elements(graph.tensors[t]) + 1) // 2
    return tensor_bytes(graph.tensors[t])


# ----------------------------------------------------------------------------------------------
# Arena plan


@dataclass
class Buffer:
    tensor: int  # tensor index
    size: int  # bytes for the planned batch, aligned
    first: int  # execution position of the producer (-1: graph input, live from the start)
    last: int  # execution position of the last reader
    offset: int = 0


@dataclass
class ArenaPlan:
    buffers: list  # list[Buffer], in placement order
    peak_bytes: int  # greedy plan: highest end offset
    naive_bytes: int  # every activation tensor in its own buffer
    max_live_bytes: int  # lower bound: largest sum of simultaneously live tensors
    largest_tensor_bytes: int
    batch: int = 1

    def offsets(self) -> dict:
        return {b.tensor: b.offset for b in self.buffers}


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def activation_lifetimes(interp) -> dict:
    """{tensor index: (first, last)} execution positions of every activation tensor of the plan."""
    graph = interp.graph
    n_ops = len(interp.kernels)
    life: dict = {}
    for t in graph.inputs:
        life[t] = [-1, -1]
    for pos, k in enumerate(interp.kernels):
        for t in k.op.inputs:
            if t >= 0 and not graph.tensors[t].is_constant:
                life.setdefault(t, [pos, pos])[1] = pos
        for t in k.op.outputs:
            life.setdefault(t, [pos, pos])
    for t in graph.outputs:
        if t in life:
            life[t][1] = n_ops  # read by the caller after the last op
    return {t: (a, b) for t, (a, b) in life.items()}


def greedy_first_fit(buffers: list) -> int:
    """Place buffers (largest first, ties by first use) at the lowest non-conflicting offset, as
    TFLM's GreedyMemoryPlanner does; set each .offset and return the arena peak."""
    order = sorted(buffers, key=lambda b: (-b.size, b.first, b.tensor))
    placed: list = []
    peak = 0
    for b in order:
        conflicts = sorted(
            (p for p in placed if p.first <= b.last and b.first <= p.last), key=lambda p: p.offset
        )
        offset = 0
        for p in conflicts:
            if p.offset - offset >= b.size:
                break
            offset = max(offset, p.offset + p.size)
        b.offset = offset
        placed.append(b)
        peak = max(peak, offset + b.size)
    buffers[:] = order
    return peak


def plan_arena(interp, batch: int = 1, alignment: int = ARENA_ALIGNMENT) -> ArenaPlan:
    """Liveness-based offset plan of the activation tensors for `batch` images held at once."""
    if batch < 1:
        raise NpusimError(f"batch must be at least 1, got {batch}")
    tensors = interp.graph.tensors
    buffers = [
        Buffer(t, _align(tensor_bytes(tensors[t]) * batch, alignment), a, b)
        for t, (a, b) in activation_lifetimes(interp).items()
    ]
    peak = greedy_first_fit(buffers)
    positions = sorted({b.first for b in buffers} | {b.last for b in buffers})
    max_live = max((sum(b.size for b in buffers if b.first <= p <= b.last) for p in positions), default=0)
    return ArenaPlan(
        buffers=buffers,
        peak_bytes=peak,
        naive_bytes=sum(b.size for b in buffers),
        max_live_bytes=max_live,
        largest_tensor_bytes=max((b.size for b in buffers), default=0),
        batch=batch,
    )
