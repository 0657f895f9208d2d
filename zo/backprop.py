"""The back-propagation upper bound that ZO results are reported beside: the same trainable layers,
trained in float with exact gradients.

FloatSuffix re-implements a TrainableModel's trainable suffix (the ops from the first trainable
layer to the logits) in float32/float64 numpy with a hand-written backward pass. It reads the
dequantized boundary activations, scale * (q - zero_point), and computes with dequantized weights
(per channel along the tensor's quantized dimension: axis 0 for CONV_2D and FULLY_CONNECTED, axis 3
for DEPTHWISE_CONV_2D) and biases (scale in_scale * w_scale: one accumulator LSB). Every output of a
MAC op, ADD, pool or MEAN is clamped to the real range its int8 tensor can hold, intersected with the
fused activation, exactly the clamp the int8 graph applies; padding is a real zero, which is what
padding with the zero point means in int8. Rounding is the only thing left out, so the float logits
match npusim's up to quantization error (tests/test_backprop.py).

backprop_baseline trains the float copies of the trainable tensors with mini-batch Adam on the
cross-entropy of the logits (zo/loss.py, the ZO trainer's loss), then writes them back into the int8
model with the deployed scales fixed, as the ZO trainer does, and measures both.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np

from npusim.ops import MAC_OPS as MAC_KINDS
from npusim.quant import activation_range

from .errors import ZoError
from .loss import cross_entropy
from .model import TrainableModel
from .optim import OPTIMIZERS, SCHEDULES, learning_rate

INT8_MIN, INT8_MAX = -128, 127
try:  # optional: caps the BLAS threads of the training loop
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover - then the BLAS keeps its own thread count
    threadpool_limits = None

# lr by coordinate units (see backprop_baseline) and optimizer.
DEFAULT_LR = {"steps": {"adam": 1.0, "sgd": 10.0}, "real": {"adam": 1e-3, "sgd": 1e-2}}


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
# says whether input i needs a gradient.


class FloatOp:
    # Whether the int8 op clamps its output (to the int8 range, narrowed by a fused activation):
    # every op that computes new values; data movement (RESHAPE, PAD, CONCATENATION) cannot leave it.
    clamps = True

    def __init__(self, kernel):
        self.kernel = kernel
        self.op = kernel.op
        self.clamp = None  # real (lo, hi) applied to the output, with its gradient mask
        out = kernel.outputs[0]
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

    def __init__(self, kernel):
        super().__init__(kernel)
        o = kernel.options
        self.sh, self.sw = o.get("stride_h", 1), o.get("stride_w", 1)
        self.dh, self.dw = o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)
        self.pointwise = (kernel.kh, kernel.kw, self.sh, self.sw, kernel.pad_top, kernel.pad_left) == (
            1,
            1,
            1,
            1,
            0,
            0,
        )

    def columns(self, x):
        k = self.kernel
        if self.pointwise:
            return x.reshape(-1, x.shape[3]), None
        xp = _pad_spatial(
            x, k.pad_top, k.pad_left, k.out_h, k.out_w, k.kh, k.kw, self.sh, self.sw, self.dh, self.dw
        )
        cols = np.empty((x.shape[0], k.out_h, k.out_w, k.kh, k.kw, x.shape[3]), dtype=x.dtype)
        for ky in range(k.kh):
            for kx in range(k.kw):
                cols[:, :, :, ky, kx, :] = _tap(
                    xp, ky, kx, k.out_h, k.out_w, self.sh, self.sw, self.dh, self.dw
                )
        return cols.reshape(-1, k.kh * k.kw * x.shape[3]), xp.shape

    def forward(self, args):
        x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
        k = self.kernel
        cols, padded_shape = self.columns(x)
        wm = w.reshape(w.shape[0], -1)
        y = cols @ wm.T
        if b is not None:
            y += b
        return y.reshape(x.shape[0], k.out_h, k.out_w, k.out_channels), (x.shape, cols, padded_shape, w)

    def backward(self, saved, dy, wanted):
        x_shape, cols, padded_shape, w = saved
        k = self.kernel
        dyf = dy.reshape(-1, k.out_channels)
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
                dcols = dcols.reshape(x_shape[0], k.out_h, k.out_w, k.kh, k.kw, x_shape[3])
                dxp = np.zeros(padded_shape, dtype=dy.dtype)
                for ky in range(k.kh):
                    for kx in range(k.kw):
                        _tap(dxp, ky, kx, k.out_h, k.out_w, self.sh, self.sw, self.dh, self.dw)[...] += dcols[
                            :, :, :, ky, kx, :
                        ]
                grads[0] = _unpad(dxp, k.pad_top, k.pad_left, x_shape[1], x_shape[2])
        return grads


class DepthwiseConv2D(FloatOp):
    """Output channel ic * multiplier + m reads input channel ic: the input is repeated along the
    channel axis, then each tap is an elementwise multiply-add."""

    def __init__(self, kernel):
        super().__init__(kernel)
        o = kernel.options
        self.sh, self.sw = o.get("stride_h", 1), o.get("stride_w", 1)
        self.dh, self.dw = o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)

    def forward(self, args):
        x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
        k = self.kernel
        xr = np.repeat(x, k.multiplier, axis=3) if k.multiplier > 1 else x
        xp = _pad_spatial(
            xr, k.pad_top, k.pad_left, k.out_h, k.out_w, k.kh, k.kw, self.sh, self.sw, self.dh, self.dw
        )
        y = np.zeros((x.shape[0], k.out_h, k.out_w, k.out_channels), dtype=x.dtype)
        for ky in range(k.kh):
            for kx in range(k.kw):
                y += _tap(xp, ky, kx, k.out_h, k.out_w, self.sh, self.sw, self.dh, self.dw) * w[0, ky, kx]
        if b is not None:
            y += b
        return y, (x.shape, xp, w)

    def backward(self, saved, dy, wanted):
        x_shape, xp, w = saved
        k = self.kernel
        grads = [None] * len(wanted)
        taps = [(ky, kx) for ky in range(k.kh) for kx in range(k.kw)]
        if len(wanted) > 1 and wanted[1]:
            dw = np.empty_like(w)
            for ky, kx in taps:
                dw[0, ky, kx] = np.einsum(
                    "nhwc,nhwc->c", _tap(xp, ky, kx, k.out_h, k.out_w, self.sh, self.sw, self.dh, self.dw), dy
                )
            grads[1] = dw
        if len(wanted) > 2 and wanted[2]:
            grads[2] = dy.sum(axis=(0, 1, 2))
        if wanted[0]:
            dxp = np.zeros(xp.shape, dtype=dy.dtype)
            for ky, kx in taps:
                _tap(dxp, ky, kx, k.out_h, k.out_w, self.sh, self.sw, self.dh, self.dw)[...] += (
                    dy * w[0, ky, kx]
                )
            dxr = _unpad(dxp, k.pad_top, k.pad_left, x_shape[1], x_shape[2])
            if k.multiplier > 1:
                dxr = dxr.reshape(x_shape + (k.multiplier,)).sum(axis=4)
            grads[0] = dxr
        return grads


class FullyConnected(FloatOp):
    def forward(self, args):
        x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
        x2 = x.reshape(-1, self.kernel.depth)
        y = x2 @ w.T
        if b is not None:
            y += b
        return y.reshape((-1,) + self.kernel.out_shape), (x.shape, x2, w)

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


class AveragePool2D(FloatOp):
    """Only taps inside the image count (TFLite's reference pooling): divide by the in-image count."""

    def __init__(self, kernel):
        super().__init__(kernel)
        k = kernel
        ones = np.ones((1,) + k.in_hw + (1,))
        self.count = self._window_sum(ones)[0]

    def _window_sum(self, x):
        k = self.kernel
        xp = _pad_spatial(x, k.pad_h, k.pad_w, k.out_h, k.out_w, k.kh, k.kw, k.sh, k.sw, 1, 1)
        total = np.zeros((x.shape[0], k.out_h, k.out_w, x.shape[3]), dtype=x.dtype)
        for ky in range(k.kh):
            for kx in range(k.kw):
                total += _tap(xp, ky, kx, k.out_h, k.out_w, k.sh, k.sw, 1, 1)
        return total, xp.shape

    def forward(self, args):
        x = args[0]
        total, padded_shape = self._window_sum(x)
        return total / self.count.astype(x.dtype), (x.shape, padded_shape)

    def backward(self, saved, dy, wanted):
        k = self.kernel
        x_shape, padded_shape = saved
        if not wanted[0]:
            return [None]
        d = dy / self.count.astype(dy.dtype)
        dxp = np.zeros(padded_shape, dtype=dy.dtype)
        for ky in range(k.kh):
            for kx in range(k.kw):
                _tap(dxp, ky, kx, k.out_h, k.out_w, k.sh, k.sw, 1, 1)[...] += d
        return [_unpad(dxp, k.pad_h, k.pad_w, x_shape[1], x_shape[2])]


class MaxPool2D(FloatOp):
    """Padding is -inf (taps outside the image never win); the gradient goes to the first maximum."""

    def forward(self, args):
        x = args[0]
        k = self.kernel
        xp = _pad_spatial(x, k.pad_h, k.pad_w, k.out_h, k.out_w, k.kh, k.kw, k.sh, k.sw, 1, 1, value=-np.inf)
        taps = np.stack(
            [_tap(xp, ky, kx, k.out_h, k.out_w, k.sh, k.sw, 1, 1) for ky in range(k.kh) for kx in range(k.kw)]
        )
        winner = taps.argmax(axis=0)
        return np.take_along_axis(taps, winner[None], axis=0)[0], (x.shape, xp.shape, winner)

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None]
        x_shape, padded_shape, winner = saved
        k = self.kernel
        dxp = np.zeros(padded_shape, dtype=dy.dtype)
        for t in range(k.kh * k.kw):
            ky, kx = divmod(t, k.kw)
            _tap(dxp, ky, kx, k.out_h, k.out_w, k.sh, k.sw, 1, 1)[...] += np.where(winner == t, dy, 0)
        return [_unpad(dxp, k.pad_h, k.pad_w, x_shape[1], x_shape[2])]


