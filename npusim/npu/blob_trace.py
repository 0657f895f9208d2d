"""Reading ST Edge AI's readable trace of a compiled Neural-ART program (`<network>_blob_trace.c`,
what ST Edge AI 3.0 writes beside its epoch-controller blobs): every epoch's unit init structs
(`LL_Convacc_InitTypeDef`, `LL_Arithacc_InitTypeDef`, `LL_Poolacc_InitTypeDef`,
`LL_Streng_TensorInitTypeDef`) with the values the compiler chose, the stream switch's links
(`LL_Switch_InitTypeDef`: ATONN_DSTPORT / ATONN_SRCPORT), and the per-channel coefficient tables
the ARITHs' A_vector / B_vector / C_vector point into (byte offsets into
`__ec_params_memory_pool_base`).

It gives the same epochs and units as npu/ec_blob.read_ecblobs, each unit carrying its ll_aton
fields as the trace states them (Unit.fields), so npu/compiled_wiring.py, compiled.py and
compiled_epochs.py map it to the model's ops as they map the blobs. A trace that cannot be read
gives one line naming the file, epoch and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .ec_blob import CompiledError, Epoch, Unit

_START = re.compile(r"ec_trace_start_epoch\((\d+)\);")
_POOL = re.compile(r"static const uint64_t __ec_params_memory_pool_base\[(\d+)\]\s*=\s*\{(.*?)\};", re.S)
_STRUCT = re.compile(r"static const (LL_\w+)InitTypeDef (\w+)\s*=\s*\{(.*?)\n\s*\};", re.S)
_INIT = re.compile(
    r"\bLL_(Convacc|Arithacc|Poolacc)_Init\((\d+),\s*&(\w+)\)|\bLL_Streng_TensorInit\((\d+),\s*&(\w+)"
)
_SWITCH = re.compile(r"static const LL_Switch_InitTypeDef \w+\[\]\s*=\s*\{(.*?)\n\s*\};", re.S)
_PORT = re.compile(r"ATONN_(DST|SRC)PORT\(STRSWITCH,\s*0,\s*(\w+),\s*(\d+),\s*(\d+)\)")
_FIELD = re.compile(r"^\s*\.(\w+)\s*=\s*(.*?),?\s*(?:/\*.*\*/)?\s*$")
_OFFSET = re.compile(r"__ec_params_memory_pool_base\)\)\s*\+\s*(\d+)\)")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_KINDS = {"Convacc": "CONVACC", "Arithacc": "ARITH", "Poolacc": "POOL"}
_UNITS = {"CONVACC": 4, "ARITH": 4, "POOL": 2, "STRENG": 10}
_BITS = {8: "<i1", 16: "<i2", 32: "<i4"}


def is_trace(text: str) -> bool:
    return _START.search(text) is not None


class _Reader:
    def __init__(self, path: Path, text: str):
        self.path, self.text = path, text

    def fail(self, epoch, pos: int, what: str):
        line = self.text.count("\n", 0, pos) + 1
        raise CompiledError(f"{self.path.name}: epoch {epoch}, line {line}: {what}")

    def pool(self) -> bytes:
        m = _POOL.search(self.text)
        if m is None:
            return b""
        try:
            words = [int(w.strip().rstrip("uUlL"), 16) for w in m.group(2).split(",") if w.strip()]
        except ValueError:
            self.fail("-", m.start(), "__ec_params_memory_pool_base holds a value that is not a hex word")
        return np.array(words, dtype=np.uint64).astype("<u8").tobytes()

    def struct(self, epoch: int, body: str, pos: int) -> dict:
        fields, start = {}, pos
        for line in body.split("\n"):
            pos, start = start, start + len(line) + 1  # pos: this line's, for an error's line number
            f = _FIELD.match(line)
            if f is None:
                continue
            name, text = f.group(1), f.group(2).strip()
            m = _OFFSET.search(text)
            if m is not None:
                fields[name] = ("offset", int(m.group(1)))
            elif name == "addr_base":
                h = _HEX.search(text)
                fields[name] = int(h.group(0), 16) if h else 0
            elif text == "{0}":
                fields[name] = None
            elif text.startswith("{"):
                fields[name] = self.number_list(epoch, text, pos)
            else:
                fields[name] = self.value(epoch, name, text, pos)
        return fields

    def number_list(self, epoch, text: str, pos: int) -> list[int]:
        try:
            return [int(v, 0) for v in text.strip("{}").split(",") if v.strip()]
        except ValueError:
            self.fail(epoch, pos, f"cannot read {text!r} as a list of numbers")

    def value(self, epoch, name: str, text: str, pos: int):
        text = re.sub(r"^\((?:short|int|unsigned|unsigned char|signed char)\)", "", text).strip()
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", text):
            return text  # an enumerator: ARITH_AFFINE, ARITH_BCAST_CHAN, POOL_MAX
        try:
            return int(text.rstrip("uUlL"), 0)
        except ValueError:
            self.fail(epoch, pos, f"field .{name} = {text!r} is not a number")


def read_trace(path) -> list[Epoch]:
    """Every epoch of a blob trace, in program order (module docstring); CompiledError when a part of
    it cannot be read (the epoch and line named)."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise CompiledError(f"{path}: cannot read: {e.strerror}") from None
    starts = list(_START.finditer(text))
    if not starts:
        raise CompiledError(f"{path}: no ec_trace_start_epoch(...): not a Neural-ART blob trace")
    reader = _Reader(path, text)
    pool = reader.pool()
    epochs = []
    for k, start in enumerate(starts):
        number = int(start.group(1))
        end = starts[k + 1].start() if k + 1 < len(starts) else len(text)
        segment = text[start.start() : end]
        if f"ec_trace_end_epoch({number});" not in segment:
            reader.fail(number, end, "the epoch does not end (no ec_trace_end_epoch): the file is cut short?")
        epochs.append(_epoch(reader, number, segment, start.start(), pool))
    return epochs


