"""Exact int8 convolutions on AMX-INT8 tiles (Sapphire Rapids and later), with the fused output stage.

TDPBSSD adds to each int32 element of a 16 x 16 tile C the dot products of a row of A (16 pixels x
K bytes) and a column of B (K bytes x 16 channels, stored as K/4 rows of 16 x 4 bytes), signed by
signed, without saturation: exact int32 sums of (x * w), so that
sum (x - zp) * w = sum x * w - zp * sum w, the second term folded into the bias as on the VNNI path.

A tile row is 16 consecutive output pixels of one output row: their input corners are a constant
stride (stride_w * C bytes) apart, so a tap of 16 pixels is one tile load from the (padded) input;
the reduction runs over taps and chunks of up to 64 channels. The last block of a row is moved
back to end on the row's last pixel (it recomputes a few outputs instead of reading past the row),
so rows must hold at least 16 output pixels; a 1x1 stride-1 convolution is one long row. Filters
use vnni.py's packed layout, whose 64-byte rows are exactly AMX's B rows.

Tiles: C0..C3 = tmm0..3 (2 pixel blocks x 2 channel groups), A = tmm4, tmm5, B = tmm6, tmm7.
The OS must grant the tile data state to the process first (arch_prctl ARCH_REQ_XCOMP_PERM, asked
by host.has_amx(); backend.py runs this engine only where that was granted).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import aligned
from .jit import njit, parallel_kernel
from .output_stage import output_stage_tile
from .vnni import MAX_DEPTH, padded_input, prepared_filters

ROWS = 16  # pixels per tile
MIN_CHUNK = 16  # narrower reductions per tile op leave AMX slower than VNNI


def chunk_for(cp: int) -> int:
    """Channels per tile op: the largest of 64, 32, 16 dividing the (padded) channel count."""
    for chunk in (64, 32, 16, 8, 4):
        if cp % chunk == 0:
            return chunk
    return 4


_I8, _I64 = ir.IntType(8), ir.IntType(64)


def _tile(k: int):
    return ir.Constant(_I8, k)


@intrinsic
def _load_config(typingctx, config_ptr):
    sig = types.void(types.int64)

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer()]), "llvm.x86.ldtilecfg"
        )
        builder.call(fn, [builder.inttoptr(args[0], _I8.as_pointer())])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _release(typingctx):
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.call(
            cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.tilerelease"
            ),
            [],
        )
        return context.get_dummy_value()

    return sig, codegen


def _block_kernel(groups: int):
    """acc[(2 * b + j) * 256 + 16 * r + l] = sum over taps t and chunks k of
    x[base_b + 16 * r * a_stride ... ] . w, for pixel blocks b = 0, 1 and channel groups j < groups."""

    @intrinsic
    def kernel(
        typingctx, x_ptr, a_stride, base0, base1, taps_ptr, n_taps, n_chunks, chunk, w_ptr, w_stride, acc_ptr
    ):
        sig = types.void(*([types.int64] * 11))

        def codegen(context, builder, signature, args):
            x_ptr, a_stride, base0, base1, taps_ptr, n_taps, n_chunks, chunk, w_ptr, w_stride, acc_ptr = args
            mod = builder.module
            i8p = _I8.as_pointer()
            void = ir.VoidType()
            zero = cgutils.get_or_insert_function(mod, ir.FunctionType(void, [_I8]), "llvm.x86.tilezero")
            load = cgutils.get_or_insert_function(
                mod, ir.FunctionType(void, [_I8, i8p, _I64]), "llvm.x86.tileloadd64"
            )
            dot = cgutils.get_or_insert_function(
                mod, ir.FunctionType(void, [_I8, _I8, _I8]), "llvm.x86.tdpbssd"
            )
            store = cgutils.get_or_insert_function(
                mod, ir.FunctionType(void, [_I8, i8p, _I64]), "llvm.x86.tilestored64"
            )
            x = builder.inttoptr(x_ptr, i8p)
            w = builder.inttoptr(w_ptr, i8p)
            taps = builder.inttoptr(taps_ptr, _I64.as_pointer())
            for b in range(2):
                for j in range(groups):
                    builder.call(zero, [_tile(2 * b + j)])
            quads = builder.sdiv(chunk, ir.Constant(_I64, 4))
            with cgutils.for_range(builder, n_taps) as tap_loop:
                tap = builder.load(builder.gep(taps, [tap_loop.index]))
                with cgutils.for_range(builder, n_chunks) as chunk_loop:
                    a_off = builder.add(tap, builder.mul(chunk_loop.index, chunk))
                    builder.call(load, [_tile(4), builder.gep(x, [builder.add(base0, a_off)]), a_stride])
                    builder.call(load, [_tile(5), builder.gep(x, [builder.add(base1, a_off)]), a_stride])
                    # B rows of this chunk: quad index (t * n_chunks + k) * quads, w_stride bytes apart.
                    quad = builder.mul(
                        builder.add(builder.mul(tap_loop.index, n_chunks), chunk_loop.index), quads
                    )
                    b_off = builder.mul(quad, w_stride)
                    for j in range(groups):
                        builder.call(
                            load,
                            [
                                _tile(6 + j),
                                builder.gep(w, [builder.add(b_off, ir.Constant(_I64, 64 * j))]),
                                w_stride,
                            ],
                        )
                    for b in range(2):
                        for j in range(groups):
                            builder.call(dot, [_tile(2 * b + j), _tile(4 + b), _tile(6 + j)])
            acc = builder.inttoptr(acc_ptr, i8p)
            for b in range(2):
                for j in range(groups):
                    builder.call(
                        store,
                        [
                            _tile(2 * b + j),
                            builder.gep(acc, [ir.Constant(_I64, (2 * b + j) * 1024)]),
                            ir.Constant(_I64, 64),
                        ],
                    )
            return context.get_dummy_value()

        return sig, codegen

    return kernel


_block1, _block2 = _block_kernel(1), _block_kernel(2)


def tile_config(chunk: int) -> np.ndarray:
    """The 64-byte LDTILECFG record: palette 1; C tiles 16 x 64 bytes, A tiles 16 x chunk bytes,
    B tiles chunk/4 x 64 bytes."""
    cfg = aligned.zeros(64, np.uint8)
    cfg[0] = 1
    colsb = cfg[16:48].view(np.uint16)
    rows = cfg[48:64]
    for t, (r, c) in enumerate([(ROWS, 64)] * 4 + [(ROWS, chunk)] * 2 + [(chunk // 4, 64)] * 2):
        colsb[t], rows[t] = c, r
    return cfg


@njit(inline="always")
def _block_start(blk, blocks_per_row, out_w):
    """(output row index, first column) of pixel block blk: 16 columns, the last block of a row
    moved back to end on the row's last column."""
    row = blk // blocks_per_row
    ox = min((blk - row * blocks_per_row) * ROWS, out_w - ROWS)
    return row, ox


