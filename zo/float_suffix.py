"""A TrainableModel's trainable suffix (the ops from the first trainable layer to the logits) in
float32/float64 numpy, forward and backward, for the back-propagation baseline (backprop.py).

It reads the dequantized boundary activations, scale * (q - zero_point), and computes with
dequantized weights (per channel along the tensor's quantized dimension: axis 0 for CONV_2D and
FULLY_CONNECTED, axis 3 for DEPTHWISE_CONV_2D) and biases (scale in_scale * w_scale: one accumulator
LSB); the ops are float_ops.py's, which clamp as the int8 graph does. Rounding is the only thing
left out, so the float logits match npusim's up to quantization error (tests/test_backprop.py).
"""

from __future__ import annotations

import numpy as np

from npusim.ops import MAC_OPS as MAC_KINDS
from npusim.runtime.walker import Walker

from .errors import ZoError
from .float_ops import FLOAT_OPS, FloatOp
from .loss import cross_entropy
from .model import TrainableModel


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
        for op in (k.op for k in model.suffix):
            if op.kind not in FLOAT_OPS:
                raise ZoError(
                    f"op {op.index} ({op.kind}): no float implementation for the back-propagation baseline "
                    f"(supported: {', '.join(sorted(FLOAT_OPS))})"
                )
            self.ops.append(FLOAT_OPS[op.kind](op, graph))
        # Real value of one integer step of each constant: the weight scale (per channel along the
        # quantized axis) and in_scale * w_scale for a MAC op's bias (one accumulator LSB).
        self.steps: dict[int, np.ndarray] = {}
        self.constants: dict[int, np.ndarray] = {}
        for f in self.ops:
            for pos, t in enumerate(f.op.inputs):
                if t < 0 or not tensors[t].is_constant or t in self.constants:
                    continue
                tensor = tensors[t]
                if f.op.kind in MAC_KINDS and pos in (1, 2):
                    step = self._mac_step(f, pos)
                elif tensor.dtype == np.int8 and tensor.quant is not None:
                    step = self._along_axis(tensor, tensor.quant.scale)
                else:
                    continue  # shapes, axes, paddings: read by the float op, not computed with
                zp = 0 if f.op.kind in MAC_KINDS else self._along_axis(tensor, tensor.quant.zero_point)
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

    def _mac_step(self, f: FloatOp, pos: int) -> np.ndarray:
        w = f.inputs[1]
        if w.quant is None:
            raise ZoError(f"op {f.op.index} ({f.op.kind}): weights {w.name!r} have no quantization")
        w_step = self._along_axis(w, w.quant.scale)
        if pos == 1:
            return w_step
        in_scale = np.float64(f.inputs[0].quant.scale[0])
        return in_scale * np.broadcast_to(w.quant.scale.astype(np.float64), (f.out_channels,))

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
        walk = _SuffixWalk(params, self.constants, keep)
        values = walk.walk(self.ops, dict(inputs))
        logits = values[self.logits_tensor].reshape(-1, self.num_classes)
        return (logits, walk.tape) if keep else logits

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


class _SuffixWalk(Walker):
    """The suffix's forward walk: inputs from the parameters, the activations, then the frozen
    constants (None: an input the float op reads from its own fields); each op's clamp applied to
    its output, and with keep the tape that backward reads, one (saved, mask, shape) per op."""

    def __init__(self, params: dict, constants: dict, keep: bool):
        self.params = params
        self.constants = constants
        self.keep = keep
        self.tape = []
        self._saved = self._mask = None

    def sources(self, position, values):
        return (self.params, values, self.constants)

    def missing(self, f, t):
        return None

    def call(self, position, f, args):
        y, self._saved = f.forward(args)
        return y

    def output(self, f, t, y):
        self._mask = None
        if f.clamp is not None:
            lo, hi = f.clamp
            if self.keep:
                self._mask = (y > lo) & (y < hi)
            y = np.clip(y, lo, hi)
        return y

    def after(self, position, f, reads, values):
        if self.keep:
            self.tape.append((self._saved, self._mask, values[f.op.outputs[0]].shape))
