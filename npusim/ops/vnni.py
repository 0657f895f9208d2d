"""Exact int8 convolutions and matrix products on AVX-512 VNNI, with the fused output stage.

VPDPBUSD multiplies 4 unsigned bytes by 4 signed bytes and adds the 4 products to an int32 lane,
without saturation. The kernel makes activations unsigned as it loads them, by flipping their sign
bits (u = x + 128), so

    sum (x - zp) * w = sum u * w - (zp + 128) * sum w,

and the second term, one number per channel, folds into the bias (gemm.accumulator_offset with
zp + 128). Padding taps hold x = zp and so contribute exactly zero, as TFLM skips them.
Every int32 sum is exact while the depth K stays at most MAX_DEPTH (K * 255 * 128 < 2^31).

Layouts:
- activations: the int8 input itself when every tap falls inside the image and C is a multiple
  of 4; else a padded copy [N, Hp, Wp, C] (with C not a multiple of 4, a pixel's last 4-byte
  read takes bytes of the next pixel, which meet zero weights). A convolution then reads its taps
  straight from this copy: the reduction index is (tap, channel), and a tap is a fixed offset from
  the output pixel's corner (no im2col).
- filters: per block of up to 64 output channels, [K4, nr, 16, 4] bytes (K4 = taps * Cp / 4,
  nr = block width / 16), so one 64-byte load holds 4 reduction steps of 16 channels.

The micro-kernel (LLVM IR, built below) computes MR output pixels x nr*16 channels over the whole
reduction in MR * nr ZMM accumulators (24 of the 32 registers at nr = 4).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit import njit, parallel_kernel
from . import aligned
from .gemm import accumulator_offset
from .output_stage import (
    each_profile,
    load_parameters,
    output_parameters,
    splat,
    store_bytes,
    vector_output_stage,
)
from .padding import pad_input

MR = 6  # output pixels per micro-kernel call
BLOCK = 64  # output channels per micro-kernel call (4 ZMM registers of 16 int32)
MAX_DEPTH = 65536  # reduction length with exact int32 sums: 65536 * 255 * 128 < 2^31
BLOCKS_PER_TASK = 16  # pixel blocks per parallel task (one scratch allocation each)

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_V16 = ir.VectorType(_I32, 16)


def _micro_kernel(nr: int):
    """out[r, 16j + l] for r < rows and 16j + l < width: the output stage of
    sum over taps t and channel quads q of u8x4(x[base[r] + tap[t] + 4q]) . packed[(t * c4 + q) * nr + j],
    for MR pixels and nr vectors of 16 channels."""

    @intrinsic
    def kernel(
        typingctx,
        x_ptr,
        bases_ptr,
        taps_ptr,
        n_taps,
        c4,
        w_ptr,
        out_ptr,
        out_stride,
        rows,
        width,
        params_ptr,
        params_stride,
        profile,
        zero_point,
        lo,
        hi,
    ):
        sig = types.void(*([types.int64] * 16))

        def codegen(context, builder, signature, args):
            (
                x_ptr,
                bases_ptr,
                taps_ptr,
                n_taps,
                c4,
                w_ptr,
                out_ptr,
                out_stride,
                rows,
                width,
                params_ptr,
                params_stride,
                profile,
                zero_point,
                lo,
                hi,
            ) = args
            dpbusd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V16, [_V16, _V16, _V16]), "llvm.x86.avx512.vpdpbusd.512"
            )
            i8p = ir.IntType(8).as_pointer()
            x = builder.inttoptr(x_ptr, i8p)
            w = builder.inttoptr(w_ptr, i8p)
            bases = builder.inttoptr(bases_ptr, _I64.as_pointer())
            taps = builder.inttoptr(taps_ptr, _I64.as_pointer())
            row_base = [builder.load(builder.gep(bases, [ir.Constant(_I64, r)])) for r in range(MR)]
            # Allocas in the entry block: LLVM promotes them to registers (phis) across the loops.
            accs = [
                [cgutils.alloca_once_value(builder, ir.Constant(_V16, None)) for _ in range(nr)]
                for _ in range(MR)
            ]
            step = ir.Constant(_I64, nr * 64)  # bytes of packed filter per channel quad
            with cgutils.for_range(builder, n_taps) as tap_loop:
                tap = builder.load(builder.gep(taps, [tap_loop.index]))
                tap_w = builder.mul(builder.mul(tap_loop.index, c4), step)
                with cgutils.for_range(builder, c4) as quad_loop:
                    q = quad_loop.index
                    x_off = builder.add(tap, builder.shl(q, ir.Constant(_I64, 2)))
                    w_off = builder.add(tap_w, builder.mul(q, step))
                    wv = [
                        builder.load(
                            builder.bitcast(
                                builder.gep(w, [builder.add(w_off, ir.Constant(_I64, 64 * j))]),
                                _V16.as_pointer(),
                            ),
                            align=1,
                        )
                        for j in range(nr)
                    ]
                    for r in range(MR):
                        a = builder.load(
                            builder.bitcast(
                                builder.gep(x, [builder.add(row_base[r], x_off)]), _I32.as_pointer()
                            ),
                            align=1,
                        )
                        a = builder.xor(a, ir.Constant(_I32, 0x80808080))  # 4 int8 x -> 4 uint8 x + 128
                        av = splat(builder, a, _V16)
                        for j in range(nr):
                            builder.store(
                                builder.call(dpbusd, [builder.load(accs[r][j]), av, wv[j]]), accs[r][j]
                            )
            # Output stage on the registers; per-channel parameters: 5 rows of params_stride bytes.
            params = builder.inttoptr(params_ptr, i8p)
            out = builder.inttoptr(out_ptr, i8p)
            for j in range(nr):
                pj = load_parameters(builder, params, params_stride, j)
                for pid in each_profile(builder, profile):
                    for r in range(MR):
                        with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), rows)):
                            y = vector_output_stage(
                                builder, builder.load(accs[r][j]), pj, pid, zero_point, lo, hi
                            )
                            dst = builder.gep(
                                out,
                                [
                                    builder.add(
                                        builder.mul(out_stride, ir.Constant(_I64, r)),
                                        ir.Constant(_I64, 16 * j),
                                    )
                                ],
                            )
                            store_bytes(builder, y, dst, builder.sub(width, ir.Constant(_I64, 16 * j)))
            return context.get_dummy_value()

        return sig, codegen

    return kernel


_mk1, _mk2, _mk3, _mk4 = (_micro_kernel(nr) for nr in (1, 2, 3, 4))


def pack_filters(w, cp):
    """w [G, O, T, C] int8 (T taps) -> [G, K4 * O16 * 4] int8 in the block layout above, 64-byte
    aligned (O16 = O rounded up to 16; the padding channels and quads hold zero weights)."""
    groups, o, t, _ = w.shape
    return _pack_filters(w, cp, aligned.zeros((groups, t * cp * ((o + 15) // 16 * 16)), np.int8))


@njit()
def _pack_filters(w, cp, out):
    groups, o, t, c = w.shape
    c4 = cp // 4
    k4 = t * c4
    o16 = (o + 15) // 16 * 16
    for g in range(groups):
        for oc in range(o):
            block = oc // BLOCK
            width = min(BLOCK, o16 - block * BLOCK)
            base = block * BLOCK * k4 * 4 + (oc - block * BLOCK) * 4
            for tt in range(t):
                for ci in range(c):
                    out[g, base + (tt * c4 + ci // 4) * width * 4 + ci % 4] = w[g, oc, tt, ci]
    return out


@parallel_kernel
def conv_vnni(
    xp,
    packed,
    taps,
    c4,
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
    output_parameters) of the exact sum over taps and channels of xp at pixel p's corner + tap, times
    filter g's channel c. shared: every group reads all N images of xp; else group g reads its
    slice of N / groups."""
    n_in, hp, wp, pixel = xp.shape  # pixel: bytes per input pixel (C); c4 quads cover them
    pixels = out_h * out_w
    images = n_in if shared else n_in // groups
    per_group = images * pixels
    n_blocks = (per_group + MR - 1) // MR
    tasks_per_group = (n_blocks + BLOCKS_PER_TASK - 1) // BLOCKS_PER_TASK
    k_bytes = taps.size * c4 * 4  # packed bytes per output channel
    o16 = (out_c + 15) // 16 * 16
    for task in nb.prange(groups * tasks_per_group):
        g = task // tasks_per_group
        first_block = (task - g * tasks_per_group) * BLOCKS_PER_TASK
        first_image = 0 if shared else g * images
        bases = np.empty(MR, dtype=np.int64)
        w_group = packed.ctypes.data + g * packed.shape[1]
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
                nr = min(BLOCK, o16 - cb) // 16
                args = (
                    xp.ctypes.data,
                    bases.ctypes.data,
                    taps.ctypes.data,
                    taps.size,
                    c4,
                    w_group + cb * k_bytes,
                    out_row + cb,
                    out_c,
                    rows,
                    out_c - cb,
                    p_group + cb * 4,
                    o16 * 4,
                    profile,
                    zero_point,
                    lo,
                    hi,
                )
                if nr == 4:
                    _mk4(*args)
                elif nr == 3:
                    _mk3(*args)
                elif nr == 2:
                    _mk2(*args)
                else:
                    _mk1(*args)
    return out


