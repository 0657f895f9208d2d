"""The ops of the trainable suffix in float, each with a hand-written backward pass, for the
back-propagation baseline (float_suffix.py, backprop.py).

Each FloatOp computes its int8 op's real-valued counterpart: MAC ops with dequantized weights and
biases, every output of a MAC op, ADD, pool or MEAN clamped to the real range its int8 tensor can
hold, intersected with the fused activation, exactly the clamp the int8 graph applies; padding is a
real zero, which is what padding with the zero point means in int8. Rounding is the only thing left
out.
"""

from __future__ import annotations

import numpy as np

from npusim.engines.geometry import ConvGeometry
from npusim.graph import Graph, Op
from npusim.quant import activation_range

INT8_MIN, INT8_MAX = -128, 127


# ----------------------------------------------------------------------------------------------
# Helpers shared by the sliding-window ops


def _real_range(tensor, lo: int = INT8_MIN, hi: int = INT8_MAX) -> tuple[float, float] | None:
    """[scale*(lo - zp), scale*(hi - zp)] of an int8 tensor: what its values can represent."""
    if tensor.quant is None or tensor.dtype != np.int8:
        return None
    s, zp = float(tensor.quant.scale[0]), int(tensor.quant.zero_point[0])
    return s * (lo - zp), s * (hi - zp)


def _pad_spatial(x, pad_top, pad_left, out_h, out_w, kh, kw, sh, sw, dh, dw, value=0.0):
    """x [N, H, W, C] padded so that every window tap of the op lies inside the array."""
    _, h, w, _ = x.shape
    bottom = max((out_h - 1) * sh + (kh - 1) * dh + 1 - h - pad_top, 0)
    right = max((out_w - 1) * sw + (kw - 1) * dw + 1 - w - pad_left, 0)
    if pad_top == pad_left == bottom == right == 0:
        return x
    return np.pad(x, ((0, 0), (pad_top, bottom), (pad_left, right), (0, 0)), constant_values=value)


def _tap(xp, ky, kx, out_h, out_w, sh, sw, dh, dw):
    """The view of padded input xp that tap (ky, kx) of every output window reads: [N, out_h, out_w, C]."""
    y0, x0 = ky * dh, kx * dw
    return xp[:, y0 : y0 + (out_h - 1) * sh + 1 : sh, x0 : x0 + (out_w - 1) * sw + 1 : sw, :]


def _unpad(xp, pad_top, pad_left, h, w):
    return xp[:, pad_top : pad_top + h, pad_left : pad_left + w, :]


def _unbroadcast(grad, shape):
    """Sum grad down to shape, undoing numpy broadcasting."""
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


# ----------------------------------------------------------------------------------------------
# Float ops: forward(args) -> (output, saved), backward(saved, dy, wanted) -> one grad per input.
# `args` are the op's inputs in op.inputs order (None for an omitted optional input); `wanted[i]`
# says whether input i needs a gradient. An op reads what it needs from the graph (the op's
# options, its tensors' shapes, quantization and constants; window geometry through npusim's
# ConvGeometry), never from the simulator's prepared kernel.


class FloatOp:
    # Whether the int8 op clamps its output (to the int8 range, narrowed by a fused activation):
    # every op that computes new values; data movement (RESHAPE, PAD, CONCATENATION) cannot leave it.
    clamps = True

    def __init__(self, op: Op, graph: Graph):
        self.op = op
        self.inputs = [graph.tensors[t] if t >= 0 else None for t in op.inputs]
        self.outputs = [graph.tensors[t] for t in op.outputs]
        self.clamp = None  # real (lo, hi) applied to the output, with its gradient mask
        out = self.outputs[0]
        if self.clamps and out.dtype == np.int8 and out.quant is not None:
            lo, hi = activation_range(
                self.op.options.get("fused_activation_function", "NONE"), float(out.scale), out.zero_point
            )
            self.clamp = _real_range(out, lo, hi)

    def forward(self, args):
        raise NotImplementedError

    def backward(self, saved, dy, wanted):
        raise NotImplementedError


