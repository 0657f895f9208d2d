"""How the units of ST Edge AI's compiled program form each convolution's chain (npu/compiled.py
maps the chains to the model's ops): the suboff ARITH, the CONVACC pipe, the requantizing ARITHs,
and the epochs each runs in. docs/neural-art.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ec_blob import Epoch, arith_fields, convacc_fields, pool_fields, streng_fields, switch_links


@dataclass
class Chain:
    """One convolution as compiled: its CONVACC pipe and requantizing ARITHs (ll_aton fields), and
    the epoch of each (a requantization may run epochs after its pipe, through a 16-bit buffer)."""

    epoch: int
    convaccs: list = field(default_factory=list)
    ariths: list = field(default_factory=list)
    arith_epochs: list = field(default_factory=list)
    suboff: dict | None = None  # the ARITH feeding the pipe (wired_chains only)
    suboff_epoch: int | None = None
    units: list = field(default_factory=list)  # (epoch, unit name) of each of its units (wired only)

    @property
    def channels(self) -> int:
        return next((len(a["A_vector"]) for a in self.ariths if a["A_vector"] is not None), 0)

    @property
    def epochs(self) -> list[int]:
        """Every epoch one of its units runs in."""
        first = [] if self.suboff_epoch is None else [self.suboff_epoch]
        return sorted({*first, self.epoch, *self.arith_epochs})

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
        """Its units' fields in data-flow order, the suboff (when wired) with role "suboff"."""
        first = [] if self.suboff is None else [dict(self.suboff, role="suboff")]
        return [*first, *self.convaccs, *self.ariths]


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
    feeds its input 0, and the suboff feeding a pipe's first CONVACC (port 0) is the chain's.
    Across epochs a unit writes its output to memory through a stream engine, and the unit that a
    later epoch feeds from an engine reading that address continues from it (network.c names these
    buffers `<conv>_zero_off_out`, `<conv>_out`, `<conv>_mul_scale_out`)."""
    return [c for c in wire(epochs).chains if c.complete]


def wire(epochs: list[Epoch]) -> _Wiring:
    """Follow the program's wiring through every epoch (wired_chains): .chains, and .pools, the
    chains of POOL units (PoolChain)."""
    wiring = _Wiring()
    for epoch in epochs:
        wiring.epoch(epoch)
    return wiring


@dataclass
class PoolChain:
    """One pooling as compiled: POOL units chained within epochs and through memory across them,
    after the CONVACCs (8-bit out, no ARITH) that pad its input when there are (network.c:
    `<pool>_decomposed_pad_out`)."""

    epoch: int
    pads: list = field(default_factory=list)  # CONVACC fields
    pools: int = 0
    units: list = field(default_factory=list)  # (epoch, unit name)
    pool_fields: list = field(default_factory=list)  # each POOL unit's fields (ec_blob.pool_fields)

    @property
    def epochs(self) -> list[int]:
        return sorted({e for e, _ in self.units})

    def stages(self) -> list[dict]:
        return [*(dict(p, role="pad") for p in self.pads), *self.pool_fields]


class _Wiring:
    """The state of wired_chains: chains so far, what each unit of the current epoch ends, and
    what each buffer address in memory holds (a chain's 16-bit output, or a suboff's output)."""

    def __init__(self):
        self.chains, self.pools, self.in_memory = [], [], {}

    def epoch(self, epoch: Epoch):
        self.number, self.links = epoch.number, switch_links(epoch)
        self.units, self.ends = {u.name: u for u in epoch.units}, {}
        waiting = [u for u in epoch.units if u.name.startswith(("CONVACC", "ARITH", "POOL"))]
        while waiting:
            left = [u for u in waiting if not self.place(u)]
            if len(left) == len(waiting):
                break  # fed by nothing this epoch resolves: not part of a conv chain
            waiting = left
        for port, sources in self.links.items():
            engine = self.units.get(port)
            if engine is not None and port.startswith("STRENG") and streng_fields(engine)["write"]:
                for source in sources:
                    held = self.ends.get(source)
                    if held is not None and not (isinstance(held, Chain) and held.complete):
                        self.in_memory[streng_fields(engine)["addr"]] = held

    def source(self, port: str):
        """(True, what feeds the port: a chain, a suboff (fields, epoch, unit) or None) once placed;
        (False, None) while its feeder in this epoch is not placed yet."""
        source = (self.links.get(port) or [None])[0]
        if source is not None and source.startswith("STRENG") and source in self.units:
            return True, self.in_memory.pop(streng_fields(self.units[source])["addr"], None)
        if source in self.ends:
            return True, self.ends.pop(source)
        return source is None or source not in self.units, None

    def place(self, unit) -> bool:
        """Place one unit of the epoch; False while what feeds it is not placed yet."""
        if unit.name.startswith("POOL"):
            return self.place_pool(unit)
        if unit.name.startswith("CONVACC"):
            f = convacc_fields(unit)
            feeder = next((s for s in self.links.get(f"{unit.name}.2", []) if s.startswith("CONVACC")), None)
            if f["accumulate"] and feeder is not None:
                if feeder not in self.ends:
                    return False
                chain = self.ends.pop(feeder)
            else:
                placed, suboff = self.source(f"{unit.name}.0")
                if not placed:
                    return False
                chain = Chain(self.number)
                if isinstance(suboff, tuple):
                    chain.suboff, chain.suboff_epoch, name = suboff
                    chain.units.append((chain.suboff_epoch, name))
                self.chains.append(chain)
            chain.convaccs.append(f)
            chain.units.append((self.number, unit.name))
            # the weights' port fed by a decompression unit: the DECUN is this conv's too
            chain.units += [
                (self.number, d) for d in self.links.get(f"{unit.name}.1", []) if d.startswith("DECUN")
            ]
            self.ends[unit.name] = chain
            return True
        f = arith_fields(unit)
        if _suboff(f):
            placed, _ = self.source(f"{unit.name}.0")
            self.ends[unit.name] = (f, self.number, unit.name)
            return True
        if not _requantizing(f):
            return True
        placed, chain = self.source(f"{unit.name}.0")
        if not placed:
            return False
        if isinstance(chain, Chain) and not chain.complete:
            chain.ariths.append(f)
            chain.arith_epochs.append(self.number)
            chain.units.append((self.number, unit.name))
            self.ends[unit.name] = chain
        return True

    def place_pool(self, unit) -> bool:
        """A POOL unit continues the pooling that feeds it; fed by a CONVACC pipe without ARITHs
        (the input's padding), it starts one with that pipe, which is then no conv's."""
        placed, source = self.source(unit.name)
        if not placed:
            return False
        if isinstance(source, PoolChain):
            pool = source
        else:
            pool = PoolChain(self.number)
            self.pools.append(pool)
            if isinstance(source, Chain) and not source.ariths:
                pool.pads, pool.units = source.convaccs, source.units
                self.chains.remove(source)
        pool.pools += 1
        pool.pool_fields.append(pool_fields(unit))
        pool.units.append((self.number, unit.name))
        self.ends[unit.name] = pool
        return True


def _suboff(f: dict) -> bool:
    """The ARITH that turns a conv's int8 input into the CONVACC's feature: scalar, one 8-bit input."""
    return bool(f["scalar"]) and not f["dualinput"] and f["inbytes_x"] == 1


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
