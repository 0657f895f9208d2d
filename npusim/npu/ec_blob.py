"""Reading ST Edge AI's compiled Neural-ART program as users have it on disk: `network_ecblobs.h`,
the epoch-controller blobs (`static const uint64_t _ec_blob_N[] = {0x...UL, ...}`).

The encoding is not documented by ST; this is our reading, checked by every blob of the shared
compile decoding to exactly its stated end (tests/test_ec_blob.py):

* the blob is a stream of little-endian 32-bit words: word 0 the magic 0xca057a7a, word 1 the
  program's length n in words, the program words 2 .. n + 1, the last one the end (op 12), then
  padding to 64 bits;
* an instruction word is register word address << 16 | count << 5 | op (addresses in 32-bit
  words from ATON_BASE): op 0 writes one data word to the register (count: a byte mask, 0x3e0),
  op 2 writes `count` words to one register in turn (the last stays), op 3 writes `count` words
  to consecutive registers, op 4 waits (two data words), op 1 (a unit's start) and op 12 (the
  end) carry none, op 29 marks the start of epoch `count`.

The register layouts are those of ST's public ll_aton runtime (ATON.h, ll_aton.c's
LL_Arithacc_Init and LL_Convacc_Init, ll_aton_rcompat.h for the ARITH coefficient memory): ARITH
unit n at byte 0x17000 + 0x1000 n from ATON_BASE (word 0x5c00 + 0x400 n), CONVACC n at 0xf000 +
0x1000 n (word 0x3c00 + 0x400 n). Fields are given ll_aton's names, so a decoded unit compares
with what npusim derives (npu/neural_art.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NpusimError

MAGIC = 0xCA057A7A
OP_WRITE, OP_START, OP_BURST_ONE, OP_BURST, OP_WAIT, OP_END, OP_EPOCH = 0, 1, 2, 3, 4, 12, 29
ARITH_BASE, CONVACC_BASE, STRENG_BASE, SWITCH_BASE, UNIT_STRIDE = 0x5C00, 0x3C00, 0x1400, 0x1000, 0x400
# The N6's units (ATON.h): 10 stream engines, 4 CONVACCs, 2 DECUN (weight decompression), 2 ACTIV,
# 4 ARITHs, 2 POOLs, each 0x1000 bytes apart; DECUN0 follows CONVACC3, so a unit at the address
# of a "CONVACC4" is DECUN0 (ST's trace configures CONVACC 0-3 only, and the stream switch's sources
# name 4 CONVACCs)
ARITH_UNITS, CONVACC_UNITS, STRENG_UNITS = 4, 4, 10
DECUN_BASE, ACTIV_BASE, POOL_BASE = 0x4C00, 0x5400, 0x6C00
DECUN_UNITS, ACTIV_UNITS, POOL_UNITS = 2, 2, 2
COEFF_MEMORY = 0x100  # ARITH coefficients from byte 0x400: (COEFF_AB, COEFF_C) word pairs
SHIFT_BIAS = 16  # ATON_SHIFT(x) = x + 16 (ll_aton_platform.h): signed shifts stored with an offset

# ARITH registers (word offsets) and CONVACC registers, from ATON.h
A_CTRL, A_SHIFT, A_COEFFAC, A_COEFFB, A_INSHIFTER, A_CLIPRANGE = 0x0, 0x2, 0x7, 0x8, 0xD, 0xE
C_CTRL, C_KFORMAT, C_SAMPLE, C_DFORMAT, C_FFORMAT, C_FHCROP, C_FVCROP = 0x0, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7
C_ZFRAME, C_ZFBIAS = 0xA, 0xD
# POOL registers (word offsets), in the order ll_aton.c's LL_Poolacc_Init writes them
P_CTRL, P_PDIMS, P_FDIMS, P_OUTDIMS, P_MULVAL = 0x0, 0x2, 0x3, 0x4, 0x5
P_XCROP, P_YCROP, P_RNDCTRL = 0x6, 0x7, 0x8
S_CTRL, S_ADDR, S_WRITE = 0x0, 0x2, 1 << 3  # STRENG: CTRL (DIR bit 3: 1 writes memory), ADDR
SWITCH_DST = 0x2  # STRSWITCH: one register per destination port from word 2 (ATON.h's DST)
CTRL_CLEARS = 1 << 1 | 1 << 30  # CLR and CONFCLR, the same bits in ARITH's and CONVACC's CTRL

_BLOB = re.compile(r"static\s+const\s+uint64_t\s+(_ec_blob_\w+)\s*\[\s*\]\s*=\s*\{")


class CompiledError(NpusimError):
    """A compiled program npusim cannot read: the message names the file, blob, epoch and word."""


@dataclass
class Unit:
    """One hardware unit's registers as an epoch leaves them: name (ARITH0, CONVACC3), regs (word
    offset -> value, the last write), coeffs (ARITH: coefficient-memory word offset -> value), and
    the order in which the epoch configured it; a unit read from ST's readable trace carries its
    ll_aton fields themselves (`fields`), which every *_fields function below then returns."""

    name: str
    order: int
    regs: dict = field(default_factory=dict)
    coeffs: dict = field(default_factory=dict)
    fields: dict | None = None  # ll_aton's fields as a readable trace states them (npu/blob_trace.py)


@dataclass
class Epoch:
    number: int
    blob: str
    units: list = field(default_factory=list)


def _words(body: str, where: str) -> list[int]:
    out = []
    for i, item in enumerate(v.strip() for v in body.split(",")):
        if not item:
            continue
        text = re.sub(r"(?i)u?l{0,2}u?$", "", item)
        try:
            v = int(text, 16)
        except ValueError:
            raise CompiledError(f"{where}: 64-bit word {i} is {item!r}, expected a hex literal") from None
        out += [v & 0xFFFFFFFF, v >> 32]
    return out


_UNITS = (
    (ARITH_BASE, ARITH_UNITS, "ARITH"),
    (CONVACC_BASE, CONVACC_UNITS, "CONVACC"),
    (STRENG_BASE, STRENG_UNITS, "STRENG"),
    (POOL_BASE, POOL_UNITS, "POOL"),
    (DECUN_BASE, DECUN_UNITS, "DECUN"),
    (ACTIV_BASE, ACTIV_UNITS, "ACTIV"),
)


def _unit_of(address: int) -> tuple[str, int] | None:
    if SWITCH_BASE <= address < SWITCH_BASE + UNIT_STRIDE:
        return "STRSWITCH", address - SWITCH_BASE
    for base, count, kind in _UNITS:
        if base <= address < base + count * UNIT_STRIDE:
            return f"{kind}{(address - base) // UNIT_STRIDE}", (address - base) % UNIT_STRIDE
    return None


def decode_blob(name: str, words: list[int], where: str) -> list[Epoch]:
    """The epochs of one blob with the ARITH and CONVACC registers each one writes."""
    if len(words) < 3 or words[0] != MAGIC:
        raise CompiledError(f"{where}: blob {name}, word 0: expected the magic 0x{MAGIC:08x}")
    end = 1 + words[1]
    if end >= len(words):
        raise CompiledError(f"{where}: blob {name}, word 1: program length {words[1]} exceeds the blob")
    epochs, current, i = [], None, 2
    while True:
        if i > end:
            raise CompiledError(
                f"{where}: blob {name}, epoch {_num(current)}, word {i}: runs past the stated end {end}"
            )
        w = words[i]
        op, count, address = w & 0x1F, (w >> 5) & 0x7FF, w >> 16
        data = {OP_WRITE: 1, OP_BURST_ONE: count, OP_BURST: count, OP_WAIT: 2}.get(op, 0)
        if op not in (OP_WRITE, OP_START, OP_BURST_ONE, OP_BURST, OP_WAIT, OP_END, OP_EPOCH):
            raise CompiledError(
                f"{where}: blob {name}, epoch {_num(current)}, word {i}: "
                f"unknown instruction 0x{w:08x} (op {op})"
            )
        if op == OP_END:
            if i != end:
                raise CompiledError(
                    f"{where}: blob {name}, epoch {_num(current)}, word {i}: ends before its stated end {end}"
                )
            return epochs
        if op == OP_EPOCH:
            current = Epoch(count, name)
            epochs.append(current)
        elif data and current is not None:
            values = words[i + 1 : i + 1 + data]
            if op == OP_BURST_ONE:
                values = values[-1:]
            if op != OP_WAIT:
                _write(current, address, values, op == OP_BURST)
        i += 1 + data


def _epoch_at(words: list[int]) -> str:
    """The epoch a blob's words reach at their end (for a blob cut short): "-" before the first."""
    i, epoch = 2, "-"
    while i < len(words):
        op, count = words[i] & 0x1F, (words[i] >> 5) & 0x7FF
        if op == OP_EPOCH:
            epoch = str(count)
        i += 1 + {OP_WRITE: 1, OP_BURST_ONE: count, OP_BURST: count, OP_WAIT: 2}.get(op, 0)
    return epoch


