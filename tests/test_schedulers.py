"""The q schedulers: formulas, SlopeTest's plateau test, budget awareness and resumable state."""

import json
import math

import numpy as np
import pytest

from zo.schedulers import (
    CoupledSlopeTest,
    EfficiencyTest,
    FixedQ,
    LinearRamp,
    PowerLaw,
    Progress,
    SignalToNoise,
    SlopeTest,
    parse_scheduler,
)


def test_fixed_linear_power_formulas():
    assert FixedQ(8).next_q(Progress(5, 100, 1000)) == 8
    ramp = LinearRamp(q_max=32)
    assert [ramp.next_q(Progress(0, p, 1000)) for p in (0, 250, 500, 999, 1000)] == [1, 8, 16, 31, 32]
    power = PowerLaw(q_max=32, a=0.5, epochs=10)
    b = math.log(32 / 0.5) / math.log(10)
    for e in range(1, 11):
        passes = (e - 1) * 100
        assert power.next_q(Progress(0, passes, 1000)) == min(max(math.floor(0.5 * e**b + 1e-9), 1), 32)
    assert power.next_q(Progress(0, 999, 1000)) == 32


def feed(s: SlopeTest, losses, budget=10**9):
    passes = 0
    for step, loss in enumerate(losses, 1):
        q = s.next_q(Progress(step - 1, passes, budget))
        passes += 2 * q
        s.observe(Progress(step, passes, budget), q, np.array([loss]), np.array([loss]))
    return passes


def test_qscheduler_holds_q_while_the_noisy_loss_still_falls():
    rng = np.random.default_rng(0)
    s = SlopeTest(q_init=2, window=400)
    # 0.08 per window (4% of the loss) against a step-to-step noise of 0.1 (a batch of 32 on EuroSAT)
    feed(s, 2.0 - 0.0002 * np.arange(2000) + rng.normal(0, 0.1, 2000))
    assert s.q == 2 and s.changes == []


def test_qscheduler_doubles_q_on_a_plateau_up_to_q_max():
    rng = np.random.default_rng(1)
    s = SlopeTest(q_init=1, q_max=8, window=400)
    feed(s, 1.5 + rng.normal(0, 0.1, 2000))
    assert s.q == 8
    assert [q for _, q in s.changes] == [2, 4, 8]


def test_qscheduler_does_not_escalate_on_noise_alone():
    """A very noisy loss that still improves by 6% a window: the interval stays wide, then
    confirms the progress; q holds (the naive rule fires here)."""
    rng = np.random.default_rng(3)
    s = SlopeTest(q_init=1, window=400)
    feed(s, 1.5 - 0.00025 * np.arange(6000) + rng.normal(0, 0.6, 6000))
    assert s.q == 1


def test_qscheduler_waits_for_a_decision_on_a_low_noisy_plateau():
    """Loss 0.5 with noise 0.13 (MobileNetV2's head late in training): one window cannot bound the
    improvement below 4% of the loss; the growing collection can, and then q doubles."""
    rng = np.random.default_rng(4)
    s = SlopeTest(q_init=1, q_max=2, window=400)
    feed(s, 0.5 + rng.normal(0, 0.13, 400))
    assert s.q == 1
    feed(s, 0.5 + rng.normal(0, 0.13, 3600))
    assert s.q == 2


def test_qscheduler_keeps_budget_for_a_window_at_the_new_q():
    s = SlopeTest(q_init=4, window=10)
    # Flat loss, but only 100 forward passes left after the window: a doubled q (8) cannot run 10 steps.
    feed(s, np.full(10, 1.0) + np.linspace(0, 1e-9, 10), budget=10 * 8 + 100)
    assert s.q == 4


def test_qscheduler_state_round_trips_through_json():
    rng = np.random.default_rng(2)
    a = SlopeTest(window=20)
    feed(a, 1 + rng.normal(0, 0.1, 130))
    b = SlopeTest(window=20)
    b.load(json.loads(json.dumps(a.state())))
    tail = 1 + rng.normal(0, 0.1, 100)
    feed(a, tail)
    feed(b, tail)
    assert a.state() == b.state()


