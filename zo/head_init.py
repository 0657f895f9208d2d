"""Forward-only initialization of a fresh classifier head, before zeroth-order training.

The features are what the deployed model (its frozen layers, and the lower trainable layers as
deployed) computes at the head's input for the training images: forward passes the device runs, one
per mini-batch, charged to the training budget. From them, on the host:

- `ridge` (default): a closed-form regularized least-squares fit of the features to centred one-hot
  targets, W = (Xc'Xc + lambda I)^-1 Xc'Y. On a device it is accumulated in one streaming pass
  (X'X, D x D; X'Y, D x C; the feature sum and the class counts) and solved once.
- `imprint`: class-mean prototypes ("weight imprinting"), logits x.m_c - |m_c|^2 / 2 (the nearest
  class mean): C x D accumulators, the device-friendly one.
- `zero`: the zero head (every class equally likely), as before initialization existed.

Least squares fits the targets' scale, not the softmax's: a single logit temperature is then fitted
(a 1-D search minimizing the cross-entropy of the logits as the int8 head can hold them, clipped to
its logit range), so the loss starts well below ln C. The head's quantization stays the one chosen
before training (zo/head.py); the weights are rounded to it (docs/zo.md says why, measured).
"""

from __future__ import annotations

import numpy as np

from .errors import ZoError
from .head import LOGIT_RANGE

HEAD_INITS = ("ridge", "imprint", "zero")
# A warning when more than this share of the head's input features is constant over the data.
DEAD_FEATURES_WARNING = 0.5
DEFAULT_HEAD_INIT = "ridge"
# lambda relative to the mean eigenvalue of Xc'Xc (trace / D): scale-free across models.
RIDGE_LAMBDA = 1e-2
# The initialized head's weight scales: "hold" (coarsen a class's scale until its weights fit) or
# "probe" (keep the probe rule's scales and clamp). Chosen by measurement (docs/zo.md).
SCALE_RULE = "hold"


def check_head_init(name: str):
    if name not in HEAD_INITS:
        raise ZoError(f"--head-init {name!r}: expected one of {', '.join(HEAD_INITS)}")


def fit_head(features: np.ndarray, labels: np.ndarray, num_classes: int, method: str) -> tuple:
    """Real-valued head (W [C, D], b [C]) with logits = x W' + b, before the temperature."""
    x = features.astype(np.float64)
    onehot = np.eye(num_classes)[labels]
    if method == "imprint":
        counts = np.maximum(onehot.sum(axis=0), 1)
        means = onehot.T @ x / counts[:, None]
        return means, -0.5 * np.sum(means**2, axis=1)
    if method != "ridge":
        raise ZoError(f"--head-init {method!r}: expected one of {', '.join(HEAD_INITS)}")
    mu = x.mean(axis=0)
    xc = x - mu
    gram = xc.T @ xc
    lam = RIDGE_LAMBDA * max(np.trace(gram) / len(gram), 1e-30)
    targets = onehot - 1.0 / num_classes
    w = np.linalg.solve(gram + lam * np.eye(len(gram)), xc.T @ targets).T
    return w, -(mu @ w.T)


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(labels)), labels]))


def fit_temperature(logits: np.ndarray, labels: np.ndarray, logit_range: float) -> float:
    """The scale s minimizing the cross-entropy of clip(s * logits) (golden-section search on log s)."""
    spread = float(np.std(logits))
    if not spread > 0:
        return 1.0

    def loss(log_s):
        return cross_entropy(np.clip(np.exp(log_s) * logits, -logit_range, logit_range), labels)

    # from a scale that makes the logits' spread 1/100 to one that makes it 100 logit units
    a, b = np.log(0.01 / spread), np.log(100.0 / spread)
    ratio = (np.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(60):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    return float(np.exp((a + b) / 2))


def holding_scales(w: np.ndarray, probe_scale: np.ndarray) -> np.ndarray:
    """Per class the probe rule's weight scale, or max|w_c| / 127 where that is coarser (TFLite's
    converter's per-channel rule): the initialized weights then fit in int8 without a clamp."""
    return np.maximum(probe_scale, np.abs(w).max(axis=1) / 127).astype(np.float32)


def quantize_head(w: np.ndarray, b: np.ndarray, w_scale: np.ndarray, in_scale: float) -> tuple:
    """int8 weights (clamped to +-127) and int32 biases of the real head, at the head's fixed scales;
    and the fraction of weights the clamp changed."""
    codes = np.rint(w / w_scale[:, None])
    clamped = float(np.mean(np.abs(codes) > 127))
    bias = np.rint(b / (np.float64(in_scale) * w_scale.astype(np.float64)))
    bias = np.clip(bias, -(2**31 - 1), 2**31 - 1)
    return np.clip(codes, -127, 127).astype(np.int8), bias.astype(np.int32), clamped


def initialize(model, features: np.ndarray, labels: np.ndarray, method: str, warn) -> int:
    """Fill model's fresh head (a TrainableModel) from the head's input `features` of the training
    images: fit (fit_head), a temperature (fit_temperature), the weight scales held or coarsened to
    fit (SCALE_RULE), the codes rounded into them. warn(message) when most features are dead on this
    data. Returns how many weights were clamped to the int8 range (quantize_head)."""
    dead = float(np.mean(np.ptp(features, axis=0) == 0))
    if dead > DEAD_FEATURES_WARNING:
        warn(
            f"{dead:.0%} of the head's {features.shape[1]} input features are constant over the "
            "training images (dead on this data): the head can learn from the rest only; check the "
            "input mapping (--input-range, --mean/--std) or train lower layers (--trainable last:K)"
        )
    w, b = fit_head(features, labels, model.num_classes, method)
    s = fit_temperature(features @ w.T + b, labels, LOGIT_RANGE)
    w, b = s * w, s * b
    head, tensors = model.head_op, model.graph.tensors
    if SCALE_RULE == "hold":
        probe = tensors[head.inputs[1]].quant.scale
        scales = holding_scales(w, probe)
        if np.any(scales != probe):
            model.requantize_head(scales)
    weights = tensors[head.inputs[1]]
    codes, bias, clamped = quantize_head(
        w, b, weights.quant.scale.astype(np.float64), tensors[head.inputs[0]].scale
    )
    weights.data = codes
    if len(head.inputs) > 2 and head.inputs[2] >= 0:
        tensors[head.inputs[2]].data = bias
    return clamped
