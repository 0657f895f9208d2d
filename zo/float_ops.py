"""The ops of the trainable suffix in float, for the back-propagation baseline (float_suffix.py,
backprop.py): forward is npusim's float form of the op (npusim/ops/float_form.py, one float
definition per op for npusim validate and zo alike), and each op here adds its hand-written backward.

On the int8 graph a float form is the op's real-valued meaning: MAC ops on dequantized weights and
biases, padding with a real zero (what padding with the zero point means in int8), the fused
activation as a clamp. FloatOp adds the one thing the bound needs beyond it: every output of a MAC
op, ADD, pool or MEAN clamped to the real range its int8 tensor can hold, intersected with the fused
activation, exactly the clamp the int8 graph applies (FloatSuffix applies it, with its gradient
mask). Rounding is the only thing left out.
"""

from __future__ import annotations

import numpy as np

from npusim.graph import Graph, Op
from npusim.ops import KERNELS
from npusim.ops.float_form import columns, pad_spatial, tap
from npusim.quant import activation_range

INT8_MIN, INT8_MAX = -128, 127


# ----------------------------------------------------------------------------------------------
# Helpers of the backward passes


def _real_range(tensor, lo: int = INT8_MIN, hi: int = INT8_MAX) -> tuple[float, float] | None:
    """[scale*(lo - zp), scale*(hi - zp)] of an int8 tensor: what its values can represent."""
    if tensor.quant is None or tensor.dtype != np.int8:
        return None
    s, zp = float(tensor.quant.scale[0]), int(tensor.quant.zero_point[0])
    return s * (lo - zp), s * (hi - zp)


def _padded_shape(x_shape, g) -> tuple:
    """The shape pad_spatial gives an input of x_shape for geometry g."""
    (sh, sw), (dh, dw), (top, left) = g.stride, g.dilation, g.pad
    n, h, w, c = x_shape
    bottom = max((g.out_h - 1) * sh + (g.kh - 1) * dh + 1 - h - top, 0)
    right = max((g.out_w - 1) * sw + (g.kw - 1) * dw + 1 - w - left, 0)
    return (n, h + top + bottom, w + left + right, c)


def _unpad(xp, g, h, w):
    top, left = g.pad
    return xp[:, top : top + h, left : left + w, :]


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
# says whether input i needs a gradient. Forward is the op's npusim float form, which reads the
# op's options, shapes and geometry from the graph, never from the simulator's prepared kernel.


class FloatOp:
    # Whether the int8 op clamps its output (to the int8 range, narrowed by a fused activation):
    # every op that computes new values; data movement (RESHAPE, PAD, CONCATENATION) cannot leave it.
    clamps = True

    def __init__(self, op: Op, graph: Graph):
        self.op = op
        self.form = KERNELS[op.kind].float_form(op, graph)
        self.inputs = self.form.inputs
        self.outputs = self.form.outputs
        self.clamp = None  # real (lo, hi) applied to the output, with its gradient mask
        out = self.outputs[0]
        if self.clamps and out.dtype == np.int8 and out.quant is not None:
            lo, hi = activation_range(
                self.op.options.get("fused_activation_function", "NONE"), float(out.scale), out.zero_point
            )
            self.clamp = _real_range(out, lo, hi)
            # That clamp holds the fused activation in the int8 tensor's own steps (RELU6 stops at
            # scale * round(6 / scale), not at 6.0): it replaces the form's real-valued one.
            self.form.lo = self.form.hi = None

    @property
    def out_channels(self) -> int:
        """A MAC op's output channels: the last axis of its output (NHWC, or [rows, units])."""
        return int(self.outputs[0].shape[-1])

    def forward(self, args):
        return self.form(*args), self.saved(args)

    def saved(self, args):
        """What backward needs of the forward's inputs."""
        return args

    def backward(self, saved, dy, wanted):
        raise NotImplementedError


class Conv2D(FloatOp):
    """The backward scatters the column gradient back tap by tap (col2im)."""

    def saved(self, args):
        return args[0], args[1]

    def backward(self, saved, dy, wanted):
        x, w = saved
        g = self.form.geometry
        dyf = dy.reshape(-1, w.shape[0])
        grads = [None] * len(wanted)
        if len(wanted) > 1 and wanted[1]:
            grads[1] = (dyf.T @ columns(x, g)).reshape(w.shape)
        if len(wanted) > 2 and wanted[2]:
            grads[2] = dyf.sum(axis=0)
        if wanted[0]:
            dcols = dyf @ w.reshape(w.shape[0], -1)
            if g.pointwise:
                grads[0] = dcols.reshape(x.shape)
            else:
                dcols = dcols.reshape(x.shape[0], g.out_h, g.out_w, g.kh, g.kw, x.shape[3])
                dxp = np.zeros(_padded_shape(x.shape, g), dtype=dy.dtype)
                for ky in range(g.kh):
                    for kx in range(g.kw):
                        tap(dxp, g, ky, kx)[...] += dcols[:, :, :, ky, kx, :]
                grads[0] = _unpad(dxp, g, x.shape[1], x.shape[2])
        return grads


