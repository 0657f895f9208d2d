"""The classifier's exact gradient, forward-only: what a device computes without back-propagating.

A last FULLY_CONNECTED layer's gradient needs only its input features x (int8, dequantized) and the
softmax error of its logits on the same forward pass: dL/dW = (p - y)' x / B, dL/db = mean(p - y).
The NPU runs the pass as deployed; the Cortex-M55 forms the outer product (C x K multiply-adds per
image, fewer than the layer's own forward pass). This is ElasticZO's split (back-propagation for
the last layer, zeroth order below) with the last layer's backward pass reduced to one outer
product, so no activation of any other layer is kept and nothing runs backwards through the NPU.

ZO then spends its forward passes on the layers below, where they can resolve something: the 10
head biases alone held 86% of the squared gradient norm of ResNet-8's `last:2`, and one global
normalization let them drown every layer below (docs/zo.md).
"""

from __future__ import annotations

import numpy as np

from .head import PASS_THROUGH
from .loss import cross_entropy
from .model import TrainableModel


class ExactHead:
    """The trainable FULLY_CONNECTED that produces the logits, and its gradient in the trainer's units
    (loss per integer step of each coordinate: one weight LSB, BIAS_UNIT bias LSBs).

    coords: the positions of its weight (and bias) in the trainer's flat vector of trainable values.
    """

    def __init__(self, model: TrainableModel, op, coords: np.ndarray):
        tensors = model.graph.tensors
        self.model = model
        self.op = op
        self.coords = coords
        self.x_tensor = op.inputs[0]
        self.out_tensor = op.outputs[0]
        x = tensors[self.x_tensor]
        self.x_scale, self.x_zero = np.float64(x.scale), int(x.zero_point)
        self.features = int(np.prod(x.shape[1:]))  # K: one image's inputs to the head
        w = tensors[op.inputs[1]]
        classes = w.shape[0]
        # A per-tensor scale broadcasts over the classes: one weight LSB's real value per row.
        self.w_step = np.broadcast_to(w.quant.scale.astype(np.float64), (classes,)).copy()
        params = {p.tensor: p for p in model.params}
        self.has_bias = len(op.inputs) > 2 and op.inputs[2] in params
        self.bias_unit = params[op.inputs[2]].unit if self.has_bias else 0
        out = tensors[self.out_tensor]
        self.out_scale, self.out_zero = np.float64(out.scale), int(out.zero_point)
        self.classes = classes
        self.error = None

    def input_gradient(self, values: dict) -> np.ndarray:
        """dL/d(head input) in real units, shaped as the pass's head input: error W (W dequantized), of
        the last loss_and_gradient's pass. What the exact tail (zo/tail.py) spreads back."""
        w = self.model.graph.tensors[self.op.inputs[1]].data.astype(np.float64) * self.w_step[:, None]
        return (self.error @ w).reshape(values[self.x_tensor].shape)

    @staticmethod
    def find(model: TrainableModel, offsets: dict) -> ExactHead | None:
        """The head when it is trainable and its output is the logits (through reshapes only), else
        None (its gradient is then estimated by ZO like any other layer). offsets: {tensor index:
        (start, end)} in the flat vector."""
        kernels = {k.op.outputs[0]: k.op for k in model.suffix}
        t = model.logits_tensor
        op = kernels.get(t)
        while op is not None and op.kind in PASS_THROUGH and op.kind != "SOFTMAX":
            op = kernels.get(op.inputs[0])
        if op is None or op.kind != "FULLY_CONNECTED" or op.inputs[1] not in offsets:
            return None
        # A fused ReLU would zero some logits' gradient: the saturation mask below handles clamps at
        # the int8 limits only, so such a head stays with ZO.
        if op.options.get("fused_activation_function", "NONE") != "NONE":
            return None
        parts = [np.arange(*offsets[op.inputs[1]])]
        if len(op.inputs) > 2 and op.inputs[2] in offsets:
            parts.append(np.arange(*offsets[op.inputs[2]]))
        return ExactHead(model, op, np.concatenate(parts))

    def loss_and_gradient(self, values: dict, labels: np.ndarray) -> tuple[float, np.ndarray]:
        """Cross-entropy and its gradient over self.coords, from one forward pass's values (the
        head's input and the logits, as the suffix computed them)."""
        xq = values[self.x_tensor]
        x = self.x_scale * (xq.reshape(len(xq), -1).astype(np.float64) - self.x_zero)
        zq = values[self.model.logits_tensor].reshape(len(xq), -1)
        logits = self.model.logits_scale * (zq.astype(np.float64) - self.model.logits_zero_point)
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        error = p
        error[np.arange(len(labels)), labels] -= 1.0
        # A logit held at an int8 limit does not move with the weights (straight-through elsewhere).
        out = values[self.out_tensor].reshape(len(xq), -1)
        error[(out == -128) | (out == 127)] = 0.0
        error /= len(labels)
        self.error = error  # dL/dlogits of this pass: input_gradient() spreads it below the head
        grads = [(error.T @ x) * self.w_step[:, None]]
        if self.has_bias:
            grads.append(error.sum(axis=0) * self.x_scale * self.w_step * self.bias_unit)
        loss = float(np.mean(cross_entropy(logits, labels)))
        return loss, np.concatenate([g.ravel() for g in grads])