def _num(epoch) -> str:
    return "-" if epoch is None else str(epoch.number)


def _write(epoch: Epoch, address: int, values: list[int], consecutive: bool):
    for k, v in enumerate(values):
        hit = _unit_of(address + (k if consecutive else 0))
        if hit is None:
            continue
        name, offset = hit
        if offset == A_CTRL and v & CTRL_CLEARS:
            continue  # the epoch's end clearing the unit (CLR, CONFCLR), not its configuration
        if name == "STRSWITCH" and offset >= SWITCH_DST and v == 0:
            continue  # the epoch's end disconnecting a port
        unit = next((u for u in epoch.units if u.name == name), None)
        if unit is None:
            unit = Unit(name, len(epoch.units))
            epoch.units.append(unit)
        if name.startswith("ARITH") and offset >= COEFF_MEMORY:
            unit.coeffs[offset - COEFF_MEMORY] = v
        else:
            unit.regs[offset] = v


def read_ecblobs(path) -> list[Epoch]:
    """Every epoch of a network_ecblobs.h, in program order."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise CompiledError(f"{path}: cannot read: {e.strerror}") from None
    starts = list(_BLOB.finditer(text))
    if not starts:
        raise CompiledError(
            f"{path}: no `static const uint64_t _ec_blob_...[]` array: not a network_ecblobs.h"
        )
    epochs = []
    for k, m in enumerate(starts):
        name, end = m.group(1), text.find("};", m.end())
        limit = starts[k + 1].start() if k + 1 < len(starts) else len(text)
        if end < 0 or end > limit:  # the array never closes: read what it has, then say where it stops
            body = text[m.end() : limit].rsplit(",", 1)[0]  # the last item may be cut
            words = _words(body, f"{path.name}: blob {name}")
            raise CompiledError(
                f"{path.name}: blob {name}, epoch {_epoch_at(words)}, word {len(words)}: the array ends "
                "without its closing `};` (the file is cut short?)"
            )
        epochs += decode_blob(name, _words(text[m.end() : end], f"{path.name}: blob {name}"), path.name)
    return epochs


# ----------------------------------------------------------------------------------------------
# Registers to ll_aton's fields


def _bits(v: int, lsb: int, width: int) -> int:
    return (v >> lsb) & ((1 << width) - 1)


def _s16(v: int) -> int:
    v &= 0xFFFF
    return v - 0x10000 if v & 0x8000 else v


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 0x100000000 if v & 0x80000000 else v


def arith_fields(unit: Unit, channels: int | None = None) -> dict:
    """An ARITH unit's LL_Arithacc_InitTypeDef fields (ATON.h's bit positions). Per-channel
    coefficients (vector mode) as A_vector, B_vector, C_vector, with combinebc's BC = {B, C} in
    C_vector; `channels` (default: every pair written) limits them."""
    if unit.fields is not None:
        f = dict(unit.fields)
        for k in ("A_vector", "B_vector", "C_vector"):
            if f.get(k) is not None and channels is not None:
                f[k] = f[k][:channels]
        return f
    r = unit.regs
    ctrl, shift, inshift = r.get(A_CTRL, 0), r.get(A_SHIFT, 0), r.get(A_INSHIFTER, 0)
    coeffac, coeffb = r.get(A_COEFFAC, 0), r.get(A_COEFFB, 0)
    orndmode = _bits(ctrl, 24, 2)
    f = {
        "unit": "ARITH",
        "operation": "ARITH_AFFINE" if _bits(ctrl, 9, 6) == 0 else f"op{_bits(ctrl, 9, 6)}",
        "scalar": 0 if _bits(ctrl, 7, 1) else 1,
        "bcast": "ARITH_BCAST_CHAN" if _bits(ctrl, 3, 1) else "ARITH_BCAST_SCALAR",
        "dualinput": _bits(ctrl, 8, 1),
        "combinebc": _bits(ctrl, 28, 1),
        "rounding_o": _bits(ctrl, 5, 1),
        "saturation_o": _bits(ctrl, 6, 1),
        "round_mode_o": orndmode & 1,
        "relu_mode_o": orndmode >> 1,
        "outbytes_o": _bits(ctrl, 26, 2),
        "clipout": _bits(ctrl, 29, 1),
        "inbytes_x": _bits(inshift, 0, 2),
        "shift_x": _bits(inshift, 2, 6) - SHIFT_BIAS,
        "inbytes_y": _bits(inshift, 16, 2),
        "shift_y": _bits(inshift, 18, 6) - SHIFT_BIAS,
        "Ax_shift": _bits(shift, 0, 5),
        "By_shift": _bits(shift, 5, 5),
        "C_shift": _bits(shift, 10, 5),
        "shift_o": _bits(shift, 15, 6),
        "A_scalar": _s16(coeffac),
        "B_scalar": _s16(coeffb),
        "C_scalar": _s16(coeffac >> 16),
        "A_vector": None,
        "B_vector": None,
        "C_vector": None,
    }
    if f["clipout"]:
        clip = r.get(A_CLIPRANGE, 0)
        f.update(clipmax=_s16(clip), clipmin=_s16(clip >> 16))
    if not f["scalar"]:
        pairs = len(unit.coeffs) // 2 if channels is None else channels
        ab = [unit.coeffs.get(2 * k, 0) for k in range(pairs)]
        c = [unit.coeffs.get(2 * k + 1, 0) for k in range(pairs)]
        f["A_vector"] = [_s16(v) for v in ab]
        if f["combinebc"]:
            f["C_vector"] = [_s32(((v >> 16) << 16) | (cv & 0xFFFF)) for v, cv in zip(ab, c)]
        else:
            f["B_vector"] = [_s16(v >> 16) for v in ab]
            f["C_vector"] = [_s16(cv) for cv in c]
    return f


def convacc_fields(unit: Unit) -> dict:
    """A CONVACC unit's LL_Convacc_InitTypeDef fields that set its arithmetic (ATON.h's CTRL and
    DFORMAT bit positions; shift_a is DFORMAT's INSHIFT, "accumulator shift left really")."""
    if unit.fields is not None:
        return dict(unit.fields)
    r = unit.regs
    ctrl, fmt = r.get(C_CTRL, 0), r.get(C_DFORMAT, 0)
    orndmode = _bits(fmt, 14, 2)
    kformat, sample, zframe = r.get(C_KFORMAT, 0), r.get(C_SAMPLE, 0), r.get(C_ZFRAME, 0)
    batch = max(_bits(kformat, 16, 8), 1)  # the horizontal fields count batchDepth channels a pixel
    return {
        "unit": "CONVACC",
        "simd": _bits(ctrl, 5, 2),
        "f_unsigned": _bits(ctrl, 20, 1),
        "k_unsigned": _bits(ctrl, 21, 1),
        "accumulate": 1 - _bits(ctrl, 2, 1),
        "deepmode": _bits(ctrl, 28, 1),
        "inbytes_f": _bits(fmt, 22, 2),
        "shift_a": _bits(fmt, 0, 6),
        "shift_o": _bits(fmt, 8, 6),
        "rounding_o": _bits(fmt, 16, 1),
        "saturation_o": _bits(fmt, 17, 1),
        "round_mode_o": orndmode & 1,
        "relu_mode_o": orndmode >> 1,
        "raw_o": _bits(fmt, 18, 1),
        "outbytes_o": _bits(fmt, 20, 2),
        "zfbias": _s16(r.get(C_ZFBIAS, 0)),
        "fWidth": _bits(r.get(C_FFORMAT, 0), 0, 16) // batch,
        "fHeight": _bits(r.get(C_FFORMAT, 0), 16, 16),
        "kernelWidth": _bits(kformat, 0, 8),
        "kernelHeight": _bits(kformat, 8, 8),
        "batchDepth": _bits(kformat, 16, 8),
        "nKernels": _bits(kformat, 24, 8),
        "hstride": _bits(sample, 8, 3),
        "vstride": _bits(sample, 12, 3),
        # a pad is SAMPLE's 2-bit one or the zero frame's (ZFRAME: left, right in batch units, top, bottom)
        "left_padding": _bits(sample, 0, 2) + _bits(zframe, 0, 8) // batch,
        "right_padding": _bits(sample, 2, 2) + _bits(zframe, 8, 8) // batch,
        "top_padding": _bits(sample, 4, 2) + _bits(zframe, 16, 8),
        "bot_padding": _bits(sample, 6, 2) + _bits(zframe, 24, 8),
        "left_crop": _bits(r.get(C_FHCROP, 0), 0, 16) // batch,
        "right_crop": _bits(r.get(C_FHCROP, 0), 16, 16) // batch,
        "top_crop": _bits(r.get(C_FVCROP, 0), 0, 16),
        "bot_crop": _bits(r.get(C_FVCROP, 0), 16, 16),
    }


