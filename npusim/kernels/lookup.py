"""out = table[x] over bytes x: the lookup that table-driven ops (LOGISTIC, TANH, a requantizing
QUANTIZE, ...) and run()'s fused elementwise chains (chains.py; YOLO's SiLU) end in.

A byte indexes a table of 256 entries, which no gather instruction reads a byte at a time: the
scalar loop ran at about a byte per cycle, 5 ms of each YOLOv8n-256 run at batch 8 (58 SiLU chains).
With AVX-512 VBMI (Ice Lake and later, Zen 4 and later) a table of bytes lives in four ZMM
registers, and two VPERMI2B (each picks 64 bytes out of 128 by the index's low 7 bits) and a blend on
the index's top bit look up 64 bytes at once. With AVX2 alone, VPSHUFB looks up 32 bytes in a
16-byte table (a row of the 256, the index's low 4 bits) and gives 0 where the index byte's top
bit is set; sixteen of them, XOR-ed, look up the whole table (XNNPACK's x8-lut AVX2 kernel does the
same): see _avx2_lookup. Other hosts, and tables of wider entries, take the scalar loop.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils

from . import host
from .jit import parallel_kernel
from .microkernel import int64_intrinsic
from .output_stage import lane_mask, load_bytes, store_bytes

CHUNK = 1 << 16  # bytes per parallel task
_B64 = ir.VectorType(ir.IntType(8), 64)
_B32, _B16 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(8), 16)


@parallel_kernel
def lookup_scalar(table, x, out):
    """out = table[x] for bytes x."""
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in nb.prange(xf.size):
        of[i] = table[xf[i]]
    return out


def _vpermi2b(builder, low, index, high):
    """The bytes of the 128-byte table low:high at index's low 7 bits (VPERMI2B)."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_B64, [_B64] * 3), "llvm.x86.avx512.vpermi2var.qi.512"
    )
    return builder.call(fn, [low, index, high])


@int64_intrinsic("table x out count")
def _lookup_run(builder, a):
    """out[i] = table[x[i]] for i < count: 64 bytes per step, the last step masked."""
    i8p = ir.IntType(8).as_pointer()
    table, x, out = (builder.inttoptr(v, i8p) for v in (a.table, a.x, a.out))
    i64 = ir.IntType(64)
    vectors = builder.bitcast(table, _B64.as_pointer())
    # the table's four 64-byte quarters, in registers for the whole run
    quarters = [builder.load(builder.gep(vectors, [ir.Constant(i64, q)]), align=1) for q in range(4)]

    def step(first, masked):
        src, dst = builder.gep(x, [first]), builder.gep(out, [first])
        remaining = builder.sub(a.count, first)
        if masked:
            index = load_bytes(builder, src, lane_mask(builder, remaining, 64))
        else:
            index = builder.load(builder.bitcast(src, _B64.as_pointer()), align=1)
        low = _vpermi2b(builder, quarters[0], index, quarters[1])
        high = _vpermi2b(builder, quarters[2], index, quarters[3])
        upper_half = builder.icmp_signed("<", index, ir.Constant(_B64, 0))  # index >= 128
        y = builder.select(upper_half, high, low)
        if masked:
            store_bytes(builder, y, dst, remaining)
        else:
            builder.store(y, builder.bitcast(dst, _B64.as_pointer()), align=1)

    whole = builder.sdiv(a.count, ir.Constant(i64, 64))
    with cgutils.for_range(builder, whole) as loop:
        step(builder.mul(loop.index, ir.Constant(i64, 64)), False)
    tail = builder.mul(whole, ir.Constant(i64, 64))
    with builder.if_then(builder.icmp_signed("<", tail, a.count)):
        step(tail, True)


