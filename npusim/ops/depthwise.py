"""DEPTHWISE_CONV_2D: per-channel int8 depthwise convolution with depth multiplier
(TFLM reference_integer_ops/depthwise_conv.h). Output channel c_out = c_in * multiplier + m,
weights [1, kh, kw, C * multiplier] (or [G, 1, kh, kw, C * multiplier] for grouped weights, see conv.py).
Prepare checks the operands and fills the geometry and the output stage; Eval runs the direct
integer loop of kernels/depthwise.py (vector runs of 64 channels with multiplier 1, a scalar loop
otherwise), in the vector form the interpreter's backend selection picks.
"""

from __future__ import annotations

import numpy as np

from ..kernels import aligned, backend, depthwise, wide
from ..kernels.geometry import ConvGeometry, SlidingWindow
from ..kernels.int16 import Stage16, depthwise16, is_int16
from ..kernels.requant import OutputStage
from ..quant import mac_profile
from .base import Kernel, WeightMemo
from .float_form import FloatForm, pad_spatial, real, tap


class DepthwiseConv2DFloat(FloatForm):
    """Output channel c * multiplier + m reads input channel c: the input repeated along the
    channels, then one multiply-add per filter tap (float32, as LiteRT's float depthwise conv)."""

    mac_inputs = (0, 1, 2)

    def __init__(self, op, graph):
        super().__init__(op, graph)
        x = self.inputs[0]
        _, kh, kw, out_channels = self.inputs[1].shape  # filter [1, kh, kw, C * multiplier]
        self.multiplier = out_channels // x.shape[3]
        self.geometry = ConvGeometry.from_options(op.options, x.shape, kh, kw)

    def __call__(self, x, w, b=None):
        g = self.geometry
        x = real(x)
        xp = pad_spatial(np.repeat(x, self.multiplier, axis=3) if self.multiplier > 1 else x, g)
        y = np.zeros((x.shape[0], g.out_h, g.out_w, w.shape[3]), np.result_type(x, w))
        for ky in range(g.kh):
            for kx in range(g.kw):
                y += tap(xp, g, ky, kx) * w[0, ky, kx]
        if b is not None:
            y += b
        return self.activate(y)