class Mean(FloatOp):
    def forward(self, args):
        x = args[0]
        k = self.kernel
        return x.mean(axis=k.axes).reshape((x.shape[0],) + k.out_image_shape), x.shape

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None]
        x_shape = saved
        k = self.kernel
        kept = tuple(1 if i in k.axes else d for i, d in enumerate(x_shape))
        return [np.broadcast_to(dy.reshape(kept) / k.count, x_shape)] + [None] * (len(wanted) - 1)


class Reshape(FloatOp):
    clamps = False

    def forward(self, args):
        x = args[0]
        return x.reshape((x.shape[0],) + self.kernel.per_image), x.shape

    def backward(self, saved, dy, wanted):
        return [dy.reshape(saved) if wanted[0] else None] + [None] * (len(wanted) - 1)


class Pad(FloatOp):
    clamps = False

    def __init__(self, kernel):
        super().__init__(kernel)
        out = kernel.outputs[0]
        # The int8 pad value (the zero point, or PADV2's constant) as a real number.
        self.value = (
            float(out.scale) * (int(kernel.value) - out.zero_point)
            if out.dtype == np.int8 and out.quant
            else float(kernel.value)
        )

    def forward(self, args):
        x = args[0]
        return np.pad(x, [tuple(p) for p in self.kernel.paddings], constant_values=self.value), x.shape

    def backward(self, saved, dy, wanted):
        if not wanted[0]:
            return [None] * len(wanted)
        index = tuple(slice(int(p[0]), int(p[0]) + n) for p, n in zip(self.kernel.paddings, saved))
        return [dy[index]] + [None] * (len(wanted) - 1)


