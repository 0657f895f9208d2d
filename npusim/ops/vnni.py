"""Exact int8 convolutions and matrix products on AVX-512 VNNI, with the fused output stage.

VPDPBUSD multiplies 4 unsigned bytes by 4 signed bytes and adds the 4 products to an int32 lane,
without saturation. Activations are made unsigned by adding 128 (u = x + 128), so

    sum (x - zp) * w = sum u * w - (zp + 128) * sum w,

and the second term, one number per channel, folds into the bias (gemm.accumulator_offset with
zp + 128). Padding taps hold u = zp + 128 and so contribute exactly zero, as TFLM skips them.
Every int32 sum is exact while the depth K stays at most MAX_DEPTH (K * 255 * 128 < 2^31).

Layouts:
- activations: a padded unsigned copy [N, Hp, Wp, Cp], Cp = C rounded up to 4; the extra
  channels meet zero weights. A convolution then reads its taps straight from this copy: the
  reduction index is (tap, channel), and a tap is a fixed offset from the output pixel's corner
  (no im2col).
- filters: per block of up to 64 output channels, [K4, nr, 16, 4] bytes (K4 = taps * Cp / 4,
  nr = block width / 16), so one 64-byte load holds 4 reduction steps of 16 channels.

The micro-kernel (LLVM IR, built below) computes MR output pixels x nr*16 channels over the whole
reduction in MR * nr ZMM accumulators (24 of the 32 registers at nr = 4).
"""
from __future__ import annotations

import os

import llvmlite.binding
import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit import parallel_kernel
from ..quant import SINGLE, TFLM, XNNPACK
from .gemm import accumulator_offset

MR = 6  # output pixels per micro-kernel call
BLOCK = 64  # output channels per micro-kernel call (4 ZMM registers of 16 int32)
MAX_DEPTH = 65536  # reduction length with exact int32 sums: 65536 * 255 * 128 < 2^31
BLOCKS_PER_TASK = 16  # pixel blocks per parallel task (one scratch allocation each)

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_V16 = ir.VectorType(_I32, 16)


def _host_has_vnni() -> bool:
    """VPDPBUSD needs AVX-512 VNNI; Numba must compile for this host (a NUMBA_CPU_NAME such as
    'generic', set for portable caches, would leave the instruction unselectable)."""
    if nb.config.CPU_NAME or nb.config.CPU_FEATURES:
        return False
    features = llvmlite.binding.get_host_cpu_features()
    return all(features.get(f, False) for f in ("avx512f", "avx512bw", "avx512vnni"))


SUPPORTED = _host_has_vnni()
# NPUSIM_VNNI=0 selects the float32 BLAS path everywhere. Read at call time, so that tests can run
# both kernel paths on one machine.
ENABLED = SUPPORTED and os.environ.get("NPUSIM_VNNI", "1") != "0"


def usable(depth: int) -> bool:
    """Whether a reduction of `depth` int8 products runs on VNNI here."""
    return ENABLED and depth <= MAX_DEPTH


def _splat(builder, value, vector_type):
    undef = ir.Constant(vector_type, ir.Undefined)
    lane0 = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(lane0, undef, ir.Constant(ir.VectorType(_I32, vector_type.count), None))


