"""DEPTHWISE_CONV_2D: per-channel int8 depthwise convolution with depth multiplier
(TFLM reference_integer_ops/depthwise_conv.h). Output channel c_out = c_in * multiplier + m,
weights [1, kh, kw, C * multiplier] (or [G, 1, kh, kw, C * multiplier] for grouped weights, see conv.py).
A direct integer loop: there is no reduction long enough for a GEMM to pay. With multiplier 1,
the pixels whose taps all fall inside the image run 16 channels at a time as vector code with the
accumulators in registers (output_stage.depthwise_run); the border pixels and other multipliers
take the scalar loop.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..jit import parallel_kernel
from . import aligned
from .base import Kernel, WeightMemo
from .output_stage import DEPTHWISE_LANES, depthwise_run16, depthwise_run32, output_parameters, output_stage_row
from .padding import compute_padding
from .requant import OutputStage


@parallel_kernel
def depthwise_conv(x, w, w32, paired, groups, multiplier, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, in_zp,
                   params, profile, out_zp, lo, hi, out):
    """paired: 16 channels with stride 1 (multiplier 1); w32 and params then hold the 16 channels
    twice, so that one 32-lane vector computes two adjacent output pixels."""
    n_batch, in_h, in_w, in_c = x.shape
    _, out_h, out_w, out_c = out.shape
    kh, kw = w.shape[2], w.shape[3]
    per_group = n_batch // groups
    zp = np.int32(in_zp)
    o32 = params.shape[2]  # channels, padded to a multiple of 32
    # Output columns whose taps all fall inside the image, [ox_lo, ox_hi), and the tap offsets.
    ox_lo = min(out_w, (pad_left + stride_w - 1) // stride_w)
    ox_hi = max(ox_lo, min(out_w, (in_w - 1 + pad_left - (kw - 1) * dil_w) // stride_w + 1))
    taps = np.empty(kh * kw, dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            taps[ky * kw + kx] = ((ky * dil_h) * in_w + kx * dil_w) * in_c
    for row in nb.prange(n_batch * out_h):
        n = row // out_h
        oy = row - n * out_h
        g = n // per_group
        # int32 accumulators, as TFLM's: at most kh*kw taps of 255 * 127, and twice the SIMD lanes of int64.
        scratch = np.empty(o32 + 16, dtype=np.int32)
        start = (-scratch.ctypes.data // 4) % 16  # vector loads of the output stage on cache lines
        a = scratch[start:start + o32]
        p_group = params.ctypes.data + g * params.shape[1] * o32 * 4
        iy0 = oy * stride_h - pad_top
        vector_run = multiplier == 1 and iy0 >= 0 and iy0 + (kh - 1) * dil_h < in_h and ox_hi > ox_lo
        if vector_run:
            x_first = x.ctypes.data + ((n * in_h + iy0) * in_w + ox_lo * stride_w - pad_left) * in_c
            out_first = out.ctypes.data + ((n * out_h + oy) * out_w + ox_lo) * out_c
            run = ox_hi - ox_lo
            if paired:  # 16 channels, adjacent pixels 16 bytes apart: two pixels per 32-lane vector
                w_group = w32.ctypes.data + g * kh * kw * 64
                depthwise_run32(x_first, 2 * in_c, taps.ctypes.data, kh * kw, w_group, in_zp, run // 2, out_first, 2 * out_c, 32,
                                p_group, o32 * 4, profile, out_zp, lo, hi)
                if run % 2:
                    depthwise_run16(x_first + (run - 1) * in_c, in_c, taps.ctypes.data, kh * kw, w_group, in_zp, 1,
                                    out_first + (run - 1) * out_c, out_c, 16, p_group, o32 * 4, profile, out_zp, lo, hi)
            else:
                for c0 in range(0, out_c, 32):
                    args = (x_first + c0, stride_w * in_c, taps.ctypes.data, kh * kw, w32.ctypes.data + (g * (o32 // 32) + c0 // 32) * kh * kw * 64,
                            in_zp, run, out_first + c0, out_c, out_c - c0, p_group + c0 * 4, o32 * 4, profile, out_zp, lo, hi)
                    if out_c - c0 > 16:
                        depthwise_run32(*args)
                    else:
                        depthwise_run16(*args)
        for ox in range(out_w):
            if vector_run and ox_lo <= ox < ox_hi:
                continue
            a[:] = 0  # the bias is the stage's offset
            for ky in range(kh):
                iy = oy * stride_h - pad_top + ky * dil_h
                if iy < 0 or iy >= in_h:
                    continue
                for kx in range(kw):
                    ix = ox * stride_w - pad_left + kx * dil_w
                    if ix < 0 or ix >= in_w:
                        continue
                    xs = x[n, iy, ix]
                    ws = w[g, 0, ky, kx]
                    if multiplier == 1:  # the common case: one contiguous, vectorizable channel loop
                        for c in range(in_c):
                            a[c] += (np.int32(xs[c]) - zp) * np.int32(ws[c])
                    else:
                        for ic in range(in_c):
                            xv = np.int32(xs[ic]) - zp
                            for mi in range(multiplier):
                                oc = ic * multiplier + mi
                                a[oc] += xv * np.int32(ws[oc])
            output_stage_row(a.ctypes.data, p_group, o32 * 4, out.ctypes.data + ((n * out_h + oy) * out_w + ox) * out_c,
                             out_c, profile, out_zp, lo, hi)
    return out


def vector_weights(wg: np.ndarray) -> np.ndarray:
    """[G, 1, kh, kw, O] int8 -> [G, O32 / 32, kh * kw, 32] int16, 64-byte aligned: the weights of
    one tap for 32 channels are one vector (channels past O: 0)."""
    groups, _, kh, kw, o = wg.shape
    lanes = DEPTHWISE_LANES
    o32 = (o + lanes - 1) // lanes * lanes
    padded = np.zeros((groups, kh * kw, o32), dtype=np.int16)
    padded[:, :, :o] = wg.reshape(groups, kh * kw, o)
    w32 = aligned.empty((groups, o32 // lanes, kh * kw, lanes), np.int16)
    w32[...] = padded.reshape(groups, kh * kw, o32 // lanes, lanes).transpose(0, 2, 1, 3)
    return w32


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

        def prepare():
            bias = np.zeros((groups, self.out_channels), dtype=np.int64) if b is None else np.ascontiguousarray(
                np.broadcast_to(b.reshape(-1, self.out_channels), (groups, self.out_channels)), dtype=np.int64)
            params = output_parameters(bias, self.stage, DEPTHWISE_LANES)
            if paired:
                params = np.concatenate([params[:, :, :16]] * 2, axis=2)
            return vector_weights(np.concatenate([wg] * 2, axis=4) if paired else wg), params

        w32, params = self.memo.get("depthwise", wg, b, prepare) if groups == 1 else prepare()
        out = aligned.empty((x.shape[0], self.out_h, self.out_w, self.out_channels), np.int8)
        s = self.stage
        depthwise_conv(np.ascontiguousarray(x), np.ascontiguousarray(wg), w32, paired, groups, self.multiplier,
                       o.get("stride_h", 1), o.get("stride_w", 1), o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1),
                       pad_top, pad_left, np.int64(self.inputs[0].zero_point), params, np.int64(self.profile),
                       np.int64(s.zero_point), np.int64(s.lo), np.int64(s.hi), out)
        return out
