"""zo/optim.py: the step rules on the master copy."""

from __future__ import annotations

import numpy as np

from zo.optim import OPTIMIZERS, NormalizedSGD


def test_normalized_step_is_free_of_the_loss_scale():
    """The same probes on a loss 1000 times larger (another model's logit scale, another data set's
    loss level) give the same step: the estimate is divided by the RMS of its own d_i."""
    rng = np.random.default_rng(0)
    d = rng.normal(size=4)
    u = rng.choice([-1.0, 1.0], size=(4, 50))
    steps = []
    for scale in (1.0, 1000.0):
        opt = NormalizedSGD(50, momentum=0.9)
        grad = (scale * d) @ u / 4
        steps.append([opt.step(grad, 0.03, scale * d) for _ in range(3)])
    assert np.allclose(steps[0], steps[1])
    # Its size: lr times the normalized estimate, whose entries are of order 1 / sqrt(q).
    assert 0.003 < np.sqrt(np.mean(steps[0][0] ** 2)) < 0.1


def test_every_optimizer_takes_the_derivatives_argument():
    for name, kind in OPTIMIZERS.items():
        opt = kind(3)
        step = opt.step(np.array([1.0, -1.0, 0.0]), 0.1, np.array([0.5, -0.5]))
        assert step.shape == (3,) and step[0] < 0 < step[1], name