def _vector_output_stage(builder, acc, params, profile, zero_point, lo, hi):
    """16 int32 accumulators -> 16 int8 outputs: the vector form of quant.requantize_to_output for
    one profile (the same integer steps; tests hold both to TFLM and to each other).

    params: offset, multiplier, left shift, right shift (int32) and the xnnpack scale (float32),
    16 channels each.
    """
    offset, m, left, right, scale = params
    i64v, f32v = ir.VectorType(_I64, 16), ir.VectorType(ir.FloatType(), 16)
    x = builder.add(acc, offset)  # the int32 accumulator of the runtimes (wraps as theirs)
    # The clamp range of the requantized value before the zero point is added.
    y_lo = _splat(builder, builder.trunc(builder.sub(lo, zero_point), _I32), acc.type)
    y_hi = _splat(builder, builder.trunc(builder.sub(hi, zero_point), _I32), acc.type)

    def c64(v):
        return ir.Constant(i64v, v)

    if profile == TFLM:
        # SaturatingRoundingDoublingHighMul((x << left) as int32, M), then RoundingDivideByPOT(right).
        # 0 <= M < 2^31, so the saturating case (both operands INT32_MIN) cannot occur.
        ab = builder.mul(builder.sext(builder.shl(x, left), i64v), builder.sext(m, i64v))
        nudge = builder.select(builder.icmp_signed(">=", ab, c64(0)), c64(1 << 30), c64(1 - (1 << 30)))
        num = builder.add(ab, nudge)
        # C++ division by 2^31 truncates toward zero: bias negative numerators before the shift.
        high = builder.trunc(builder.ashr(builder.add(num, builder.and_(builder.ashr(num, c64(63)), c64(2**31 - 1))), c64(31)), acc.type)
        one, zero = ir.Constant(acc.type, 1), ir.Constant(acc.type, 0)
        mask = builder.sub(builder.shl(one, right), one)
        threshold = builder.add(builder.ashr(mask, one), builder.zext(builder.icmp_signed("<", high, zero), acc.type))
        rounded_up = builder.zext(builder.icmp_signed(">", builder.and_(high, mask), threshold), acc.type)
        y = builder.add(builder.ashr(high, right), rounded_up)
    elif profile == SINGLE:
        # (x * M + 2^(total - 1)) >> total, total = 31 - shift = 31 - left + right.
        total = builder.sext(builder.add(builder.sub(ir.Constant(acc.type, 31), left), right), i64v)
        half = builder.shl(c64(1), builder.sub(total, c64(1)))
        y = builder.ashr(builder.add(builder.mul(builder.sext(x, i64v), builder.sext(m, i64v)), half), total)
        y = builder.select(builder.icmp_signed("<", y, builder.sext(y_lo, i64v)), builder.sext(y_lo, i64v), y)
        y = builder.trunc(builder.select(builder.icmp_signed(">", y, builder.sext(y_hi, i64v)), builder.sext(y_hi, i64v), y), acc.type)
    else:
        # XNNPACK: round half to even of float32(x) * scale (float32), in the default rounding mode.
        rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32v, [f32v]), "llvm.rint.v16f32")
        product = builder.call(rint, [builder.fmul(builder.sitofp(x, f32v), scale)])
        f_lo, f_hi = builder.sitofp(y_lo, f32v), builder.sitofp(y_hi, f32v)
        product = builder.select(builder.fcmp_ordered("<", product, f_lo), f_lo, product)
        product = builder.select(builder.fcmp_ordered(">", product, f_hi), f_hi, product)
        y = builder.fptosi(product, acc.type)  # integer valued and in range: exact
    # Clamp before adding the zero point (the sum cannot overflow int32 then); bounds are small.
    y = builder.select(builder.icmp_signed("<", y, y_lo), y_lo, y)
    y = builder.select(builder.icmp_signed(">", y, y_hi), y_hi, y)
    y = builder.add(y, _splat(builder, builder.trunc(zero_point, _I32), acc.type))
    return builder.trunc(y, ir.VectorType(ir.IntType(8), 16))


