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


def test_every_optimizer_steps_and_its_state_round_trips():
    for name, kind in OPTIMIZERS.items():
        opt = kind(3)
        step = opt.step(np.array([1.0, -1.0, 0.0]), 0.1, np.array([0.5, -0.5]))
        assert step.shape == (3,) and step[0] < 0 < step[1], name
        twin = kind(3)
        twin.load(opt.state())
        grad = np.array([0.2, 0.3, -0.4])
        assert np.array_equal(twin.step(grad, 0.1, np.ones(2)), opt.step(grad, 0.1, np.ones(2))), name


def test_normalized_step_grows_linearly_with_q():
    """The same normalized estimate from q = 4 and from q = 16 probes: the q = 16 step is 4 times larger."""
    grad = np.array([0.5, -1.0, 2.0])
    small = NormalizedSGD(3, momentum=0.0).step(grad, 0.03, np.ones(4))
    large = NormalizedSGD(3, momentum=0.0).step(grad, 0.03, np.ones(16))
    assert np.allclose(large, 4 * small) and np.allclose(small, -0.03 * grad)
