"""Exact int8 convolutions and matrix products on AVX2 (VPMADDWD), with the fused output stage.

VPMADDWD multiplies 16 pairs of int16 lanes and adds each pair's two products into an int32 lane.
On int8 operands widened to int16 it is exact (it saturates only when both products are
(-32768)^2), which is how XNNPACK's AVX2 qs8 kernels use it; VPMADDUBSW, which multiplies bytes,
saturates its int16 pair sums and is not exact. Here the activations are widened as x - zp:

- activations: an int16 copy [N, Hp, Wp, C'] of x - zp, padded with 0 out to the rows and columns
  the taps reach, so padding taps contribute exactly zero, as TFLM skips them, and the accumulator
  offset is the bias alone. A convolution reads its taps from this copy: the reduction index is
  (tap, channel), a tap is a fixed offset from the output pixel's corner (no im2col), and one
  4-byte load is a pair of int16. A filter row without dilation along the width is one tap of
  kw * C contiguous int16 (row_runs; C' = C); otherwise each tap reads C' = C rounded up to even.
- filters: per block of up to BLOCK output channels, [K2, nr, 8, 2] int16 (K2: the pairs of the
  whole reduction, nr = block width / 8): one 32-byte load holds 2 reduction steps of 8 channels.

Every int32 sum is exact while the depth K stays at most MAX_DEPTH (|x - zp| <= 255, |w| <= 128,
K * 255 * 128 < 2^31). The micro-kernel (LLVM IR, below) computes MR output pixels x nr * 8
channels over the whole reduction in MR * nr YMM accumulators: with nr = 2, 12 of the 16 YMM
registers, two for the filter and one for the broadcast activation pair. Only AVX2 instructions:
an AVX-512 host runs the same code (tests/test_avx2_cpu.py compiles it for Haswell).
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
from .output_stage import each_profile, load_parameters, output_parameters, store_first, vector_output_stage

MR = 6  # output pixels per micro-kernel call
NR = 2  # YMM accumulators (8 int32 channels each) per pixel
BLOCK = 8 * NR  # output channels per micro-kernel call
MAX_DEPTH = 65536  # reduction length with exact int32 sums: 65536 * 255 * 128 < 2^31
BLOCKS_PER_TASK = 16  # pixel blocks per parallel task (one scratch allocation each)

_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
_V8 = ir.VectorType(_I32, 8)
_W16 = ir.VectorType(_I16, 16)


def _micro_kernel(nr: int):
    """out[r, 8j + l] for r < rows and 8j + l < width: the output stage of
    sum over taps t and channel pairs q of i16x2(x[base[r] + tap[t] + 4q]) . packed[(t * c2 + q) * nr + j],
    for MR pixels and nr vectors of 8 channels."""

    @intrinsic
    def kernel(
        typingctx,
        x_ptr,
        bases_ptr,
        taps_ptr,
        n_taps,
        c2,
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
                c2,
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
            pmaddwd = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_V8, [_W16, _W16]), "llvm.x86.avx2.pmadd.wd"
            )
            i8p = ir.IntType(8).as_pointer()
            x = builder.inttoptr(x_ptr, i8p)
            w = builder.inttoptr(w_ptr, i8p)
            bases = builder.inttoptr(bases_ptr, _I64.as_pointer())
            taps = builder.inttoptr(taps_ptr, _I64.as_pointer())
            row_base = [builder.load(builder.gep(bases, [ir.Constant(_I64, r)])) for r in range(MR)]
            # Allocas in the entry block: LLVM promotes them to registers (phis) across the loops.
            accs = [
                [cgutils.alloca_once_value(builder, ir.Constant(_V8, None)) for _ in range(nr)]
                for _ in range(MR)
            ]
            step = ir.Constant(_I64, nr * 32)  # bytes of packed filter per channel pair
            with cgutils.for_range(builder, n_taps) as tap_loop:
                tap = builder.load(builder.gep(taps, [tap_loop.index]))
                tap_w = builder.mul(builder.mul(tap_loop.index, c2), step)
                with cgutils.for_range(builder, c2) as pair_loop:
                    q = pair_loop.index
                    x_off = builder.add(tap, builder.shl(q, ir.Constant(_I64, 2)))
                    w_off = builder.add(tap_w, builder.mul(q, step))
                    wv = [
                        builder.load(
                            builder.bitcast(
                                builder.gep(w, [builder.add(w_off, ir.Constant(_I64, 32 * j))]),
                                _W16.as_pointer(),
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
                        undef = ir.Constant(_V8, ir.Undefined)
                        av = builder.shuffle_vector(
                            builder.insert_element(undef, a, ir.Constant(_I32, 0)),
                            undef,
                            ir.Constant(_V8, None),
                        )
                        av = builder.bitcast(av, _W16)  # the pair (x0 - zp, x1 - zp) in every lane
                        for j in range(nr):
                            acc = builder.load(accs[r][j])
                            builder.store(builder.add(acc, builder.call(pmaddwd, [av, wv[j]])), accs[r][j])
            # Output stage on the registers; per-channel parameters: 5 rows of params_stride bytes.
            params = builder.inttoptr(params_ptr, i8p)
            out = builder.inttoptr(out_ptr, i8p)
            for j in range(nr):
                pj = load_parameters(builder, params, params_stride, j, lanes=8)
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
                                        ir.Constant(_I64, 8 * j),
                                    )
                                ],
                            )
                            store_first(builder, y, dst, builder.sub(width, ir.Constant(_I64, 8 * j)))
            return context.get_dummy_value()

        return sig, codegen

    return kernel


_MICRO_KERNELS = tuple(_micro_kernel(nr) for nr in range(1, NR + 1))
_mk1, _mk2 = _MICRO_KERNELS


def pack_filters(w, c2p):
    """w [G, O, T, C] int8 (T taps of C weights) -> [G, K2 * O8 * 2] int16 in the block layout above,
    64-byte aligned (K2 = T * c2p / 2, c2p = C rounded up to even, O8 = O rounded up to 8; padding
    channels and the weight past an odd C hold zero)."""
    groups, o, t, _ = w.shape
    return _pack_filters(w, c2p, aligned.zeros((groups, t * c2p * ((o + 7) // 8 * 8)), np.int16))


@njit()
def _pack_filters(w, c2p, out):
    groups, o, t, c = w.shape
    c2 = c2p // 2
    k2 = t * c2
    o8 = (o + 7) // 8 * 8
    for g in range(groups):
        for oc in range(o):
            block = oc // BLOCK
            width = min(BLOCK, o8 - block * BLOCK)
            base = block * BLOCK * k2 * 2 + (oc - block * BLOCK) * 2
            for tt in range(t):
                for ci in range(c):
                    out[g, base + (tt * c2 + ci // 2) * width * 2 + ci % 2] = w[g, oc, tt, ci]
    return out


@parallel_kernel
def widen_input(x, pad_top, pad_left, zero_point, out):
    """out[n, y, x, c] = x[n, y - pad_top, x - pad_left, c] - zero_point as int16 inside the image
    and its channels, 0 elsewhere, for the rows and columns of out (which may end before or after
    the image; out may have one channel more than x)."""
    n_batch, in_h, in_w, channels = x.shape
    _, hp, wp, cp = out.shape
    zp = np.int16(zero_point)
    inside = max(0, min(in_w, wp - pad_left))  # image columns that land in out
    for row in nb.prange(n_batch * hp):
        n = row // hp
        y = row - n * hp
        iy = y - pad_top
        dst = out[n, y].reshape(-1)
        if iy < 0 or iy >= in_h:
            dst[:] = 0
            continue
        src = x[n, iy].reshape(-1)
        first = pad_left * cp
        dst[:first] = 0
        dst[first + inside * cp :] = 0
        if cp == channels:  # the row's pixels are contiguous on both sides: one flat loop
            for k in range(inside * cp):
                dst[first + k] = np.int16(src[k]) - zp
        else:
            for ix in range(inside):
                for c in range(channels):
                    dst[first + ix * cp + c] = np.int16(src[ix * channels + c]) - zp
                dst[first + ix * cp + channels] = 0
    return out


@parallel_kernel
def conv_avx2(
    xp,
    packed,
    taps,
    c2,
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
    output_parameters) of the exact sum over taps and their c2 channel pairs of xp (int16) at pixel
    p's corner + tap, times filter g's channel c. shared: every group reads all N images of xp; else group g
    reads its slice of N / groups. As vnni.conv_vnni, with pairs of int16 channels for quads of bytes."""
    n_in, hp, wp, cp = xp.shape
    pixel = cp * 2  # bytes per input pixel
    pixels = out_h * out_w
    images = n_in if shared else n_in // groups
    per_group = images * pixels
    n_blocks = (per_group + MR - 1) // MR
    tasks_per_group = (n_blocks + BLOCKS_PER_TASK - 1) // BLOCKS_PER_TASK
    k_bytes = taps.size * c2 * 4  # packed bytes per output channel (c2 pairs of int16 per tap)
    o8 = (out_c + 7) // 8 * 8
    for task in nb.prange(groups * tasks_per_group):
        g = task // tasks_per_group
        first_block = (task - g * tasks_per_group) * BLOCKS_PER_TASK
        first_image = 0 if shared else g * images
        bases = np.empty(MR, dtype=np.int64)
        w_group = packed.ctypes.data + g * packed.shape[1] * 2
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
                nr = min(BLOCK, o8 - cb) // 8
                args = (
                    xp.ctypes.data,
                    bases.ctypes.data,
                    taps.ctypes.data,
                    taps.size,
                    c2,
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
                if nr == 2:
                    _mk2(*args)
                else:
                    _mk1(*args)
    return out


def row_runs(kw: int, dilation_w: int) -> bool:
    """Whether the kernel reads each filter row as one tap: with no dilation along the width, the kw
    taps of a row are kw * C contiguous int16 of the copy, and kw * C contiguous weights of the filter
    (whose reduction index is (ky, kx, c)). Fewer, longer loops where C is small, and no padding
    channel for odd C (an odd run reads one int16 past its end, which meets a zero weight)."""
    return dilation_w == 1 and kw > 1


def widened_input(x, kh, kw, stride, dilation, pad, out_hw, zero_point, workspace=None):
    """The int16 input x - zero_point that the kernel reads, padded with 0 out to the rows and
    columns the taps reach (and, without row runs, to an even channel count), its tap offsets in
    bytes and the channel pairs that each tap reads. workspace: an aligned.Workspace for the copy
    (or None)."""
    (sh, sw), (dh, dw), (pad_top, pad_left), (out_h, out_w) = stride, dilation, pad, out_hw
    n, _, _, c = x.shape
    hp, wp = (out_h - 1) * sh + (kh - 1) * dh + 1, (out_w - 1) * sw + (kw - 1) * dw + 1
    rows = row_runs(kw, dw)
    cp = c if rows else c + c % 2
    size = n * hp * wp * cp
    flat = (workspace or aligned.Workspace()).get((size + 2,), np.int16)  # slack: an odd run's last pair
    flat[size:] = 0
    xp = widen_input(
        np.ascontiguousarray(x), pad_top, pad_left, np.int64(zero_point), flat[:size].reshape(n, hp, wp, cp)
    )
    if rows:
        taps, pairs = [ky * dh * wp * cp * 2 for ky in range(kh)], (kw * cp + 1) // 2
    else:
        taps, pairs = [(ky * dh * wp + kx * dw) * cp * 2 for ky in range(kh) for kx in range(kw)], cp // 2
    return xp, np.array(taps, dtype=np.int64), pairs


def prepared_filters(w, bias, stage, rows: bool, memo=None):
    """(packed filters, output parameters) of weights w [G, O, kh, kw, C], as taps of C or, with
    rows (row_runs), as filter rows of kw * C weights; the accumulator offset is the bias (the
    activations carry their zero point); from memo (a base.WeightMemo, or None) while w and bias
    are unchanged."""
    groups, o, kh, kw, c = w.shape

    def prepare():
        taps = (
            np.ascontiguousarray(w).reshape(groups, o, kh, kw * c)
            if rows
            else w.reshape(groups, o, kh * kw, c)
        )
        run = taps.shape[3]
        return (
            pack_filters(np.ascontiguousarray(taps), run + run % 2),
            output_parameters(accumulator_offset(w, bias, 0), stage, 8),
        )

    return memo.get("avx2 rows" if rows else "avx2", w, bias, prepare) if memo is not None else prepare()


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
    """Exact int8 convolution with its output stage: as vnni.convolve (same arrays and result,
    int8 [G * P, O]), on AVX2."""
    groups, o, kh, kw, c = w.shape
    (sh, sw), (out_h, out_w) = stride, out_hw
    xp, taps, pairs = widened_input(x, kh, kw, stride, dilation, pad, out_hw, input_zero_point, workspace)
    packed, params = prepared_filters(w, bias, stage, row_runs(kw, dilation[1]), memo)
    out = aligned.empty((x.shape[0] * out_h * out_w * (groups if shared else 1), o), np.int8)
    return conv_avx2(
        xp,
        packed,
        taps,
        pairs,
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