def _micro_kernel(nr: int):
    """out[r, 16j + l] for r < rows and 16j + l < width: the output stage of
    sum over taps t and channel quads q of u8x4(x[base[r] + tap[t] + 4q]) . packed[(t * c4 + q) * nr + j],
    for MR pixels and nr vectors of 16 channels."""

    @intrinsic
    def kernel(typingctx, x_ptr, bases_ptr, taps_ptr, n_taps, c4, w_ptr, out_ptr, out_stride, rows, width,
               params_ptr, params_stride, profile, zero_point, lo, hi):
        sig = types.void(*([types.int64] * 16))

        def codegen(context, builder, signature, args):
            (x_ptr, bases_ptr, taps_ptr, n_taps, c4, w_ptr, out_ptr, out_stride, rows, width,
             params_ptr, params_stride, profile, zero_point, lo, hi) = args
            dpbusd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, _V16, _V16]),
                                                    "llvm.x86.avx512.vpdpbusd.512")
            i8p = ir.IntType(8).as_pointer()
            x = builder.inttoptr(x_ptr, i8p)
            w = builder.inttoptr(w_ptr, i8p)
            bases = builder.inttoptr(bases_ptr, _I64.as_pointer())
            taps = builder.inttoptr(taps_ptr, _I64.as_pointer())
            row_base = [builder.load(builder.gep(bases, [ir.Constant(_I64, r)])) for r in range(MR)]
            # Allocas in the entry block: LLVM promotes them to registers (phis) across the loops.
            accs = [[cgutils.alloca_once_value(builder, ir.Constant(_V16, None)) for _ in range(nr)] for _ in range(MR)]
            step = ir.Constant(_I64, nr * 64)  # bytes of packed filter per channel quad
            with cgutils.for_range(builder, n_taps) as tap_loop:
                tap = builder.load(builder.gep(taps, [tap_loop.index]))
                tap_w = builder.mul(builder.mul(tap_loop.index, c4), step)
                with cgutils.for_range(builder, c4) as quad_loop:
                    q = quad_loop.index
                    x_off = builder.add(tap, builder.shl(q, ir.Constant(_I64, 2)))
                    w_off = builder.add(tap_w, builder.mul(q, step))
                    wv = [builder.load(builder.bitcast(builder.gep(w, [builder.add(w_off, ir.Constant(_I64, 64 * j))]),
                                                       _V16.as_pointer()), align=1) for j in range(nr)]
                    for r in range(MR):
                        a = builder.load(builder.bitcast(builder.gep(x, [builder.add(row_base[r], x_off)]), _I32.as_pointer()), align=1)
                        av = _splat(builder, a, _V16)
                        for j in range(nr):
                            builder.store(builder.call(dpbusd, [builder.load(accs[r][j]), av, wv[j]]), accs[r][j])
            # Output stage on the registers; per-channel parameters: 5 rows of params_stride bytes.
            pp = builder.inttoptr(params_ptr, i8p)
            v16i8 = ir.VectorType(ir.IntType(8), 16)
            masked_store = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [v16i8, v16i8.as_pointer(), _I32, ir.VectorType(ir.IntType(1), 16)]),
                "llvm.masked.store.v16i8.p0")
            lanes = ir.Constant(_V16, list(range(16)))
            f32v = ir.VectorType(ir.FloatType(), 16)
            out = builder.inttoptr(out_ptr, i8p)
            def param(k, j, ty):  # row k of the parameters, channels 16j .. 16j + 15 of the block
                p = builder.gep(pp, [builder.add(builder.mul(params_stride, ir.Constant(_I64, k)), ir.Constant(_I64, 64 * j))])
                return builder.load(builder.bitcast(p, ty.as_pointer()), align=1)

            for j in range(nr):
                params = [param(k, j, _V16) for k in range(4)] + [param(4, j, f32v)]
                valid = builder.icmp_signed("<", lanes, _splat(builder, builder.trunc(builder.sub(width, ir.Constant(_I64, 16 * j)), _I32), _V16))
                for pid in (TFLM, SINGLE, XNNPACK):
                    with builder.if_then(builder.icmp_signed("==", profile, ir.Constant(_I64, pid))):
                        for r in range(MR):
                            with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), rows)):
                                y = _vector_output_stage(builder, builder.load(accs[r][j]), params, pid, zero_point, lo, hi)
                                dst = builder.gep(out, [builder.add(builder.mul(out_stride, ir.Constant(_I64, r)), ir.Constant(_I64, 16 * j))])
                                builder.call(masked_store, [y, builder.bitcast(dst, v16i8.as_pointer()), ir.Constant(_I32, 1), valid])
            return context.get_dummy_value()

        return sig, codegen

    return kernel


_mk1, _mk2, _mk3, _mk4 = (_micro_kernel(nr) for nr in (1, 2, 3, 4))


@nb.njit(cache=True)
def pack_filters(w, cp):
    """w [G, O, T, C] int8 (T taps) -> [G, K4 * O16 * 4] int8 in the block layout above
    (O16 = O rounded up to 16; the padding channels and quads hold zero weights)."""
    groups, o, t, c = w.shape
    c4 = cp // 4
    k4 = t * c4
    o16 = (o + 15) // 16 * 16
    out = np.zeros((groups, k4 * o16 * 4), dtype=np.int8)
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
def pad_unsigned(x, pad_top, pad_left, fill, out):
    """out[n, y, x, c] = x[n, y - pad_top, x - pad_left, c] + 128 inside the image, fill outside,
    for the rows and columns of out (which may end before or after the image); channels past C: 0."""
    n_batch, in_h, in_w, channels = x.shape
    _, hp, wp, cp = out.shape
    for row in nb.prange(n_batch * hp):
        n = row // hp
        y = row - n * hp
        iy = y - pad_top
        for xx in range(wp):
            ix = xx - pad_left
            o = out[n, y, xx]
            if 0 <= iy < in_h and 0 <= ix < in_w:
                src = x[n, iy, ix]
                for c in range(channels):
                    o[c] = np.uint8(np.int32(src[c]) + 128)
                for c in range(channels, cp):
                    o[c] = 0
            else:
                for c in range(cp):
                    o[c] = fill
    return out


