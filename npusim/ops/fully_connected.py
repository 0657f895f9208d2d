"""FULLY_CONNECTED: int8 matrix-vector product (TFLM reference_integer_ops/fully_connected.h).

The input is flattened to [N, K] per image; per-tensor or per-channel weight scales. Weights may
carry a leading group axis [G, O, K] (bias [G, O]) as in conv.py. Eval is a 1x1 convolution of one
pixel per row on the MAC engine that the backend selection picks (kernels/backend.py).

Weights that are an activation (an attention's product of two activations written as an
FULLY_CONNECTED, as in YOLO11's attention blocks) run TFLM's reference kernel, which takes the
filter's zero point as weights_offset: exact sums of (x - z_x)(w - z_w), plus the bias, requantized
by the per-tensor multiplier (ActivationWeights). The filter's axis 0 is its units, not the batch,
so such a model runs image by image (crosses_batch).
"""

from __future__ import annotations

import numpy as np

from ..kernels import backend, wide
from ..kernels.elementwise import requantize_rows
from ..kernels.geometry import ConvGeometry
from ..kernels.int16 import Stage16, is_int16
from ..kernels.requant import OutputStage, requantization_multiplier
from ..quant import activation_range, mac_profile
from .base import Kernel, WeightMemo
from .float_form import FloatForm, real


class ActivationWeights:
    """The output stage of a FULLY_CONNECTED whose weights are an activation (TFLM's reference
    FullyConnected: weights_offset = -z_w, bias added to the int32 sum, MultiplyByQuantizedMultiplier
    of double(s_x) * double(s_w) / double(s_y), the output zero point, the fused activation's clamp)."""

    def __init__(self, kernel, x, w, bias, y, activation: str):
        if w.quant is None or w.quant.per_channel:
            raise kernel.error(f"weights {w.name!r} are an activation: expected one scale and zero point")
        if bias is not None:
            kernel.require_constant(bias, "bias")
        s_x, s_w, s_y = (np.float64(t.quant.scale[0]) for t in (x, w, y))
        self.m, self.shift = requantization_multiplier(float(s_x * s_w / s_y))
        with np.errstate(over="ignore", under="ignore"):  # the float32 scale of the fp32 profiles
            self.real = np.float32(np.float32(s_x) * np.float32(s_w) / np.float32(s_y))
        self.profile = mac_profile(kernel.profile)
        self.zx, self.zw, self.zy = x.zero_point, w.zero_point, y.zero_point
        self.lo, self.hi = activation_range(activation, float(s_y), self.zy, kernel.profile)

    def __call__(self, rows, w, b):
        acc = (rows.astype(np.float64) - self.zx) @ (w.astype(np.float64) - self.zw).T  # exact below 2^53
        if b is not None:
            acc += b.astype(np.float64)
        out = np.empty(acc.shape, dtype=np.int8)
        args = (np.int64(self.m), np.int64(self.shift), self.real, np.int64(self.profile))
        return requantize_rows(acc, *args, np.int64(self.zy), np.int64(self.lo), np.int64(self.hi), out)


class FullyConnectedFloat(FloatForm):
    """Rows of K input values times the weights [O, K] plus the bias (float32, as LiteRT's float
    FullyConnected), shaped as the output tensor."""

    mac_inputs = (0, 1, 2)

    def __init__(self, op, graph):
        super().__init__(op, graph)
        self.depth = self.inputs[1].shape[1]
        self.out_shape = tuple(self.outputs[0].shape[1:])
        if self.inputs[1].data is None:  # activation weights: their axis 0 is no batch (as the kernel's)
            self.crosses_batch = (
                f"weights {self.inputs[1].name!r} are an activation, whose axis 0 is not the batch"
            )

    def __call__(self, x, w, b=None):
        y = real(x).reshape(-1, self.depth) @ w.T
        if b is not None:
            y += b
        return self.activate(y.reshape((-1,) + self.out_shape))


