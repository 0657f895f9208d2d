"""The compiled program's units that are not a convolution's chain, mapped to ops (ADD, an int8
QUANTIZE: each one ARITH; pools: chains of POOL units), and what each epoch runs
(docs/neural-art.md).

An ADD is the two-input ARITH whose ratios A / 2^(shift_o + Ax_shift) and B / 2^(shift_o + By_shift)
are the op's s_x / s_out and s_y / s_out; a QUANTIZE the one-input scalar ARITH whose
A / 2^shift_o is s_x / s_out and whose BC / 2^shift_o is z_out - (s_x / s_out) z_x: each within
its coefficients' rounding, the first such op in program order not yet mapped (a match by
arithmetic, as npu/compiled.py's for convolutions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ec_blob import arith_fields

TOLERANCE = 1e-3  # relative, beyond half a unit of each coefficient


@dataclass
class Placed:
    """One op compiled as a single ARITH: its epoch, unit name and ll_aton fields."""

    epoch: int
    unit: str
    fields: dict

    @property
    def epochs(self) -> list[int]:
        return [self.epoch]

    def stages(self) -> list[dict]:
        return [self.fields]


def _bc(f: dict) -> int:
    return (int(f["B_scalar"]) << 16) + (int(f["C_scalar"]) & 0xFFFF)


def _candidates(graph) -> dict[int, tuple]:
    """op index -> (kind, ratios the ARITH computes)."""
    t, out = graph.tensors, {}
    for op in graph.ops:
        ins = [t[i] for i in op.inputs if i >= 0]
        o = t[op.outputs[0]] if op.outputs else None
        if o is None or o.quant is None or any(x.quant is None for x in ins):
            continue
        if op.kind == "ADD" and len(ins) == 2 and not any(x.is_constant for x in ins):
            out[op.index] = ("ADD", ins[0].scale / o.scale, ins[1].scale / o.scale)
        elif op.kind == "QUANTIZE" and np.dtype(ins[0].dtype).kind in "iu":
            r = ins[0].scale / o.scale
            out[op.index] = ("QUANTIZE", r, o.zero_point - r * ins[0].zero_point)
    return out


def _error(f: dict, kind: str, a: float, b: float) -> float | None:
    """How far the ARITH's coefficients are from the op's, over what their rounding allows
    (<= 1: a match); None when the unit cannot be that op."""
    if kind == "ADD":
        if not f["dualinput"]:
            return None
        ra = f["A_scalar"] / 2.0 ** (f["shift_o"] + f["Ax_shift"])
        rb = f["B_scalar"] / 2.0 ** (f["shift_o"] + f["By_shift"])
        allowed = 0.5 / max(abs(f["A_scalar"]), 1) + 0.5 / max(abs(f["B_scalar"]), 1) + TOLERANCE
        return max(abs(ra / a - 1), abs(rb / b - 1)) / allowed
    if f["dualinput"] or not f["scalar"]:
        return None  # (a uint8 input arrives as a 16-bit stream: inbytes_x 2 on the 2.1 compile)
    ratio, c = f["A_scalar"] / 2.0 ** f["shift_o"], _bc(f) / 2.0 ** f["shift_o"]
    allowed = 0.5 / max(abs(f["A_scalar"]), 1) + TOLERANCE
    return max(abs(ratio / a - 1) / allowed, abs(c - b) / (1 + abs(b)) / allowed)


def map_arith_ops(graph, epochs, claimed: set) -> dict[int, Placed]:
    """op index -> the single ARITH it compiled to, over the ARITHs no chain claimed
    ((epoch, unit) pairs), in program order."""
    candidates, mapped = _candidates(graph), {}
    for epoch in epochs:
        for unit in epoch.units:
            if not unit.name.startswith("ARITH") or (epoch.number, unit.name) in claimed:
                continue
            f = arith_fields(unit)
            best, err = None, np.nextafter(1.0, 2.0)
            for index, (kind, a, b) in candidates.items():
                e = None if index in mapped else _error(f, kind, a, b)
                if e is not None and e < err:
                    best, err = index, e
            if best is not None:
                mapped[best] = Placed(epoch.number, unit.name, dict(f, role=candidates[best][0].lower()))
    return mapped


def map_pools(graph, pools) -> dict:
    """op index -> its PoolChain (npu/compiled_wiring.py): the first MAX_POOL_2D / AVERAGE_POOL_2D
    in program order whose decomposition (neural_art.pool_stages) has as many POOL units (their
    fields are then compared, compiled.differs_pool)."""
    from .neural_art import pool_stages

    counts = {
        op.index: sum(st["unit"] == "POOL" for st in pool_stages(op.kind, op.options))
        for op in graph.ops
        if op.kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D")
    }
    mapped = {}
    for pool in pools:
        index = next((i for i, n in counts.items() if n == pool.pools and i not in mapped), None)
        if index is not None:
            mapped[index] = pool
    return mapped


def epoch_kinds(epochs, claimed: set) -> dict:
    """What the epochs run: "mapped", every ARITH, CONVACC, POOL, ACTIV and DECUN unit in a mapped op;
    "unmapped", some not (listed as "epoch:unit"); "movement", stream engines only (copies:
    concatenation, resize, transposes through memory); "empty", no NPU unit."""
    out = {"mapped": 0, "unmapped": 0, "movement": 0, "empty": 0, "unmapped_units": []}
    for epoch in epochs:
        names = [u.name for u in epoch.units]
        compute = [n for n in names if n.startswith(("ARITH", "CONVACC", "POOL", "ACTIV", "DECUN"))]
        if compute:
            left = [f"{epoch.number}:{n}" for n in compute if (epoch.number, n) not in claimed]
            out["unmapped" if left else "mapped"] += 1
            out["unmapped_units"] += left
        elif any(n.startswith("STRENG") for n in names):
            out["movement"] += 1
        else:
            out["empty"] += 1
    return out


COMPUTE_UNITS = ("ARITH", "CONVACC", "POOL", "ACTIV", "DECUN")


def movement_ops(graph, epochs, owners: dict) -> dict[int, list[int]]:
    """Epoch -> the ops each data-movement epoch (stream engines only: a copy from one buffer to
    another) works for. owners: (epoch, unit) -> op index of the mapped units. A copy reads what
    some op wrote (the data's producer, followed through earlier copies) and writes what a later
    unit reads (its consumer): it is the data-movement op between them in the graph (a
    CONCATENATION, a resize's expansion, ...) when there is one, else the op it prepares the input
    of (of several, the first in program order). A gap in the epoch numbers is a software epoch
    (network.c, not the blobs), which may write any buffer: what memory held is forgotten there,
    and a copy nothing resolves is the first data-movement op after the ops the epochs before it
    ran."""
    from .ec_blob import streng_fields, switch_links

    producer_at, copies, out = {}, {}, {}  # address -> op; address -> [epoch]; epoch -> [op]
    consumers = {}
    for op in graph.ops:
        for t in op.inputs:
            consumers.setdefault(t, []).append(op)
    moving = {op.index for op in graph.ops if op.kind not in _UNIT_KINDS}
    last = None
    for epoch in epochs:
        if last is not None and epoch.number != last + 1:
            producer_at, copies = {}, {}  # a software epoch ran between: memory is not what we saw
        last = epoch.number
        links, units = switch_links(epoch), {u.name: u for u in epoch.units}
        copying = not any(n.startswith(COMPUTE_UNITS) for n in units)
        for port, sources in links.items():
            for source in sources:
                src, dst = units.get(source), units.get(port)
                if src is not None and source.startswith("STRENG") and (epoch.number, port) in owners:
                    reader = owners[(epoch.number, port)]
                    for e in copies.pop(streng_fields(src)["addr"], []):
                        out[e].append(("reader", reader))
                if dst is None or not port.startswith("STRENG") or not streng_fields(dst)["write"]:
                    continue
                addr = streng_fields(dst)["addr"]
                if copying and src is not None and source.startswith("STRENG"):
                    made = producer_at.get(streng_fields(src)["addr"])
                    out.setdefault(epoch.number, []).append(("producer", made))
                    copies.setdefault(addr, []).append(epoch.number)
                    producer_at[addr] = made
                elif (epoch.number, source) in owners:
                    producer_at[addr] = owners[(epoch.number, source)]
    found = {e: _movement_op(graph, f, consumers, moving) for e, f in out.items()}
    ran = {}  # epoch -> the ops its mapped units run, for the copies nothing above resolves
    for (e, _), index in owners.items():
        ran.setdefault(e, set()).add(index)
    for e in sorted(found):
        if not found[e]:
            before = max((i for k, ops in ran.items() if k < e for i in ops), default=-1)
            found[e] = [min((i for i in moving if i > before), default=None)] if moving else []
            found[e] = [i for i in found[e] if i is not None]
        ran.setdefault(e, set()).update(found[e])
    return found


_UNIT_KINDS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD", "QUANTIZE", "MAX_POOL_2D")


def _movement_op(graph, found, consumers, moving) -> list[int]:
    made = {i for k, i in found if k == "producer" and i is not None}
    readers = {i for k, i in found if k == "reader" and i is not None}
    after = {c.index for i in made for t in graph.ops[i].outputs for c in consumers.get(t, [])} & moving
    t_before = {t for i in readers for t in graph.ops[i].inputs}
    before = {op.index for op in graph.ops if set(op.outputs) & t_before} & moving
    for choice in (after & before, before, after, readers, made):
        if choice:
            return [min(choice)]  # the nearest in program order: epochs run in it
    return []