def pool_fields(unit: Unit) -> dict:
    """A POOL unit's LL_Poolacc_InitTypeDef fields as far as they are decoded: the window, stride
    and batch (PDIMS), the input and output sizes (FDIMS, OUTDIMS), the crops (XCROP, YCROP),
    mulval, and the output's width and rounding (RNDCTRL); CTRL (operation, rounding, saturation,
    shifts) as its raw word `ctrl`, its bit positions not being published. Register order is
    ll_aton.c's LL_Poolacc_Init; the positions are our reading, fitted on ST's debug listing of the
    3.0 compile, where each register write stands beside the struct the trace shows
    (docs/neural-art.md)."""
    if unit.fields is not None:
        return dict(unit.fields)
    r = unit.regs
    pdims, rnd = r.get(P_PDIMS, 0), r.get(P_RNDCTRL, 0)
    batch = max(_bits(pdims, 26, 6), 1)
    return {
        "unit": "POOL",
        "ctrl": r.get(P_CTRL, 0),
        "poolWinX": _bits(pdims, 0, 3),
        "poolWinY": _bits(pdims, 3, 3),
        "strideX": _bits(pdims, 6, 4),
        "strideY": _bits(pdims, 10, 4),
        "batchSize": _bits(pdims, 26, 6),
        "inputX": _bits(r.get(P_FDIMS, 0), 0, 16) // batch,
        "inputY": _bits(r.get(P_FDIMS, 0), 16, 16),
        "outputX": _bits(r.get(P_OUTDIMS, 0), 0, 16),
        "outputY": _bits(r.get(P_OUTDIMS, 0), 16, 16),
        "leftCrop": _bits(r.get(P_XCROP, 0), 0, 16) // batch,
        "rightCrop": _bits(r.get(P_XCROP, 0), 16, 16) // batch,
        "topCrop": _bits(r.get(P_YCROP, 0), 0, 16),
        "bottomCrop": _bits(r.get(P_YCROP, 0), 16, 16),
        "mulval": _s16(r.get(P_MULVAL, 0)),
        "outbytes_f": _bits(rnd, 0, 2),
        "outbytes_o": _bits(rnd, 16, 2),
        "round_mode_o": _bits(rnd, 18, 1),
        "relu_mode_o": _bits(rnd, 19, 1),
    }


