"""Activation memory as ST's Neural-ART compiler lays it out on the STM32N6: buffers after fusion
(fusion.py: views share their source's memory, concatenation inputs are written in place, chained
epilogues never reach memory), aligned, each placed whole in one on-chip RAM bank.

The banks are those of ST's memory-pool file for the STM32N6570-DK (the `.mpool` the model zoo and ST
Edge AI Core use, e.g. stm32n6_reloc.mpool; see MEMORY_POOLS below for the figures and
docs/stm32n6.md for the sources): AXISRAM3 to AXISRAM6, four 448 KiB "npuRAM" banks next to the NPU
(HIGH throughput, LOW latency in ST's description), then AXISRAM2, the 1 MiB "cpuRAM2" (MID, MID),
then external PSRAM (hyperRAM) when nothing on chip is left. Buffers are placed largest first, each
in the fastest bank where a first-fit by lifetime finds room (TFLM's greedy planner over one address
space); a buffer that no single bank can hold goes into the virtual pool that spans the contiguous
cpuRAM2 and npuRAM3 to npuRAM6 (0x34100000 to 0x343C0000) before the external RAM: ST's compiler
does so with `enable-virtual-mem-pools` (its default; ST's own compile of YOLOX-nano 480 in
../shared/models/stm32n6/st_compiler, c_info.json: 22 of its 300 activation buffers in the pool
"cpuRAM2_npuRAM3_npuRAM4_npuRAM5_npuRAM6", nothing in hyperRAM). The
"internal RAM" of ST's model-zoo tables is the sum over on-chip banks of the highest byte used,
which is what `internal_bytes` reports; the graph's input and output buffers are included, as in
ST's "input / output allocated" benchmarks.

A convolution's input reaches memory as the suboff's output (npu/neural_art.py: x + 128, the
unsigned feature the CONVACC reads), a buffer of its own per convolution: the suboff runs fused after
the unit that wrote x, in that epoch, and writes `<conv>_zero_off_out`, which the convolution's epoch
reads. The int8 x itself is in memory only when something else reads it (an ADD, a concatenation,
the graph's output) or it comes from the Cortex-M55 or the graph's input. Both shared compiles of
YOLOX-nano 480 (../shared/models/stm32n6/st_compiler) show it: ST Edge AI 2.1's network.c names 182
`_zero_off_out` buffers for 186 convolutions (c_info.json of 3.0: 183) and 52 `_off_bias_out` int8
conv outputs, where 53 of the model's 186 conv outputs have a reader other than a convolution. Only
for an input zero point of -128, the one the suboff turns unsigned by adding 128 (for other zero
points ST's 2.2 BlazeFace compile has no separate suboff: issue 55); SUBOFF_KINDS below.

Placement order and bank preference are ASSUMPTIONS (ST documents the pools, not its allocator; in
ST's YOLOX compile npuRAM5 holds most buffers, npuRAM6 fewest).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .arena import Buffer, activation_lifetimes, tensor_bytes
from .fusion import FusionPlan

# The on-chip alignment of a buffer: a cache line, so that the cache maintenance around software
# epochs (clean/invalidate by line) never touches a neighbouring buffer. ST's compiled program for
# YOLOX-nano says "MCU+NPU cache line size equal to 64 bytes" (default_blob_trace.c), and 286 of the
# 300 activation buffers of its c_info.json start at a multiple of 64 (the rest are views into
# others); the NPU's stream engines alone need only their 64-bit bus width.
NPU_BUFFER_ALIGNMENT = 64
# The ops whose input the suboff copies (the convolutions of both shared compiles; FULLY_CONNECTED
# and TRANSPOSE_CONV are not in them), and the input zero point it copies for.
SUBOFF_KINDS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D"})
SUBOFF_ZERO_POINT = -128


@dataclass(frozen=True)
class MemoryPool:
    name: str
    size: int  # bytes available to activations
    bytes_per_npu_cycle: float  # ST's byteWidth / freqRatio for the pool (NPU clock cycles)
    on_chip: bool = True
    # address of the bank in the contiguous on-chip region of the virtual pool (None: outside it)
    region_offset: int | None = None
    virtual: bool = False  # the pool spanning the banks of the region, not a bank of its own


KIB = 1024
# ST Edge AI Core memory-pool description of the STM32N6570-DK (name, size, byteWidth 8 at freqRatio
# 1.25 for the npuRAMs and 2.5 for cpuRAM2, i.e. 6.4 and 3.2 bytes per NPU cycle; hyperRAM byteWidth 2
# at freqRatio 5), fastest first.
MEMORY_POOLS = (
    MemoryPool("npuRAM3", 448 * KIB, 8 / 1.25, region_offset=1024 * KIB),
    MemoryPool("npuRAM4", 448 * KIB, 8 / 1.25, region_offset=1472 * KIB),
    MemoryPool("npuRAM5", 448 * KIB, 8 / 1.25, region_offset=1920 * KIB),
    MemoryPool("npuRAM6", 448 * KIB, 8 / 1.25, region_offset=2368 * KIB),
    MemoryPool("cpuRAM2", 1024 * KIB, 8 / 2.5, region_offset=0),
    MemoryPool("hyperRAM", 16 * 1024 * KIB, 2 / 5.0, on_chip=False),
)
# The virtual pool over the banks above that have a region_offset, as ST's c_info.json describes it
# (size 2,883,584 B; throughput HIGH, byte_width 8, freq_ratio 1.25).
VIRTUAL_POOL = MemoryPool("cpuRAM2+npuRAM3-6", 2816 * KIB, 8 / 1.25, region_offset=0, virtual=True)


@dataclass
class PoolUse:
    pool: MemoryPool
    buffers: list = field(default_factory=list)  # list[Buffer]
    used: int = 0  # highest byte used


@dataclass
class MemoryLayout:
    pools: list  # list[PoolUse], in MEMORY_POOLS order
    pool_of: dict  # root tensor (or a copy's key) -> pool name
    root_of: dict  # every activation tensor -> the tensor whose buffer it uses
    streamed: set  # tensors that never reach memory
    copies: dict = field(default_factory=dict)  # (tensor, reader position) -> key of its suboff copy

    @property
    def internal_bytes(self) -> int:
        """The highest byte used in each on-chip bank, summed (a virtual-pool buffer counts in the
        banks it covers)."""
        return sum(p.used for p in self.pools if p.pool.on_chip and not p.pool.virtual)

    @property
    def external_bytes(self) -> int:
        return sum(p.used for p in self.pools if not p.pool.on_chip)

    def pool_for(self, tensor: int, reader: int | None = None):
        """The MemoryPool holding `tensor` (None when it is streamed or not an activation); with
        `reader` (an execution position), the pool of that reader's suboff copy when it has one."""
        key = self.copies.get((tensor, reader), self.root_of.get(tensor, tensor))
        name = self.pool_of.get(key)
        return next((p.pool for p in self.pools if p.pool.name == name), None)

    def pool_for_key(self, key: int):
        """The MemoryPool of a buffer by its key (a root tensor or a copy's key)."""
        name = self.pool_of.get(key)
        return next((p.pool for p in self.pools if p.pool.name == name), None)

    def copies_of(self, tensor: int) -> list:
        """The keys of the suboff copies written from `tensor`."""
        return [k for (t, _), k in self.copies.items() if t == tensor]

    def to_dict(self) -> dict:
        return {
            "internal_bytes": self.internal_bytes,
            "external_bytes": self.external_bytes,
            "pools": {
                p.pool.name: {"used_bytes": p.used, "size_bytes": p.pool.size} for p in self.pools if p.used
            },
        }


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _lowest_fit(buf: Buffer, placed: list, lo: int, hi: int) -> int | None:
    """The lowest offset in [lo, hi) where buf fits beside the placed buffers live with it."""
    conflicts = sorted(
        (p for p in placed if p.first <= buf.last and buf.first <= p.last and p.offset + p.size > lo),
        key=lambda p: p.offset,
    )
    offset = lo
    for p in conflicts:
        if p.offset - offset >= buf.size:
            break
        offset = max(offset, p.offset + p.size)
    return offset if offset + buf.size <= hi else None


