"""The direct-convolution micro-kernel that the VNNI and AVX2 engines share, written once.

As XNNPACK's per-ISA microkernel tables: vnni.py and avx2.py each describe their instructions in
an Isa (vector type, lanes, the multiply-accumulate step, how a group of activations is broadcast,
how the output bytes are stored), and this module builds from it the micro-kernel (LLVM IR), the
driver that walks pixels and channel blocks (conv_kernel) and the filter packing. Both engines
reduce over (tap, channel group), a group being 4 bytes of one pixel's channels: a quad of int8
(VPDPBUSD) or a pair of int16 (VPMADDWD); a tap is a fixed offset from the output pixel's corner
(no im2col). Filters: per block of up to isa.block output channels, [K, nr, lanes, 4 bytes] (K:
the groups of the whole reduction, nr = block width / lanes), so one vector load holds one group
of `lanes` channels. Also the helpers of the other x86 vector kernels (depthwise.py): the
multiply-accumulate steps and the intrinsic of int64 arguments.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import aligned
from .jit import ParallelKernel, njit, renamed
from .output_stage import each_stage, load_parameters, vector_output_stage

MACS_PER_WORK = 8  # multiply-adds that count as one element of jit.PARALLEL_MIN_WORK (measured below)
MR = 12  # output pixels per micro-kernel call, computed in tiles of tile_rows(isa, nr) pixels
BLOCKS_PER_TASK = 16  # pixel blocks per parallel task (one scratch allocation each)

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_V8, _V16 = ir.VectorType(_I32, 8), ir.VectorType(_I32, 16)
_W16 = ir.VectorType(ir.IntType(16), 16)


def int64_intrinsic(names: str):
    """A decorator: codegen(builder, a) -> an intrinsic that returns nothing, of the int64 arguments
    named in `names` (a holds their values as attributes). Arguments of other integer types are
    cast to int64, as a signature of int64 arguments has Numba do."""
    names = names.split()

    def decorate(codegen):
        @intrinsic
        def kernel(typingctx, *args):
            if len(args) != len(names):
                return None

            def lower(context, builder, signature, values):
                (packed,) = values
                given = zip(cgutils.unpack_tuple(builder, packed), signature.args[0])
                codegen(
                    builder,
                    SimpleNamespace(
                        **{
                            name: context.cast(builder, v, ty, types.int64)
                            for name, (v, ty) in zip(names, given)
                        }
                    ),
                )
                return context.get_dummy_value()

            return types.void(types.StarArgTuple.from_types(args)), lower

        return kernel

    return decorate


def vpdpbusd(builder, acc, u, s):
    """acc + the sum of the 4 products u8 x s8 in each int32 lane (AVX-512 VNNI, no saturation);
    all three <16 x i32>."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.x86.avx512.vpdpbusd.512"
    )
    return builder.call(fn, [acc, u, s])


def pmaddwd_add(builder, acc, a, b):
    """acc (<8 x i32>) + VPMADDWD (AVX2): the sum of the 2 products of int16 lanes (a, b: <16 x i16>)
    in each int32 lane. On an AVX-512 host LLVM may fuse the two into VPDPWSSD."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_V8, [_W16, _W16]), "llvm.x86.avx2.pmadd.wd"
    )
    return builder.add(acc, builder.call(fn, [a, b]))


def packs_to_bytes(builder, y0, y1, in_lanes=False):
    """The 16 int8 of two <8 x i32> whose lanes all lie within int8, by the saturating packs of AVX2
    (exact there): y0 then y1, or with in_lanes y0[0:4] y1[0:4] y0[4:8] y1[4:8], the order that
    VPACKSSDW leaves (it packs within 128-bit lanes), for kernels that keep their channels so
    (depthwise.PAIR_ORDER); otherwise one word shuffle across the lanes puts y0 before y1."""
    w16, w8 = ir.VectorType(ir.IntType(16), 16), ir.VectorType(ir.IntType(16), 8)
    b16 = ir.VectorType(ir.IntType(8), 16)
    dwords = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(w16, [_V8, _V8]), "llvm.x86.avx2.packssdw"
    )
    words = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(b16, [w8, w8]), "llvm.x86.sse2.packsswb.128"
    )
    packed = builder.call(dwords, [y0, y1])
    order = list(range(16)) if in_lanes else [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]

    def half(h):
        return builder.shuffle_vector(
            packed,
            ir.Constant(w16, ir.Undefined),
            ir.Constant(ir.VectorType(_I32, 8), order[8 * h : 8 * h + 8]),
        )

    return builder.call(words, [half(0), half(1)])


@int64_intrinsic("address size")
def prefetch_range(builder, a):
    """Prefetch the cache lines of `size` bytes from `address` for reading (PREFETCHT0 on x86;
    LLVM's generic prefetch, dropped on targets without one): for input rows that a kernel reads
    soon but at a stride the hardware prefetcher does not follow far enough ahead."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0"
    )
    base = builder.inttoptr(a.address, i8p)
    lines = builder.sdiv(builder.add(a.size, ir.Constant(_I64, 63)), ir.Constant(_I64, 64))
    with cgutils.for_range(builder, lines) as line:
        address = builder.gep(base, [builder.mul(line.index, ir.Constant(_I64, 64))])
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