@parallel_kernel
def conv_amx(
    xp,
    packed,
    taps,
    cp,
    chunk,
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
    config,
    out,
):
    """As vnni.conv_vnni, on AMX tiles: out[g * P + p, c], P output pixels per group (out_w >= 16).
    cp: the channels of the packed filters (C rounded up to 4); xp holds C per pixel."""
    n_in, hp, wp, pixel = xp.shape
    images = n_in if shared else n_in // groups
    per_group = images * out_h * out_w
    blocks_per_row = (out_w + ROWS - 1) // ROWS
    n_pairs = (images * out_h * blocks_per_row + 1) // 2  # two pixel blocks per kernel call
    k_bytes = taps.size * cp  # packed bytes per output channel
    o16 = (out_c + 15) // 16 * 16
    n_chunks = cp // chunk
    a_stride = stride_w * pixel
    pairs_per_task = 8
    tasks_per_group = (n_pairs + pairs_per_task - 1) // pairs_per_task
    for task in nb.prange(groups * tasks_per_group):
        g = task // tasks_per_group
        first_image = 0 if shared else g * images
        _load_config(config.ctypes.data)
        scratch = np.empty(4 * 256 + 16, dtype=np.int32)
        acc = (scratch.ctypes.data + 63) // 64 * 64  # tile rows on cache lines
        w_group = packed.ctypes.data + g * packed.shape[1]
        p_group = params.ctypes.data + g * params.shape[1] * o16 * 4
        first_pair = (task - g * tasks_per_group) * pairs_per_task
        for pair in range(first_pair, min(first_pair + pairs_per_task, n_pairs)):
            blk0 = 2 * pair
            blk1 = min(blk0 + 1, images * out_h * blocks_per_row - 1)  # an odd last block repeats
            row0, ox0 = _block_start(blk0, blocks_per_row, out_w)
            row1, ox1 = _block_start(blk1, blocks_per_row, out_w)
            i0, oy0 = row0 // out_h, row0 % out_h
            i1, oy1 = row1 // out_h, row1 % out_h
            base0 = (((first_image + i0) * hp + oy0 * stride_h) * wp + ox0 * stride_w) * pixel
            base1 = (((first_image + i1) * hp + oy1 * stride_h) * wp + ox1 * stride_w) * pixel
            for cb in range(0, out_c, 64):
                nr = min(64, o16 - cb) // 16
                w_block = w_group + cb * k_bytes
                for j0 in range(0, nr, 2):
                    w_pair = w_block + j0 * 64
                    if j0 + 1 < nr:
                        _block2(
                            xp.ctypes.data,
                            a_stride,
                            base0,
                            base1,
                            taps.ctypes.data,
                            taps.size,
                            n_chunks,
                            chunk,
                            w_pair,
                            nr * 64,
                            acc,
                        )
                    else:
                        _block1(
                            xp.ctypes.data,
                            a_stride,
                            base0,
                            base1,
                            taps.ctypes.data,
                            taps.size,
                            n_chunks,
                            chunk,
                            w_pair,
                            nr * 64,
                            acc,
                        )
                    for j in range(j0, min(j0 + 2, nr)):
                        c0 = cb + 16 * j
                        for b in range(2):
                            row, ox = (row0, ox0) if b == 0 else (row1, ox1)
                            p_first = g * per_group + row * out_w + ox
                            output_stage_tile(
                                acc + (2 * b + j - j0) * 1024,
                                p_group + c0 * 4,
                                o16 * 4,
                                out.ctypes.data + p_first * out_c + c0,
                                out_c,
                                ROWS,
                                min(16, out_c - c0),
                                profile,
                                zero_point,
                                lo,
                                hi,
                            )
        _release()
    return out