class DepthwiseConv2D(FloatOp):
    """Output channel ic * multiplier + m reads input channel ic (the input repeated along the
    channels): the gradient of each tap's elementwise multiply-add, summed back over the repeats."""

    def saved(self, args):
        return args[0], args[1]

    def backward(self, saved, dy, wanted):
        x, w = saved
        g, m = self.form.geometry, self.form.multiplier
        xp = pad_spatial(np.repeat(x, m, axis=3) if m > 1 else x, g)
        grads = [None] * len(wanted)
        taps = [(ky, kx) for ky in range(g.kh) for kx in range(g.kw)]
        if len(wanted) > 1 and wanted[1]:
            dw = np.empty_like(w)
            for ky, kx in taps:
                dw[0, ky, kx] = np.einsum("nhwc,nhwc->c", tap(xp, g, ky, kx), dy)
            grads[1] = dw
        if len(wanted) > 2 and wanted[2]:
            grads[2] = dy.sum(axis=(0, 1, 2))
        if wanted[0]:
            dxp = np.zeros(xp.shape, dtype=dy.dtype)
            for ky, kx in taps:
                tap(dxp, g, ky, kx)[...] += dy * w[0, ky, kx]
            dxr = _unpad(dxp, g, x.shape[1], x.shape[2])
            if m > 1:
                dxr = dxr.reshape(x.shape + (m,)).sum(axis=4)
            grads[0] = dxr
        return grads


class FullyConnected(FloatOp):
    def saved(self, args):
        return args[0], args[1]

    def backward(self, saved, dy, wanted):
        x, w = saved
        x2 = x.reshape(-1, self.form.depth)
        dyf = dy.reshape(-1, w.shape[0])
        grads = [None] * len(wanted)
        if len(wanted) > 1 and wanted[1]:
            grads[1] = dyf.T @ x2
        if len(wanted) > 2 and wanted[2]:
            grads[2] = dyf.sum(axis=0)
        if wanted[0]:
            grads[0] = (dyf @ w).reshape(x.shape)
        return grads


class Add(FloatOp):
    def saved(self, args):
        return [np.shape(a) for a in args]

    def backward(self, saved, dy, wanted):
        return [_unbroadcast(dy, shape) if want else None for shape, want in zip(saved, wanted)]


class AveragePool2D(FloatOp):
    """Only taps inside the image count (TFLite's reference pooling): divide by the in-image count."""

    def saved(self, args):
        return args[0].shape

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None]
        g = self.form.geometry
        d = dy / self.form.count.astype(dy.dtype)
        dxp = np.zeros(_padded_shape(saved, g), dtype=dy.dtype)
        for ky in range(g.kh):
            for kx in range(g.kw):
                tap(dxp, g, ky, kx)[...] += d
        return [_unpad(dxp, g, saved[1], saved[2])]


class MaxPool2D(FloatOp):
    """Padding is -inf (taps outside the image never win); the gradient goes to the first maximum."""

    def saved(self, args):
        return args[0]

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None]
        x = saved
        g = self.form.geometry
        xp, taps = self.form.windows(x, -np.inf)
        winner = np.stack(taps).argmax(axis=0)
        dxp = np.zeros(xp.shape, dtype=dy.dtype)
        for t in range(g.kh * g.kw):
            ky, kx = divmod(t, g.kw)
            tap(dxp, g, ky, kx)[...] += np.where(winner == t, dy, 0)
        return [_unpad(dxp, g, x.shape[1], x.shape[2])]


class Mean(FloatOp):
    def saved(self, args):
        return args[0].shape

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None]
        axes = self.form.axes
        count = int(np.prod([saved[a] for a in axes], dtype=np.int64))
        kept = tuple(1 if i in axes else d for i, d in enumerate(saved))
        return [np.broadcast_to(dy.reshape(kept) / count, saved)] + [None] * (len(wanted) - 1)


class Reshape(FloatOp):
    clamps = False

    def saved(self, args):
        return args[0].shape

    def backward(self, saved, dy, wanted):
        return [dy.reshape(saved) if wanted[0] else None] + [None] * (len(wanted) - 1)


class Pad(FloatOp):
    clamps = False

    def saved(self, args):
        return args[0].shape

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None] * len(wanted)
        paddings = self.form.kernel.paddings
        index = tuple(slice(int(p[0]), int(p[0]) + n) for p, n in zip(paddings, saved))
        return [dy[index]] + [None] * (len(wanted) - 1)


class Concatenation(FloatOp):
    clamps = False

    def saved(self, args):
        return [t.shape[self.form.kernel.axis] for t in self.inputs]

    def backward(self, saved, dy, wanted):
        axis = self.form.kernel.axis
        parts = np.split(dy, np.cumsum(saved)[:-1], axis=axis)
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