def _source_port(link: int) -> str:
    """A stream switch source (ATON.h): STRENG 0-9, CONVACC 10-13, DECUN 14-15, ACTIV 16-17,
    ARITH 18-21, POOL 22-23, RECBUF from 24."""
    for first, count, kind in ((0, 10, "STRENG"), (10, 4, "CONVACC"), (14, 2, "DECUN"), (16, 2, "ACTIV")):
        if link < first + count:
            return f"{kind}{link - first}"
    for first, count, kind in ((18, 4, "ARITH"), (22, 2, "POOL")):
        if link < first + count:
            return f"{kind}{link - first}"
    return f"RECBUF{link - 24}"


def _destination_port(index: int) -> str:
    """A stream switch destination register (ATON.h): STRENG n (0-9), CONVACC n port p
    (10 + 3n + p; port 2 the accumulator input), DECUN, ACTIV, ARITH n port p (28 + 2n + p),
    POOL n (36 + n), RECBUF."""
    if index < 10:
        return f"STRENG{index}"
    if index < 22:
        return f"CONVACC{(index - 10) // 3}.{(index - 10) % 3}"
    if index < 26:
        return f"DECUN{(index - 22) // 2}.{(index - 22) % 2}"
    if index < 28:
        return f"ACTIV{index - 26}"
    if index < 36:
        return f"ARITH{(index - 28) // 2}.{(index - 28) % 2}"
    if index < 38:
        return f"POOL{index - 36}"
    return f"RECBUF.{index - 38}"


