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
  Pointwise layers (1x1, no padding, even C, up to INT8_MAX_OUT output channels) make no copy:
  conv_avx2_int8 widens each pair of int8 as it broadcasts it, and the offset takes -zp * sum w.
- filters: per block of up to 16 output channels, [K2, nr, 8, 2] int16 (K2: the pairs of the
  whole reduction, nr = block width / 8): one 32-byte load holds 2 reduction steps of 8 channels.

Every int32 sum is exact while the depth K stays at most MAX_DEPTH (|x - zp| <= 255, |w| <= 128,
K * 255 * 128 < 2^31). The micro-kernel (LLVM IR, microkernel.py, from the description ISA
below) computes MR output pixels x nr * 8 channels over the whole reduction, in register tiles of
12 pixels (nr = 1) or 6 (nr = 2): 12 of the 16 YMM registers hold sums, one or two the filter
and one the broadcast activation pair. Only AVX2 instructions:
an AVX-512 host runs the same code (tests/test_avx2_cpu.py compiles it for Haswell).
"""

from __future__ import annotations

import dataclasses

import numba as nb
import numpy as np
from llvmlite import ir

from . import aligned
from .gemm import accumulator_offset
from .geometry import row_runs
from .jit import parallel_kernel
from .microkernel import Isa, conv_kernel, pack_filters, packs_to_bytes, pmaddwd_add, run_conv
from .output_stage import output_parameters, splat, store_first

NR = 2  # YMM accumulators (8 int32 channels each) per pixel
# Output channels up to which a pointwise layer reads its int8 input (reads_int8): one block of 16.
# From two blocks on the widened copy was faster, measured layer by layer and on whole models (median,
# in one process, the two limits in turn): with 512, ReID MobileNetV2 at batch 8 32.3 ms, YOLOv8n-256
# at 8 63.8, MobileNetV2 at 64 34.3; with 16, 28.3, 59.9 and 32.4; ResNet-8 unchanged.
INT8_MAX_OUT = 16
MAX_DEPTH = 65536  # reduction length with exact int32 sums: 65536 * 255 * 128 < 2^31

_V8 = ir.VectorType(ir.IntType(32), 8)
_W16 = ir.VectorType(ir.IntType(16), 16)


def _int16_pair(builder, pair):
    """The pair (x0 - zp, x1 - zp) of int16 (i32) in every lane."""
    return builder.bitcast(splat(builder, pair, _V8), _W16)


# Blocks of 16 output channels (NR YMM registers of 8 int32) per micro-kernel call.
ISA = Isa(
    "avx2",
    lanes=8,
    max_nr=NR,
    operand=_W16,
    broadcast=_int16_pair,
    multiply_add=pmaddwd_add,
    store=store_first,
    dtype=np.int16,
    pack=packs_to_bytes,
)
conv_avx2 = conv_kernel(ISA)  # (xp, unsigned, packed, taps, c2, out_h, out_w, ...): see microkernel._conv


def _int8_pair(builder, pair):
    """The pair of int8 activations (an i16) sign-extended to a pair of int16, in every lane: the
    pair in all 8 words of 128 bits (VPBROADCASTW), whose 16 bytes widened to 16 words
    (VPMOVSXBW) are the pair 8 times. (Widening the pair first, then broadcasting, became a move
    to a general register and back, and three shuffles.)"""
    i16x8 = ir.VectorType(ir.IntType(16), 8)
    lane0 = builder.insert_element(ir.Constant(i16x8, ir.Undefined), pair, ir.Constant(ir.IntType(32), 0))
    pairs = builder.shuffle_vector(
        lane0, ir.Constant(i16x8, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), 8), None)
    )
    return builder.sext(builder.bitcast(pairs, ir.VectorType(ir.IntType(8), 16)), _W16)


# The same kernel on the int8 input itself, a pair of channels per group: for pointwise layers
# (no padding, 1x1, an even channel count), which then need no widened copy of their input (its
# writes and reads cost a large share of a small 1x1 layer's time). The activations are then x,
# not x - zp: the offset takes -zp * sum w (exact: |x| <= 128).
ISA_INT8 = dataclasses.replace(ISA, name="avx2_int8", broadcast=_int8_pair, group_bytes=2)
conv_avx2_int8 = conv_kernel(ISA_INT8)


def reads_int8(kh: int, kw: int, pad, channels: int, out_channels: int) -> bool:
    """Whether convolve runs conv_avx2_int8 on the input itself: 1x1 taps, no padding (any
    stride), whole pairs of channels (a pair never reads past its pixel), and at most
    INT8_MAX_OUT output channels: the copy it saves costs once per input value, its broadcast
    (two shuffles instead of none) once per input pair per block of 16 output channels, and
    from two blocks on the widened copy was faster."""
    return (kh, kw) == (1, 1) and tuple(pad) == (0, 0) and channels % 2 == 0 and out_channels <= INT8_MAX_OUT


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
        # Indexed from 0 in a view of its own: an index first + k, which Numba must check for
        # wrapping below 0, kept LLVM from vectorizing the loop (2.5x slower: 5.0 against 2.0 ms
        # on MobileNetV2's first layer at batch 256).
        body = dst[first : first + inside * cp]
        if cp == channels:  # the row's pixels are contiguous on both sides: one flat loop
            for k in range(inside * cp):
                body[k] = src[k] - zp
        else:
            for ix in range(inside):
                for c in range(channels):
                    body[ix * cp + c] = src[ix * channels + c] - zp
                body[ix * cp + channels] = 0
    return out


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


def prepared_filters(w, bias, stage, rows: bool, memo=None, zero_point=None):
    """(packed filters, output parameters) of weights w [G, O, kh, kw, C], as taps of C or, with
    rows (row_runs), as filter rows of kw * C weights; the accumulator offset is the bias (the
    activations carry their zero point), or with zero_point (conv_avx2_int8, on x itself)
    bias - zero_point * sum w; from memo (a base.WeightMemo, or None) while w and bias are
    unchanged."""
    groups, o, kh, kw, c = w.shape

    def prepare():
        taps = (
            np.ascontiguousarray(w).reshape(groups, o, kh, kw * c)
            if rows
            else w.reshape(groups, o, kh * kw, c)
        )
        run = taps.shape[3]
        return (
            pack_filters(np.ascontiguousarray(taps), run + run % 2, ISA),
            output_parameters(accumulator_offset(w, bias, zero_point or 0), stage, 8),
        )

    key = "avx2 rows" if rows else "avx2" if zero_point is None else f"avx2 int8 {zero_point}"
    return memo.get(key, w, bias, prepare) if memo is not None else prepare()


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
    kh, kw = w.shape[2:4]
    if reads_int8(kh, kw, pad, x.shape[3], w.shape[1]):
        # The input itself, one tap at offset 0, C / 2 pairs per pixel.
        kernel = conv_avx2_int8
        xp, taps, pairs = np.ascontiguousarray(x), np.zeros(1, np.int64), x.shape[3] // 2
        packed, params = prepared_filters(w, bias, stage, False, memo, int(input_zero_point))
    else:
        kernel = conv_avx2
        xp, taps, pairs = widened_input(x, kh, kw, stride, dilation, pad, out_hw, input_zero_point, workspace)
        packed, params = prepared_filters(w, bias, stage, row_runs(kw, dilation[1]), memo)
    return run_conv(kernel, x, w, xp, taps, pairs, packed, params, stride, out_hw, shared, stage, profile)
