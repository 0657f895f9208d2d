"""Activity perturbation (`--estimator activity`): below the exact tail, each trainable layer's output
gradient is estimated by perturbing that output, not the weights, and its weight and bias gradients
are then local products with its cached input (as the exact tail's are, zo/tail.py).

Ren, Kornblith, Liao and Hinton (ICLR 2023): a random direction over a layer's activations instead
of its weights divides the estimator's variance by about (weights / activations), and a direction of
its own per example makes the mini-batch B independent samples from one pair of passes. Measured on
ResNet-8 conv2d_7 (docs/zo.md): cosine with the true gradient 0.095 at q = 1 against 0.004 for
weight perturbation.

One step, one layer (round robin, as the weights estimator's blocks): its int8 output h (from the
step's forward pass) gets q Gaussian integer directions u_ib per example b, zero where h sits at its
clamp (a ReLU's zero: the output does not move there); the rest of the suffix runs at h + eps u and
h - eps u (2q passes, batched); d_ib = (L_b+ - L_b-) / (2 eps) from the per-example losses; the
output gradient dL/dh_b = (1/q) sum_i d_ib u_ib / (E[u^2] B). eps in LSB of h's scale, measured per
layer before the first step as the weights estimator's is (zo/blocks.py, d(eps) against d(2 eps)).

Two rules measured on ResNet-8 `last:6` (docs/zo.md): u is also zero where an elementwise op that
alone reads h (a residual ADD with a fused ReLU) sits at its clamp; and each layer's move is scaled
by the square root of its signal fraction rho = |G|^2 / E|g|^2 (each estimate paired with the running
mean of the layer's earlier ones, signal_fraction): the best SGD step's rho, of which Adam's
normalization already applies sqrt(rho).
"""

from __future__ import annotations

import numpy as np

from .blocks import CALIBRATION_DIRECTIONS, calibration_sizes, choose_eps
from .float_ops import FLOAT_OPS
from .loss import cross_entropy
from .perturbation import rounded_gaussian, second_moment
from .tail import _clamp_mask, layer_steps

# The signal fraction's averages, per layer estimate: the running mean M of the layer's estimates and
# the EMAs of g.M and |g|^2 (about the last 33 estimates, 100 steps of a three-layer round robin).
# Measured on ResNet-8 `last:6` (docs/zo.md): rho is about 0.004 at q = 1, and the two half-batches'
# product a.c spreads by about 0.4 |g|^2 an estimate, so at 0.9 (ten estimates, the rule before)
# rho's standard error was about 0.1, and the move's factor was noise; g.M spreads about
# sqrt((1 - b) / (1 + b)) times less.
SIGNAL_EMA = 0.97


ELEMENTWISE = ("ADD",)  # ops whose output element i moves only with element i of each input


def dependent_suffix(kernels, f, out: int) -> tuple[int, list]:
    """Where the MAC op f sits in the suffix's kernels, and the kernels after it that depend on its
    output `out`: all that a perturbed (or locally spread) pass of f's output must run."""
    at = next(i for i, k in enumerate(kernels) if k.op is f.op)
    dirty, after = {out}, []
    for k in kernels[at + 1 :]:
        if any(t in dirty for t in k.op.inputs):
            after.append(k)
            dirty.update(k.op.outputs)
    return at, after


def macs_per_image(f) -> int:
    """The multiply-adds of f's weight gradient for one image: its output elements times the taps
    (and input channels, but a depthwise filter's) each one sums."""
    taps = f.inputs[1].shape[1:3] if f.op.kind == "DEPTHWISE_CONV_2D" else f.inputs[1].shape[1:]
    return int(np.prod(f.outputs[0].shape[1:])) * int(np.prod(taps))


def elementwise_clamps(model, kernels, out: int) -> list:
    """The FloatOps of the chain of same-shaped elementwise ops that alone read `out` (and then their
    output, and so on), which can clamp: where one of them sits at its clamp, the loss does not move
    with that element of `out` (a residual block's conv, read by its ADD with a fused ReLU)."""
    graph, chain = model.graph, []
    shape = tuple(graph.tensors[out].shape)
    while True:
        readers = [k.op for k in kernels if out in k.op.inputs]
        if len(readers) != 1 or readers[0].kind not in ELEMENTWISE or len(readers[0].outputs) != 1:
            return chain
        op = readers[0]
        out = op.outputs[0]
        if tuple(graph.tensors[out].shape) != shape:
            return chain
        chain.append(FLOAT_OPS[op.kind](op, graph))