def padded_input(x, kh, kw, stride, dilation, pad, out_hw, zero_point, workspace=None):
    """The input a direct convolution reads, and its tap offsets in bytes.

    x itself when every tap falls inside the image and C is a multiple of 4; else a copy [N, Hp, Wp, C]
    padded with the zero point out to the rows and columns the taps reach. With C not a multiple of
    4 the kernels read a pixel's channels in 4-byte quads (or AMX chunks) whose last one takes up to
    3 bytes of the next pixel, which meet zero weights; 4 bytes of slack keep the last pixel's read
    inside the buffer. workspace: an aligned.Workspace for the copy (or None).
    """
    (sh, sw), (dh, dw), (pad_top, pad_left), (out_h, out_w) = stride, dilation, pad, out_hw
    n, h, w, c = x.shape
    hp, wp = (out_h - 1) * sh + (kh - 1) * dh + 1, (out_w - 1) * sw + (kw - 1) * dw + 1
    if (pad_top, pad_left) == (0, 0) and c % 4 == 0 and hp <= h and wp <= w:
        xp = np.ascontiguousarray(x)  # every tap inside the image: read the input itself
    else:
        size = n * hp * wp * c
        flat = (workspace or aligned.Workspace()).get((size + 4,), np.int8)
        xp = pad_input(
            np.ascontiguousarray(x), pad_top, pad_left, np.int8(zero_point), flat[:size].reshape(n, hp, wp, c)
        )
    wp = xp.shape[2]
    return xp, np.array(
        [(ky * dh * wp + kx * dw) * c for ky in range(kh) for kx in range(kw)], dtype=np.int64
    )


