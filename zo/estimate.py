"""What one training step measured and what it cost, as a scheduler and a cost model read it.

A step's gradient has an exact part (the head and its exact tail, zo/head_grad.py, zo/tail.py:
one forward pass, local products on the Cortex-M55) and an estimated part (ZO below the tail). The
trainer records each step's StepEstimate as `Trainer.last_estimate` (/work/notes/zo-interface.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepEstimate:
    # The per-direction estimates of the ZO part: one directional derivative per direction (and per
    # probed mini-batch) for the weights estimator, one per (direction, example) for the activity
    # estimator; empty when the step had no ZO part. A scheduler reads their variance.
    estimates: np.ndarray = field(default_factory=lambda: np.zeros(0))
    suffix_passes: int = 0  # forward passes of the trainable suffix over one mini-batch
    local_macs: int = 0  # multiply-adds of the local gradients on the M55 (head outer product, tail layers)
    local_elements: int = 0  # elementwise M55 work (the head's input gradient spread back, masks)
    exact_coords: int = 0  # trainable values whose gradient was exact this step