def _zero_point(t) -> int | None:
    q = getattr(t, "quant", None)
    if q is None:
        return None
    z = np.asarray(q.zero_point).ravel()
    return int(z[0]) if z.size else None


def suboff_copies(interp, fusion: FusionPlan, units: list) -> tuple[dict, set]:
    """({(tensor, reader position): copy key}, tensors whose int8 buffer no reader needs): the
    suboff copies of the module docstring. Copy keys are ints past the graph's tensor indices."""
    graph, kernels = interp.graph, interp.kernels
    producer = {t: pos for pos, k in enumerate(kernels) for t in k.op.outputs}
    readers: dict = {}
    for pos, k in enumerate(kernels):
        for t in k.op.inputs:
            if t >= 0 and not graph.tensors[t].is_constant:
                readers.setdefault(t, []).append(pos)
    copies: dict = {}
    for pos, k in enumerate(kernels):
        if units[pos] != "NPU" or k.op.kind not in SUBOFF_KINDS or fusion.roles[pos] != "layer":
            continue
        t = k.op.inputs[0]
        if t >= 0 and not graph.tensors[t].is_constant and _zero_point(graph.tensors[t]) == SUBOFF_ZERO_POINT:
            copies[(t, pos)] = len(graph.tensors) + len(copies)
    aliased = set(fusion.aliases.values()) | set(fusion.aliases)
    dropped = {
        t
        for t, rs in readers.items()
        if all((t, r) in copies for r in rs)
        and t not in graph.inputs
        and t not in graph.outputs
        and t not in aliased
        and t in producer
        and units[producer[t]] == "NPU"
        and fusion.roles[producer[t]] != "view"
    }
    return copies, dropped