class Concatenation(FloatOp):
    clamps = False

    def forward(self, args):
        k = self.kernel
        n = max(x.shape[0] for x, t in zip(args, k.inputs) if t.data is None)
        xs = [
            np.broadcast_to(x, (n,) + x.shape[1:]) if t.data is not None else x
            for x, t in zip(args, k.inputs)
        ]
        return np.concatenate(xs, axis=k.axis), [x.shape[k.axis] for x in xs]

    def backward(self, saved, dy, wanted):
        parts = np.split(dy, np.cumsum(saved)[:-1], axis=self.kernel.axis)
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


# ----------------------------------------------------------------------------------------------
# The suffix in float


class FloatSuffix:
    """A TrainableModel's trainable suffix in float: forward to the logits, backward to the
    trainable tensors (model.params). Frozen constants of the suffix stay at their dequantized
    deployed values.

    params: {tensor index: float array}, in the tensor's own layout (CONV_2D [O, kh, kw, C],
    DEPTHWISE_CONV_2D [1, kh, kw, C*M], FULLY_CONNECTED [O, K], bias [O]), in real units.
    """

    def __init__(self, model: TrainableModel, dtype=np.float32):
        self.model = model
        self.dtype = np.dtype(dtype)
        graph = model.graph
        tensors = graph.tensors
        self.ops: list[FloatOp] = []
        for k in model.suffix:
            if k.kind not in FLOAT_OPS:
                raise ZoError(
                    f"op {k.op.index} ({k.kind}): no float implementation for the back-propagation baseline "
                    f"(supported: {', '.join(sorted(FLOAT_OPS))})"
                )
            self.ops.append(FLOAT_OPS[k.kind](k))
        # Real value of one integer step of each constant: the weight scale (per channel along the
        # quantized axis) and in_scale * w_scale for a MAC op's bias (one accumulator LSB).
        self.steps: dict[int, np.ndarray] = {}
        self.constants: dict[int, np.ndarray] = {}
        for k in model.suffix:
            for pos, t in enumerate(k.op.inputs):
                if t < 0 or not tensors[t].is_constant or t in self.constants:
                    continue
                tensor = tensors[t]
                if k.kind in MAC_KINDS and pos in (1, 2):
                    step = self._mac_step(k, pos)
                elif tensor.dtype == np.int8 and tensor.quant is not None:
                    step = self._along_axis(tensor, tensor.quant.scale)
                else:
                    continue  # shapes, axes, paddings: read by the prepared kernel, not computed with
                zp = 0 if k.kind in MAC_KINDS else self._along_axis(tensor, tensor.quant.zero_point)
                self.steps[t] = step
                self.constants[t] = ((tensor.data.astype(np.float64) - zp) * step).astype(self.dtype)
        self.trainable = [p.tensor for p in model.params]
        missing = [t for t in self.trainable if t not in self.constants]
        if missing:
            raise ZoError(f"trainable tensors {missing} are not read by the suffix as weights or biases")
        self.params = {t: self.constants[t].copy() for t in self.trainable}
        # Real range each trainable tensor can take when written back: [-127, 127] or int32 steps.
        self.bounds = {p.tensor: p.bound * self.steps[p.tensor] for p in model.params}
        # Activations that depend on a trainable tensor: the only ones the backward pass visits.
        self.needs_grad: set[int] = set()
        for f in self.ops:
            if any(t in self.needs_grad or t in self.params for t in f.op.inputs):
                self.needs_grad.update(f.op.outputs)
        self.logits_tensor = model.logits_tensor
        self.num_classes = model.num_classes

    @staticmethod
    def _along_axis(tensor, values) -> np.ndarray:
        """A per-tensor (size 1) or per-channel quantization field of `tensor`, as float64 shaped
        to broadcast along the tensor's quantized axis."""
        v = values.astype(np.float64)
        if v.size == 1:
            return v.reshape(())
        shape = [1] * len(tensor.shape)
        shape[tensor.quant.axis] = -1
        return v.reshape(shape)

    def _mac_step(self, kernel, pos: int) -> np.ndarray:
        w = kernel.inputs[1]
        if w.quant is None:
            raise ZoError(f"op {kernel.op.index} ({kernel.kind}): weights {w.name!r} have no quantization")
        w_step = self._along_axis(w, w.quant.scale)
        if pos == 1:
            return w_step
        in_scale = np.float64(kernel.inputs[0].quant.scale[0])
        return in_scale * np.broadcast_to(w.quant.scale.astype(np.float64), (kernel.out_channels,))

    # -- data -----------------------------------------------------------------------------------
    def dequantize(self, boundary: dict, index=None) -> dict:
        """Real-valued boundary activations scale * (q - zp), optionally of the rows in index."""
        out = {}
        for t, q in boundary.items():
            tensor = self.model.graph.tensors[t]
            q = q if index is None else q[index]
            out[t] = (q.astype(self.dtype) - self.dtype.type(tensor.zero_point)) * self.dtype.type(
                tensor.scale
            )
        return out

    # -- forward and backward -------------------------------------------------------------------
    def forward(self, inputs: dict, params: dict | None = None, keep: bool = False):
        """Logits [N, num_classes] from real boundary activations; with keep, also the tape that
        backward needs."""
        params = self.params if params is None else params
        values = dict(inputs)
        tape = []
        for f in self.ops:
            args = []
            for t in f.op.inputs:
                if t < 0:
                    args.append(None)
                elif t in params:
                    args.append(params[t])
                elif t in values:
                    args.append(values[t])
                else:
                    args.append(self.constants.get(t))
            y, saved = f.forward(args)
            mask = None
            if f.clamp is not None:
                lo, hi = f.clamp
                if keep:
                    mask = (y > lo) & (y < hi)
                y = np.clip(y, lo, hi)
            values[f.op.outputs[0]] = y
            if keep:
                tape.append((saved, mask, y.shape))
        logits = values[self.logits_tensor].reshape(-1, self.num_classes)
        return (logits, tape) if keep else logits

    def backward(self, tape, dlogits: np.ndarray) -> dict:
        """Gradients of the trainable tensors ({tensor index: array}) given dL/dlogits."""
        grads = {self.logits_tensor: dlogits}
        pgrads = {t: np.zeros_like(v) for t, v in self.params.items()}
        for f, (saved, mask, shape) in zip(reversed(self.ops), reversed(tape)):
            out = f.op.outputs[0]
            if out not in grads:
                continue
            dy = grads.pop(out).reshape(shape)  # the logits arrive as [N, classes] from the loss
            if mask is not None:
                dy = dy * mask
            wanted = [t >= 0 and (t in self.needs_grad or t in pgrads) for t in f.op.inputs]
            if not any(wanted):
                continue
            for t, g in zip(f.op.inputs, f.backward(saved, dy, wanted)):
                if g is None or t < 0:
                    continue
                if t in pgrads:
                    pgrads[t] += g.reshape(pgrads[t].shape)
                elif t in grads:
                    grads[t] = grads[t] + g
                else:
                    grads[t] = g
        return pgrads

    def loss_and_gradient(self, inputs: dict, labels: np.ndarray, params: dict | None = None):
        """Mean cross-entropy of the logits (zo.loss) and its gradient w.r.t. the trainable tensors."""
        logits, tape = self.forward(inputs, params, keep=True)
        z = logits.astype(np.float64)
        losses = cross_entropy(z, labels)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(labels)), labels] -= 1.0
        return float(losses.mean()), self.backward(tape, (p / len(labels)).astype(self.dtype))

    def predict(self, boundary: dict, chunk: int = 512) -> np.ndarray:
        """Float predictions from int8 boundary activations."""
        n = len(next(iter(boundary.values())))
        return np.concatenate(
            [
                self.forward(self.dequantize(boundary, slice(i, i + chunk))).argmax(axis=1)
                for i in range(0, n, chunk)
            ]
        )

    # -- parameters -----------------------------------------------------------------------------
    def int_values(self, params: dict | None = None) -> list[np.ndarray]:
        """The trainable tensors as deployed integers with the scales fixed, in model.params order:
        round to nearest, weights clamped to [-127, 127], biases to int32."""
        params = self.params if params is None else params
        out = []
        for p in self.model.params:
            q = np.rint(params[p.tensor].astype(np.float64) / self.steps[p.tensor])
            out.append(np.clip(q, -p.bound, p.bound).astype(self.model.graph.tensors[p.tensor].dtype))
        return out


