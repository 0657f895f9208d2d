"""The exact tail: trainable layers whose output reaches the head through parameter-free ops only
get their exact gradient forward-only, from the same pass that gives the head its own.

The head's input gradient dL/dx = (p - y) W / B (W the head's dequantized weights) is spread back
through the ops between a layer and the head, which have no parameters (ADD, pools, MEAN, RESHAPE,
PAD, CONCATENATION), each masked where its int8 output sat at its clamp (a fused ReLU, the int8
limits): there the output does not move with its input. That gives the exact gradient at the
layer's output, and the layer's weight and bias gradients are then local products with its own
cached input, as the head's is (zo/head_grad.py). Nothing runs backwards through a weighted layer,
and nothing is kept but the tail layers' inputs and the masks of the clamped tensors on the way.

The tail is found on the graph, for any model: walking the suffix backwards from the head, a
tensor's gradient is exact when every op that reads it is a parameter-free op the walk spread
through (or the head); a trainable MAC op whose output is exact is a tail layer. The walk stops at
a tail layer (its input gradient would need its weights) and at any other op.

Rounding is left out, as in the back-propagation bound (zo/float_suffix.py): the int8 forward
pass's values, dequantized, are where the gradient is taken.
"""

from __future__ import annotations

import numpy as np

from npusim.ops import MAC_OPS

from .float_ops import FLOAT_OPS, FloatOp

# Ops with no parameters whose backward zo/float_ops.py has: the tail spreads gradients through them.
PARAMETER_FREE = ("ADD", "AVERAGE_POOL_2D", "MAX_POOL_2D", "MEAN", "RESHAPE", "PAD", "PADV2", "CONCATENATION")


def find_tail_ops(kernels, head_op, is_trainable) -> tuple[list, list]:
    """(the parameter-free ops the head's input gradient spreads through, the MAC ops that get an
    exact gradient), both in execution order. kernels: the ops up to the head (interpreter kernels);
    is_trainable(op): whether a MAC op's weights are trainable."""
    ops = [k.op for k in kernels]
    consumers: dict[int, list] = {}
    for op in ops + [head_op]:
        for t in op.inputs:
            if t >= 0:
                consumers.setdefault(t, []).append(op)
    through = {id(head_op)}  # ops whose input gradients the walk has
    spread, layers = [], []
    position = next(i for i, op in enumerate(ops) if op is head_op)
    for op in reversed(ops[:position]):
        out = op.outputs[0]
        if len(op.outputs) != 1 or not consumers.get(out):
            continue
        if not all(id(c) in through for c in consumers[out]):
            continue
        if op.kind in PARAMETER_FREE:
            through.add(id(op))
            spread.append(op)
        elif op.kind in MAC_OPS and is_trainable(op):
            layers.append(op)
    return spread[::-1], layers[::-1]


def _clamp_mask(f: FloatOp, q: np.ndarray) -> np.ndarray | None:
    """Where the int8 output q is strictly inside the op's clamp (None: the op cannot clamp)."""
    if f.clamp is None:
        return None
    t = f.outputs[0]
    s, zp = float(t.scale), int(t.zero_point)
    lo, hi = (round(v / s) + zp for v in f.clamp)
    return (q > lo) & (q < hi)


def layer_steps(model, f: FloatOp, offsets: dict) -> tuple[list, list]:
    """A MAC op's real value of one trainer unit per weight (per channel along its quantized axis)
    and, when trainable, per bias (in_scale * w_scale times the bias unit); and their positions in
    the trainer's flat vector, in the same order."""
    units = {p.tensor: p.unit for p in model.params}
    w, op = f.inputs[1], f.op
    w_scale = w.quant.scale.astype(np.float64)
    shape = [1] * len(w.shape)
    shape[w.quant.axis if w_scale.size > 1 else 0] = -1
    steps = [w_scale.reshape(shape) if w_scale.size > 1 else w_scale.reshape(())]
    coords = [np.arange(*offsets[op.inputs[1]])]
    if len(op.inputs) > 2 and op.inputs[2] in offsets:
        in_scale = np.float64(f.inputs[0].quant.scale[0])
        steps.append(in_scale * np.broadcast_to(w_scale, (f.out_channels,)) * units[op.inputs[2]])
        coords.append(np.arange(*offsets[op.inputs[2]]))
    return steps, coords