def plan_memory(
    interp,
    fusion: FusionPlan,
    pools=MEMORY_POOLS,
    alignment: int = NPU_BUFFER_ALIGNMENT,
    scale: float = 1.0,
    virtual: MemoryPool | None = VIRTUAL_POOL,
    units: list | None = None,
) -> MemoryLayout:
    """Bank placement of the activation buffers of one image. `scale` multiplies every buffer's size
    (the same graph at another input resolution; see experiments/tables/stm32n6.py). virtual: the
    pool spanning the contiguous banks, for buffers no single bank holds (None: no such pool).
    units: each execution position's unit (NPU or M55); with it, the convolutions' suboff copies
    (module docstring) are buffers of their own; without it, none."""
    graph = interp.graph
    life = activation_lifetimes(interp)
    root_of = {t: fusion.root(t) for t in life}
    copies, dropped = suboff_copies(interp, fusion, units) if units is not None else ({}, set())
    spans: dict = {}
    sizes: dict = {}
    for t, (first, last) in life.items():
        if t in fusion.streamed or t in dropped:
            continue
        r = root_of[t]
        a, b = spans.get(r, (first, last))
        spans[r] = (min(a, first), max(b, last))
        sizes[r] = max(sizes.get(r, 0), int(tensor_bytes(graph.tensors[t]) * scale))
    for (t, reader), key in copies.items():  # written in the epoch of t's producer, read by the conv
        spans[key] = (life[t][0], reader)
        sizes[key] = int(tensor_bytes(graph.tensors[t]) * scale)
    buffers = sorted(
        (Buffer(r, _align(sizes[r], alignment), a, b) for r, (a, b) in spans.items()),
        key=lambda b: (-b.size, b.first, b.tensor),
    )
    uses = [PoolUse(p) for p in pools]
    region = [u for u in uses if u.pool.region_offset is not None]
    virtual_use = PoolUse(virtual) if virtual is not None and region else None
    shared: list = []  # buffers in the contiguous region, at region offsets
    pool_of: dict = {}

    def put(buf, use, offset):
        buf.offset = offset
        use.buffers.append(buf)
        pool_of[buf.tensor] = use.pool.name

    for buf in buffers:
        for use in uses:
            start = use.pool.region_offset
            if start is None:  # a pool of its own (external RAM): TFLM's greedy planner in it
                offset = _lowest_fit(buf, use.buffers, 0, use.pool.size if use is not uses[-1] else 1 << 62)
                if offset is None:
                    continue
                if virtual_use is not None and use.pool.on_chip is False:
                    offset_v = _lowest_fit(buf, shared, 0, virtual_use.pool.size)
                    if offset_v is not None:  # before the external RAM: the virtual pool
                        put(buf, virtual_use, offset_v)
                        shared.append(buf)
                        break
                put(buf, use, offset)
                break
            offset = _lowest_fit(buf, shared, start, start + use.pool.size)
            if offset is not None:
                put(buf, use, offset)
                shared.append(buf)
                break
    for use in uses:  # the highest byte used in each pool, virtual buffers counted in the banks
        if use.pool.region_offset is None:
            use.used = max((b.offset + b.size for b in use.buffers), default=0)
            continue
        lo, hi = use.pool.region_offset, use.pool.region_offset + use.pool.size
        ends = [min(b.offset + b.size, hi) - lo for b in shared if b.offset < hi and b.offset + b.size > lo]
        use.used = max(ends, default=0)
    if virtual_use is not None and virtual_use.buffers:
        virtual_use.used = max(b.offset + b.size for b in virtual_use.buffers)
        uses.append(virtual_use)
    return MemoryLayout(uses, pool_of, root_of, set(fusion.streamed) | dropped, copies)