# ----------------------------------------------------------------------------------------------
# The baseline


def int8_accuracy(
    model: TrainableModel, values: list[np.ndarray], test_cache: dict, y_test: np.ndarray
) -> float:
    """Test accuracy of the int8 model (npusim) with the trainable tensors set to values; the
    model's own values are restored afterwards."""
    original = [v.copy() for v in model.values()]
    try:
        model.set_values(values)
        return float(np.mean(model.predict(test_cache) == y_test))
    finally:
        model.set_values(original)


def backprop_baseline(
    trainer_or_model,
    train_cache: dict | None = None,
    y_train: np.ndarray | None = None,
    test_cache: dict | None = None,
    y_test: np.ndarray | None = None,
    *,
    epochs: int = 10,
    lr: float | None = None,
    batch: int = 32,
    seed: int = 0,
    optimizer: str = "adam",
    units: str = "steps",
    lr_schedule: str = "cosine",
    project: bool = True,
    eval_every_epoch: bool = True,
    blas_threads: int | None = 1,
) -> dict:
    """Train the trainable layers in float by back-propagation; report float and int8 accuracy.

    trainer_or_model: a zo Trainer (its model, caches and labels are the defaults) or a
    TrainableModel with the caches and labels given. Training starts from the values currently in
    the model (the deployed weights, or replace_head's zero head), so call it before ZO training
    changes them; the model itself is left unchanged.

    units: what the optimizer's coordinates are. "steps" (default): each tensor in the ZO trainer's
    integer units (one weight LSB, BIAS_UNIT bias LSB, scales as deployed), so lr means the same as
    the ZO trainer's (Adam: about the largest change per update, in steps) and one lr fits layers
    whose weight scales differ by 50x (ResNet-8's last block and head); default lr 1.0 (adam, best
    of 0.1, 0.3, 1.0 on each of the three runs in the report) or 10 (sgd with momentum, whose step
    is lr times a gradient per step: 30 was best and 100 diverged on ResNet-8's head). "real": real
    units, the textbook float setting; default lr 1e-3. lr_schedule ("constant", "cosine", "linear")
    runs over all steps. project keeps each tensor inside its int8 / int32 range after every step,
    so the float model stays deployable with the fixed scales. blas_threads caps the BLAS threads
    while training (needs threadpoolctl; None leaves them): the GEMMs of a batch of 32 are small,
    and on 2 shared cores a second OpenBLAS thread made a ResNet-8 last:4 step 1.2x slower (load
    ~3), and float64 checks on a loaded machine (load ~7) 5x slower.

    Returns float_test_accuracy; int8_test_accuracy (the trained float values written back with the
    deployed scales fixed: round to nearest, weights clamped to [-127, 127], biases to int32; run on
    npusim); both before training (*_initial); train_loss (mean over the last epoch); history
    (per epoch: train_loss and, with eval_every_epoch, float_test_accuracy); the settings; seconds.
    """
    if isinstance(trainer_or_model, TrainableModel):
        model = trainer_or_model
    elif hasattr(trainer_or_model, "model") and hasattr(trainer_or_model, "train_cache"):
        tr = trainer_or_model
        model = tr.model
        train_cache = tr.train_cache if train_cache is None else train_cache
        test_cache = tr.test_cache if test_cache is None else test_cache
        y_train = tr.data.y_train if y_train is None else y_train
        y_test = tr.data.y_test if y_test is None else y_test
    else:
        raise ZoError(
            "backprop_baseline: expected a Trainer or a TrainableModel, got "
            f"{type(trainer_or_model).__name__}"
        )
    if train_cache is None or y_train is None or test_cache is None or y_test is None:
        raise ZoError(
            "backprop_baseline: train_cache, y_train, test_cache and y_test are required with a "
            "TrainableModel"
        )
    if optimizer not in DEFAULT_LR["steps"]:
        expected = ", ".join(DEFAULT_LR["steps"])
        raise ZoError(f"backprop_baseline: optimizer {optimizer!r}, expected one of {expected}")
    if units not in DEFAULT_LR:
        raise ZoError(f"backprop_baseline: units {units!r}, expected one of {', '.join(DEFAULT_LR)}")
    if lr_schedule not in SCHEDULES:
        raise ZoError(
            f"backprop_baseline: lr_schedule {lr_schedule!r}, expected one of {', '.join(SCHEDULES)}"
        )
    lr = DEFAULT_LR[units][optimizer] if lr is None else lr
    if epochs < 0 or batch < 1 or not (lr > 0 and np.isfinite(lr)):
        raise ZoError(
            f"backprop_baseline: epochs {epochs}, batch {batch}, lr {lr}: expected epochs >= 0, "
            "batch >= 1, lr > 0"
        )
    limit = (
        threadpool_limits(blas_threads, user_api="blas")
        if blas_threads and threadpool_limits
        else nullcontext()
    )
    with limit:
        return _train(
            model,
            train_cache,
            np.asarray(y_train, dtype=np.int64),
            test_cache,
            np.asarray(y_test, dtype=np.int64),
            epochs,
            lr,
            batch,
            seed,
            optimizer,
            units,
            lr_schedule,
            project,
            eval_every_epoch,
        )


