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
  nr = block width / 16), so one 64-byte load holds 4 reduction steps of 16 channels. Without
  dilation along the width, a filter row is one tap of kw * C bytes (geometry.row_runs): K4 = kh * the
  quads of kw * C.

The micro-kernel (LLVM IR, microkernel.py, from the description ISA below) computes MR (12) output
pixels x nr*16 channels over the whole reduction, in register tiles of 12 pixels (nr 1 and 2) or
6 (nr 3 and 4): at most 24 of the 32 ZMM registers hold sums.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from . import aligned
from .gemm import accumulator_offset
from .geometry import row_runs
from .microkernel import Isa, conv_kernel, pack_filters, run_conv, vpdpbusd
from .output_stage import output_parameters, splat, store_bytes
from .padding import pad_input

UNSIGNED_DEPTH = 64  # channels of a one-tap reduction from which the kernel reads an unsigned copy
MAX_DEPTH = 65536  # reduction length with exact int32 sums: 65536 * 255 * 128 < 2^31

_I32 = ir.IntType(32)
_V16 = ir.VectorType(_I32, 16)


def _unsigned_quad(builder, quad):
    """The 4 int8 x of quad (i32) as 4 uint8 x + 128, in every lane."""
    return splat(builder, builder.xor(quad, ir.Constant(_I32, 0x80808080)), _V16)


def _quad(builder, quad):
    """The quad (i32) of 4 uint8 in every lane: a copy that padded_input made unsigned."""
    return splat(builder, quad, _V16)


# Blocks of 64 output channels (4 ZMM registers of 16 int32) per micro-kernel call.
ISA = Isa(
    "vnni",
    lanes=16,
    max_nr=4,
    operand=_V16,
    broadcast=_unsigned_quad,
    broadcast_unsigned=_quad,
    multiply_add=vpdpbusd,
    store=store_bytes,
    dtype=np.int8,
    pair_rows=True,
)
conv_vnni = conv_kernel(ISA)  # (xp, unsigned, packed, taps, c4, out_h, out_w, ...): see microkernel._conv


def padded_input(x, kh, kw, stride, dilation, pad, out_hw, zero_point, workspace=None, unsigned=False):
    """The input a direct convolution reads, its tap offsets in bytes, and whether it holds the
    unsigned bytes u = x + 128.

    x itself when every tap falls inside the image and C is a multiple of 4 (with `unsigned`: and
    the filter has one tap); else a copy [N, Hp, Wp, C] padded with the zero point out to the
    rows and columns the taps reach, of u where `unsigned` (the VNNI kernel then broadcasts a
    quad straight from memory, instead of flipping its sign bits on the way: two instructions per
    VPDPBUSD, a fifth of a small layer's time). With C not a multiple of 4 the kernels read a
    pixel's channels in 4-byte quads (or AMX chunks) whose last one takes up to 3 bytes of the
    next pixel, which meet zero weights; 4 bytes of slack keep the last pixel's read inside the
    buffer. workspace: an aligned.Workspace for the copy (or None).
    """
    (sh, sw), (dh, dw), (pad_top, pad_left), (out_h, out_w) = stride, dilation, pad, out_hw
    n, h, w, c = x.shape
    hp, wp = (out_h - 1) * sh + (kh - 1) * dh + 1, (out_w - 1) * sw + (kw - 1) * dw + 1
    inside = (pad_top, pad_left) == (0, 0) and c % 4 == 0 and hp <= h and wp <= w
    # Every tap inside the image: read the input itself, except that an unsigned copy pays for
    # itself once each input byte meets several taps (3x3 layers of 16 to 32 channels after a
    # PAD ran 1.1x to 1.7x as fast, copy included; 1x1 layers 1.2x to 1.5x slower), or, on one
    # tap, a reduction of UNSIGNED_DEPTH channels or more: there the kernel is bound by its
    # broadcasts, and one from memory (the copy) instead of a flip in a general register halves
    # their cost (MobileNetV2's 1x1 layers of 96 to 192 channels, kernel alone: 1.5x to 1.8x).
    if inside and not (unsigned and (kh * kw > 1 or c >= UNSIGNED_DEPTH)):
        xp, unsigned = np.ascontiguousarray(x), False
    else:
        size = n * hp * wp * c
        flat = (workspace or aligned.Workspace()).get((size + 4,), np.int8)
        flip = np.int8(-128 if unsigned else 0)
        xp = pad_input(
            np.ascontiguousarray(x),
            pad_top,
            pad_left,
            np.int8(zero_point) ^ flip,
            flip,
            flat[:size].reshape(n, hp, wp, c),
        )
    wp = xp.shape[2]
    taps = np.array([(ky * dh * wp + kx * dw) * c for ky in range(kh) for kx in range(kw)], dtype=np.int64)
    return xp, taps, unsigned


def reduction(taps, kw: int, c: int, rows: bool):
    """(tap offsets, quads per tap) of the kernel: padded_input's taps, or their filter rows
    (geometry.row_runs)."""
    if rows:
        return np.ascontiguousarray(taps[::kw]), (kw * c + 3) // 4
    return taps, (c + 3) // 4


def prepared_filters(tag, w, bias, offset_zero_point, stage, memo=None, rows=False):
    """(packed filters, output parameters) of weights w [G, O, kh, kw, C], as taps of C or, with
    rows (row_runs), as filter rows of kw * C weights; the accumulator offset taken at
    offset_zero_point; from memo (a base.WeightMemo, or None) while w and bias are unchanged."""
    groups, o, kh, kw, c = w.shape

    def prepare():
        taps = w.reshape(groups, o, kh, kw * c) if rows else w.reshape(groups, o, kh * kw, c)
        return (
            pack_filters(np.ascontiguousarray(taps), (taps.shape[3] + 3) // 4 * 4, ISA),
            output_parameters(accumulator_offset(w, bias, offset_zero_point), stage),
        )

    key = f"{tag} rows" if rows else tag
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
    """Exact int8 convolution with its output stage.

    x [N, H, W, C] int8; w [G, O, kh, kw, C] int8 (G weight groups, see conv.py); bias [G or 1, O]
    or None; stride, dilation and pad (top, left) as (h, w) pairs; out_hw the output (height,
    width); stage an OutputStage; workspace an aligned.Workspace for the padded copy and memo a
    base.WeightMemo for the prepared weights (each or None).
    Returns int8 [G * P, O], P output pixels per group:
    P = N * out_h * out_w when shared (every group sees the whole batch), else N / G of that.
    """
    kh, kw, c = w.shape[2:]
    xp, taps, unsigned = padded_input(
        x, kh, kw, stride, dilation, pad, out_hw, input_zero_point, workspace, unsigned=True
    )
    rows = row_runs(kw, dilation[1])
    taps, quads = reduction(taps, kw, c, rows)
    packed, params = prepared_filters("vnni", w, bias, input_zero_point + 128, stage, memo, rows)
    return run_conv(
        conv_vnni, x, w, xp, taps, quads, packed, params, stride, out_hw, shared, stage, profile, unsigned
    )