def switch_links(epoch: Epoch) -> dict[str, list[str]]:
    """The epoch's stream switch: destination port (ARITH2.0, CONVACC1.2, STRENG6) -> the source
    units feeding it (ATON.h's DST register: EN0 bit 0, LINK0 bits 1-6, EN1 bit 16, LINK1 bits
    17-22)."""
    switch = next((u for u in epoch.units if u.name == "STRSWITCH"), None)
    if switch is not None and switch.fields is not None:
        return {k: list(v) for k, v in switch.fields["links"].items()}
    links = {}
    for offset, v in sorted(switch.regs.items()) if switch else ():
        if offset < SWITCH_DST:
            continue
        sources = [_source_port((v >> lsb) & 0x3F) for en, lsb in ((0, 1), (16, 17)) if v >> en & 1]
        if sources:
            links[_destination_port(offset - SWITCH_DST)] = sources
    return links


def streng_fields(unit: Unit) -> dict:
    """A stream engine's direction and buffer address (ATON.h's STRENG CTRL and ADDR)."""
    if unit.fields is not None:
        return dict(unit.fields)
    return {
        "unit": "STRENG",
        "write": bool(unit.regs.get(S_CTRL, 0) & S_WRITE),
        "addr": unit.regs.get(S_ADDR, 0),
    }


def unit_fields(unit: Unit) -> dict:
    if unit.name.startswith("POOL"):
        return pool_fields(unit)
    return arith_fields(unit) if unit.name.startswith("ARITH") else convacc_fields(unit)
