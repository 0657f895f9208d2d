"""Local losses below the exact tail (`--estimator local`, `--estimator guided`), forward-only.

Ren, Kornblith, Liao and Hinton (ICLR 2023, "Scaling Forward Gradient With Local Losses"): each
trainable layer below the tail gets an auxiliary linear classifier on the global average pool of its
block's output, where its block's output is the end of the chain of elementwise ops that alone read
the layer's output (a residual ADD with a fused ReLU, zo/activity.elementwise_clamps), else the
layer's own output. The auxiliary head is trained with its exact gradient, as the head is
(zo/head_grad.py). Its input gradient W_aux' (p - y) / B, spread back through the pool, masked by
the clamps (ReLU, int8 limits) and spread through the chain, is the exact gradient of the LOCAL loss
at the layer's output; the layer's weight and bias gradients then come from its cached input, as
the exact tail's do (zo/tail.py). Nothing runs backwards through a weighted layer.

- `local`: every such layer moves along its local gradient each step. No extra pass: the step's
  forward pass holds every tensor it needs. The gradient is exact for the local loss and biased for
  the global one.
- `guided`: the local gradient at each example's layer output is a direction u_b; the global loss's
  derivative along it is measured by two int8 suffix passes (h +- delta_b, delta_b = u_b scaled to
  RMS eps LSB and rounded, one direction per example, all examples in one pass pair), and the output
  gradient is its projection (g . delta_b) delta_b / |delta_b|^2: the move is along the local
  direction with the global loss's sign and size. One layer a step (round robin), 2 suffix passes.

The auxiliary heads start from a ridge fit (zo/head_init.py's, with its temperature) on the pooled
features of the training images, from the pass that initializes the fresh head (the device gathers
both from the same pass), then take Adam on their cross-entropy every step. What a device keeps
beyond the exact tail: each auxiliary head (classes x channels + classes float32, with Adam's two
moments), each estimated layer's int8 input and one mask bit per clamped element on its chain.
"""

from __future__ import annotations

import numpy as np

from .activity import dependent_suffix, elementwise_clamps, macs_per_image
from .head_init import fit_head, fit_temperature
from .loss import cross_entropy
from .tail import _clamp_mask, layer_steps

AUX_LR = 0.01  # Adam's step on an auxiliary head, relative to the RMS of its ridge-fitted weights
ESTIMATORS = ("local", "guided")


def _real(model, values: dict, t: int) -> np.ndarray:
    tensor = model.graph.tensors[t]
    return float(tensor.scale) * (values[t].astype(np.float64) - int(tensor.zero_point))