@pytest.mark.parametrize(
    "spec, cls",
    [
        ("fixed:4", FixedQ),
        ("qscheduler", SlopeTest),
        ("slope:32", SlopeTest),
        ("coupled", CoupledSlopeTest),
        ("snr:16", SignalToNoise),
        ("linear:16", LinearRamp),
        ("power", PowerLaw),
    ],
)
def test_parse(spec, cls):
    assert isinstance(parse_scheduler(spec), cls)


@pytest.mark.parametrize("spec", ["fixed", "fixed:0", "fixed:x", "adaptive", "linear:-2"])
def test_parse_rejects(spec):
    with pytest.raises(ValueError, match="--q"):
        parse_scheduler(spec)


def test_coupled_holds_the_step_of_q_init_while_q_doubles():
    rng = np.random.default_rng(1)
    s = CoupledSlopeTest(q_init=4, q_max=16, window=400)
    feed(s, 1.5 + rng.normal(0, 0.1, 2000))
    assert s.q == 16 and [q for _, q in s.changes] == [8, 16]
    assert s.step_q(s.q) == 4 and SlopeTest().step_q(8) == 8


def feed_paired(s: SignalToNoise, signal: float, noise: float, steps: int, rng, budget=10**9, passes=0):
    """Steps whose paired probes have directional derivatives d_i = a_i + n_i on batch A and
    a_i + n'_i on batch B: a_i ~ N(0, signal) shared (the true gradient along u_i), n ~ N(0, noise)."""
    for step in range(steps):
        progress = Progress(step, passes, budget)
        q, batches = s.next_q(progress), s.probe_batches(progress)
        a = rng.normal(0, np.sqrt(signal), q)
        d = a + rng.normal(0, np.sqrt(noise), (batches, q))
        passes += 2 * q * batches
        s.observe(Progress(step + 1, passes, budget), q, d if batches == 2 else d[0], np.zeros_like(d))
    return passes


def test_snr_pairs_every_few_steps_and_grows_q_with_the_noise_to_signal_ratio():
    rng = np.random.default_rng(0)
    s = SignalToNoise(q_init=4, q_max=64, every=4, window=400)  # a long window: a precise ratio
    assert [s.probe_batches(Progress(k, 0, 1)) for k in range(8)] == [1, 1, 1, 2, 1, 1, 1, 2]
    passes = feed_paired(s, 1.0, 1.0, 4 * 400, rng)  # baseline: 1 + R_0 = 2
    assert s.q == 4 and s.baseline == pytest.approx(2.0, rel=0.1)
    passes = feed_paired(s, 1.0, 1.0, 4 * 800, rng, passes=passes)  # unchanged ratio: q holds
    assert s.q == 4
    feed_paired(s, 0.25, 1.75, 4 * 400, rng, passes=passes)  # 1 + R = 8, four times the baseline
    assert s.q == 16 and s.step_q(16) == 4


def test_snr_keeps_budget_for_a_window_at_the_new_q():
    rng = np.random.default_rng(0)
    s = SignalToNoise(q_init=4, every=4, window=50)
    passes = feed_paired(s, 1.0, 1.0, 200, rng)
    # The signal collapses, but too little budget is left for one window at a larger q.
    feed_paired(s, 0.1, 1.9, 200, rng, budget=passes + 2000 * 4 + 1000, passes=passes)
    assert s.q == 4


def test_adaptive_states_round_trip_through_json():
    for make in (lambda: CoupledSlopeTest(window=20), lambda: SignalToNoise(every=2, window=7)):
        a, b = make(), make()
        feed_paired(a, 1.0, 1.0, 95, np.random.default_rng(5)) if isinstance(a, SignalToNoise) else feed(
            a, 1 + np.random.default_rng(2).normal(0, 0.1, 130)
        )
        b.load(json.loads(json.dumps(a.state())))
        assert a.state() == b.state()
        if isinstance(a, SignalToNoise):
            feed_paired(a, 0.2, 1.0, 60, np.random.default_rng(6), passes=10**4)
            feed_paired(b, 0.2, 1.0, 60, np.random.default_rng(6), passes=10**4)
        else:
            tail = 1 + np.random.default_rng(3).normal(0, 0.1, 100)
            feed(a, tail)
            feed(b, tail)
        assert a.state() == b.state()


