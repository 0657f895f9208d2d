"""CONV_2D: int8 NHWC convolution with per-channel requantization (TFLM reference_integer_ops/conv.h).

Eval runs on the MAC engine that the interpreter's backend selection picks for the layer's
geometry (kernels/backend.py): AMX tiles, AVX-512 VNNI, or im2col + an exact float32 GEMM, all exact.
Weights may carry an extra leading group axis [G, O, kh, kw, C] (bias [G, O]): the batch is then
split into G equal groups, group g convolved with weights g. The trainer uses this to run many
weight perturbations in one call.
"""

from __future__ import annotations

import dataclasses

from ..kernels import aligned, backend, gemm, wide
from ..kernels.geometry import ConvGeometry, SlidingWindow
from ..kernels.int16 import Stage16, conv16, is_int16
from ..kernels.requant import OutputStage
from ..quant import mac_profile
from .base import Kernel, WeightMemo
from .float_form import FloatForm, columns, real


class Conv2DFloat(FloatForm):
    """x (*) w + b with a real zero as padding, im2col and one float32 GEMM (LiteRT's float conv
    is im2col + GEMM too, summed in another order), then the fused activation."""

    mac_inputs = (0, 1, 2)

    def __init__(self, op, graph):
        super().__init__(op, graph)
        _, kh, kw, _ = self.inputs[1].shape  # filter [O, kh, kw, C]
        self.geometry = ConvGeometry.from_options(op.options, self.inputs[0].shape, kh, kw)

    def __call__(self, x, w, b=None):
        g = self.geometry
        y = columns(real(x), g) @ w.reshape(w.shape[0], -1).T
        if b is not None:
            y += b
        return self.activate(y.reshape(x.shape[0], g.out_h, g.out_w, w.shape[0]))


class Conv2D(SlidingWindow, Kernel):
    kind = "CONV_2D"
    float_form = Conv2DFloat
    required_inputs, max_inputs = 2, 3
    takes_backends = True

    def __init__(self, op, graph, profile, backends: backend.Selection | None = None):
        super().__init__(op, graph, profile)
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.int16: Stage16 | None = None
        self.unpadded = None  # (image shape, geometry, engine) of the input of a PAD taken over
        self.wide: wide.WideStage | None = None  # asymmetric filter or int32 output (kernels/wide.py)
        if not is_int16(x):
            self.require_int8(*((x, w) if wide.is_wide(w, y) else (x, w, y)))
        self.require_constant(w, "filter")
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4:
            raise self.error(
                "expected 4-D input, filter and output, got "
                f"{list(x.shape)}, {list(w.shape)}, {list(y.shape)}"
            )
        o = self.options = op.options
        self.out_channels, kh, kw, in_c = w.shape
        if in_c != x.shape[3]:
            raise self.error(
                f"filter depth {in_c} does not match input channels "
                f"{x.shape[3]} (grouped conv is not supported)"
            )
        bias = self.inputs[2] if len(self.inputs) > 2 else None
        if not is_int16(x):
            self.require_bias(bias, self.out_channels)
        self.in_image_shape = tuple(x.shape[1:])
        self.geometry = ConvGeometry.from_options(o, x.shape, kh, kw)
        if (self.out_h, self.out_w, self.out_channels) != tuple(y.shape[1:]):
            raise self.error(
                f"output shape {list(y.shape)} does not match the computed "
                f"[N, {self.out_h}, {self.out_w}, {self.out_channels}]"
            )
        if is_int16(x):  # 16x8: int16 activations, int8 weights (kernels/int16.py)
            activation = o.get("fused_activation_function", "NONE")
            self.int16 = Stage16.prepare(self, x, w, bias, y, self.out_channels, activation)
            return
        activation = o.get("fused_activation_function", "NONE")
        self.backends = backends or backend.select()
        self.engine = self.backends.for_geometry(self.geometry)
        self.workspace = aligned.Workspace()  # the padded input of the AMX and VNNI engines
        self.memo = WeightMemo()
        if wide.is_wide(w, y):
            args = (self.out_channels, activation, self.profile, mac_profile(self.profile))
            self.wide = wide.prepare(self.error, x, w, y, *args)
            return
        self.stage = OutputStage.prepare(x, w, y, self.out_channels, activation, self.profile)

    def fuse_pad(self, pad) -> bool:
        """Take over the spatial padding of the PAD kernel that feeds this op (YOLO's stride-2
        layers: PAD, then VALID), if it pads with the input zero point, as DEPTHWISE_CONV_2D does:
        a padded tap contributes (zp - zp) * w = 0, and the engines' own padded copy (or im2col)
        pads instead of the PAD's copy of the whole activation. Interpreter.run then passes the
        unpadded input. (A 16x8 convolution's PAD pads int16, which is never taken over.)"""
        top_left = pad.spatial_zero_point_padding(self.inputs[0].zero_point)
        if top_left is None:
            return False
        g = self.geometry
        fused = dataclasses.replace(g, pad=(g.pad[0] + top_left[0], g.pad[1] + top_left[1]))
        self.unpadded = (tuple(pad.inputs[0].shape[1:]), fused, self.backends.for_geometry(fused))
        return True

    def macs(self) -> int:
        return self.out_h * self.out_w * self.out_channels * self.geometry.depth

    def workspace_bytes(self, n: int) -> int:
        return gemm.workspace_bytes(self.geometry, self.out_channels, n)

    @property
    def pointwise(self) -> bool:
        return self.geometry.pointwise

    def __call__(self, x, w, b=None, shared=False):
        """shared=True: x is one batch seen by every weight group (output: G times the batch)."""
        geometry, engine = self.geometry, None  # (16x8 convolutions have no engine, nor a fused PAD)
        if self.unpadded is not None and x.shape[1:] == self.unpadded[0]:  # the fused PAD's input
            _, geometry, engine = self.unpadded
        elif x.shape[1:] != self.in_image_shape:  # the kernels index by the planned shape, unchecked
            raise self.error(
                f"input array has shape {list(x.shape)}, expected [N, "
                f"{', '.join(map(str, self.in_image_shape))}]"
            )
        if self.int16 is not None:
            if w.ndim != 4:
                raise self.error("grouped weights are not supported with int16 activations")
            return self.int16(conv16(x, w, self.geometry), b)
        if self.wide is not None:
            if w.ndim != 4:
                raise self.error("grouped weights are not supported with a filter zero point or int32 output")
            out = self.wide(x, w, b, self.inputs[0].zero_point, geometry)
            return out.reshape(-1, self.out_h, self.out_w, self.out_channels)
        wg = w if w.ndim == 5 else w[None]
        out = (engine or self.engine).convolve(
            geometry,
            x,
            wg,
            b,
            self.inputs[0].zero_point,
            self.stage,
            mac_profile(self.profile),
            shared,
            self.workspace,
            self.memo if wg.shape[0] == 1 else None,
        )
        return out.reshape(-1, self.out_h, self.out_w, self.out_channels)