@dataclass(frozen=True)
class Isa:
    """The ISA-specific part of the micro-kernel: lanes int32 accumulators per vector, up to max_nr
    vectors of channels per pixel (MR * max_nr accumulators in registers); operand: the vector type
    of one group of `lanes` channels of weights; broadcast(builder, a): the operand with the group
    a (an integer of group_bytes, one group of a pixel's activations) in every lane;
    multiply_add(builder, acc, x, w);
    store(builder, y, dst, count): the first count of the int8 outputs y at dst; dtype: of the
    activations and weights; pack: with two vectors of channels per pixel, narrows both to bytes at
    once (the outputs in int32 lanes), where that is cheaper than two narrowings; group_bytes: the
    bytes of one group of activations that broadcast receives (as an integer of that width);
    broadcast_unsigned: as broadcast, for activations that their copy already holds in the form the
    multiply takes (VNNI: unsigned), chosen by the kernel's `unsigned` argument."""

    name: str
    lanes: int
    max_nr: int
    operand: ir.VectorType
    broadcast: Callable
    multiply_add: Callable
    store: Callable
    dtype: type
    pack: Callable | None = None  # pack(builder, y0, y1): the bytes of two int32 output vectors
    group_bytes: int = 4  # bytes of one group of a pixel's activations (2: a pair of int8)
    broadcast_unsigned: Callable | None = None  # broadcast of a copy already in the unsigned form
    pair_rows: bool = False  # with one vector of at most lanes / 2 channels: two pixels per output stage

    @property
    def block(self) -> int:
        """Output channels per micro-kernel call."""
        return self.lanes * self.max_nr


_KERNEL_ARGS = """nr unsigned x_ptr bases_ptr taps_ptr n_taps groups w_ptr out_ptr out_stride rows width
    params_ptr params_stride stage zero_point lo hi"""


def micro_kernel(isa: Isa):
    """out[r, lanes * j + l] for r < rows and lanes * j + l < width: the output stage of
    sum over taps t and channel groups q of x[base[r] + tap[t] + q * isa.group_bytes] .
    packed[(t * groups + q) * nr + j],
    for MR pixels and nr (1 to isa.max_nr, a switch inside) vectors of isa.lanes channels; x in
    the form of isa.broadcast_unsigned where `unsigned` is nonzero and the ISA has one."""
    forms = [(0, isa.broadcast)] + ([(1, isa.broadcast_unsigned)] if isa.broadcast_unsigned else [])

    @int64_intrinsic(_KERNEL_ARGS)
    def kernel(builder, a):
        done = builder.append_basic_block("done")
        key = a.nr
        if len(forms) > 1:
            unsigned = builder.icmp_signed("!=", a.unsigned, ir.Constant(_I64, 0))
            key = builder.add(key, builder.select(unsigned, ir.Constant(_I64, 8), ir.Constant(_I64, 0)))
        default = builder.append_basic_block("nr_out_of_range")
        switch = builder.switch(key, default)
        for form, broadcast in forms:
            for nr in range(1, isa.max_nr + 1):
                body = builder.append_basic_block(f"nr{nr}_{form}")
                switch.add_case(ir.Constant(_I64, nr + 8 * form), body)
                builder.position_at_end(body)
                _micro_kernel_body(builder, isa, nr, broadcast, a)
                builder.branch(done)
        builder.position_at_end(default)  # callers pass 1 <= nr <= isa.max_nr
        builder.branch(done)
        builder.position_at_end(done)

    return kernel


def tile_rows(isa: Isa, nr: int) -> int:
    """Pixels per register tile at nr vectors per pixel: the largest divisor of MR whose tile fits
    the accumulators that 6 pixels take at isa.max_nr (VNNI 24 ZMM, AVX2 12 YMM of 16), so a
    block of few channels keeps 12 sums in flight instead of 6, enough to hide VPDPBUSD's latency."""
    return max(d for d in range(1, MR + 1) if MR % d == 0 and d * nr <= 6 * isa.max_nr)


