"""BATCH_MATMUL, int8 x int8 -> int8 (TFLM micro/kernels/batch_matmul.cc, batch_matmul_common.cc
and reference_ops::BatchMatMul).

out[..., i, j] = clamp(MBQM(sum_k (L[..., i, k] - z_L) * (R[..., k, j] - z_R), M, s) + z_out, -128,
127), with (M, s) = QuantizeMultiplier(double(s_L) * double(s_R) / double(s_out)); adj_x / adj_y
transpose the last two axes of L / R first, and the batch axes broadcast (numpy rules, rank <= 5).
TFLM accumulates in int32: a depth whose sum could overflow it is refused. The products are summed
exactly in float64 (|sum| < 2^53) by BLAS, then requantized in compiled code. The xnnpack
profile requantizes in float32 as XNNPACK does when LiteRT's delegate takes the op (z_R = 0).
"""

from __future__ import annotations

import numpy as np

from ..kernels.elementwise import requantize_array
from ..kernels.requant import requantization_multiplier
from ..profiles import profile_of
from ..quant import TFLM
from .base import Kernel, broadcast_crossing
from .float_form import FloatForm, real

MAX_RANK = 5
MAX_DEPTH = (2**31 - 1) // (255 * 255)  # no int32 accumulator overflow whatever the data


class BatchMatMulFloat(FloatForm):
    """lhs @ rhs over the last two axes (each transposed first under adj_x, adj_y), the leading
    axes broadcast (LiteRT's BatchMatMul), in float32."""

    def __init__(self, op, graph):
        super().__init__(op, graph)
        self.adj_x = bool(op.options.get("adj_x", False))
        self.adj_y = bool(op.options.get("adj_y", False))
        self.crosses_batch = broadcast_crossing(self.inputs, self.outputs[0], core=2)

    def __call__(self, lhs, rhs):
        a, b = real(lhs), real(rhs)
        if self.adj_x:
            a = np.swapaxes(a, -1, -2)
        if self.adj_y:
            b = np.swapaxes(b, -1, -2)
        return np.ascontiguousarray(np.matmul(a, b))


class BatchMatMul(Kernel):
    kind = "BATCH_MATMUL"
    float_form = BatchMatMulFloat
    required_inputs, max_inputs = 2, 2

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        lhs, rhs = self.inputs
        y = self.outputs[0]
        self.require_int8(lhs, rhs, y)
        for t in (lhs, rhs, y):
            if t.quant.per_channel:
                raise self.error(f"tensor {t.name!r} is quantized per channel, expected per-tensor")
        for t in (lhs, rhs):
            if not 2 <= len(t.shape) <= MAX_RANK:
                raise self.error(f"operand {t.name!r} has rank {len(t.shape)}, expected 2 to {MAX_RANK}")
        self.adj_x = bool(op.options.get("adj_x", False))
        self.adj_y = bool(op.options.get("adj_y", False))
        ls, rs = list(lhs.shape), list(rhs.shape)
        if self.adj_x:
            ls[-2], ls[-1] = ls[-1], ls[-2]
        if self.adj_y:
            rs[-2], rs[-1] = rs[-1], rs[-2]
        if ls[-1] != rs[-2]:
            raise self.error(f"inner dimensions differ: {list(lhs.shape)} x {list(rhs.shape)}")
        try:
            batch = np.broadcast_shapes(tuple(ls[:-2]), tuple(rs[:-2]))
        except ValueError:
            raise self.error(
                f"batch axes of {list(lhs.shape)} and {list(rhs.shape)} do not broadcast"
            ) from None
        expected = [*batch, ls[-2], rs[-1]]
        if list(y.shape) != expected:
            raise self.error(f"output shape {list(y.shape)}, expected {expected}")
        # A constant [3, 4, 5] against an activation [1, 2, 4], or an activation of rank 2: valid at
        # the declared shapes, where np.matmul broadcasts as TFLM does (the model runs image by image).
        self.crosses_batch = broadcast_crossing((lhs, rhs), y, core=2)
        self.depth = ls[-1]
        if self.depth > MAX_DEPTH:
            raise self.error(f"depth {self.depth} could overflow TFLM's int32 accumulator")
        s_l, s_r, s_o = (np.float64(t.quant.scale[0]) for t in (lhs, rhs, y))
        self.m, self.shift = requantization_multiplier(float(s_l * s_r / s_o))
        with np.errstate(over="ignore", under="ignore"):  # the xnnpack profile's float32 scale
            self.real = np.float32(np.float32(s_l) * np.float32(s_r) / np.float32(s_o))
        self.zl, self.zr, self.zo = lhs.zero_point, rhs.zero_point, y.zero_point
        # LiteRT's XNNPACK delegate takes BATCH_MATMUL only with a right operand of zero point 0 (its
        # qs8 weights are symmetric); else LiteRT's builtin kernel runs, which rounds as TFLM does.
        self.profile = TFLM if profile_of(profile).xnnpack_delegate and self.zr != 0 else profile
        self.out_image = tuple(y.shape[1:])

    def macs(self) -> int:
        return int(np.prod(self.out_image, dtype=np.int64)) * self.depth

    def workspace_bytes(self, n: int) -> int:
        return 8 * n * int(np.prod(self.out_image, dtype=np.int64))

    def __call__(self, lhs, rhs):
        a = lhs.astype(np.float64) - self.zl
        b = rhs.astype(np.float64) - self.zr
        if self.adj_x:
            a = np.swapaxes(a, -1, -2)
        if self.adj_y:
            b = np.swapaxes(b, -1, -2)
        acc = np.ascontiguousarray(np.matmul(a, b))  # exact: integers below 2^53
        out = np.empty(acc.shape, dtype=np.int8)
        return requantize_array(
            acc,
            np.int64(self.m),
            np.int64(self.shift),
            self.real,
            np.int64(self.profile),
            np.int64(self.zo),
            out,
        )