class Conv2D(FloatOp):
    """im2col + GEMM; the backward scatters the column gradient back tap by tap (col2im)."""

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.out_channels, kh, kw, _ = self.inputs[1].shape  # filter [O, kh, kw, C]
        self.geometry = g = ConvGeometry.from_options(op.options, self.inputs[0].shape, kh, kw)
        self.sh, self.sw = g.stride
        self.dh, self.dw = g.dilation
        self.pointwise = g.pointwise

    def columns(self, x):
        g = self.geometry
        if self.pointwise:
            return x.reshape(-1, x.shape[3]), None
        xp = _pad_spatial(x, *g.pad, g.out_h, g.out_w, g.kh, g.kw, self.sh, self.sw, self.dh, self.dw)
        cols = np.empty((x.shape[0], g.out_h, g.out_w, g.kh, g.kw, x.shape[3]), dtype=x.dtype)
        for ky in range(g.kh):
            for kx in range(g.kw):
                cols[:, :, :, ky, kx, :] = _tap(
                    xp, ky, kx, g.out_h, g.out_w, self.sh, self.sw, self.dh, self.dw
                )
        return cols.reshape(-1, g.kh * g.kw * x.shape[3]), xp.shape

    def forward(self, args):
        x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
        g = self.geometry
        cols, padded_shape = self.columns(x)
        wm = w.reshape(w.shape[0], -1)
        y = cols @ wm.T
        if b is not None:
            y += b
        return y.reshape(x.shape[0], g.out_h, g.out_w, self.out_channels), (x.shape, cols, padded_shape, w)

    def backward(self, saved, dy, wanted):
        x_shape, cols, padded_shape, w = saved
        g = self.geometry
        dyf = dy.reshape(-1, self.out_channels)
        grads = [None] * len(wanted)
        if len(wanted) > 1 and wanted[1]:
            grads[1] = (dyf.T @ cols).reshape(w.shape)
        if len(wanted) > 2 and wanted[2]:
            grads[2] = dyf.sum(axis=0)
        if wanted[0]:
            dcols = dyf @ w.reshape(w.shape[0], -1)
            if self.pointwise:
                grads[0] = dcols.reshape(x_shape)
            else:
                dcols = dcols.reshape(x_shape[0], g.out_h, g.out_w, g.kh, g.kw, x_shape[3])
                dxp = np.zeros(padded_shape, dtype=dy.dtype)
                for ky in range(g.kh):
                    for kx in range(g.kw):
                        _tap(dxp, ky, kx, g.out_h, g.out_w, self.sh, self.sw, self.dh, self.dw)[...] += dcols[
                            :, :, :, ky, kx, :
                        ]
                grads[0] = _unpad(dxp, *g.pad, x_shape[1], x_shape[2])
        return grads


class DepthwiseConv2D(FloatOp):
    """Output channel ic * multiplier + m reads input channel ic: the input is repeated along the
    channel axis, then each tap is an elementwise multiply-add."""

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        x = self.inputs[0]
        _, kh, kw, self.out_channels = self.inputs[1].shape  # filter [1, kh, kw, C * multiplier]
        self.multiplier = self.out_channels // x.shape[3]
        self.geometry = g = ConvGeometry.from_options(op.options, x.shape, kh, kw)
        self.sh, self.sw = g.stride
        self.dh, self.dw = g.dilation

    def forward(self, args):
        x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
        g = self.geometry
        xr = np.repeat(x, self.multiplier, axis=3) if self.multiplier > 1 else x
        xp = _pad_spatial(xr, *g.pad, g.out_h, g.out_w, g.kh, g.kw, self.sh, self.sw, self.dh, self.dw)
        y = np.zeros((x.shape[0], g.out_h, g.out_w, self.out_channels), dtype=x.dtype)
        for ky in range(g.kh):
            for kx in range(g.kw):
                y += _tap(xp, ky, kx, g.out_h, g.out_w, self.sh, self.sw, self.dh, self.dw) * w[0, ky, kx]
        if b is not None:
            y += b
        return y, (x.shape, xp, w)

    def backward(self, saved, dy, wanted):
        x_shape, xp, w = saved
        g = self.geometry
        grads = [None] * len(wanted)
        taps = [(ky, kx) for ky in range(g.kh) for kx in range(g.kw)]
        if len(wanted) > 1 and wanted[1]:
            dw = np.empty_like(w)
            for ky, kx in taps:
                dw[0, ky, kx] = np.einsum(
                    "nhwc,nhwc->c", _tap(xp, ky, kx, g.out_h, g.out_w, self.sh, self.sw, self.dh, self.dw), dy
                )
            grads[1] = dw
        if len(wanted) > 2 and wanted[2]:
            grads[2] = dy.sum(axis=(0, 1, 2))
        if wanted[0]:
            dxp = np.zeros(xp.shape, dtype=dy.dtype)
            for ky, kx in taps:
                _tap(dxp, ky, kx, g.out_h, g.out_w, self.sh, self.sw, self.dh, self.dw)[...] += (
                    dy * w[0, ky, kx]
                )
            dxr = _unpad(dxp, *g.pad, x_shape[1], x_shape[2])
            if self.multiplier > 1:
                dxr = dxr.reshape(x_shape + (self.multiplier,)).sum(axis=4)
            grads[0] = dxr
        return grads


