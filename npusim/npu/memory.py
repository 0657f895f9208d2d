"""Activation memory as ST's Neural-ART compiler lays it out on the STM32N6: buffers after fusion
(fusion.py: views share their source's memory, concatenation inputs are written in place, chained
epilogues never reach memory), aligned, each placed whole in one on-chip RAM bank.

The banks are those of ST's memory-pool file for the STM32N6570-DK (the `.mpool` the model zoo and ST
Edge AI Core use, e.g. stm32n6_reloc.mpool; see MEMORY_POOLS below for the figures and
docs/stm32n6.md for the sources): AXISRAM3 to AXISRAM6, four 448 KiB "npuRAM" banks next to the NPU
(HIGH throughput, LOW latency in ST's description), then AXISRAM2, the 1 MiB "cpuRAM2" (MID, MID),
then external PSRAM (hyperRAM) when nothing on chip is left. A buffer does not straddle two banks
(each pool is a separate region for the compiler). Buffers are placed largest first, each in the
fastest bank where a first-fit by lifetime finds room (TFLM's greedy planner, per bank). The
"internal RAM" of ST's model-zoo tables is the sum over on-chip banks of the highest byte used,
which is what `internal_bytes` reports; the graph's input and output buffers are included, as in
ST's "input / output allocated" benchmarks.

Placement order and bank preference are ASSUMPTIONS (ST documents the pools, not its allocator).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .arena import Buffer, activation_lifetimes, greedy_first_fit, tensor_bytes
from .fusion import FusionPlan

# The on-chip alignment of a buffer: the Cortex-M55's data-cache line, so that the cache maintenance
# around software epochs (clean/invalidate by line) never touches a neighbouring buffer; the NPU's
# stream engines need only their 64-bit bus width (8 bytes).
NPU_BUFFER_ALIGNMENT = 32


@dataclass(frozen=True)
class MemoryPool:
    name: str
    size: int  # bytes available to activations
    bytes_per_npu_cycle: float  # ST's byteWidth / freqRatio for the pool (NPU clock cycles)
    on_chip: bool = True


KIB = 1024
# ST Edge AI Core memory-pool description of the STM32N6570-DK (name, size, byteWidth 8 at freqRatio
# 1.25 for the npuRAMs and 2.5 for cpuRAM2, i.e. 6.4 and 3.2 bytes per NPU cycle; hyperRAM byteWidth 2
# at freqRatio 5), fastest first.
MEMORY_POOLS = (
    MemoryPool("npuRAM3", 448 * KIB, 8 / 1.25),
    MemoryPool("npuRAM4", 448 * KIB, 8 / 1.25),
    MemoryPool("npuRAM5", 448 * KIB, 8 / 1.25),
    MemoryPool("npuRAM6", 448 * KIB, 8 / 1.25),
    MemoryPool("cpuRAM2", 1024 * KIB, 8 / 2.5),
    MemoryPool("hyperRAM", 16 * 1024 * KIB, 2 / 5.0, on_chip=False),
)


@dataclass
class PoolUse:
    pool: MemoryPool
    buffers: list = field(default_factory=list)  # list[Buffer]
    used: int = 0  # highest byte used


@dataclass
class MemoryLayout:
    pools: list  # list[PoolUse], in MEMORY_POOLS order
    pool_of: dict  # root tensor -> pool name
    root_of: dict  # every activation tensor -> the tensor whose buffer it uses
    streamed: set  # tensors that never reach memory

    @property
    def internal_bytes(self) -> int:
        return sum(p.used for p in self.pools if p.pool.on_chip)

    @property
    def external_bytes(self) -> int:
        return sum(p.used for p in self.pools if not p.pool.on_chip)

    def pool_for(self, tensor: int):
        """The MemoryPool holding `tensor` (None when it is streamed or not an activation)."""
        name = self.pool_of.get(self.root_of.get(tensor, tensor))
        return next((p.pool for p in self.pools if p.pool.name == name), None)

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


def plan_memory(
    interp,
    fusion: FusionPlan,
    pools=MEMORY_POOLS,
    alignment: int = NPU_BUFFER_ALIGNMENT,
    scale: float = 1.0,
) -> MemoryLayout:
    """Bank placement of the activation buffers of one image. `scale` multiplies every buffer's size
    (the same graph at another input resolution; see experiments/stm32n6_table.py)."""
    graph = interp.graph
    life = activation_lifetimes(interp)
    root_of = {t: fusion.root(t) for t in life}
    spans: dict = {}
    sizes: dict = {}
    for t, (first, last) in life.items():
        if t in fusion.streamed:
            continue
        r = root_of[t]
        a, b = spans.get(r, (first, last))
        spans[r] = (min(a, first), max(b, last))
        sizes[r] = max(sizes.get(r, 0), int(tensor_bytes(graph.tensors[t]) * scale))
    buffers = sorted(
        (Buffer(r, _align(sizes[r], alignment), a, b) for r, (a, b) in spans.items()),
        key=lambda b: (-b.size, b.first, b.tensor),
    )
    uses = [PoolUse(p) for p in pools]
    pool_of: dict = {}
    for buf in buffers:
        for use in uses:
            trial = [Buffer(x.tensor, x.size, x.first, x.last) for x in use.buffers] + [
                Buffer(buf.tensor, buf.size, buf.first, buf.last)
            ]
            peak = greedy_first_fit(trial)
            if peak <= use.pool.size or use is uses[-1]:
                use.buffers.append(buf)
                use.used = peak
                pool_of[buf.tensor] = use.pool.name
                break
    for use in uses:  # final offsets
        use.used = greedy_first_fit(use.buffers) if use.buffers else 0
    return MemoryLayout(uses, pool_of, root_of, set(fusion.streamed))