class AuxHead:
    """A linear classifier on the global average pool of one int8 tensor [B, H, W, C], float."""

    def __init__(self, model, producer, classes: int):
        self.model = model
        self.producer = producer  # the FloatOp that writes the tensor (its clamp masks the gradient)
        self.tensor = producer.op.outputs[0]
        shape = model.graph.tensors[self.tensor].shape
        self.channels = int(shape[-1])
        self.pixels = int(np.prod(shape[1:-1]))
        self.w = np.zeros((classes, self.channels))
        self.b = np.zeros(classes)
        self.m = [np.zeros_like(self.w), np.zeros_like(self.b)]
        self.v = [np.zeros_like(self.w), np.zeros_like(self.b)]
        self.t = 0
        self.lr = 0.0
        self.last_loss = float("nan")

    def features(self, values: dict) -> np.ndarray:
        x = _real(self.model, values, self.tensor)
        return x.reshape(len(x), -1, self.channels).mean(axis=1)

    def fit(self, features: np.ndarray, labels: np.ndarray) -> None:
        """Ridge fit with a temperature (zo/head_init.py), its logits held within the model's own
        logits' range (a separable block output would otherwise take an unbounded temperature, and
        then no gradient), and Adam's step from its size."""
        w, b = fit_head(features, labels, len(self.b), "ridge")
        s = fit_temperature(features @ w.T + b, labels, 127.5 * self.model.logits_scale)
        self.w, self.b = s * w, s * b
        self.lr = AUX_LR * float(np.sqrt(np.mean(self.w**2)))

    def error(self, feats: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """(p - y) / B of the local loss; records its mean cross-entropy."""
        logits = feats @ self.w.T + self.b
        self.last_loss = float(np.mean(cross_entropy(logits, labels)))
        z = np.exp(logits - logits.max(axis=1, keepdims=True))
        p = z / z.sum(axis=1, keepdims=True)
        p[np.arange(len(labels)), labels] -= 1.0
        return p / len(labels)

    def input_gradient(self, values: dict, err: np.ndarray) -> np.ndarray:
        """dL_local / d(tensor) in real units, through the pool and the producer's clamp."""
        shape = values[self.tensor].shape
        g = np.broadcast_to((err @ self.w)[:, None, :] / self.pixels, (shape[0], self.pixels, self.channels))
        g = g.reshape(shape)
        mask = _clamp_mask(self.producer, values[self.tensor])
        return g if mask is None else g * mask

    def train(self, feats: np.ndarray, err: np.ndarray) -> None:
        """One Adam step on the local cross-entropy (its exact gradient)."""
        self.t += 1
        for i, (p, g) in enumerate(((self.w, err.T @ feats), (self.b, err.sum(axis=0)))):
            self.m[i] = 0.9 * self.m[i] + 0.1 * g
            self.v[i] = 0.999 * self.v[i] + 0.001 * g * g
            mhat, vhat = self.m[i] / (1 - 0.9**self.t), self.v[i] / (1 - 0.999**self.t)
            p -= self.lr * mhat / (np.sqrt(vhat) + 1e-12 * self.lr + 1e-30)

    def state(self) -> np.ndarray:
        return np.concatenate(
            [a.ravel() for a in (self.w, self.b, *self.m, *self.v)] + [np.array([self.t, self.lr])]
        )

    def load(self, state: np.ndarray) -> None:
        state = np.asarray(state, dtype=np.float64)
        parts, i = [], 0
        for a in (self.w, self.b, *self.m, *self.v):
            parts.append(state[i : i + a.size].reshape(a.shape))
            i += a.size
        self.w, self.b, m0, m1, v0, v1 = parts
        self.m, self.v = [m0, m1], [v0, v1]
        self.t, self.lr = int(state[i]), float(state[i + 1])


class LocalLayer:
    """One trainable MAC op below the tail and the auxiliary head of its block's output."""

    def __init__(self, model, f, offsets: dict, aux: AuxHead, chain: list):
        self.f, self.op, self.aux, self.chain = f, f.op, aux, chain
        self.name = f.inputs[1].name
        self.out = f.op.outputs[0]
        self.steps, self.coords = layer_steps(model, f, offsets)
        self.eps = 4
        self.out_elements = int(np.prod(f.outputs[0].shape[1:]))
        self.macs_per_image = macs_per_image(f)
        _, self.after = dependent_suffix(model.suffix, f, self.out)


class LocalEstimator:
    """Local-loss gradients of the layers below the tail (module docstring)."""

    def __init__(
        self, model, layers: list, offsets: dict, classes: int, kind: str = "local", every: bool = True
    ):
        self.model, self.kind = model, kind
        self.every = every and kind == "local"  # every layer each step, else one a step (round robin)
        self.examples, self.seed = None, 0  # the weight gradients' examples of a batch (None: all)
        self.aux, self.layers = {}, []
        for f in layers:
            at = next(i for i, k in enumerate(model.suffix) if k.op is f.op)
            chain = elementwise_clamps(model, model.suffix[at + 1 :], f.op.outputs[0])
            producer = chain[-1] if chain else f
            t = producer.op.outputs[0]
            if t not in self.aux:
                self.aux[t] = AuxHead(model, producer, classes)
            self.layers.append(LocalLayer(model, f, offsets, self.aux[t], chain))
        self.coords = np.concatenate([c for layer in self.layers for c in layer.coords])

    # -- the auxiliary heads -----------------------------------------------------------------
    def fit(self, boundary: dict, labels: np.ndarray, chunk: int = 256) -> None:
        """Ridge-fit every auxiliary head on the pooled features of cached boundary activations."""
        last = max(
            next(i for i, k in enumerate(self.model.suffix) if k.op is a.producer.op)
            for a in self.aux.values()
        )
        ops = self.model.suffix[: last + 1]
        n = len(labels)
        feats = {t: [] for t in self.aux}
        for i in range(0, n, chunk):
            values = {b: v[i : i + chunk] for b, v in boundary.items()}
            self.model.interp.evaluate(values, ops)
            for t, a in self.aux.items():
                feats[t].append(a.features(values))
        for t, a in self.aux.items():
            a.fit(np.concatenate(feats[t]), labels)

    def train_aux(self, values: dict, labels: np.ndarray) -> dict:
        """Each auxiliary head's error on this pass, then one Adam step of it: {tensor: error}."""
        errors = {}
        for t, a in self.aux.items():
            feats = a.features(values)
            errors[t] = a.error(feats, labels)
            a.train(feats, errors[t])
        return errors

    # -- gradients ---------------------------------------------------------------------------
    def output_gradient(self, values: dict, layer: LocalLayer, err: np.ndarray) -> np.ndarray:
        """dL_local / d(layer output) in real units: the aux head's input gradient spread through
        the chain of elementwise ops (masked at each clamp) and the layer's own clamp."""
        grads = {layer.aux.tensor: layer.aux.input_gradient(values, err)}
        tensors = self.model.graph.tensors
        path = {layer.out} | {f.op.outputs[0] for f in layer.chain}
        for f in reversed(layer.chain):
            dy = grads.pop(f.op.outputs[0])
            if f is not layer.aux.producer:
                mask = _clamp_mask(f, values[f.op.outputs[0]])
                dy = dy if mask is None else dy * mask
            args = [
                None if t < 0 or tensors[t].is_constant else _real(self.model, values, t) for t in f.op.inputs
            ]
            wanted = [t in path for t in f.op.inputs]
            for t, g in zip(f.op.inputs, f.backward(f.saved(args), dy, wanted)):
                if g is not None and t in path:
                    grads[t] = grads[t] + g if t in grads else g
        dy = grads[layer.out].reshape(values[layer.out].shape)
        if layer.chain:
            mask = _clamp_mask(layer.f, values[layer.out])
            dy = dy if mask is None else dy * mask
        return dy

    def weight_gradient(self, values: dict, layer: LocalLayer, dy: np.ndarray, rows=None) -> np.ndarray:
        """The layer's weight (and bias) gradient in the trainer's units from its cached input; with
        rows, from those examples only, scaled to the batch (an unbiased estimate of the batch's)."""
        f = layer.f
        x = _real(self.model, values, f.op.inputs[0])
        if rows is not None:
            x, dy = x[rows], dy[rows] * (len(dy) / len(rows))
        grads = f.backward((x, np.zeros(f.inputs[1].shape)), dy, [False, True, len(layer.steps) > 1])
        parts = [(grads[1] * layer.steps[0]).ravel()]
        if len(layer.steps) > 1:
            parts.append((grads[2] * layer.steps[1]).ravel())
        return np.concatenate(parts)

    def guided_output_gradient(self, values: dict, layer: LocalLayer, dy: np.ndarray, labels) -> np.ndarray:
        """The global loss's output gradient projected on each example's local direction, from two
        int8 suffix passes (module docstring), in real units."""
        h = values[layer.out].astype(np.int64)
        scale = float(layer.f.outputs[0].scale)
        u = dy * scale  # dL_local / d(code)
        b = len(u)
        rms = np.sqrt(np.mean(u.reshape(b, -1) ** 2, axis=1)).reshape((b,) + (1,) * (u.ndim - 1))
        delta = np.rint(layer.eps * u / np.where(rms > 0, rms, 1.0)).astype(np.int64)
        stacked = np.concatenate([np.clip(h + delta, -128, 127), np.clip(h - delta, -128, 127)])
        run = dict(values)
        run[layer.out] = stacked.astype(values[layer.out].dtype)
        self.model.interp.evaluate(run, layer.after, shared_batch=b)
        m = self.model
        zq = run[m.logits_tensor].reshape(2 * b, -1)
        logits = m.logits_scale * (zq.astype(np.float64) - m.logits_zero_point)
        losses = cross_entropy(logits, np.tile(labels, 2)).reshape(2, b)
        along = (losses[0] - losses[1]) / 2.0 / b  # (g . delta_b) for the batch's mean loss
        norm2 = np.sum(delta.reshape(b, -1).astype(np.float64) ** 2, axis=1)
        coef = np.where(norm2 > 0, along / np.where(norm2 > 0, norm2, 1.0), 0.0)
        g_codes = coef.reshape((b,) + (1,) * (u.ndim - 1)) * delta
        self.last_differences = losses[0] - losses[1]
        return g_codes / scale

    def gradient(self, values: dict, labels: np.ndarray, step: int) -> tuple[np.ndarray, int]:
        """(the gradient over self.coords, the suffix passes spent): `local` every layer (or with
        every=False the step's layer), `guided` the step's layer (round robin), zero over the
        others. Trains the auxiliary heads after."""
        errors = {t: a.error(a.features(values), labels) for t, a in self.aux.items()}
        parts, passes = [], 0
        chosen = self.layers[step % len(self.layers)]
        rows, b = None, len(labels)
        if self.examples is not None and self.examples < b:
            rng = np.random.Generator(np.random.PCG64([self.seed, step, 0x10CA1]))
            rows = np.sort(rng.choice(b, self.examples, replace=False))
        for layer in self.layers:
            size = sum(c.size for c in layer.coords)
            if not self.every and layer is not chosen:
                parts.append(np.zeros(size))
                continue
            dy = self.output_gradient(values, layer, errors[layer.aux.tensor])
            if self.kind == "guided":
                dy = self.guided_output_gradient(values, layer, dy, labels)
                passes += 2
            parts.append(self.weight_gradient(values, layer, dy, rows))
        self.train_aux(values, labels)
        return np.concatenate(parts), passes

    # -- what a device keeps -----------------------------------------------------------------
    def memory_bytes(self, batch: int) -> int:
        """The auxiliary heads with Adam's moments (float32), the layers' int8 inputs and a float32
        output-gradient buffer of the largest block output, for a batch."""
        heads = sum(3 * 4 * (a.w.size + a.b.size) for a in self.aux.values())
        inputs = sum(int(np.prod(layer.f.inputs[0].shape[1:])) for layer in self.layers)
        buffer = max(layer.out_elements for layer in self.layers)
        return heads + batch * (inputs + 4 * buffer)

    def aux_macs_per_image(self) -> int:
        """The auxiliary heads' logits, input gradients and weight gradients: 3 x classes x channels."""
        return sum(3 * a.w.size for a in self.aux.values())

    def state(self) -> np.ndarray:
        return np.concatenate([a.state() for a in self.aux.values()])

    def load(self, state) -> None:
        state, i = np.asarray(state, dtype=np.float64), 0
        for a in self.aux.values():
            n = a.state().size
            a.load(state[i : i + n])
            i += n


def cost_line(model, head, tail, offsets: dict, batch: int) -> str:
    """`zo cost`'s line for --estimator local: what a device keeps and computes for the trainable
    layers below the exact tail ("" when there are none)."""
    from .float_ops import FLOAT_OPS

    taken = set() if head is None else set(head.op.inputs[1:3])
    if tail is not None:
        taken |= {t for f in tail.layers for t in f.op.inputs[1:3]}
    ops = {k.op.index: k.op for k in model.suffix}
    below = []
    for p in model.params:
        op = ops[p.op_index]
        if head is not None and p.tensor not in taken and not p.is_bias and op.kind in FLOAT_OPS:
            below.append(FLOAT_OPS[op.kind](op, model.graph))
            taken |= {t for t in op.inputs[1:3] if t in offsets}
    if not below:
        return ""
    local = LocalEstimator(model, below, offsets, model.num_classes)
    macs = batch * (sum(layer.macs_per_image for layer in local.layers) + local.aux_macs_per_image())
    heads = sum(a.w.size + a.b.size for a in local.aux.values())
    return (
        f"--estimator local: {len(local.layers)} layer(s) below the exact tail on {len(local.aux)} auxiliary "
        f"head(s) ({heads:,} float32 values, with Adam's moments {12 * heads / 1024:.1f} KiB); device memory "
        f"{local.memory_bytes(batch) / 1024:.1f} KiB for batch {batch} (the heads, the layers' int8 inputs, "
        f"one float32 output-gradient buffer); {macs:,} fp32 multiply-adds a step on the M55 (every layer "
        "each step; --local-layers round-robin: one), no extra pass"
    )