class FullyConnected(FloatOp):
    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.out_channels, self.depth = self.inputs[1].shape  # weights [O, K]; the input in rows of K
        self.out_shape = tuple(self.outputs[0].shape[1:])

    def forward(self, args):
        x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
        x2 = x.reshape(-1, self.depth)
        y = x2 @ w.T
        if b is not None:
            y += b
        return y.reshape((-1,) + self.out_shape), (x.shape, x2, w)

    def backward(self, saved, dy, wanted):
        x_shape, x2, w = saved
        dyf = dy.reshape(-1, w.shape[0])
        grads = [None] * len(wanted)
        if len(wanted) > 1 and wanted[1]:
            grads[1] = dyf.T @ x2
        if len(wanted) > 2 and wanted[2]:
            grads[2] = dyf.sum(axis=0)
        if wanted[0]:
            grads[0] = (dyf @ w).reshape(x_shape)
        return grads


class Add(FloatOp):
    def forward(self, args):
        a, b = args
        return a + b, (a.shape, b.shape)

    def backward(self, saved, dy, wanted):
        return [_unbroadcast(dy, shape) if want else None for shape, want in zip(saved, wanted)]


def _pool_geometry(op: Op, x) -> ConvGeometry:
    """A pool's window: Pool2DOptions name the window filter_height x filter_width (no dilation)."""
    o = op.options
    return ConvGeometry.from_options(o, x.shape, int(o["filter_height"]), int(o["filter_width"]))


class AveragePool2D(FloatOp):
    """Only taps inside the image count (TFLite's reference pooling): divide by the in-image count."""

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.geometry = _pool_geometry(op, self.inputs[0])
        ones = np.ones((1,) + tuple(int(d) for d in self.inputs[0].shape[1:3]) + (1,))
        self.count = self._window_sum(ones)[0]

    def _window_sum(self, x):
        g = self.geometry
        xp = _pad_spatial(x, *g.pad, g.out_h, g.out_w, g.kh, g.kw, *g.stride, 1, 1)
        total = np.zeros((x.shape[0], g.out_h, g.out_w, x.shape[3]), dtype=x.dtype)
        for ky in range(g.kh):
            for kx in range(g.kw):
                total += _tap(xp, ky, kx, g.out_h, g.out_w, *g.stride, 1, 1)
        return total, xp.shape

    def forward(self, args):
        x = args[0]
        total, padded_shape = self._window_sum(x)
        return total / self.count.astype(x.dtype), (x.shape, padded_shape)

    def backward(self, saved, dy, wanted):
        g = self.geometry
        x_shape, padded_shape = saved
        if not wanted[0]:
            return [None]
        d = dy / self.count.astype(dy.dtype)
        dxp = np.zeros(padded_shape, dtype=dy.dtype)
        for ky in range(g.kh):
            for kx in range(g.kw):
                _tap(dxp, ky, kx, g.out_h, g.out_w, *g.stride, 1, 1)[...] += d
        return [_unpad(dxp, *g.pad, x_shape[1], x_shape[2])]