@parallel_kernel
def conv_vnni(xp, packed, taps, c4, out_h, out_w, stride_h, stride_w, groups, shared, out_c, params, profile,
              zero_point, lo, hi, out):
    """out[g * P + p, c] for P output pixels per group: the output stage (params[g], see
    output_parameters) of the exact sum over taps and channels of xp at pixel p's corner + tap, times
    filter g's channel c. shared: every group reads all N images of xp; else group g reads its
    slice of N / groups."""
    n_in, hp, wp, cp = xp.shape
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
        for blk in range(first_block, min(first_block + BLOCKS_PER_TASK, n_blocks)):
            for r in range(MR):
                p = min(blk * MR + r, per_group - 1)  # the last block repeats its last pixel
                i = p // pixels
                rem = p - i * pixels
                oy = rem // out_w
                ox = rem - oy * out_w
                bases[r] = (((first_image + i) * hp + oy * stride_h) * wp + ox * stride_w) * cp
            rows = min(MR, per_group - blk * MR)
            out_row = out.ctypes.data + (g * per_group + blk * MR) * out_c
            for cb in range(0, out_c, BLOCK):
                nr = min(BLOCK, o16 - cb) // 16
                args = (xp.ctypes.data, bases.ctypes.data, taps.ctypes.data, taps.size, c4, w_group + cb * k_bytes,
                        out_row + cb, out_c, rows, out_c - cb, p_group + cb * 4, o16 * 4, profile, zero_point, lo, hi)
                if nr == 4:
                    _mk4(*args)
                elif nr == 3:
                    _mk3(*args)
                elif nr == 2:
                    _mk2(*args)
                else:
                    _mk1(*args)
    return out


def output_parameters(weights, bias, input_zero_point, stage) -> np.ndarray:
    """[G, 5, O16] int32 per group and channel: the accumulator offset of the unsigned activations
    (bias - (zp + 128) * sum w, wrapped to int32 as the runtimes' accumulators), M, left and right
    shift, and the bits of the float32 xnnpack scale. Channels past O are zero (never stored)."""
    offset = accumulator_offset(weights, bias, input_zero_point + 128)
    groups, o = offset.shape
    params = np.zeros((groups, 5, (o + 15) // 16 * 16), dtype=np.int32)
    params[:, 0, :o] = offset.astype(np.int32)  # two's complement wrap
    params[:, 1, :o] = stage.multiplier
    params[:, 2, :o] = np.maximum(stage.shift, 0)
    params[:, 3, :o] = np.maximum(-stage.shift, 0)
    params[:, 4, :o] = stage.real_scale.astype(np.float32).view(np.int32)
    return params


def convolve(x, w, bias, input_zero_point, stride, dilation, pad, out_hw, stage, profile, shared=False):
    """Exact int8 convolution with its output stage.

    x [N, H, W, C] int8; w [G, O, kh, kw, C] int8 (G weight groups, see conv.py); bias [G or 1, O]
    or None; stride, dilation and pad (top, left) as (h, w) pairs; out_hw the output (height,
    width); stage an OutputStage. Returns int8 [G * P, O], P output pixels per group:
    P = N * out_h * out_w when shared (every group sees the whole batch), else N / G of that.
    """
    groups, o, kh, kw, c = w.shape
    (sh, sw), (dh, dw), (pad_top, pad_left), (out_h, out_w) = stride, dilation, pad, out_hw
    cp = (c + 3) // 4 * 4
    hp, wp = (out_h - 1) * sh + (kh - 1) * dh + 1, (out_w - 1) * sw + (kw - 1) * dw + 1
    xp = pad_unsigned(np.ascontiguousarray(x), pad_top, pad_left, np.uint8(input_zero_point + 128),
                      np.empty((x.shape[0], hp, wp, cp), dtype=np.uint8))
    taps = np.array([(ky * dh * wp + kx * dw) * cp for ky in range(kh) for kx in range(kw)], dtype=np.int64)
    packed = pack_filters(np.ascontiguousarray(w).reshape(groups, o, kh * kw, c), cp)
    params = output_parameters(w, bias, input_zero_point, stage)
    rows = x.shape[0] * out_h * out_w * (groups if shared else 1)
    out = np.empty((rows, o), dtype=np.int8)
    return conv_vnni(xp, packed, taps, cp // 4, out_h, out_w, sh, sw, groups, shared, o, params, np.int64(profile),
                     np.int64(stage.zero_point), np.int64(stage.lo), np.int64(stage.hi), out)


def matmul(x, w, bias, input_zero_point, stage, profile, shared=False):
    """Exact int8 rows x [R, K] times weights w [G, O, K] with the output stage: int8 [G * R or R, O]."""
    r, k = x.shape
    return convolve(x.reshape(r, 1, 1, k), w.reshape(w.shape[0], w.shape[1], 1, 1, k), bias, input_zero_point,
                    (1, 1), (1, 1), (0, 0), (1, 1), stage, profile, shared)
