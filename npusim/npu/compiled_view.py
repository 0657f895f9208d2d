"""The N6 view counted on the compiled program (`npusim inspect --target stm32n6 --compiled FILE`):
latency over the epochs ST's compiler formed, internal RAM over the buffers it placed.

What is read:
- the epochs of the epoch-controller blobs (npu/ec_blob.py): every blob epoch is a hardware epoch;
- ST's generated network.c beside the blobs (or given itself; it includes them): its epoch blocks
  (`LL_ATON_EpochBlockItems_...`: `pure_hw` blob ranges `epoch_num`..`last_epoch_num`, `hybrid` and
  `pure_sw` epochs the Cortex-M55 runs), its memory pools (the header's `index=N ... name=...
  offset=0x... size=N` lines, `vpool` the virtual one) and its activation buffers (every
  `LL_Buffer_InfoTypeDef` entry with `.is_param = 0`: `.addr_base` + `.offset_start` .. `.offset_end`).
- beside ST Edge AI 3.0's readable blob trace (npu/blob_trace.py), which has no network.c, its
  c_info.json: the memory pools and activation buffers (read_c_info), no software epochs.

Latency: each op keeps npusim's roofline time (max(compute, memory), npu/cost.py); an op mapped to
the program (npu/compiled.py) is counted in the epoch of its CONVACC pipe (a conv), its ARITH (an ADD,
a QUANTIZE), its POOL chain or its first copy (data movement); an epoch costs max(sum of its ops'
compute, sum of their memory) plus one epoch overhead, and each software epoch of network.c one
overhead more. NPU ops the program does not show mapped keep their own time, with no overhead (the
compiler's epochs already carry them). Internal RAM: per on-chip bank (not the virtual pool, not
hyperRAM), the highest byte an activation buffer reaches, summed: what npu/memory.py estimates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .cost import M55, NPU, DeviceReport
from .ec_blob import CompiledError
from .fusion import LAYER

_POOL = re.compile(
    r"/\*\s*index=(\d+)\s+file postfix=\S+\s+name=(\S+)\s+offset=(0x[0-9a-fA-F]+)\s.*?"
    r"size=(\d+)\s+(vpool\s+)?(READ_ONLY|READ_WRITE)"
)
_STATED = re.compile(r"/\*\s*global pool (\d+) is ([\d.]+) (KB|MB|B)\s*\*/")
_BUFFER = re.compile(
    r"\.name\s*=\s*\"([^\"]+)\",\s*\.addr_base\s*=\s*\{\(unsigned char \*\)\((0x[0-9a-fA-F]+)UL\).*?\},\s*"
    r"\.offset_start\s*=\s*(\d+),\s*\.offset_end\s*=\s*(\d+),.*?\.is_param\s*=\s*(\d),\s*\.epoch\s*=\s*(\d+)",
    re.S,
)
_BLOCK = re.compile(r"\{\s*(\.start_epoch_block.*?)\n    \},", re.S)
_UNITS = {"KB": 1024, "MB": 1024 * 1024, "B": 1}


@dataclass
class Pool:
    index: int
    name: str
    address: int
    size: int
    virtual: bool
    read_only: bool
    stated_bytes: int | None = None  # the header's "global pool N is X KB" (rounded by ST)

    @property
    def on_chip(self) -> bool:
        """An internal RAM bank of activations: not flash, not the external hyperRAM (0x9...), not the
        virtual pool (its buffers count in the banks they cover)."""
        return not (self.virtual or self.read_only or self.address >= 0x60000000)


@dataclass
class NetworkC:
    """What ST's network.c says about the program's epochs and buffers."""

    path: str
    pools: list  # list[Pool]
    buffers: dict  # name -> (start address, end address, epoch)
    hw_epochs: list = field(default_factory=list)  # epoch numbers run by blobs
    sw_epochs: list = field(default_factory=list)  # hybrid and pure_sw epochs (the Cortex-M55 steps)

    def used(self) -> dict:
        """pool name -> the highest byte of it an activation buffer reaches."""
        out = {}
        for p in self.pools:
            lo, hi = p.address, p.address + p.size
            ends = [min(e, hi) - lo for s, e, _ in self.buffers.values() if s < hi and e > lo]
            if ends and not p.read_only:
                out[p.name] = max(ends)
        return out

    @property
    def internal_bytes(self) -> int:
        used = self.used()
        return sum(used.get(p.name, 0) for p in self.pools if p.on_chip)


def read_network_c(path) -> NetworkC:
    """network.c's epochs, pools and buffers (module docstring); a c_info.json's (read_c_info)."""
    if Path(path).suffix == ".json":
        return read_c_info(path)
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise CompiledError(f"{path}: cannot read: {e.strerror}") from None
    pools = [
        Pool(int(i), name, int(addr, 16), int(size), bool(v), rw == "READ_ONLY")
        for i, name, addr, size, v, rw in _POOL.findall(text)
    ]
    stated = {int(i): round(float(n) * _UNITS[u]) for i, n, u in _STATED.findall(text)}
    for p in pools:
        p.stated_bytes = stated.get(p.index)
    buffers = {}
    for name, base, start, end, param, epoch in _BUFFER.findall(text):
        if param == "0":
            buffers.setdefault(name, (int(base, 16) + int(start), int(base, 16) + int(end), int(epoch)))
    net = NetworkC(str(path), pools, buffers)
    items = text[text.find("LL_ATON_EpochBlockItems") :]
    for block in _BLOCK.findall(items):
        first = re.search(r"\.epoch_num\s*=\s*(\d+)", block)
        last = re.search(r"\.last_epoch_num\s*=\s*(\d+)", block)
        if first is None:
            continue
        span = list(range(int(first.group(1)), int((last or first).group(1)) + 1))
        if "EpochBlock_Flags_blob" in block:
            net.hw_epochs += span
        elif "pure_sw" in block or "hybrid" in block:
            net.sw_epochs += span
    return net


def read_c_info(path) -> NetworkC:
    """What ST Edge AI's c_info.json (beside a 3.0 blob trace) says of the buffers: its memory pools
    (`used_size_bytes` as the stated figure; a pool with subpools is the virtual one) and its
    activation buffers (`is_param` false: pool address + `offset_start`, `size_bytes`, first epoch).
    It lists no software epochs apart from the hardware ones, so none are counted."""
    import json

    try:
        info = json.loads(Path(path).read_text(errors="replace"))
        pools = [
            Pool(
                int(p["id"]),
                p["name"],
                int(p["address"]),
                int(p["size_bytes"]),
                bool(p.get("subpools")),
                p.get("rights") == "ACC_READ",
                int(p["used_size_bytes"]),
            )
            for p in info["memory_pools"]
        ]
        at = {p.index: p.address for p in pools}
        buffers = {
            b["name"]: (
                at[b["mpool_id"]] + int(b["offset_start"]),
                at[b["mpool_id"]] + int(b["offset_start"]) + int(b["size_bytes"]),
                int(b["epochs"]["start"]),
            )
            for b in info["buffers"]
            if not b["is_param"]
        }
    except OSError as e:
        raise CompiledError(f"{path}: cannot read: {e.strerror}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise CompiledError(f"{path}: not an ST Edge AI c_info.json ({type(e).__name__}: {e})") from None
    return NetworkC(str(path), pools, buffers)


def network_c_beside(path) -> Path | None:
    """The network.c of a compiled program: the file itself when it is one, else a .c beside it that
    lists the epoch blocks; for a blob trace without one, the c_info.json beside it."""
    path = Path(path)
    candidates = [path] if path.suffix == ".c" else sorted(path.parent.glob("*.c"))
    for c in candidates:
        try:
            if "LL_ATON_EpochBlockItems" in c.read_text(errors="replace"):
                return c
        except OSError:
            continue
    beside = sorted(path.parent.glob("*c_info.json"))
    return beside[0] if path.suffix == ".c" and beside else None


def blobs_of(path) -> Path:
    """The epoch-controller blobs of `path`: itself, or the _ecblobs.h a network.c includes."""
    path = Path(path)
    if path.suffix != ".c":
        return path
    try:
        m = re.search(r'#include\s+"([^"]*ecblobs[^"]*)"', path.read_text(errors="replace"))
    except OSError as e:
        raise CompiledError(f"{path}: cannot read: {e.strerror}") from None
    if m is None:
        raise CompiledError(f"{path}: includes no _ecblobs.h: not the network.c of an epoch-controller build")
    return path.parent / m.group(1)


def _main_epoch(program) -> dict:
    """op index -> the epoch its work is counted in."""
    out = {i: c.epoch for i, c in (*program.mapped.items(), *program.pools.items())}
    out.update({i: p.epoch for i, p in program.singles.items()})
    for epoch, ops in sorted(program.movement.items()):
        for i in ops:
            out.setdefault(i, epoch)
    return out


def compiled_view(dev: DeviceReport, program, net: NetworkC | None) -> dict:
    """Latency and internal RAM counted on the compiled program (module docstring)."""
    overhead = dev.cost.epoch_overhead_s
    main = _main_epoch(program)
    hw = sorted({e.number for e in program.epochs} | set(net.hw_epochs if net else []))
    sw = sorted(set(net.sw_epochs)) if net else []
    work = {e: [0.0, 0.0] for e in hw}
    loose = 0.0  # NPU layers the program does not show mapped, and M55 compute
    unmapped = 0
    for o in dev.ops:
        if o.unit == NPU and o.role == LAYER and o.op_index in main and main[o.op_index] in work:
            w = work[main[o.op_index]]
            w[0] += o.compute_s
            w[1] += o.memory_s
        elif o.unit == M55 or o.role == LAYER:
            loose += max(o.compute_s, o.memory_s)
            unmapped += o.unit == NPU
    npu_s = sum(max(c, m) for c, m in work.values()) + overhead * len(hw)
    latency = npu_s + loose + overhead * len(sw)
    out = {
        "file": program.path,
        "network_c": net.path if net else None,
        "hardware_epochs": len(hw),
        "software_epochs": len(sw),
        "npu_layers_not_in_program": unmapped,
        "latency_s": latency,
        "npusim_latency_s": dev.latency_s(1),
        "npusim_epochs": dev.hardware_epochs + dev.software_epochs,
        "npusim_internal_ram_bytes": dev.memory.internal_bytes,
    }
    if net is not None:
        used = net.used()
        out["internal_ram_bytes"] = net.internal_bytes
        out["memory_pools"] = {
            p.name: {"used_bytes": used[p.name], "size_bytes": p.size, "stated_bytes": p.stated_bytes}
            for p in net.pools
            if p.name in used
        }
        out["buffers"] = len(net.buffers)
        stated = [p for p in net.pools if p.name in used and p.stated_bytes is not None]
        # ST prints its figure with two decimals of KB or MB
        out["equals_stated_pools"] = bool(stated) and all(
            abs(used[p.name] - p.stated_bytes) <= 0.006 * (1 << 20 if used[p.name] >= 1 << 20 else 1 << 10)
            for p in stated
        )
    return out


def view_lines(view: dict) -> list[str]:
    """The text `inspect --compiled` adds for the N6 view."""
    lat, est = view["latency_s"], view["npusim_latency_s"]
    lines = [
        f"  N6 view on the compiled epochs: {view['hardware_epochs']} hardware + {view['software_epochs']} "
        f"software epochs (npusim's grouping: {view['npusim_epochs']}); estimated latency "
        f"{lat * 1e3:.3f} ms (npusim's grouping: {est * 1e3:.3f} ms)"
    ]
    if view["npu_layers_not_in_program"]:
        lines[0] += f"; {view['npu_layers_not_in_program']} NPU layers not in the program"
    if "internal_ram_bytes" in view:
        pools = ", ".join(
            f"{n} {p['used_bytes'] / 1024:.1f}"
            for n, p in view["memory_pools"].items()
            if not n.startswith("cpuRAM2_")
        )
        ram, mine = view["internal_ram_bytes"], view["npusim_internal_ram_bytes"]
        name = Path(view["network_c"]).name
        lines.append(
            f"  internal RAM on the compiled buffers ({view['buffers']} in {name}): {ram / 1024:.1f} KiB "
            f"({pools} KiB{f'; as {name} states its pools' if view['equals_stated_pools'] else ''}); "
            f"npusim's layout: {mine / 1024:.1f} KiB ({100.0 * (mine / ram - 1):+.1f} %)"
        )
    else:
        lines.append("  internal RAM: no network.c beside the blobs (its buffer tables give the layout)")
    return lines