def prepared_filters(tag, w, bias, offset_zero_point, stage, memo=None):
    """(packed filters, output parameters) of weights w [G, O, kh, kw, C], the accumulator offset
    taken at offset_zero_point; from memo (a base.WeightMemo, or None) while w and bias are unchanged."""
    groups, o, kh, kw, c = w.shape

    def prepare():
        return (
            pack_filters(np.ascontiguousarray(w).reshape(groups, o, kh * kw, c), (c + 3) // 4 * 4),
            output_parameters(accumulator_offset(w, bias, offset_zero_point), stage),
        )

    return memo.get(tag, w, bias, prepare) if memo is not None else prepare()


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
    """Exact int8 convolution with its output stage.

    x [N, H, W, C] int8; w [G, O, kh, kw, C] int8 (G weight groups, see conv.py); bias [G or 1, O]
    or None; stride, dilation and pad (top, left) as (h, w) pairs; out_hw the output (height,
    width); stage an OutputStage; workspace an aligned.Workspace for the padded copy and memo a
    base.WeightMemo for the prepared weights (each or None).
    Returns int8 [G * P, O], P output pixels per group:
    P = N * out_h * out_w when shared (every group sees the whole batch), else N / G of that.
    """
    groups, o, kh, kw, c = w.shape
    (sh, sw), (out_h, out_w) = stride, out_hw
    xp, taps = padded_input(x, kh, kw, stride, dilation, pad, out_hw, input_zero_point, workspace)
    packed, params = prepared_filters("vnni", w, bias, input_zero_point + 128, stage, memo)
    out = aligned.empty((x.shape[0] * out_h * out_w * (groups if shared else 1), o), np.int8)
    return conv_vnni(
        xp,
        packed,
        taps,
        (c + 3) // 4,
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
        out,
    )