def usable(depth: int, channels: int, row_pixels: int) -> bool:
    """Whether a convolution of reduction `depth`, `channels` input channels and output rows of
    `row_pixels` pixels suits the AMX kernel (on a host that has AMX, see host.has_amx)."""
    return depth <= MAX_DEPTH and chunk_for((channels + 3) // 4 * 4) >= MIN_CHUNK and row_pixels >= ROWS


def convolve(
    x,
    w,
    bias,
    input_zero_point,
    stride,
    dilation,
    pad,
    out_hw,
    stage,
    profile,
    shared=False,
    workspace=None,
    memo=None,
):
    """As vnni.convolve (same arguments and result), on AMX tiles; callers check usable() first."""
    groups, o, kh, kw, c = w.shape
    (sh, sw), (out_h, out_w) = stride, out_hw
    cp = (c + 3) // 4 * 4
    n = x.shape[0]
    if (kh, kw, sh, sw) == (1, 1, 1, 1) and tuple(pad) == (0, 0) and c % 4 == 0:
        xp = np.ascontiguousarray(x).reshape(n, 1, -1, c)  # a pointwise convolution: each image one long row
        out_h, out_w = 1, xp.shape[2]
        taps = np.zeros(1, dtype=np.int64)
    else:
        xp, taps, _ = padded_input(x, kh, kw, stride, dilation, pad, out_hw, input_zero_point, workspace)
    if out_w < ROWS:  # the kernel would read past the input: callers check usable() first
        raise ValueError(f"AMX convolution needs output rows of at least {ROWS} pixels, got {out_w}")
    packed, params = prepared_filters("amx", w, bias, input_zero_point, stage, memo)
    out = aligned.empty((n * out_h * out_w * (groups if shared else 1), o), np.int8)
    chunk = chunk_for(cp)
    return conv_amx(
        xp,
        packed,
        taps,
        cp,
        chunk,
        out_h,
        out_w,
        sh,
        sw,
        groups,
        shared,
        o,
        params,
        np.int64(profile),
        np.int64(stage.zero_point),
        np.int64(stage.lo),
        np.int64(stage.hi),
        tile_config(chunk),
        out,
    )