class ExactTail:
    """The exact gradient of the tail layers, in the trainer's units (loss per integer step of each
    coordinate), from one forward pass's values and the head's input gradient.

    coords: the tail layers' weight (and bias) positions in the trainer's flat vector, in the order
    gradient() returns them."""

    def __init__(self, model, head_input: int, spread: list, layers: list, offsets: dict):
        graph = model.graph
        self.model = model
        self.head_input = head_input
        self.spread = [FLOAT_OPS[op.kind](op, graph) for op in spread]
        self.layers = [FLOAT_OPS[op.kind](op, graph) for op in layers]
        self.steps, parts = [], []
        for f in self.layers:
            steps, coords = layer_steps(model, f, offsets)
            self.steps.append(steps)
            parts += coords
        self.coords = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        tensors = graph.tensors
        # Per image: the layers' weight-gradient multiply-adds (one per MAC of their forward pass) and
        # the elements the spread touches; what a device keeps: the layers' int8 inputs and one mask bit
        # per element of each clamped tensor on the way.
        self.macs_per_image = sum(
            int(np.prod(tensors[f.op.outputs[0]].shape[1:])) * int(np.prod(f.inputs[1].shape[1:]))
            if f.op.kind != "DEPTHWISE_CONV_2D"
            else int(np.prod(tensors[f.op.outputs[0]].shape[1:])) * int(np.prod(f.inputs[1].shape[1:3]))
            for f in self.layers
        )
        self.elements_per_image = sum(int(np.prod(f.outputs[0].shape[1:])) for f in self.spread + self.layers)
        self.input_bytes_per_image = sum(int(np.prod(f.inputs[0].shape[1:])) for f in self.layers)
        clamped = [f for f in self.spread + self.layers if f.clamp is not None]
        self.mask_bytes_per_image = sum(-(-int(np.prod(f.outputs[0].shape[1:])) // 8) for f in clamped)
        self.buffer_elements_per_image = max(
            [int(np.prod(f.outputs[0].shape[1:])) for f in self.spread + self.layers] or [0]
        )

    @staticmethod
    def find(model, head, offsets: dict) -> ExactTail | None:
        """The tail below `head` (zo/head_grad.py's ExactHead) among the trainable layers, or None."""
        if head is None:
            return None
        trainable = set(offsets)
        head_at = next(i for i, k in enumerate(model.suffix) if k.op is head.op)
        spread, layers = find_tail_ops(
            model.suffix[: head_at + 1], head.op, lambda op: op.inputs[1] in trainable
        )
        if not layers:
            return None
        return ExactTail(model, head.x_tensor, spread, layers, offsets)

    def memory_bytes(self, batch: int) -> int:
        """Device memory the tail adds to a forward pass: the layers' int8 inputs, the masks, and one
        float32 gradient buffer of the largest tensor on the way, for a batch."""
        per_image = (
            self.input_bytes_per_image + self.mask_bytes_per_image + 4 * self.buffer_elements_per_image
        )
        return batch * per_image

    def gradient(self, values: dict, dx_head: np.ndarray) -> np.ndarray:
        """The tail's gradient over self.coords from the pass's int8 values ({tensor index: array})
        and dL/d(head input) in real units (shaped as the head's input)."""
        grads = {self.head_input: dx_head}
        tensors = self.model.graph.tensors

        def real(t):
            tensor = tensors[t]
            return float(tensor.scale) * (values[t].astype(np.float64) - int(tensor.zero_point))

        def output_gradient(f):
            out = f.op.outputs[0]
            dy = grads.pop(out).reshape(values[out].shape)
            mask = _clamp_mask(f, values[out])
            return dy if mask is None else dy * mask

        for f in reversed(self.spread):
            dy = output_gradient(f)
            args = [None if t < 0 else (real(t) if not tensors[t].is_constant else None) for t in f.op.inputs]
            wanted = [t >= 0 and not tensors[t].is_constant for t in f.op.inputs]
            for t, g in zip(f.op.inputs, f.backward(f.saved(args), dy, wanted)):
                if g is not None:
                    grads[t] = grads[t] + g if t in grads else g
        out = []
        for f, steps in zip(self.layers, self.steps):
            dy = output_gradient(f)
            x = real(f.op.inputs[0])
            w = np.zeros(f.inputs[1].shape)  # the weight gradient needs only the weights' shape
            wanted = [False, True, len(steps) > 1]
            g = f.backward((x, w), dy, wanted)
            out.append((g[1] * steps[0]).ravel())
            if len(steps) > 1:
                out.append((g[2] * steps[1]).ravel())
        return np.concatenate(out)
