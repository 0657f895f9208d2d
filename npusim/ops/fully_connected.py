"""FULLY_CONNECTED: int8 matrix-vector product (TFLM reference_integer_ops/fully_connected.h).

The input is flattened to [N, K] per image; per-tensor or per-channel weight scales. Weights may
carry a leading group axis [G, O, K] (bias [G, O]) as in conv.py. Eval is a 1x1 convolution of one
pixel per row on the MAC engine that the backend selection picks (engines/backend.py).
"""

from __future__ import annotations

import numpy as np

from ..engines import backend
from ..engines.geometry import ConvGeometry
from ..engines.int16 import Stage16, is_int16
from ..engines.requant import OutputStage
from ..quant import mac_profile
from .base import Kernel, WeightMemo
from .float_form import FloatForm, real


class FullyConnectedFloat(FloatForm):
    """Rows of K input values times the weights [O, K] plus the bias (float32, as LiteRT's float
    FullyConnected), shaped as the output tensor."""

    mac_inputs = (0, 1, 2)

    def __init__(self, op, graph):
        super().__init__(op, graph)
        self.depth = self.inputs[1].shape[1]
        self.out_shape = tuple(self.outputs[0].shape[1:])

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
        if not is_int16(x):
            self.require_int8(x, w, y)
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
        if is_int16(x):  # 16x8: int16 activations, int8 weights (engines/int16.py)
            activation = op.options.get("fused_activation_function", "NONE")
            self.int16 = Stage16.prepare(self, x, w, bias, y, self.out_channels, activation)
            return
        self.stage = OutputStage.prepare(
            x, w, y, self.out_channels, op.options.get("fused_activation_function", "NONE"), self.profile
        )
        self.engine = (backends or backend.select()).for_geometry(self.geometry)
        # Packed once while the weights stay: packing at every call took half of a small FC's time
        # (ResNet-8's 64 -> 10 classifier at batch 64).
        self.memo = WeightMemo()

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
        wg = w if w.ndim == 3 else w[None]
        rows = x.reshape(-1, 1, 1, self.depth)
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
