"""ST Edge AI's compiled program mapped to the model's ops: `npusim inspect --target stm32n6
--compiled network_ecblobs.h` (docs/neural-art.md).

The epochs of the blobs (npu/ec_blob.py) are cut into convolution chains: a pipe of CONVACCs (the
first without an accumulator input, `accumulate` 0) and the per-channel ARITHs that requantize its
16-bit output (ST Edge AI 3.0: one "off_bias"; 2.x: a per-channel scale A1 into 16 bits, then a
scalar A2 with a per-channel BC). A chain is the op whose multiplier it computes: of the model's
CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED ops with its channel count, the one whose
M[c] = s_x s_w[c] / s_y is nearest the chain's effective multiplier, A1[c] A2 / 2^(S + s1 + s2)
(or A[c] / 2^(S + shift_o)), taken in program order. The blobs name no op, so this is a match by
arithmetic: it holds when no two layers share every channel's multiplier.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ec_blob import (
    CompiledError,
    Epoch,
    arith_fields,
    convacc_fields,
    read_ecblobs,
    streng_fields,
    switch_links,
)
from .neural_art import MAC_KINDS, N6Options, graph_stages

MATCH_TOLERANCE = 1e-3  # relative, beyond the coefficients' own rounding (Chain.rounding)


@dataclass
class Chain:
    """One convolution as compiled: its CONVACC pipe and requantizing ARITHs (ll_aton fields), and
    the epoch of each (a requantization may run epochs after its pipe, through a 16-bit buffer)."""

    epoch: int
    convaccs: list = field(default_factory=list)
    ariths: list = field(default_factory=list)
    arith_epochs: list = field(default_factory=list)

    @property
    def channels(self) -> int:
        return next((len(a["A_vector"]) for a in self.ariths if a["A_vector"] is not None), 0)

    @property
    def epochs(self) -> list[int]:
        return sorted({self.epoch, *self.arith_epochs})

    @property
    def complete(self) -> bool:
        """Its requantization reached int8 (an ARITH with an 8-bit output)."""
        return bool(self.ariths) and self.ariths[-1]["outbytes_o"] == 1

    def multiplier(self) -> np.ndarray:
        """The effective per-channel multiplier, accumulator to output steps."""
        total = np.full(self.channels, 2.0 ** -self.convaccs[-1]["shift_o"])
        for a in self.ariths:
            coefficient = a["A_scalar"] if a["A_vector"] is None else np.asarray(a["A_vector"], np.float64)
            total = total * coefficient / 2.0 ** a["shift_o"]
        return total

    def rounding(self) -> np.ndarray:
        """Per channel, the relative error the coefficients' rounding allows the multiplier:
        half a unit of each A (a channel far below the layer's largest keeps few bits of A1)."""
        bound = np.zeros(self.channels)
        for a in self.ariths:
            coefficient = a["A_scalar"] if a["A_vector"] is None else np.asarray(a["A_vector"], np.float64)
            bound = bound + 0.5 / np.maximum(np.abs(coefficient), 1)
        return bound

    def stages(self) -> list[dict]:
        return [*self.convaccs, *self.ariths]


def _requantizing(f: dict) -> bool:
    """An ARITH that takes a 16-bit stream (a CONVACC's output or a 16-bit intermediate) to a
    scale: not a suboff or QUANTIZE (8-bit input), not an ADD (two inputs)."""
    return not f["dualinput"] and f["inbytes_x"] == 2


def program_chains(epochs: list[Epoch]) -> list[Chain]:
    """The convolution chains of a whole program, by its wiring (wired_chains); by configuration
    order (ordered_chains) for a program that configures no stream switch."""
    if any(u.name == "STRSWITCH" for e in epochs for u in e.units):
        return wired_chains(epochs)
    return ordered_chains(epochs)


def wired_chains(epochs: list[Epoch]) -> list[Chain]:
    """The chains as the program wires them. Within an epoch the stream switch says which unit
    feeds which (ec_blob.switch_links): a CONVACC whose accumulator input (port 2) is another
    CONVACC continues that one's pipe, a requantizing ARITH continues the chain whose last unit
    feeds its input 0. Across epochs a chain's last unit writes its 16-bit output to memory through
    a stream engine, and the ARITH that a later epoch feeds from an engine reading that address
    continues it (network.c names these buffers `<conv>_out`, `<conv>_mul_scale_out`)."""
    chains, in_memory = [], {}
    for epoch in epochs:
        links, units = switch_links(epoch), {u.name: u for u in epoch.units}
        ends = {}  # unit of this epoch -> the chain it currently ends
        waiting = [u for u in epoch.units if u.name.startswith(("CONVACC", "ARITH"))]
        while waiting:
            left = [u for u in waiting if not _wire(u, epoch.number, links, units, ends, in_memory, chains)]
            if len(left) == len(waiting):
                break  # fed by nothing this epoch resolves: not part of a conv chain
            waiting = left
        for port, sources in links.items():
            engine = units.get(port)
            if engine is not None and port.startswith("STRENG") and streng_fields(engine)["write"]:
                for source in sources:
                    if source in ends and not ends[source].complete:
                        in_memory[streng_fields(engine)["addr"]] = ends[source]
    return [c for c in chains if c.complete]


def _wire(unit, epoch: int, links: dict, units: dict, ends: dict, in_memory: dict, chains: list) -> bool:
    """Place one unit of an epoch in its chain; False while what feeds it is not placed yet."""
    if unit.name.startswith("CONVACC"):
        f = convacc_fields(unit)
        feeder = next((s for s in links.get(f"{unit.name}.2", []) if s.startswith("CONVACC")), None)
        if f["accumulate"] and feeder is not None:
            if feeder not in ends:
                return False
            chain = ends.pop(feeder)
        else:
            chain = Chain(epoch)
            chains.append(chain)
        chain.convaccs.append(f)
        ends[unit.name] = chain
        return True
    f = arith_fields(unit)
    if not _requantizing(f):
        return True
    source = (links.get(f"{unit.name}.0") or [None])[0]
    if source is not None and source.startswith("STRENG") and source in units:
        chain = in_memory.pop(streng_fields(units[source])["addr"], None)
    elif source in ends:
        chain = ends.pop(source)
    else:
        return source is None or source not in units
    if chain is not None and not chain.complete:
        chain.ariths.append(f)
        chain.arith_epochs.append(epoch)
        ends[unit.name] = chain
    return True


def ordered_chains(epochs: list[Epoch]) -> list[Chain]:
    """The convolution chains of a whole program by configuration order alone: each CONVACC pipe
    (a first unit with `accumulate` 0, then the units accumulating onto it) with the requantizing
    ARITHs that take its 16-bit output to int8, in the order the epochs configure them.

    A pipe whose output is already 8-bit needs none. An ARITH goes to an open chain of its own
    stage: a first ARITH (the 2.x mul_scale, or 3.0's off_bias) to a pipe without one, a later one
    to a chain whose last ARITH has its channel count. Within an epoch units stream into each
    other, so the chain configured last in the same epoch is taken first; otherwise the ARITH reads
    a buffer an earlier epoch wrote, and the oldest open chain is taken (ST's network.c names these
    buffers `<conv>_out`, `<conv>_mul_scale_out`)."""
    chains, open_chains, pipe = [], [], None
    for epoch in epochs:
        for unit in epoch.units:
            if not unit.name.startswith(("CONVACC", "ARITH")):
                continue
            if unit.name.startswith("CONVACC"):
                f = convacc_fields(unit)
                if pipe is None or not f["accumulate"] or pipe.ariths or pipe not in open_chains:
                    pipe = Chain(epoch.number)
                    chains.append(pipe)
                    open_chains.append(pipe)
                pipe.convaccs.append(f)
                if f["outbytes_o"] == 1:
                    open_chains.remove(pipe)  # 8-bit out: no requantization follows
                continue
            f = arith_fields(unit)
            if not _requantizing(f):
                continue
            chain = _open_chain_for(f, open_chains, epoch.number)
            if chain is None:
                continue
            chain.ariths.append(f)
            chain.arith_epochs.append(epoch.number)
            if chain.complete:
                open_chains.remove(chain)
    return [c for c in chains if c.complete]


def _open_chain_for(f: dict, open_chains: list[Chain], epoch: int) -> Chain | None:
    """The open chain an ARITH continues: a 16-bit output starts a requantization (a pipe without
    ARITHs); an 8-bit one ends one, preferably a chain waiting on a 16-bit intermediate of its
    channel count, else a pipe (a one-stage requantization). Same epoch first (the last such
    chain configured), then the oldest from an earlier epoch."""
    n = None if f["A_vector"] is None else len(f["A_vector"])
    bare = [c for c in open_chains if not c.ariths]
    waiting = [
        c for c in open_chains if c.ariths and c.ariths[-1]["outbytes_o"] == 2 and n in (None, c.channels)
    ]
    groups = [bare] if f["outbytes_o"] == 2 else [waiting, bare]
    for same_epoch in (True, False):
        for group in groups:
            found = [c for c in group if ((c.arith_epochs or [c.epoch])[-1] == epoch) == same_epoch]
            if found:
                return found[-1] if same_epoch else found[0]
    return None


def _op_multiplier(graph, op) -> np.ndarray | None:
    t = graph.tensors
    x, w, y = t[op.inputs[0]], t[op.inputs[1]], t[op.outputs[0]]
    if x.quant is None or w.quant is None or y.quant is None:
        return None
    channels = w.shape[-1] if op.kind == "DEPTHWISE_CONV_2D" else w.shape[0]
    sw = np.broadcast_to(np.asarray(w.quant.scale, np.float32).astype(np.float64), (channels,))
    return np.float64(x.scale) * sw / np.float64(y.scale)


def map_chains(graph, chains: list[Chain]) -> dict[int, Chain]:
    """op index -> its compiled chain: per chain, in program order, the unmapped MAC op of its
    channel count whose multipliers it reproduces best, every channel within its coefficients'
    rounding (Chain.rounding) plus MATCH_TOLERANCE."""
    candidates = {}
    for op in graph.ops:
        if op.kind in MAC_KINDS:
            m = _op_multiplier(graph, op)
            if m is not None:
                candidates[op.index] = m
    mapped = {}
    for chain in chains:
        eff, allowed = chain.multiplier(), chain.rounding() + MATCH_TOLERANCE
        best, err = None, np.nextafter(1.0, 2.0)  # within the allowed error, the first best
        for index, m in candidates.items():
            if index in mapped or len(m) != len(eff) or not np.all(m > 0):
                continue
            e = float(np.max(np.abs(eff / m - 1.0) / allowed))
            if e < err:
                best, err = index, e
        if best is not None:
            mapped[best] = chain
    return mapped


# ----------------------------------------------------------------------------------------------
# Derived against compiled


COMPARED_CONVACC = (
    "simd",
    "f_unsigned",
    "inbytes_f",
    "shift_a",
    "rounding_o",
    "saturation_o",
    "round_mode_o",
)
COMPARED_ARITH = (
    "combinebc",
    "inbytes_x",
    "rounding_o",
    "saturation_o",
    "round_mode_o",
    "outbytes_o",
    "shift_o",
    "A_vector",
    "C_vector",
)


def differs(derived: list[dict], compiled: list[dict]) -> list[str]:
    """The fields where npusim's derived chain and the compiled one part, as UNIT.field (ll_aton's
    names): the first CONVACC's format and shift_a, the pipe's output (its last CONVACC's shift_o and
    outbytes_o against the derived one's), and each requantizing ARITH in order; "stages" when the
    compiled chain has a different number of requantizing ARITHs."""
    out = []
    d_conv = [s for s in derived if s["unit"] == "CONVACC"]
    d_arith = [s for s in derived if s["unit"] == "ARITH" and s.get("role") != "suboff"]
    c_conv = [s for s in compiled if s["unit"] == "CONVACC"]
    c_arith = [s for s in compiled if s["unit"] == "ARITH"]
    if d_conv and c_conv:
        # deep mode (1x1 kernels) streams the feature 3 bytes at a time (inbytes_f 3 in the 3.0 trace
        # and the 2.1 blobs alike, only there): a packing of the stream, not the feature's width
        keys = [k for k in COMPARED_CONVACC if not (k == "inbytes_f" and c_conv[0].get("deepmode"))]
        out += [f"CONVACC.{k}" for k in keys if d_conv[0].get(k) != c_conv[0].get(k)]
        for k in ("shift_o", "outbytes_o"):
            if d_conv[-1].get(k) != c_conv[-1].get(k):
                out.append(f"CONVACC.{k}")
    if len(d_arith) != len(c_arith):
        out.append("stages")
    for i, (d, c) in enumerate(zip(d_arith[::-1], c_arith[::-1])):  # from the output back
        prefix = "ARITH" if i == 0 else f"ARITH[-{i + 1}]"
        for k in COMPARED_ARITH:
            if _value(d, k) != _value(c, k):
                out.append(f"{prefix}.{k}")
    return sorted(set(out), key=out.index)


def _value(stage: dict, key: str):
    """A field as compared: a scalar stage's per-channel fields as its scalars, a C_vector with
    combinebc as the BC it stands for."""
    if key == "A_vector" and stage.get("A_vector") is None:
        return stage.get("A_scalar")
    if key == "C_vector" and stage.get("C_vector") is None:
        b, c = stage.get("B_scalar", 0), stage.get("C_scalar", 0)
        return ((b & 0xFFFF) << 16 | (c & 0xFFFF)) - ((b & 0x8000) << 17) if stage.get("combinebc") else c
    return stage.get(key)


@dataclass
class CompiledProgram:
    """A compiled program read and mapped: epochs, chains, op index -> chain."""

    path: str
    epochs: list
    chains: list
    mapped: dict

    def summary(self) -> dict:
        conv_epochs = sorted({c.epoch for c in self.chains})
        mapped_epochs = sorted({c.epoch for c in self.mapped.values()})
        return {
            "file": self.path,
            "epochs": len(self.epochs),
            "conv_chains": len(self.chains),
            "mapped_chains": len(self.mapped),
            "conv_epochs": len(conv_epochs),
            "mapped_conv_epochs": len(mapped_epochs),
        }


def read_compiled(path, graph) -> CompiledProgram:
    """Read network_ecblobs.h and map its convolution chains to graph's ops; CompiledError (one
    line naming the blob, epoch and word) when it cannot be read."""
    epochs = read_ecblobs(path)
    chains = program_chains(epochs)
    if not chains:
        raise CompiledError(f"{path}: no epoch configures a CONVACC with a requantizing ARITH")
    return CompiledProgram(str(path), epochs, chains, map_chains(graph, chains))


def compiled_ops(data: dict, graph, program: CompiledProgram, options: N6Options | None = None) -> dict:
    """Give each op of report_dict's "ops" that a compiled chain maps to its
    "neural_art": {..., "compiled": {"stages": [...], "differs": [...]}}, and data a
    "compiled" summary."""
    derived = graph_stages(graph, options or N6Options())
    for o in data["ops"]:
        chain = program.mapped.get(o["op_index"])
        if chain is None:
            continue
        na = o.setdefault("neural_art", {"stages": []})
        stages = chain.stages()
        na["compiled"] = {
            "epoch": chain.epoch,
            "stages": stages,
            "differs": differs(derived.get(o["op_index"], []), stages),
        }
    data["compiled"] = program.summary()
    return data


def summary_lines(program: CompiledProgram, graph, options: N6Options | None = None) -> list[str]:
    """The text `inspect --compiled` adds: how much of the program mapped, and which fields differ."""
    s = program.summary()
    derived = graph_stages(graph, options or N6Options())
    counts, exact = {}, 0
    for index, chain in program.mapped.items():
        d = differs(derived.get(index, []), chain.stages())
        exact += not d
        for f in d:
            counts[f] = counts.get(f, 0) + 1
    lines = [
        "",
        f"compiled program {s['file']}: {s['epochs']} epochs, {s['conv_chains']} conv chains, "
        f"{s['mapped_chains']} mapped to ops ({s['mapped_conv_epochs']} of {s['conv_epochs']} conv epochs); "
        f"{exact} of {s['mapped_chains']} equal the derived chain in every compared field",
    ]
    if counts:
        shown = ", ".join(f"{k} ({v})" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        lines.append(f"  fields that differ (layers): {shown}")
    return lines


def run_stages(derived: list[dict], chain: Chain) -> list[dict]:
    """The chain `--profile neural-art --compiled` runs for a mapped conv: the derived suboff (the
    blobs' suboffs are not mapped yet), the CONVACC with the compiled pipe's shift_a and output
    (its last unit's shift_o and width), then the compiled requantizing ARITHs as they are."""
    convacc = dict(derived[1])
    convacc.update(
        shift_a=chain.convaccs[0]["shift_a"],
        shift_o=chain.convaccs[-1]["shift_o"],
        outbytes_o=chain.convaccs[-1]["outbytes_o"],
    )
    return [derived[0], convacc, *(dict(a, role="compiled") for a in chain.ariths)]