class DepthwiseConv2D(SlidingWindow, Kernel):
    """variant: the form of the vector code, "vnni" where the interpreter's backend selection has
    an engine that runs AVX-512 VNNI (amx, vnni), "avx2" where its widest engine runs AVX2, else
    "generic" (backend="blas" runs it too): backend.Selection.depthwise_variant."""

    kind = "DEPTHWISE_CONV_2D"
    float_form = DepthwiseConv2DFloat
    required_inputs, max_inputs = 2, 3
    takes_backends = True

    def __init__(self, op, graph, profile, backends: backend.Selection | None = None):
        super().__init__(op, graph, profile)
        self.variant = (backends or backend.select()).depthwise_variant()
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.int16: Stage16 | None = None
        self.wide: wide.WideStage | None = None  # a filter with a zero point (kernels/wide.py)
        if not is_int16(x):
            self.require_int8(x, w, y)
        self.require_constant(w, "filter")
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4 or w.shape[0] != 1:
            raise self.error(
                f"expected 4-D input and output and a [1, kh, kw, C] filter, got {list(x.shape)}, "
                f"{list(w.shape)}, {list(y.shape)}"
            )
        o = self.options = op.options
        _, kh, kw, self.out_channels = w.shape
        in_c = x.shape[3]
        if self.out_channels % in_c:
            raise self.error(
                f"filter channels {self.out_channels} are not a multiple of input channels {in_c}"
            )
        self.multiplier = self.out_channels // in_c
        bias = self.inputs[2] if len(self.inputs) > 2 else None
        if not is_int16(x):
            self.require_bias(bias, self.out_channels)
        elif bias is not None and bias.dtype != np.int64:
            # TFLM's int16 depthwise reads the bias as int64 whatever its type.
            raise self.error(f"bias {bias.name!r} is {np.dtype(bias.dtype).name}, expected int64 (16x8)")
        self.in_image_shape = tuple(x.shape[1:])
        self.geometry = ConvGeometry.from_options(o, x.shape, kh, kw)
        if (self.out_h, self.out_w, self.out_channels) != tuple(y.shape[1:]):
            raise self.error(
                f"output shape {list(y.shape)} does not match the computed "
                f"[N, {self.out_h}, {self.out_w}, {self.out_channels}]"
            )
        self.unpadded_shape = None  # see fuse_pad
        if is_int16(x):  # 16x8: int16 activations, int8 weights (kernels/int16.py)
            activation = o.get("fused_activation_function", "NONE")
            self.int16 = Stage16.prepare(self, x, w, bias, y, self.out_channels, activation)
            return
        self.stage = OutputStage.prepare(
            x, w, y, self.out_channels, o.get("fused_activation_function", "NONE"), self.profile
        )
        self.memo = WeightMemo()
        if wide.is_wide(w, y):  # a uint8 model's asymmetric filter (npusim/runtime/uint8.py)
            activation = o.get("fused_activation_function", "NONE")
            args = (self.out_channels, activation, self.profile, mac_profile(self.profile))
            self.wide = wide.prepare(self.error, x, w, y, *args)

    def fuse_pad(self, pad) -> bool:
        """Take over the spatial padding of the PAD kernel that feeds this op (as converters write
        SAME stride-2 depthwise layers: PAD, then VALID), if it pads with the input zero point: a
        padded tap then contributes (zp - zp) * w = 0, exactly as a skipped one. Interpreter.run then
        passes the unpadded input and the PAD's copy of a large activation is saved."""
        top_left = pad.spatial_zero_point_padding(self.inputs[0].zero_point)
        if top_left is None or self.wide is not None:
            return False
        self.unpadded_shape = tuple(pad.inputs[0].shape[1:])
        self.fused_pad = top_left
        return True

    def macs(self) -> int:
        return self.out_h * self.out_w * self.out_channels * self.kh * self.kw

    def workspace_bytes(self, n: int) -> int:
        return 0  # one int32 accumulator row per thread

    def __call__(self, x, w, b=None, shared=False):
        g = self.geometry
        if self.int16 is not None:
            if w.ndim != 4:
                raise self.error("grouped weights are not supported with int16 activations")
            if x.shape[1:] != self.in_image_shape:
                raise self.error(
                    f"input array has shape {list(x.shape)}, expected [N, {self.in_image_shape}]"
                )
            return self.int16(depthwise16(x, w, g, self.multiplier), b)
        pad_top, pad_left = g.pad
        if self.unpadded_shape is not None and x.shape[1:] == self.unpadded_shape:  # the fused PAD's input
            pad_top, pad_left = pad_top + self.fused_pad[0], pad_left + self.fused_pad[1]
        elif x.shape[1:] != self.in_image_shape:  # the Numba loop indexes by the planned shape, unchecked
            raise self.error(
                f"input array has shape {list(x.shape)}, expected [N, "
                f"{', '.join(map(str, self.in_image_shape))}]"
            )
        if self.wide is not None:
            if w.ndim != 4 or shared:
                raise self.error("grouped weights are not supported with a filter zero point")
            acc = self.wide.depthwise_sums(x, w, self.inputs[0].zero_point, g, self.multiplier)
            out = self.wide(x, w, b, self.inputs[0].zero_point, g, acc=acc)
            return out.reshape(x.shape[0], self.out_h, self.out_w, self.out_channels)
        wg = w if w.ndim == 5 else w[None]
        groups = wg.shape[0]
        if shared:  # no reduction to share: give each group its own copy of the batch
            x = np.concatenate([x] * groups)
        replicas = depthwise.replicas_for(self.multiplier, self.out_channels, g.stride[1], self.variant)
        in_zp = self.inputs[0].zero_point

        def prepare():
            return depthwise.prepared_weights(self.variant, wg, b, in_zp, self.stage, replicas)

        params, wv, vparams = self.memo.get("depthwise", wg, b, prepare) if groups == 1 else prepare()
        out = aligned.empty((x.shape[0], self.out_h, self.out_w, self.out_channels), np.int8)
        s = self.stage
        depthwise.depthwise_kernel(self.variant)(
            np.ascontiguousarray(x),
            np.ascontiguousarray(wg),
            wv,
            replicas,
            groups,
            self.multiplier,
            *g.stride,
            *g.dilation,
            pad_top,
            pad_left,
            np.int64(in_zp),
            params,
            vparams,
            np.int64(mac_profile(self.profile)),
            np.int64(s.zero_point),
            np.int64(s.lo),
            np.int64(s.hi),
            *depthwise.isa_parameters(self.variant),
            out,
        )
        return out