def _train(
    model,
    train_cache,
    y_train,
    test_cache,
    y_test,
    epochs,
    lr,
    batch,
    seed,
    optimizer,
    units,
    lr_schedule,
    project,
    eval_every_epoch,
) -> dict:
    start, cpu_start = time.perf_counter(), time.process_time()

    net = FloatSuffix(model, np.float32)
    # The optimizer moves x = w / unit (unit: real value of one coordinate step); dL/dx = unit * dL/dw.
    if units == "steps":
        unit = {
            p.tensor: np.broadcast_to(net.steps[p.tensor] * p.unit, net.params[p.tensor].shape)
            for p in model.params
        }
    else:
        unit = {t: np.ones(v.shape) for t, v in net.params.items()}
    unit_flat = np.concatenate([unit[t].ravel() for t in net.trainable])
    bound_flat = (
        np.concatenate([np.broadcast_to(net.bounds[t], unit[t].shape).ravel() for t in net.trainable])
        / unit_flat
    )
    offsets = np.cumsum([0] + [net.params[t].size for t in net.trainable])
    master = np.concatenate([net.params[t].astype(np.float64).ravel() for t in net.trainable]) / unit_flat
    opt = OPTIMIZERS[optimizer](master.size)

    def write_params():
        real = master * unit_flat
        net.params = {
            t: real[offsets[i] : offsets[i + 1]].reshape(net.params[t].shape).astype(net.dtype)
            for i, t in enumerate(net.trainable)
        }

    def test_accuracy_float():
        return float(np.mean(net.predict(test_cache) == y_test))

    result = {
        "trainable": [p.name for p in model.params],
        "parameters": int(master.size),
        "epochs": epochs,
        "lr": lr,
        "units": units,
        "batch": batch,
        "seed": seed,
        "optimizer": optimizer,
        "lr_schedule": lr_schedule,
        "float_test_accuracy_initial": test_accuracy_float(),
        "int8_test_accuracy_initial": float(np.mean(model.predict(test_cache) == y_test)),
    }
    n = len(y_train)
    b = min(batch, n)
    per_epoch = n // b
    total = max(epochs * per_epoch, 1)
    rng = np.random.default_rng(seed)
    history, step = [], 0
    for epoch in range(epochs):
        order = rng.permutation(n)
        losses = np.empty(per_epoch)
        for j in range(per_epoch):
            index = np.sort(order[j * b : (j + 1) * b])
            losses[j], grads = net.loss_and_gradient(net.dequantize(train_cache, index), y_train[index])
            g = np.concatenate([grads[t].astype(np.float64).ravel() for t in net.trainable]) * unit_flat
            master += opt.step(g, learning_rate(lr, lr_schedule, step / total))
            if project:
                np.clip(master, -bound_flat, bound_flat, out=master)
            write_params()
            step += 1
        row = {"epoch": epoch + 1, "train_loss": float(losses.mean())}
        if eval_every_epoch:
            row["float_test_accuracy"] = test_accuracy_float()
        history.append(row)
    result["float_test_accuracy"] = (
        history[-1]["float_test_accuracy"] if history and eval_every_epoch else test_accuracy_float()
    )
    result["int8_test_accuracy"] = int8_accuracy(model, net.int_values(), test_cache, y_test)
    result["train_loss"] = history[-1]["train_loss"] if history else float("nan")
    result["history"] = history
    result["seconds"] = time.perf_counter() - start
    result["cpu_seconds"] = (
        time.process_time() - cpu_start
    )  # all threads; wall time varies on a shared machine
    return result