def _micro_kernel_body(builder, isa: Isa, nr: int, broadcast, a):
    rows = tile_rows(isa, nr)
    for first in range(0, MR, rows):
        with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, first), a.rows)):
            _tile(builder, isa, nr, broadcast, a, range(first, first + rows))


def _tile(builder, isa: Isa, nr: int, broadcast, a, pixels: range):
    """The micro-kernel on the block's pixels `pixels`, whole: the reduction and the output stage."""
    i8p = ir.IntType(8).as_pointer()
    acc_t = ir.VectorType(_I32, isa.lanes)
    x = builder.inttoptr(a.x_ptr, i8p)
    w = builder.inttoptr(a.w_ptr, i8p)
    bases = builder.inttoptr(a.bases_ptr, _I64.as_pointer())
    taps = builder.inttoptr(a.taps_ptr, _I64.as_pointer())
    row_base = {r: builder.load(builder.gep(bases, [ir.Constant(_I64, r)])) for r in pixels}
    # Allocas in the entry block: LLVM promotes them to registers (phis) across the loops.
    accs = {
        r: [cgutils.alloca_once_value(builder, ir.Constant(acc_t, None)) for _ in range(nr)] for r in pixels
    }
    vector = 4 * isa.lanes  # bytes of one group of `lanes` channels
    step = ir.Constant(_I64, nr * vector)  # bytes of packed filter per channel group
    with cgutils.for_range(builder, a.n_taps) as tap_loop:
        tap = builder.load(builder.gep(taps, [tap_loop.index]))
        tap_w = builder.mul(builder.mul(tap_loop.index, a.groups), step)
        with cgutils.for_range(builder, a.groups) as group_loop:
            q = group_loop.index
            x_off = builder.add(tap, builder.mul(q, ir.Constant(_I64, isa.group_bytes)))
            w_off = builder.add(tap_w, builder.mul(q, step))
            wv = [
                builder.load(
                    builder.bitcast(
                        builder.gep(w, [builder.add(w_off, ir.Constant(_I64, vector * j))]),
                        isa.operand.as_pointer(),
                    ),
                    align=1,
                )
                for j in range(nr)
            ]
            for r in pixels:
                xq = builder.load(
                    builder.bitcast(
                        builder.gep(x, [builder.add(row_base[r], x_off)]),
                        ir.IntType(8 * isa.group_bytes).as_pointer(),
                    ),
                    align=1,
                )
                xv = broadcast(builder, xq)
                for j in range(nr):
                    builder.store(isa.multiply_add(builder, builder.load(accs[r][j]), xv, wv[j]), accs[r][j])
    # Output stage on the registers; per-channel parameters: 5 rows of params_stride bytes.
    params = builder.inttoptr(a.params_ptr, i8p)
    out = builder.inttoptr(a.out_ptr, i8p)
    if isa.pack is not None and nr == 2:  # both vectors of a pixel narrowed together
        pj = [load_parameters(builder, params, a.params_stride, j, lanes=isa.lanes) for j in range(nr)]
        for kind in each_stage(builder, a.stage):
            for r in pixels:
                with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), a.rows)):
                    ys = [
                        vector_output_stage(
                            builder,
                            builder.load(accs[r][j]),
                            pj[j],
                            kind,
                            a.zero_point,
                            a.lo,
                            a.hi,
                            narrow=False,
                        )
                        for j in range(nr)
                    ]
                    dst = builder.gep(out, [builder.mul(a.out_stride, ir.Constant(_I64, r))])
                    isa.store(builder, isa.pack(builder, *ys), dst, a.width)
        return
    if isa.pair_rows and nr == 1 and len(pixels) % 2 == 0:
        half = builder.icmp_signed("<=", a.width, ir.Constant(_I64, isa.lanes // 2))
        with builder.if_else(half) as (paired, whole):
            with paired:
                _paired_stage(builder, isa, accs, pixels, a, params, out)
            with whole:
                _vector_stages(builder, isa, nr, accs, pixels, a, params, out)
        return
    _vector_stages(builder, isa, nr, accs, pixels, a, params, out)


def _paired_stage(builder, isa: Isa, accs, pixels: range, a, params, out):
    """The output stage of a tile whose one vector per pixel holds at most lanes / 2 valid channels
    (a width of 8 or fewer on VNNI): the lower halves of pixels r and r + 1 in one vector, so one
    output stage serves two pixels (as XNNPACK amortises its rescale over a whole tile row). The
    same lane-wise steps as one stage per pixel: the bits do not change."""
    lanes = isa.lanes
    h = lanes // 2

    def indices(values):
        return ir.Constant(ir.VectorType(_I32, len(values)), values)

    pj = load_parameters(builder, params, a.params_stride, 0, lanes=lanes)
    doubled = [builder.shuffle_vector(p, p, indices(list(range(h)) * 2)) for p in pj]
    for kind in each_stage(builder, a.stage):
        for r in pixels[::2]:
            with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), a.rows)):
                both = builder.shuffle_vector(
                    builder.load(accs[r][0]),
                    builder.load(accs[r + 1][0]),
                    indices(list(range(h)) + list(range(lanes, lanes + h))),
                )
                y = vector_output_stage(builder, both, doubled, kind, a.zero_point, a.lo, a.hi)
                dst = builder.gep(out, [builder.mul(a.out_stride, ir.Constant(_I64, r))])
                isa.store(builder, builder.shuffle_vector(y, y, indices(list(range(h)))), dst, a.width)
                with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r + 1), a.rows)):
                    dst = builder.gep(dst, [a.out_stride])
                    isa.store(
                        builder, builder.shuffle_vector(y, y, indices(list(range(h, lanes)))), dst, a.width
                    )


