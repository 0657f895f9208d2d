"""Reading ST Edge AI's `default_blob_trace.c` (the compiled Neural-ART program written out as C):
every unit's init struct with its fields, and the per-channel coefficient tables its A_vector /
B_vector / C_vector point into (byte offsets into `__ec_params_memory_pool_base`).

A test helper only: npusim derives these values itself (npusim/npu/neural_art.py); this reads
what ST's compiler chose, to compare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

_POOL = re.compile(r"static const uint64_t __ec_params_memory_pool_base\[(\d+)\] = \{(.*?)\};", re.S)
_BLOCK = re.compile(
    r"/\* kind=(\w+) node=(\w+) \*/\s*static const (LL_\w+?)_InitTypeDef (\w+?)_init(\d+) = \{(.*?)\n\s*\};",
    re.S,
)
_FIELD = re.compile(r"^\s*\.(\w+) = (.*?),?\s*(?:/\*.*\*/)?\s*$")
_POINTER = re.compile(r"__ec_params_memory_pool_base\)\) \+ (\d+)\)")


@dataclass
class Unit:
    """One unit's init struct: kind (ST's node kind: Conv, Add, Sub...), node (its graph node,
    e.g. Conv2D_7_off_bias_6), unit (Convacc, Arithacc, Poolacc), epoch, fields (ints; vector
    fields the byte offset into the pool, None when null)."""

    kind: str
    node: str
    unit: str
    epoch: int
    fields: dict = field(default_factory=dict)


def _value(text: str):
    text = text.strip()
    m = _POINTER.search(text)
    if m:
        return int(m.group(1))
    if text == "{0}":
        return None
    if text.startswith("{"):
        return [int(v) for v in text.strip("{}").split(",")]
    text = re.sub(r"^\((?:short|int|unsigned)\)", "", text)
    try:
        return int(text, 0)
    except ValueError:
        return text


def read_trace(path) -> tuple[list[Unit], bytes]:
    """(units in program order, the coefficient pool as little-endian bytes)."""
    text = open(path).read()
    m = _POOL.search(text)
    words = [int(w.strip().removesuffix("ULL"), 16) for w in m.group(2).split(",") if w.strip()]
    pool = np.array(words, dtype=np.uint64).astype("<u8").tobytes()
    units = []
    for kind, node, unit, _name, epoch, body in _BLOCK.findall(text):
        fields = {}
        for line in body.splitlines():
            f = _FIELD.match(line)
            if f:
                fields[f.group(1)] = _value(f.group(2))
        units.append(Unit(kind, node, unit.replace("LL_", ""), int(epoch), fields))
    return units, pool


def vector(pool: bytes, offset: int, bits: int, count: int) -> np.ndarray:
    """count signed coefficients of `bits` bits from the pool at byte offset."""
    dtype = {8: "<i1", 16: "<i2", 32: "<i4"}[bits]
    return np.frombuffer(pool, dtype=dtype, count=count, offset=offset).astype(np.int64)