def _epoch(reader: _Reader, number: int, segment: str, base: int, pool: bytes) -> Epoch:
    epoch = Epoch(number, reader.path.name)
    structs = {m.group(2): (m.group(1), m.group(3), base + m.start(3)) for m in _STRUCT.finditer(segment)}
    for m in _INIT.finditer(segment):
        kind = _KINDS[m.group(1)] if m.group(1) else "STRENG"
        unit_id, name = (int(m.group(2)), m.group(3)) if m.group(1) else (int(m.group(4)), m.group(5))
        pos = base + m.start()
        if unit_id >= _UNITS[kind]:
            reader.fail(number, pos, f"{kind} {unit_id} does not exist (the N6 has {_UNITS[kind]})")
        if name not in structs:
            reader.fail(number, pos, f"{name} is configured but not defined in this epoch")
        _, body, at = structs[name]
        fields = reader.struct(number, body, at)
        unit = Unit(f"{kind}{unit_id}", len(epoch.units))
        unit.fields = _fields(reader, kind, fields, pool, number, at)
        epoch.units = [u for u in epoch.units if u.name != unit.name] + [unit]
    links = {}
    for m in _SWITCH.finditer(segment):
        for entry in m.group(1).split("\n"):
            ports = _PORT.findall(entry)
            dst = [p for p in ports if p[0] == "DST"]
            if dst:
                links.setdefault(_port(dst[0], True), []).extend(
                    _port(p, False) for p in ports if p[0] == "SRC"
                )
    if links:
        switch = Unit("STRSWITCH", len(epoch.units))
        switch.fields = {"links": links}
        epoch.units.append(switch)
    return epoch


def _port(port: tuple, destination: bool) -> str:
    """ATONN_DSTPORT(..., KIND, n, p) / ATONN_SRCPORT as ec_blob.switch_links names them."""
    _, kind, n, p = port
    if destination and kind in ("CONVACC", "ARITH", "DECUN"):
        return f"{kind}{n}.{p}"
    return f"{kind}{n}"


def _fields(reader: _Reader, kind: str, f: dict, pool: bytes, epoch: int, pos: int) -> dict:
    if kind == "STRENG":
        addr = f.get("addr_base", 0) + f.get("offset_start", 0)
        return {"unit": "STRENG", "write": bool(f.get("dir", 0)), "addr": addr}
    out = {"unit": kind, **{k: v for k, v in f.items() if not isinstance(v, tuple)}}
    if kind != "ARITH":
        return out
    channels = int(f.get("fChannels", 0))
    bits = f.get("vec_precision") or [16, 16, 16]
    vectors = {}
    for i, k in enumerate(("A_vector", "B_vector", "C_vector")):
        v = f.get(k)
        if isinstance(v, tuple):
            offset, width = v[1], _BITS.get(bits[i])
            if width is None or offset + channels * bits[i] // 8 > len(pool):
                reader.fail(epoch, pos, f"{k} at byte {offset} lies outside __ec_params_memory_pool_base")
            vectors[k] = np.frombuffer(pool, dtype=width, count=channels, offset=offset).astype(int).tolist()
        else:
            vectors[k] = None
    if out.get("combinebc") and vectors["C_vector"] is not None and bits[2] != 32:
        b = vectors["B_vector"] or [0] * channels  # BC = {B[15:0], C[15:0]}
        vectors["C_vector"] = [(bb << 16) | (c & 0xFFFF) for bb, c in zip(b, vectors["C_vector"])]
        vectors["B_vector"] = None
    out.update(vectors)
    return out
