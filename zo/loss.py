"""Host-side loss: cross-entropy on the dequantized logits, as the Cortex-M55 would compute it."""

from __future__ import annotations

import numpy as np


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-example cross-entropy for logits [N, C] (float) and labels [N]."""
    z = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(axis=1))
    return log_norm - z[np.arange(len(labels)), labels]


def group_losses(logits: np.ndarray, labels: np.ndarray, groups: int) -> np.ndarray:
    """Mean cross-entropy of each of `groups` consecutive blocks of the batch (one per probe)."""
    per_example = cross_entropy(logits, np.tile(labels, groups))
    return per_example.reshape(groups, -1).mean(axis=1)
