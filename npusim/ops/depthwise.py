"""DEPTHWISE_CONV_2D: per-channel int8 depthwise convolution with depth multiplier
(TFLM reference_integer_ops/depthwise_conv.h). Output channel c_out = c_in * multiplier + m,
weights [1, kh, kw, C * multiplier] (or [G, 1, kh, kw, C * multiplier] for grouped weights, see conv.py).
A direct integer loop: there is no reduction long enough for a GEMM to pay. With multiplier 1,
every pixel runs 16 or 32 channels at a time as vector code with the accumulators in registers
(tap_pairs_run16/32 below): the runs of pixels whose taps all fall inside the image, and each
border pixel alone, its padding taps reading a pixel of the zero point. Other multipliers take a
scalar loop.

The vector code takes the taps two at a time: the int16 activations of taps t and t+1 are
interleaved channel by channel, so that one VPDPWSSD (AVX-512 VNNI) adds x_t * w_t + x_t+1 * w_t+1
to each channel's int32 accumulator (elsewhere generic vector code does the same). As on the
conv paths, sum (x - zp) * w = sum x * w - zp * sum w: the second term folds into the bias, which
holds on the border too, where a padding tap reads x = zp: (zp - zp) * w = 0, as TFLM skips it.

The interleave follows x86's in-lane unpacks: of each 8 channels, the low 4 go to the "lo"
accumulator, the high 4 to "hi". Weights and output parameters are stored in that order (pair_order),
and the output bytes are put back in channel order before they are stored.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..jit import parallel_kernel
from . import aligned, vnni
from .base import Kernel, WeightMemo
from .output_stage import (
    each_profile,
    lane_mask,
    load_parameters,
    output_parameters,
    output_stage_row,
    store_bytes,
    vector_output_stage,
)
from .padding import compute_padding
from .requant import OutputStage

LANES = 32  # channels per vector block; a block of 16 or fewer channels runs on half vectors


def pair_order(lanes: int) -> np.ndarray:
    """The channel (within a block of `lanes`) at each accumulator position: positions
    [0, lanes/2) are the lo accumulator, the rest hi; lo lane i holds channel 8 (i // 4) + i % 4."""
    k = np.arange(lanes)
    i = k % (lanes // 2)
    return 8 * (i // 4) + i % 4 + 4 * (k // (lanes // 2))


def _tap_pairs_run(lanes: int):
    half = lanes // 2
    i8, i16, i32, i64 = (ir.IntType(b) for b in (8, 16, 32, 64))
    bytes_t, shorts_t, acc_t = ir.VectorType(i8, lanes), ir.VectorType(i16, lanes), ir.VectorType(i32, half)
    mask_t = ir.VectorType(ir.IntType(1), lanes)
    order = pair_order(lanes)
    # interleave[h]: (x_t[c], x_t+1[c]) for the channels c of accumulator h, from shuffle operands (x_t, x_t+1).
    interleave = [[int(v) for c in order[h * half:(h + 1) * half] for v in (c, lanes + c)] for h in range(2)]
    to_channels = [int(np.argsort(order)[c]) for c in range(lanes)]  # output bytes back in channel order

    @intrinsic
    def run(typingctx, x_ptr, x_step, taps_ptr, n_pairs, w_ptr, n_pixels, out_ptr, out_step, count,
            params_ptr, params_stride, profile, zero_point, lo, hi):
        sig = types.void(*([types.int64] * 15))

        def codegen(context, builder, signature, args):
            (x_ptr, x_step, taps_ptr, n_pairs, w_ptr, n_pixels, out_ptr, out_step, count,
             params_ptr, params_stride, profile, zero_point, lo, hi) = args
            x, w, out, params = (builder.inttoptr(v, i8.as_pointer()) for v in (x_ptr, w_ptr, out_ptr, params_ptr))
            taps = builder.inttoptr(taps_ptr, i64.as_pointer())
            masked_load = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(bytes_t, [bytes_t.as_pointer(), i32, mask_t, bytes_t]), f"llvm.masked.load.v{lanes}i8.p0")
            if vnni.SUPPORTED:
                dpwssd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(acc_t, [acc_t] * 3),
                                                        f"llvm.x86.avx512.vpdpwssd.{32 * half}")

                def multiply_add(acc, xs, ws):
                    return builder.call(dpwssd, [acc, builder.bitcast(xs, acc_t), builder.bitcast(ws, acc_t)])
            else:
                def multiply_add(acc, xs, ws):  # the same sums in generic vector code
                    wide = ir.VectorType(i32, lanes)
                    products = builder.mul(builder.sext(xs, wide), builder.sext(ws, wide))
                    for parity in (0, 1):
                        acc = builder.add(acc, builder.shuffle_vector(products, ir.Constant(wide, ir.Undefined),
                                                                      ir.Constant(acc_t, list(range(parity, lanes, 2)))))
                    return acc

            valid = lane_mask(builder, count, lanes)
            channel_params = [load_parameters(builder, params, params_stride, j) for j in range(lanes // 16)]
            acc_slots = [cgutils.alloca_once_value(builder, ir.Constant(acc_t, None)) for _ in range(2)]

            def load_tap(base, t):
                offset = builder.add(base, builder.load(builder.gep(taps, [t])))
                xb = builder.call(masked_load, [builder.bitcast(builder.gep(x, [offset]), bytes_t.as_pointer()),
                                                ir.Constant(i32, 1), valid, ir.Constant(bytes_t, None)])
                return builder.sext(xb, shorts_t)

            for pid in each_profile(builder, profile):
                with cgutils.for_range(builder, n_pixels) as pixel:
                    base = builder.mul(pixel.index, x_step)
                    for slot in acc_slots:
                        builder.store(ir.Constant(acc_t, None), slot)
                    with cgutils.for_range(builder, n_pairs) as pair:
                        t = builder.shl(pair.index, ir.Constant(i64, 1))
                        xa, xb = load_tap(base, t), load_tap(base, builder.add(t, ir.Constant(i64, 1)))
                        for h, slot in enumerate(acc_slots):
                            xs = builder.shuffle_vector(xa, xb, ir.Constant(ir.VectorType(i32, lanes), interleave[h]))
                            w_off = builder.add(builder.mul(pair.index, ir.Constant(i64, 4 * LANES)), ir.Constant(i64, 2 * LANES * h))
                            ws = builder.load(builder.bitcast(builder.gep(w, [w_off]), shorts_t.as_pointer()), align=1)
                            builder.store(multiply_add(builder.load(slot), xs, ws), slot)
                    accs = [builder.load(slot) for slot in acc_slots]
                    if lanes == 32:
                        ys = [vector_output_stage(builder, a, p, pid, zero_point, lo, hi) for a, p in zip(accs, channel_params)]
                        y = builder.shuffle_vector(ys[0], ys[1], ir.Constant(ir.VectorType(i32, lanes), to_channels))
                    else:
                        acc16 = builder.shuffle_vector(accs[0], accs[1], ir.Constant(ir.VectorType(i32, 16), list(range(16))))
                        y16 = vector_output_stage(builder, acc16, channel_params[0], pid, zero_point, lo, hi)
                        y = builder.shuffle_vector(y16, ir.Constant(bytes_t, ir.Undefined), ir.Constant(ir.VectorType(i32, lanes), to_channels))
                    store_bytes(builder, y, builder.gep(out, [builder.mul(pixel.index, out_step)]), count)
            return context.get_dummy_value()

        return sig, codegen

    return run


# A run of n_pixels output pixels of a depthwise convolution (multiplier 1) whose taps all fall
# inside the image, for 16 or 32 channels (count of them valid): out[p * out_step + c] = the output
# stage of sum over tap pairs q and s in (0, 1) of x[p * x_step + taps[2q + s] + c] * w(q, s, c),
# with w in the layout of vector_layout and the parameters (offset - zp * sum w) in pair_order.
# x is read with masked loads (never past the valid channels).
tap_pairs_run16, tap_pairs_run32 = _tap_pairs_run(16), _tap_pairs_run(32)


@parallel_kernel
def depthwise_conv(x, w, wv, paired, groups, multiplier, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, in_zp,
                   params, vparams, profile, out_zp, lo, hi, out):
    """params: the output parameters of the scalar loop (channel order); wv and vparams: the
    weights and parameters of the vector runs (see vector_layout). paired: 16 channels with stride
    1 (multiplier 1); wv and vparams then hold the 16 channels twice, so that one 32-lane vector
    computes two adjacent output pixels."""
    n_batch, in_h, in_w, in_c = x.shape
    _, out_h, out_w, out_c = out.shape
    kh, kw = w.shape[2], w.shape[3]
    per_group = n_batch // groups
    zp = np.int32(in_zp)
    o32 = params.shape[2]  # channels, padded to a multiple of 32
    v32 = vparams.shape[2]
    # Output columns whose taps all fall inside the image, [ox_lo, ox_hi), and the tap offsets, in
    # pairs (an odd last tap is paired with itself; its partner's weights are zero).
    ox_lo = min(out_w, (pad_left + stride_w - 1) // stride_w)
    ox_hi = max(ox_lo, min(out_w, (in_w - 1 + pad_left - (kw - 1) * dil_w) // stride_w + 1))
    n_pairs = (kh * kw + 1) // 2
    taps = np.empty(2 * n_pairs, dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            taps[ky * kw + kx] = ((ky * dil_h) * in_w + kx * dil_w) * in_c
    taps[2 * n_pairs - 1] = taps[kh * kw - 1]
    block_bytes = n_pairs * 4 * LANES  # vector weights of one block of 32 channels
    # A pixel of the zero point: the padding taps of a border pixel read it (and so contribute
    # zp * w, which the folded bias takes back, as TFLM skips them).
    pad_pixel = np.empty(in_c, dtype=np.int8)
    pad_pixel[:] = in_zp
    vector = multiplier == 1
    for row in nb.prange(n_batch * out_h):
        n = row // out_h
        oy = row - n * out_h
        g = n // per_group
        iy0 = oy * stride_h - pad_top
        w_group = wv.ctypes.data + g * (v32 // LANES) * block_bytes
        v_group = vparams.ctypes.data + g * vparams.shape[1] * v32 * 4
        interior_row = vector and iy0 >= 0 and iy0 + (kh - 1) * dil_h < in_h and ox_hi > ox_lo
        if interior_row:
            x_first = x.ctypes.data + ((n * in_h + iy0) * in_w + ox_lo * stride_w - pad_left) * in_c
            out_first = out.ctypes.data + ((n * out_h + oy) * out_w + ox_lo) * out_c
            run = ox_hi - ox_lo
            if paired:  # 16 channels, adjacent pixels 16 bytes apart: two pixels per 32-lane vector
                tap_pairs_run32(x_first, 2 * in_c, taps.ctypes.data, n_pairs, w_group, run // 2, out_first, 2 * out_c, 32,
                                v_group, v32 * 4, profile, out_zp, lo, hi)
                if run % 2:  # the last pixel alone: the lanes of a next pixel are neither read nor stored
                    tap_pairs_run32(x_first + (run - 1) * in_c, in_c, taps.ctypes.data, n_pairs, w_group, 1,
                                    out_first + (run - 1) * out_c, out_c, 16, v_group, v32 * 4, profile, out_zp, lo, hi)
            else:
                for c0 in range(0, out_c, LANES):
                    args = (x_first + c0, stride_w * in_c, taps.ctypes.data, n_pairs, w_group + c0 // LANES * block_bytes,
                            run, out_first + c0, out_c, out_c - c0, v_group + c0 * 4, v32 * 4, profile, out_zp, lo, hi)
                    if out_c - c0 > 16:
                        tap_pairs_run32(*args)
                    else:
                        tap_pairs_run16(*args)
        # The other pixels one by one: with multiplier 1 as a vector run of one pixel whose taps are
        # offsets from x (padding taps: pad_pixel); other multipliers in a scalar loop.
        pixel_taps = np.empty(2 * n_pairs, dtype=np.int64)
        scratch = np.empty(o32 + 16, dtype=np.int32)
        start = (-scratch.ctypes.data // 4) % 16  # vector loads of the output stage on cache lines
        a = scratch[start:start + o32]  # int32 accumulators, as TFLM's
        for ox in range(out_w):
            if interior_row and ox_lo <= ox < ox_hi:
                continue
            out_pixel = out.ctypes.data + ((n * out_h + oy) * out_w + ox) * out_c
            if vector:
                # Taken here, where pad_pixel is still used (Numba frees an array after its last
                # use), and signed (a difference of two uintp addresses would wrap).
                pad_offset = np.int64(pad_pixel.ctypes.data) - np.int64(x.ctypes.data)
                for ky in range(kh):
                    iy = iy0 + ky * dil_h
                    for kx in range(kw):
                        ix = ox * stride_w - pad_left + kx * dil_w
                        inside = 0 <= iy < in_h and 0 <= ix < in_w
                        pixel_taps[ky * kw + kx] = ((n * in_h + iy) * in_w + ix) * in_c if inside else pad_offset
                pixel_taps[2 * n_pairs - 1] = pixel_taps[kh * kw - 1]
                for c0 in range(0, out_c, LANES):
                    args = (x.ctypes.data + c0, 0, pixel_taps.ctypes.data, n_pairs, w_group + c0 // LANES * block_bytes,
                            1, out_pixel + c0, out_c, out_c - c0, v_group + c0 * 4, v32 * 4, profile, out_zp, lo, hi)
                    if paired or out_c - c0 > 16:  # paired: the 16 channels in the first lanes of the 32
                        tap_pairs_run32(*args)
                    else:
                        tap_pairs_run16(*args)
                continue
            a[:] = 0  # the bias is the stage's offset
            for ky in range(kh):
                iy = iy0 + ky * dil_h
                if iy < 0 or iy >= in_h:
                    continue
                for kx in range(kw):
                    ix = ox * stride_w - pad_left + kx * dil_w
                    if ix < 0 or ix >= in_w:
                        continue
                    xs = x[n, iy, ix]
                    ws = w[g, 0, ky, kx]
                    for ic in range(in_c):
                        xv = np.int32(xs[ic]) - zp
                        for mi in range(multiplier):
                            oc = ic * multiplier + mi
                            a[oc] += xv * np.int32(ws[oc])
            output_stage_row(a.ctypes.data, params.ctypes.data + g * params.shape[1] * o32 * 4, o32 * 4, out_pixel, out_c, profile, out_zp, lo, hi)
    return out


def vector_layout(wg: np.ndarray, params: np.ndarray, paired: bool) -> tuple[np.ndarray, np.ndarray]:
    """The weights [G, 1, kh, kw, O] int8 and output parameters [G, 5, O32] (the offset with
    -zp * sum w folded in) of the vector runs: weights [G, O32 / 32, pairs, 2 (lo, hi), 32] int16,
    where lane 2i + s of accumulator h holds tap 2q + s of the channel at position h * W/2 + i of
    pair_order(W), W = 32 or, for a last block of 16 or fewer channels, 16; parameters permuted to
    the same positions. paired: the 16 channels twice, as one block of 32."""
    groups, _, kh, kw, o = wg.shape
    taps = wg.reshape(groups, kh * kw, o)
    if paired:
        taps, params, o = np.concatenate([taps] * 2, axis=2), np.concatenate([params[:, :, :16]] * 2, axis=2), 32
    o32 = (o + LANES - 1) // LANES * LANES
    pairs = (kh * kw + 1) // 2
    padded = np.zeros((groups, 2 * pairs, o32), dtype=np.int16)
    padded[:, :kh * kw, :o] = taps
    wv = aligned.zeros((groups, o32 // LANES, pairs, 2, LANES), np.int16)
    vparams = aligned.zeros((groups, params.shape[1], o32), np.int32)
    for block, c0 in enumerate(range(0, o32, LANES)):
        width = LANES if o - c0 > 16 else 16
        channels = c0 + pair_order(width)
        chosen = padded[:, :, channels].reshape(groups, pairs, 2, 2, width // 2)  # [G, pair, s, h, i]
        wv[:, block, :, :, :width] = chosen.transpose(0, 1, 3, 4, 2).reshape(groups, pairs, 2, width)
        vparams[:, :, c0:c0 + width] = params[:, :, channels]
    return wv, vparams


class DepthwiseConv2D(Kernel):
    kind = "DEPTHWISE_CONV_2D"
    required_inputs, max_inputs = 2, 3

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.require_int8(x, w, y)
        self.require_constant(w, "filter")
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4 or w.shape[0] != 1:
            raise self.error(f"expected 4-D input and output and a [1, kh, kw, C] filter, got {list(x.shape)}, {list(w.shape)}, {list(y.shape)}")
        o = self.options = op.options
        _, self.kh, self.kw, self.out_channels = w.shape
        in_c = x.shape[3]
        if self.out_channels % in_c:
            raise self.error(f"filter channels {self.out_channels} are not a multiple of input channels {in_c}")
        self.multiplier = self.out_channels // in_c
        self.require_bias(self.inputs[2] if len(self.inputs) > 2 else None, self.out_channels)
        self.in_image_shape = tuple(x.shape[1:])
        self.out_h, self.pad_top = compute_padding(x.shape[1], self.kh, o.get("stride_h", 1), o.get("dilation_h_factor", 1), o.get("padding"))
        self.out_w, self.pad_left = compute_padding(x.shape[2], self.kw, o.get("stride_w", 1), o.get("dilation_w_factor", 1), o.get("padding"))
        if (self.out_h, self.out_w, self.out_channels) != tuple(y.shape[1:]):
            raise self.error(f"output shape {list(y.shape)} does not match the computed [N, {self.out_h}, {self.out_w}, {self.out_channels}]")
        self.stage = OutputStage.prepare(x, w, y, self.out_channels, o.get("fused_activation_function", "NONE"))
        self.memo = WeightMemo()
        self.unpadded_shape = None  # see fuse_pad

    def fuse_pad(self, pad) -> bool:
        """Take over the spatial padding of the PAD kernel that feeds this op (as converters write
        SAME stride-2 depthwise layers: PAD, then VALID), if it pads with the input zero point: a
        padded tap then contributes (zp - zp) * w = 0, exactly as a skipped one. Interpreter.run then
        passes the unpadded input and the PAD's copy of a large activation is saved."""
        p = pad.paddings
        if (len(p) != 4 or p[0].any() or p[3].any() or not p[1:3].any() or pad.value != self.inputs[0].zero_point
                or pad.inputs[0].dtype != np.int8):
            return False
        self.unpadded_shape = tuple(pad.inputs[0].shape[1:])
        self.fused_pad = (int(p[1, 0]), int(p[2, 0]))
        return True

    def macs(self) -> int:
        return self.out_h * self.out_w * self.out_channels * self.kh * self.kw

    def workspace_bytes(self, n: int) -> int:
        return 0  # one int32 accumulator row per thread

    def __call__(self, x, w, b=None, shared=False):
        pad_top, pad_left = self.pad_top, self.pad_left
        if self.unpadded_shape is not None and x.shape[1:] == self.unpadded_shape:  # the fused PAD's input
            pad_top, pad_left = pad_top + self.fused_pad[0], pad_left + self.fused_pad[1]
        elif x.shape[1:] != self.in_image_shape:  # the Numba loop indexes by the planned shape, unchecked
            raise self.error(f"input array has shape {list(x.shape)}, expected [N, {', '.join(map(str, self.in_image_shape))}]")
        o = self.options
        wg = w if w.ndim == 5 else w[None]
        groups = wg.shape[0]
        if shared:  # no reduction to share: give each group its own copy of the batch
            x = np.concatenate([x] * groups)
        paired = self.multiplier == 1 and self.out_channels == 16 and o.get("stride_w", 1) == 1

        in_zp = self.inputs[0].zero_point

        def prepare():
            bias = np.zeros((groups, self.out_channels), dtype=np.int64) if b is None else np.ascontiguousarray(
                np.broadcast_to(b.reshape(-1, self.out_channels), (groups, self.out_channels)), dtype=np.int64)
            weight_sums = wg.reshape(groups, -1, self.out_channels).sum(axis=1, dtype=np.int64)
            return (output_parameters(bias, self.stage, LANES),
                    *vector_layout(wg, output_parameters(bias - in_zp * weight_sums, self.stage, LANES), paired))

        params, wv, vparams = self.memo.get("depthwise", wg, b, prepare) if groups == 1 else prepare()
        out = aligned.empty((x.shape[0], self.out_h, self.out_w, self.out_channels), np.int8)
        s = self.stage
        depthwise_conv(np.ascontiguousarray(x), np.ascontiguousarray(wg), wv, paired, groups, self.multiplier,
                       o.get("stride_h", 1), o.get("stride_w", 1), o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1),
                       pad_top, pad_left, np.int64(in_zp), params, vparams, np.int64(self.profile),
                       np.int64(s.zero_point), np.int64(s.lo), np.int64(s.hi), out)
        return out