class MaxPool2D(FloatOp):
    """Padding is -inf (taps outside the image never win); the gradient goes to the first maximum."""

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.geometry = _pool_geometry(op, self.inputs[0])

    def forward(self, args):
        x = args[0]
        g = self.geometry
        xp = _pad_spatial(x, *g.pad, g.out_h, g.out_w, g.kh, g.kw, *g.stride, 1, 1, value=-np.inf)
        taps = np.stack(
            [_tap(xp, ky, kx, g.out_h, g.out_w, *g.stride, 1, 1) for ky in range(g.kh) for kx in range(g.kw)]
        )
        winner = taps.argmax(axis=0)
        return np.take_along_axis(taps, winner[None], axis=0)[0], (x.shape, xp.shape, winner)

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None]
        x_shape, padded_shape, winner = saved
        g = self.geometry
        dxp = np.zeros(padded_shape, dtype=dy.dtype)
        for t in range(g.kh * g.kw):
            ky, kx = divmod(t, g.kw)
            _tap(dxp, ky, kx, g.out_h, g.out_w, *g.stride, 1, 1)[...] += np.where(winner == t, dy, 0)
        return [_unpad(dxp, *g.pad, x_shape[1], x_shape[2])]


class Mean(FloatOp):
    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        shape = tuple(int(d) for d in self.inputs[0].shape)
        # The axes tensor as TFLite's ResolveAxis reads it: negative axes count from the end,
        # duplicates are dropped.
        axes: list[int] = []
        for a in np.asarray(self.inputs[1].data).ravel().tolist():
            a = a + len(shape) if a < 0 else a
            if a not in axes:
                axes.append(a)
        self.axes = tuple(sorted(axes))
        self.count = int(np.prod([shape[a] for a in self.axes], dtype=np.int64))
        self.out_image_shape = tuple(int(d) for d in self.outputs[0].shape[1:])

    def forward(self, args):
        x = args[0]
        return x.mean(axis=self.axes).reshape((x.shape[0],) + self.out_image_shape), x.shape

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None]
        x_shape = saved
        kept = tuple(1 if i in self.axes else d for i, d in enumerate(x_shape))
        return [np.broadcast_to(dy.reshape(kept) / self.count, x_shape)] + [None] * (len(wanted) - 1)


class Reshape(FloatOp):
    clamps = False

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.per_image = tuple(self.outputs[0].shape[1:])

    def forward(self, args):
        x = args[0]
        return x.reshape((x.shape[0],) + self.per_image), x.shape

    def backward(self, saved, dy, wanted):
        return [dy.reshape(saved) if wanted[0] else None] + [None] * (len(wanted) - 1)


class Pad(FloatOp):
    clamps = False

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.paddings = self.inputs[1].data.astype(np.int64).reshape(-1, 2)  # [rank, (before, after)]
        out = self.outputs[0]
        # The int8 pad value (the zero point, or PADV2's constant) as a real number.
        value = self.inputs[2] if len(self.inputs) > 2 else None
        code = (
            value.data.reshape(-1)[0] if value is not None else out.zero_point if out.dtype == np.int8 else 0
        )
        self.value = (
            float(out.scale) * (int(code) - out.zero_point)
            if out.dtype == np.int8 and out.quant
            else float(code)
        )

    def forward(self, args):
        x = args[0]
        return np.pad(x, [tuple(p) for p in self.paddings], constant_values=self.value), x.shape

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None] * len(wanted)
        index = tuple(slice(int(p[0]), int(p[0]) + n) for p, n in zip(self.paddings, saved))
        return [dy[index]] + [None] * (len(wanted) - 1)


class Concatenation(FloatOp):
    clamps = False

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.axis = int(op.options.get("axis", 0)) % len(self.outputs[0].shape)

    def forward(self, args):
        n = max(x.shape[0] for x, t in zip(args, self.inputs) if t.data is None)
        xs = [
            np.broadcast_to(x, (n,) + x.shape[1:]) if t.data is not None else x
            for x, t in zip(args, self.inputs)
        ]
        return np.concatenate(xs, axis=self.axis), [x.shape[self.axis] for x in xs]

    def backward(self, saved, dy, wanted):
        parts = np.split(dy, np.cumsum(saved)[:-1], axis=self.axis)
        return [p if want else None for p, want in zip(parts, wanted)]


FLOAT_OPS = {
    "CONV_2D": Conv2D,
    "DEPTHWISE_CONV_2D": DepthwiseConv2D,
    "FULLY_CONNECTED": FullyConnected,
    "ADD": Add,
    "AVERAGE_POOL_2D": AveragePool2D,
    "MAX_POOL_2D": MaxPool2D,
    "MEAN": Mean,
    "RESHAPE": Reshape,
    "PAD": Pad,
    "PADV2": Pad,
    "CONCATENATION": Concatenation,
}