def _avx2_rows(builder, table):
    """The 16 rows (16 bytes each) of the 256-byte table, each in both 128-bit lanes, XOR-ed with
    the row before it except rows 0 and 8: the operands of _avx2_lookup's two telescoping sums."""
    i64 = ir.IntType(64)
    rows16 = builder.bitcast(table, _B16.as_pointer())
    rows = [builder.load(builder.gep(rows16, [ir.Constant(i64, r)]), align=1) for r in range(16)]
    both_lanes = ir.Constant(ir.VectorType(ir.IntType(32), 32), list(range(16)) * 2)
    deltas = [rows[r] if r % 8 == 0 else builder.xor(rows[r], rows[r - 1]) for r in range(16)]
    return [builder.shuffle_vector(d, ir.Constant(_B16, ir.Undefined), both_lanes) for d in deltas]


def _avx2_lookup(builder, rows, index):
    """table[index] for 32 bytes: rows 0-7 for indices under 128, rows 8-15 (on index ^ 0x80) for the
    others. In each half, step k shuffles row k's delta by index - 16 k (saturating, so an index
    outside the half stays negative and gives 0); the steps 0..index >> 4 give their deltas at
    index & 15, whose XOR telescopes to table[index]; later steps see a negative index."""
    shuffle = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_B32, [_B32, _B32]), "llvm.x86.avx2.pshuf.b"
    )
    subtract = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_B32, [_B32, _B32]), "llvm.ssub.sat.v32i8"
    )
    sixteen = ir.Constant(_B32, [16] * 32)
    halves = []
    for first, v in ((0, index), (8, builder.xor(index, ir.Constant(_B32, [0x80] * 32)))):
        acc = builder.call(shuffle, [rows[first], v])
        for k in range(first + 1, first + 8):
            v = builder.call(subtract, [v, sixteen])
            acc = builder.xor(acc, builder.call(shuffle, [rows[k], v]))
        halves.append(acc)
    return builder.xor(*halves)


@int64_intrinsic("table x out count")
def _lookup_run_avx2(builder, a):
    """out[i] = table[x[i]] for the whole 32-byte vectors of i < count (the caller does the rest)."""
    i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
    table, x, out = (builder.inttoptr(v, i8p) for v in (a.table, a.x, a.out))
    rows = _avx2_rows(builder, table)
    with cgutils.for_range(builder, builder.sdiv(a.count, ir.Constant(i64, 32))) as loop:
        first = builder.mul(loop.index, ir.Constant(i64, 32))
        index = builder.load(builder.bitcast(builder.gep(x, [first]), _B32.as_pointer()), align=1)
        y = _avx2_lookup(builder, rows, index)
        builder.store(y, builder.bitcast(builder.gep(out, [first]), _B32.as_pointer()), align=1)


@parallel_kernel
def lookup_vbmi(table, x, out):
    """lookup_scalar for a table of 256 bytes, with VPERMI2B, in tasks of CHUNK bytes."""
    xf, of = x.reshape(-1), out.reshape(-1)
    for task in nb.prange((xf.size + CHUNK - 1) // CHUNK):
        start = task * CHUNK
        count = min(CHUNK, xf.size - start)
        _lookup_run(table.ctypes.data, xf.ctypes.data + start, of.ctypes.data + start, count)
    return out


@parallel_kernel
def lookup_avx2(table, x, out):
    """lookup_scalar for a table of 256 bytes, with VPSHUFB, in tasks of CHUNK bytes; the last
    bytes after the whole vectors by the scalar loop."""
    xf, of = x.reshape(-1), out.reshape(-1)
    for task in nb.prange((xf.size + CHUNK - 1) // CHUNK):
        start = task * CHUNK
        count = min(CHUNK, xf.size - start)
        _lookup_run_avx2(table.ctypes.data, xf.ctypes.data + start, of.ctypes.data + start, count)
        for i in range(start + count // 32 * 32, start + count):
            of[i] = table[xf[i]]
    return out


def lookup(table: np.ndarray, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = table[x] for x uint8 (contiguous, as out); table: 256 entries."""
    if table.itemsize == 1 and table.size == 256 and x.size:
        bytes_table = np.ascontiguousarray(table).view(np.uint8)
        if host.has_vbmi():
            return lookup_vbmi(bytes_table, x, out.view(np.uint8)).view(out.dtype)
        if host.has_avx2():
            return lookup_avx2(bytes_table, x, out.view(np.uint8)).view(out.dtype)
    return lookup_scalar(table, x, out)