class ActivityLayer:
    """One trainable MAC op below the tail: its output perturbed, its gradient local."""

    def __init__(self, model, f, offsets: dict):
        self.f = f
        self.op = f.op
        self.name = f.inputs[1].name
        self.out = f.op.outputs[0]
        self.steps, self.coords = layer_steps(model, f, offsets)
        self.eps = 4
        self.correlation = float("nan")
        # EMAs of g.M and |g|^2 (g an estimate, M the bias-corrected mean of the earlier ones),
        # the count of estimates and M itself: the signal fraction (ActivityEstimator.signal_fraction)
        self.agreement, self.power, self.count = 0.0, 0.0, 0
        self.mean = np.zeros(sum(c.size for c in self.coords))
        kernels = model.suffix
        at, self.after = dependent_suffix(kernels, f, self.out)
        self.masks = [f] + elementwise_clamps(model, kernels[at + 1 :], self.out)
        self.out_elements = int(np.prod(f.outputs[0].shape[1:]))
        self.op_weights = int(np.prod(f.inputs[1].shape))
        self.macs_per_image = macs_per_image(f)


class ActivityEstimator:
    """The activity-perturbation gradient of the layers below the tail (module docstring)."""

    def __init__(self, model, layers: list, offsets: dict, seed: int):
        self.model = model
        self.layers = [ActivityLayer(model, f, offsets) for f in layers]
        self.seed = seed
        self.u_moment = second_moment("gaussian")
        self.coords = (
            np.concatenate([c for layer in self.layers for c in layer.coords])
            if self.layers
            else np.zeros(0, dtype=np.int64)
        )

    def directions(self, step: int, layer: ActivityLayer, q: int, values: dict) -> np.ndarray:
        """[q, B, ...] rounded Gaussian integers from (seed, step), zero where the layer's output, or
        an elementwise op that alone reads it (ActivityLayer.masks), sits at its clamp."""
        h = values[layer.out]
        rng = np.random.Generator(np.random.PCG64([self.seed, step, 0xAC71]))
        u = rounded_gaussian(rng, (q,) + h.shape)
        for f in layer.masks:
            mask = _clamp_mask(f, values[f.op.outputs[0]])
            if mask is not None:
                u = u * mask.astype(np.int8)
        return u

    def per_example_losses(
        self, values: dict, layer, perturbed: np.ndarray, labels: np.ndarray
    ) -> np.ndarray:
        """Per-example losses [G, B] of the suffix run from layer's output set to perturbed [G, B, ...]."""
        g, b = perturbed.shape[:2]
        run = dict(values)
        run[layer.out] = perturbed.reshape((g * b,) + perturbed.shape[2:]).astype(values[layer.out].dtype)
        self.model.interp.evaluate(run, layer.after, shared_batch=b)
        m = self.model
        zq = run[m.logits_tensor].reshape(g * b, -1)
        logits = m.logits_scale * (zq.astype(np.float64) - m.logits_zero_point)
        return cross_entropy(logits, np.tile(labels, g)).reshape(g, b)

    def probe(self, values: dict, layer, u: np.ndarray, eps: int, labels: np.ndarray) -> np.ndarray:
        """d [q, B]: per-example central differences along u at eps LSB (2q passes, one call)."""
        # int16 holds h +- eps * u: |h| <= 128, |u| <= 127 and eps at most 2 x the largest candidate
        h = values[layer.out].astype(np.int16)
        delta = np.int16(eps) * u.astype(np.int16)
        stacked = np.concatenate([np.clip(h + delta, -128, 127), np.clip(h - delta, -128, 127)])
        losses = self.per_example_losses(values, layer, stacked, labels)
        q = len(u)
        return (losses[:q] - losses[q:]) / (2.0 * eps)

    def measure_eps(self, values: dict, labels: np.ndarray, check) -> int:
        """Each layer's eps from d(eps) against d(2 eps) (zo/blocks.py); returns the passes spent."""
        passes = 0
        for k, layer in enumerate(self.layers):
            check()
            u = self.directions(2**40 + k, layer, CALIBRATION_DIRECTIONS, values)
            derivatives = {}
            for e in calibration_sizes():
                derivatives[e] = self.probe(values, layer, u, e, labels).ravel()
                passes += 2 * CALIBRATION_DIRECTIONS
            layer.eps, layer.correlation, _ = choose_eps(derivatives)
        return passes

    def gradient(self, values: dict, layer, q: int, step: int, labels: np.ndarray):
        """(the layer's gradient over layer.coords in the trainer's units, d [q, B]). Also updates the
        layer's signal fraction with the estimate (observe)."""
        f = layer.f
        u = self.directions(step, layer, q, values)
        d = self.probe(values, layer, u, layer.eps, labels)
        b = len(labels)
        # dL/dh in codes of h, for the batch's mean loss; then in real units (one code = scale).
        g_codes = np.einsum("qb,qb...->b...", d, u) / (q * self.u_moment * b)
        dy = g_codes / float(f.outputs[0].scale)
        t = f.inputs[0]
        x = float(t.scale) * (values[f.op.inputs[0]].astype(np.float64) - int(t.zero_point))
        g = self._local(f, layer, x, dy)
        self.observe(layer, g)
        return g, d

    @staticmethod
    def observe(layer, g: np.ndarray) -> None:
        """The signal fraction's averages, with the estimate g: its directions (and, on another step,
        its examples) are independent of the earlier estimates', so E[g.M] = G.E[M], |G|^2 where the
        layer's gradient changes slowly over M's window; |g|^2 against it."""
        if layer.count:
            m = layer.mean / (1 - SIGNAL_EMA**layer.count)  # Adam's bias correction of a zero start
            layer.agreement = SIGNAL_EMA * layer.agreement + (1 - SIGNAL_EMA) * float(g @ m)
            layer.power = SIGNAL_EMA * layer.power + (1 - SIGNAL_EMA) * float(g @ g)
        layer.mean = SIGNAL_EMA * layer.mean + (1 - SIGNAL_EMA) * g
        layer.count += 1

    @staticmethod
    def _local(f, layer, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """The weight (and bias) gradient from the cached input x and output gradient dy."""
        grads = f.backward((x, np.zeros(f.inputs[1].shape)), dy, [False, True, len(layer.steps) > 1])
        parts = [(grads[1] * layer.steps[0]).ravel()]
        if len(layer.steps) > 1:
            parts.append((grads[2] * layer.steps[1]).ravel())
        return np.concatenate(parts)

    def signal_fraction(self, layer) -> float:
        """rho = |G|^2 / E|g|^2 of the layer's estimate g (G its mean), from E[g.M] = |G|^2 (observe).
        Not from two half-batches' estimates a, c (E[a.c] = |G|^2 too): each of a and c carries all of
        the noise, so a.c spreads by about 0.4 |g|^2 where M's noise is a fraction of g's. Under SGD
        the step that decreases the loss most along a noisy estimate is rho times the exact
        gradient's (McCandlish et al. 2018), so rho sets the layer's update beside the exact layers'
        (move_scale). 0 before the layer's second estimate."""
        return min(1.0, max(0.0, layer.agreement) / layer.power) if layer.power > 0 else 0.0

    def state(self) -> np.ndarray:
        """Each layer's signal-fraction averages (agreement, power, count), then each layer's M (a
        checkpoint's)."""
        head = [[layer.agreement, layer.power, layer.count] for layer in self.layers]
        return np.concatenate([np.ravel(head)] + [layer.mean for layer in self.layers]).astype(np.float64)

    def load(self, state) -> None:
        state = np.asarray(state, dtype=np.float64).ravel()
        n = len(self.layers)
        if state.size == 2 * n:  # a checkpoint of the half-batch rule (averages of a.c): start anew
            return
        at = 3 * n
        for k, layer in enumerate(self.layers):
            agreement, power, count = state[3 * k : 3 * k + 3]
            layer.agreement, layer.power, layer.count = float(agreement), float(power), int(count)
            layer.mean = state[at : at + layer.mean.size].copy()
            at += layer.mean.size

    def move_scale(self, layer) -> float:
        """The factor on the layer's Adam move: sqrt(rho). SGD's best step along a noisy estimate g is
        rho times the step along its mean G (signal_fraction). Adam's move is g / sqrt(v), and its v is
        the estimate's E g^2 = |G|^2 / rho per coordinate, not |G|^2: Adam already shrinks the move's
        component along G by sqrt(rho) against the move it would make on G itself, so the rest of the
        factor is rho / sqrt(rho) = sqrt(rho) (scaling by rho again would move the layer by rho^1.5)."""
        return float(np.sqrt(self.signal_fraction(layer)))

    def update_scale(self) -> np.ndarray:
        """Per coordinate of self.coords: its layer's move_scale."""
        return np.concatenate(
            [np.full(sum(c.size for c in layer.coords), self.move_scale(layer)) for layer in self.layers]
        )