def _vector_stages(builder, isa: Isa, nr: int, accs, pixels: range, a, params, out):
    """The output stage of a tile, one vector of isa.lanes channels of one pixel at a time."""
    for j in range(nr):
        pj = load_parameters(builder, params, a.params_stride, j, lanes=isa.lanes)
        for kind in each_stage(builder, a.stage):
            for r in pixels:
                with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), a.rows)):
                    y = vector_output_stage(
                        builder, builder.load(accs[r][j]), pj, kind, a.zero_point, a.lo, a.hi
                    )
                    first = ir.Constant(_I64, isa.lanes * j)
                    dst = builder.gep(
                        out, [builder.add(builder.mul(a.out_stride, ir.Constant(_I64, r)), first)]
                    )
                    isa.store(builder, y, dst, builder.sub(a.width, first))


LANES = BLOCK = PER_GROUP = 0  # globals of the templates, bound per ISA (as micro_kernel in _conv)


def pack_filters(w, cp, isa: Isa):
    """w [G, O, T, C] int8 (T taps of C weights) -> [G, T * cp * O'] of isa.dtype in the block layout
    above, 64-byte aligned (cp: C rounded up to whole groups, O' = O rounded up to isa.lanes; padding
    channels and the weights past C hold zero)."""
    groups, o, t, _ = w.shape
    out = aligned.zeros((groups, t * cp * ((o + isa.lanes - 1) // isa.lanes * isa.lanes)), isa.dtype)
    return _packer(isa.name, 4 // out.itemsize, isa.lanes, isa.block)(w, cp, out)


@functools.cache
def _packer(name: str, per_group: int, lanes: int, block: int):
    """_pack_filters compiled with these sizes as constants (a division by a variable per weight
    made packing three times slower, and FULLY_CONNECTED packs at every call)."""
    return njit(renamed(_pack_filters, name, PER_GROUP=per_group, LANES=lanes, BLOCK=block))


def _pack_filters(w, cp, out):
    """The template of the packing that _packer compiles."""
    groups, o, t, c = w.shape
    n_groups = cp // PER_GROUP
    k = t * n_groups
    o_padded = (o + LANES - 1) // LANES * LANES
    for g in range(groups):
        for oc in range(o):
            first = oc // BLOCK * BLOCK
            width = min(BLOCK, o_padded - first)
            base = first * k * PER_GROUP + (oc - first) * PER_GROUP
            for tt in range(t):
                for ci in range(c):
                    out[g, base + (tt * n_groups + ci // PER_GROUP) * width * PER_GROUP + ci % PER_GROUP] = w[
                        g, oc, tt, ci
                    ]
    return out


def _conv(
    xp,
    unsigned,
    packed,
    taps,
    groups_per_tap,
    out_h,
    out_w,
    stride_h,
    stride_w,
    groups,
    shared,
    out_c,
    params,
    profile,
    zero_point,
    lo,
    hi,
    out,
):
    """out[g * P + p, c] for P output pixels per group: the output stage (params[g], see
    output_parameters) of the exact sum over taps and their channel groups of xp at pixel p's
    corner + tap, times filter g's channel c; unsigned: xp in the ISA's unsigned form. shared:
    every group reads all N images of xp; else group g reads its slice of N / groups. The
    template of the kernels that conv_kernel compiles, where the name micro_kernel stands for
    micro_kernel(isa)."""
    n_in, hp, wp, cp = xp.shape
    pixel = cp * xp.itemsize  # bytes per input pixel
    pixels = out_h * out_w
    images = n_in if shared else n_in // groups
    per_group = images * pixels
    n_blocks = (per_group + MR - 1) // MR
    tasks_per_group = (n_blocks + BLOCKS_PER_TASK - 1) // BLOCKS_PER_TASK
    k_bytes = taps.size * groups_per_tap * 4  # packed bytes per output channel
    o_padded = (out_c + LANES - 1) // LANES * LANES
    for task in nb.prange(groups * tasks_per_group):
        g = task // tasks_per_group
        first_block = (task - g * tasks_per_group) * BLOCKS_PER_TASK
        first_image = 0 if shared else g * images
        bases = np.empty(MR, dtype=np.int64)
        w_group = packed.ctypes.data + g * packed.shape[1] * packed.itemsize
        p_group = params.ctypes.data + g * params.shape[1] * params.shape[2] * 4
        # The output pixel (image i, row oy, column ox) of the task's first block; then step one
        # pixel at a time (divisions per pixel would cost as much as a small layer's reduction).
        p0 = first_block * MR
        i = p0 // pixels
        oy = (p0 - i * pixels) // out_w
        ox = p0 - i * pixels - oy * out_w
        for blk in range(first_block, min(first_block + BLOCKS_PER_TASK, n_blocks)):
            for r in range(MR):
                bases[r] = (((first_image + i) * hp + oy * stride_h) * wp + ox * stride_w) * pixel
                if blk * MR + r < per_group - 1:  # past the end, the last pixel repeats
                    ox += 1
                    if ox == out_w:
                        ox = 0
                        oy += 1
                        if oy == out_h:
                            oy = 0
                            i += 1
            rows = min(MR, per_group - blk * MR)
            out_row = out.ctypes.data + (g * per_group + blk * MR) * out_c
            for cb in range(0, out_c, BLOCK):
                micro_kernel(
                    min(BLOCK, o_padded - cb) // LANES,
                    unsigned,
                    xp.ctypes.data,
                    bases.ctypes.data,
                    taps.ctypes.data,
                    taps.size,
                    groups_per_tap,
                    w_group + cb * k_bytes,
                    out_row + cb,
                    out_c,
                    rows,
                    out_c - cb,
                    p_group + cb * 4,
                    params.shape[2] * 4,
                    profile,
                    zero_point,
                    lo,
                    hi,
                )
    return out


def run_conv(
    kernel, x, w, xp, taps, groups_per_tap, packed, params, stride, out_hw, shared, stage, profile, unsigned=0
):
    """kernel (a conv_kernel) on xp, taps and packed, the input x and weights w [G, O, ...] as its
    engine prepares them: int8 [G * P, O], as vnni.convolve returns it. unsigned: xp holds the
    ISA's unsigned form (vnni.padded_input)."""
    groups, out_c = w.shape[:2]
    (sh, sw), (out_h, out_w) = stride, out_hw
    out = aligned.empty((x.shape[0] * out_h * out_w * (groups if shared else 1), out_c), np.int8)
    return kernel(
        xp,
        unsigned,
        packed,
        taps,
        groups_per_tap,
        out_h,
        out_w,
        sh,
        sw,
        groups,
        shared,
        out_c,
        params,
        np.int64(profile),
        np.int64(stage.zero_point),
        np.int64(stage.lo),
        np.int64(stage.hi),
        out,
    )


def conv_work(args) -> int:
    """A call of _conv's work for ParallelKernel: its multiply-adds (outputs x taps x channel groups x
    bytes per group) / MACS_PER_WORK. Threads pay from about 2 MMAC: YOLOv8n-256's layers at batch 8
    on a 2-core AMD EPYC (AVX2), serial against threaded, min of 35 interleaved calls: 75 MMAC 1.71
    -> 1.01 ms, 2.1 MMAC 0.178 -> 0.162 ms, 0.03 MMAC 0.091 both."""
    packed, taps, groups_per_tap, out = args[2], args[3], args[4], args[-1]
    return out.size * taps.size * groups_per_tap * (4 // packed.itemsize) // MACS_PER_WORK


def conv_kernel(isa: Isa) -> ParallelKernel:
    """The convolution kernel of isa: _conv with its micro-kernel and block sizes, under its own
    qualified name (Numba's cache is keyed by name, see jit.renamed)."""
    fn = renamed(_conv, isa.name, micro_kernel=micro_kernel(isa), LANES=isa.lanes, BLOCK=isa.block)
    return ParallelKernel(fn, work=conv_work)
