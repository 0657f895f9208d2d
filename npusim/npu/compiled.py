"""ST Edge AI's compiled program mapped to the model's ops: `npusim inspect --target stm32n6
--compiled network_ecblobs.h` (docs/neural-art.md).

The epochs of the blobs (npu/ec_blob.py) form convolution chains (npu/compiled_wiring.py): a pipe
of CONVACCs and the ARITHs that requantize its 16-bit output (ST Edge AI 3.0: one "off_bias"; 2.x:
a per-channel scale A1 into 16 bits, then a scalar A2 with a BC). A chain is the op whose
multiplier it computes: of the model's
CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED ops with its channel count, the one whose
M[c] = s_x s_w[c] / s_y is nearest the chain's effective multiplier, A1[c] A2 / 2^(S + s1 + s2)
(or A[c] / 2^(S + shift_o)), taken in program order. The blobs name no op, so this is a match by
arithmetic: it holds when no two layers share every channel's multiplier.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .compiled_epochs import epoch_kinds, map_arith_ops, map_pools, movement_ops
from .compiled_wiring import Chain, program_chains, wire
from .ec_blob import CompiledError, read_ecblobs
from .neural_art import MAC_KINDS, N6Options, graph_stages

MATCH_TOLERANCE = 1e-3  # relative, beyond the coefficients' own rounding (Chain.rounding)


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
    # the frame (neural_art.conv_geometry): kernel, strides, pads, input size, crops, pad value
    *("kernelWidth", "kernelHeight", "hstride", "vstride", "fWidth", "fHeight", "zfbias"),
    *("left_padding", "right_padding", "top_padding", "bot_padding"),
    *("left_crop", "right_crop", "top_crop", "bot_crop"),
)
COMPARED_SUBOFF = ("A_scalar", "B_scalar", "C_scalar", "shift_o", "inbytes_x", "outbytes_o", "rounding_o")
# An ARITH unit's widths, rounding and output shift: compared on every requantizing ARITH, per-channel
# (COMPARED_ARITH) or scalar (COMPARED_SINGLE).
ARITH_FORMAT = ("inbytes_x", "rounding_o", "saturation_o", "round_mode_o", "outbytes_o", "shift_o")
COMPARED_ARITH = ("combinebc", *ARITH_FORMAT, "A_vector", "C_vector")


def differs(derived: list[dict], compiled: list[dict]) -> list[str]:
    """The fields where npusim's derived chain and the compiled one part, as UNIT.field (ll_aton's
    names): the suboff's coefficients and widths (ARITH[suboff].), the first CONVACC's format and
    shift_a, the pipe's output (its last CONVACC's shift_o and outbytes_o against the derived
    one's), and each requantizing ARITH in order; "stages" when the compiled chain has a different
    number of requantizing ARITHs."""
    out = []
    d_conv = [s for s in derived if s["unit"] == "CONVACC"]
    d_arith = [s for s in derived if s["unit"] == "ARITH" and s.get("role") != "suboff"]
    c_conv = [s for s in compiled if s["unit"] == "CONVACC"]
    c_arith = [s for s in compiled if s["unit"] == "ARITH" and s.get("role") != "suboff"]
    d_sub = [s for s in derived if s.get("role") == "suboff"]
    c_sub = [s for s in compiled if s.get("role") == "suboff"]
    if d_sub and c_sub:
        out += [f"ARITH[suboff].{k}" for k in COMPARED_SUBOFF if d_sub[0].get(k) != c_sub[0].get(k)]
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


COMPARED_SINGLE = (
    *ARITH_FORMAT,
    "A_scalar",
    "B_scalar",
    "C_scalar",
    "Ax_shift",
    "By_shift",
    "C_shift",
)


def differs_pool(derived: list[dict], compiled: list[dict]) -> list[str]:
    """A pool: its padding CONVACC and each POOL unit in order, every field the compiled unit states
    (ec_blob.pool_fields; not POOL's raw CTRL word), as CONVACC[pad].field and POOL[i].field;
    "stages" when the number of units differs."""
    out = []
    for unit, label in (("CONVACC", "CONVACC[pad]"), ("POOL", "POOL")):
        d = [s for s in derived if s["unit"] == unit]
        c = [s for s in compiled if s["unit"] == unit]
        if len(d) != len(c):
            out.append("stages")
        for i, (a, b) in enumerate(zip(d, c)):
            name = label if unit == "CONVACC" else f"POOL[{i}]"
            out += [f"{name}.{k}" for k in b if k not in _NOT_COMPARED and a.get(k) != b[k]]
    return sorted(set(out), key=out.index)


_NOT_COMPARED = ("unit", "role", "ctrl")


def differs_single(derived: list[dict], compiled: list[dict]) -> list[str]:
    """An op compiled as one scalar ARITH (ADD, QUANTIZE): the fields where the derived and the
    compiled unit part (for a single-input unit, Ax_shift, By_shift and C_shift are unused)."""
    if len(derived) != 1 or len(compiled) != 1:
        return ["stages"]
    d, c = derived[0], compiled[0]
    keys = [k for k in COMPARED_SINGLE if c.get("dualinput") or k not in ("Ax_shift", "By_shift", "C_shift")]
    return [f"ARITH.{k}" for k in keys if d.get(k) != c.get(k)]


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
    """A compiled program read and mapped: epochs, chains, op index -> conv chain (mapped), op index
    -> the one ARITH of an ADD or QUANTIZE (singles, npu/compiled_epochs.py)."""

    path: str
    epochs: list
    chains: list
    mapped: dict
    singles: dict
    pools: dict = field(default_factory=dict)  # op index -> PoolChain
    movement: dict = field(default_factory=dict)  # data-movement epoch -> the ops it works for

    def owners(self) -> dict:
        """(epoch, unit) -> op index, for every unit a mapped op runs on."""
        out = {u: i for i, c in (*self.mapped.items(), *self.pools.items()) for u in c.units}
        out.update({(p.epoch, p.unit): i for i, p in self.singles.items()})
        return out

    def claimed(self) -> set:
        return set(self.owners())

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
            "mapped_single_arith_ops": len(self.singles),
            "mapped_pools": len(self.pools),
            "epoch_kinds": epoch_kinds(self.epochs, self.claimed()),
            "movement_epochs_mapped": sum(bool(ops) for ops in self.movement.values()),
        }


def read_epochs(path) -> list:
    """The epochs of a compiled program: ST Edge AI's blob trace (.c, npu/blob_trace.py), its
    network_ecblobs.h, or the network.c that includes the latter (npu/ec_blob.py). A c_info.json
    names the epochs' units but holds none of their configuration: refused in one line."""
    from .blob_trace import is_trace, read_trace
    from .compiled_view import blobs_of

    path = Path(path)
    if path.suffix == ".json":
        raise CompiledError(
            f"{path}: a c_info.json lists epochs and buffers but no unit's configuration; give the "
            "blob trace (<network>_blob_trace.c) or network_ecblobs.h"
        )
    if path.suffix == ".c":
        try:
            text = path.read_text(errors="replace")
        except OSError as e:
            raise CompiledError(f"{path}: cannot read: {e.strerror}") from None
        if is_trace(text):
            return read_trace(path)
    return read_ecblobs(blobs_of(path))


def read_compiled(path, graph) -> CompiledProgram:
    """Read a compiled program (read_epochs) and map its units to graph's ops; CompiledError (one line
    naming the blob or trace, epoch and word or line) when it cannot be read or nothing maps."""
    epochs = read_epochs(path)
    chains = program_chains(epochs)
    if not chains:
        raise CompiledError(f"{path}: no epoch configures a CONVACC with a requantizing ARITH")
    mapped = map_chains(graph, chains)
    if not mapped:
        raise CompiledError(
            f"{path}: epoch {chains[0].epoch}: no convolution the program requantizes (this epoch's first, "
            f"{chains[0].channels} channels) matches a conv of the model: compiled from another model?"
        )
    pools = map_pools(graph, wire(epochs).pools)
    claimed = {u for c in (*mapped.values(), *pools.values()) for u in c.units}
    singles = map_arith_ops(graph, epochs, claimed)
    program = CompiledProgram(str(path), epochs, chains, mapped, singles, pools)
    program.movement = movement_ops(graph, epochs, program.owners())
    return program


def compiled_ops(data: dict, graph, program: CompiledProgram, options: N6Options | None = None) -> dict:
    """Give each op of report_dict's "ops" that a compiled chain maps to its
    "neural_art": {..., "compiled": {"stages": [...], "differs": [...]}}, and data a
    "compiled" summary."""
    derived = graph_stages(graph, options or N6Options())
    for o in data["ops"]:
        index = o["op_index"]
        chain = program.mapped.get(index, program.singles.get(index, program.pools.get(index)))
        moved = sorted(e for e, ops in program.movement.items() if index in ops)
        if chain is None and moved:  # a data-movement op: the epochs whose copies work for it
            na = o.setdefault("neural_art", {"stages": []})
            na["compiled"] = {"epoch": moved[0], "epochs": moved, "stages": [], "differs": []}
        if chain is None:
            continue
        na = o.setdefault("neural_art", {"stages": []})
        stages = chain.stages()
        compare = differs if index in program.mapped else differs_single
        if index in program.pools:
            compare = differs_pool
        na["compiled"] = {
            "epoch": chain.epoch,
            "epochs": chain.epochs,
            "stages": stages,
            "differs": compare(derived.get(index, []), stages),
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
    single_exact = sum(not differs_single(derived.get(i, []), p.stages()) for i, p in program.singles.items())
    pool_exact = sum(not differs_pool(derived.get(i, []), p.stages()) for i, p in program.pools.items())
    k = s["epoch_kinds"]
    lines = [
        "",
        f"compiled program {s['file']}: {s['epochs']} epochs, {s['conv_chains']} conv chains, "
        f"{s['mapped_chains']} mapped to ops ({s['mapped_conv_epochs']} of {s['conv_epochs']} conv epochs); "
        f"{exact} of {s['mapped_chains']} equal the derived chain in every compared field",
        f"  ADD and QUANTIZE units mapped to ops: {len(program.singles)}, {single_exact} equal the derived "
        f"unit in every compared field",
        f"  pools mapped to ops: {len(program.pools)}, {pool_exact} equal the derived units (the padding "
        f"CONVACC, each POOL) in every decoded field",
        f"  epochs: {k['mapped']} with every compute unit in a mapped op, {k['unmapped']} "
        f"not ({', '.join(k['unmapped_units'][:6]) or '-'}), {k['movement']} data movement only "
        f"({s['movement_epochs_mapped']} of them mapped to the op they copy for), "
        f"{k['empty']} with no NPU unit",
    ]
    if counts:
        shown = ", ".join(f"{k} ({v})" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
        lines.append(f"  fields that differ (layers): {shown}")
    return lines


def run_stages(derived: list[dict], chain: Chain) -> list[dict]:
    """The chain `--profile neural-art --compiled` runs for a mapped conv: the compiled suboff (the
    derived one where the wiring found none), the CONVACC with the compiled pipe's shift_a and
    output (its last unit's shift_o and width), then the compiled requantizing ARITHs as they are."""
    convacc = dict(derived[1])
    convacc.update(
        shift_a=chain.convaccs[0]["shift_a"],
        shift_o=chain.convaccs[-1]["shift_o"],
        outbytes_o=chain.convaccs[-1]["outbytes_o"],
    )
    suboff = derived[0] if chain.suboff is None else dict(chain.suboff, role="suboff")
    return [suboff, convacc, *(dict(a, role="compiled") for a in chain.ariths)]