# -- the efficiency test (QScheduler v3) ----------------------------------------------------------
def feed_efficiency(s: EfficiencyTest, realized: float, cost: float, steps: int, rng, budget=10**9, passes=0):
    """Per-step losses falling by `realized` (noise 0.1), and second-order costs of `cost` per step
    (noise twice their mean) measured when the scheduler asks."""
    loss = 2.0
    for _ in range(steps):
        q = s.next_q(Progress(0, passes, budget))
        step = len(s.losses)
        measured = s.measure_step(Progress(step, passes, budget))
        passes += 2 * q + 3 * measured
        if measured:
            s.observe_taylor(
                Progress(step + 1, passes, budget), realized + cost, cost + rng.normal(0, 2 * cost)
            )
        loss -= realized
        noisy = loss + rng.normal(0, 0.1)
        s.observe(Progress(step + 1, passes, budget), q, np.array([noisy] * q), np.array([noisy] * q))
    return passes


@pytest.mark.parametrize(
    "realized, expected",
    [
        (0.1e-4, [2, 4]),  # the noise costs ten times the progress: double
        (0.5e-4, []),  # half: a doubling would halve the updates for too little; hold
        (1e-4, []),  # slow but clean progress is no plateau
    ],
)
def test_efficiency_doubles_only_when_the_noise_costs_over_twice_the_progress(realized, expected):
    s = EfficiencyTest(q_init=1, q_max=4, window=400)
    feed_efficiency(s, realized, 1e-4 if realized < 1e-4 else 0.2e-4, 8000, np.random.default_rng(0))
    assert [q for _, q in s.changes] == expected


def test_efficiency_halves_q_when_the_step_is_clean():
    s = EfficiencyTest(q_init=8, window=400)
    feed_efficiency(s, 1e-4, 0.1e-4, 3000, np.random.default_rng(1))
    assert s.changes and s.changes[0][1] == 4


def test_efficiency_measures_at_its_overhead_and_keeps_budget_for_a_window():
    s = EfficiencyTest(q_init=1, overhead=0.02)
    assert s.every() == 75  # 3 passes every 75 steps of 2: 2%
    s.q = 64
    assert s.every() == 2

    # Noise that costs a hundred times the progress, measured often enough (every 6th step) that
    # the first window decides: with an unlimited budget q doubles at step 400.
    def run(budget):
        s = EfficiencyTest(q_init=1, window=400, overhead=0.25)
        passes = feed_efficiency(s, 0.1e-4, 1e-3, 400, np.random.default_rng(2), budget=budget)
        return s, passes

    unlimited, spent = run(10**9)
    assert unlimited.changes == [(400, 2)]
    # The doubling needs one window at q = 2 left: 2 * 2 * 400 passes beyond those spent.
    enough, _ = run(spent + 2 * 2 * 400)
    assert enough.changes == [(400, 2)]
    short, _ = run(spent + 2 * 2 * 400 - 1)
    assert short.q == 1 and short.changes == []


def test_efficiency_state_round_trips_through_json():
    a, b = EfficiencyTest(window=50), EfficiencyTest(window=50)
    feed_efficiency(a, 0.1e-4, 1e-4, 130, np.random.default_rng(3))
    b.load(json.loads(json.dumps(a.state())))
    assert a.state() == b.state()
    feed_efficiency(a, 0.1e-4, 1e-4, 300, np.random.default_rng(4))
    feed_efficiency(b, 0.1e-4, 1e-4, 300, np.random.default_rng(4))
    assert a.state() == b.state()