class FullyConnected(Kernel):
    kind = "FULLY_CONNECTED"
    float_form = FullyConnectedFloat
    required_inputs, max_inputs = 2, 3
    takes_backends = True

    def __init__(self, op, graph, profile, backends: backend.Selection | None = None):
        super().__init__(op, graph, profile)
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.int16: Stage16 | None = None
        self.dynamic: ActivationWeights | None = None
        self.wide: wide.WideStage | None = None  # asymmetric filter or int32 output (kernels/wide.py)
        if not is_int16(x):
            self.require_int8(*((x, w) if w.data is not None and wide.is_wide(w, y) else (x, w, y)))
        if w.data is None and not is_int16(x):
            self.crosses_batch = f"weights {w.name!r} are an activation, whose axis 0 is not the batch"
        else:
            self.require_constant(w, "weights")
        if len(w.shape) != 2:
            raise self.error(f"expected a 2-D weight matrix, got shape {list(w.shape)}")
        if op.options.get("weights_format", 0) != 0:
            raise self.error("shuffled weights format is not supported, expected DEFAULT")
        self.out_channels, self.depth = w.shape
        bias = self.inputs[2] if len(self.inputs) > 2 else None
        if not is_int16(x):
            self.require_bias(bias, self.out_channels)
        per_image = int(np.prod(x.shape[1:])) if len(x.shape) > 1 else 1
        if int(np.prod(x.shape)) % self.depth or per_image % self.depth:
            # A row straddling two images would mix the batch.
            raise self.error(f"input {list(x.shape)} does not flatten into rows of {self.depth} per image")
        # Rows per image: TFLM flattens [1, ..., K] into batches of K; usually 1 row per image.
        self.rows_per_image = (
            max(per_image // self.depth, 1)
            if x.shape and x.shape[0] == 1
            else int(np.prod(x.shape)) // self.depth
        )
        rows = int(np.prod(x.shape)) // self.depth
        # The output holds the rows, and each image's rows fill whole output entries [1:] (several
        # rows per entry with keep_num_dims, or several entries per image as TFLM's [rows, units]).
        if rows * self.out_channels != int(np.prod(y.shape)) or (
            per_image // self.depth * self.out_channels
        ) % int(np.prod(y.shape[1:])):
            raise self.error(
                f"output {list(y.shape)} does not hold {rows} rows of {self.out_channels} units, "
                f"{per_image // self.depth} per image"
            )
        self.out_shape = tuple(y.shape[1:])
        self.geometry = ConvGeometry.dense(self.depth)
        if is_int16(x):  # 16x8: int16 activations, int8 weights (kernels/int16.py)
            activation = op.options.get("fused_activation_function", "NONE")
            self.int16 = Stage16.prepare(self, x, w, bias, y, self.out_channels, activation)
            return
        if w.data is None:
            activation = op.options.get("fused_activation_function", "NONE")
            self.dynamic = ActivationWeights(self, x, w, bias, y, activation)
            return
        activation = op.options.get("fused_activation_function", "NONE")
        self.engine = (backends or backend.select()).for_geometry(self.geometry)
        # Packed once while the weights stay: packing at every call took half of a small FC's time
        # (ResNet-8's 64 -> 10 classifier at batch 64).
        self.memo = WeightMemo()
        if wide.is_wide(w, y):
            args = (self.out_channels, activation, self.profile, mac_profile(self.profile))
            self.wide = wide.prepare(self.error, x, w, y, *args)
            return
        self.stage = OutputStage.prepare(x, w, y, self.out_channels, activation, self.profile)

    def macs(self) -> int:
        return self.rows_per_image * self.out_channels * self.depth

    def workspace_bytes(self, n: int) -> int:
        return (
            n * self.rows_per_image * max(self.depth * 4, self.out_channels * 8)
        )  # float32 rows; exact products

    def __call__(self, x, w, b=None, shared=False):
        """shared=True: x is one batch seen by every weight group (output: G times the batch)."""
        if self.int16 is not None:
            if w.ndim != 2:
                raise self.error("grouped weights are not supported with int16 activations")
            acc = x.reshape(-1, self.depth).astype(np.int64) @ w.astype(np.int64).T
            return self.int16(acc, b).reshape((-1,) + self.out_shape)
        if self.dynamic is not None:
            return self.dynamic(x.reshape(-1, self.depth), w, b).reshape((-1,) + self.out_shape)
        rows = x.reshape(-1, 1, 1, self.depth)
        if self.wide is not None:
            if w.ndim != 2:
                raise self.error("grouped weights are not supported with a filter zero point or int32 output")
            out = self.wide(
                rows,
                w.reshape(self.out_channels, 1, 1, self.depth),
                b,
                self.inputs[0].zero_point,
                self.geometry,
            )
            return out.reshape((-1,) + self.out_shape)
        wg = w if w.ndim == 3 else w[None]
        filters = wg.reshape(wg.shape[0], self.out_channels, 1, 1, self.depth)
        out = self.engine.convolve(
            self.geometry,
            rows,
            filters,
            b,
            self.inputs[0].zero_point,
            self.stage,
            mac_profile(self.profile),
            shared,
            memo=self.memo if wg.shape[0] == 1 else None,
        )
        return out.reshape((-1,) + self.out_shape)
