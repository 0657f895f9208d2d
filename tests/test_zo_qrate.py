"""QScheduler v5 (zo/schedulers.py, ProgressRate): q from measured per-direction statistics and the
step's measured cost split, maximising expected progress per unit of cost (docs/zo.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zo.schedulers import (
    Progress,
    ProgressRate,
    best_q,
    direction_statistics,
    parse_scheduler,
    progress_rate,
    split_half_statistics,
)


def test_q_is_one_when_a_step_has_no_fixed_cost():
    for noise in (0.1, 10.0, 1e4):
        assert best_q(1.0, noise, fixed=0.0, per_direction=2.0) == 1


def test_q_grows_with_the_fixed_cost():
    qs = [best_q(1.0, 50.0, fixed, 2.0) for fixed in (0.5, 2.0, 8.0, 32.0, 128.0)]
    assert qs == sorted(qs) and qs[0] < qs[-1]
    assert qs[-1] == 57  # sqrt(50 x 64) = 56.6: the integer of the larger rate


def test_q_responds_to_the_variance():
    qs = [best_q(1.0, noise, 20.0, 2.0) for noise in (0.5, 5.0, 50.0, 500.0)]
    assert qs == sorted(qs) and qs[0] == 2 and qs[-1] == 64  # capped at q_max
    assert best_q(1.0, 0.0, 20.0, 2.0) == 1  # no noise: one direction is the gradient
    assert best_q(-0.1, 5.0, 20.0, 2.0) == 64  # no signal above the noise: the most the rule allows


def test_best_q_is_the_integer_argmax():
    for signal, noise, fixed, per in [(1.0, 7.0, 3.0, 1.0), (0.3, 40.0, 11.0, 2.0), (2.0, 1.0, 100.0, 0.5)]:
        rates = [progress_rate(q, signal, noise, fixed, per) for q in range(1, 65)]
        assert best_q(signal, noise, fixed, per) == 1 + int(np.argmax(rates))


def whole_step_rate(q, signal, noise, fixed, per_direction, exact):
    """The whole step's progress per cost, written out here (not progress_rate): the exact layers'
    |g|^2 plus the estimated layers' |g|^2 times their signal fraction q s / (q s + v)."""
    return (exact + signal * q * signal / (q * signal + noise)) / (fixed + q * per_direction)


def test_q_is_one_when_the_exact_part_dominates():
    """The case that made last:6 lose to the tail alone (docs/zo.md): a large fixed cost and a noisy
    estimate (v / s = 300, C_s / C_p = 8) ask for q = 49 when only the estimated layers' progress
    counts; exact head and tail layers whose |g|^2 is 3% of the estimated layers' already outweigh
    what more directions would add, and the whole step's rate is largest at q = 1."""
    assert best_q(1.0, 300.0, 16.0, 2.0) == 49  # the estimated part alone (the rule before)
    assert best_q(1.0, 300.0, 16.0, 2.0, exact=0.03) == 1
    assert best_q(1.0, 300.0, 16.0, 2.0, exact=10.0) == 1
    # the rate falls from q = 1 on once E / s >= (C_s / C_p) / (v / s): here 64 / 50 = 1.28
    assert best_q(1.0, 50.0, 128.0, 2.0, exact=1.28) == 1 < best_q(1.0, 50.0, 128.0, 2.0, exact=1.2)
    # no signal measured in the estimate: only the exact part's progress is known, and q = 1 pays most
    assert best_q(-0.1, 5.0, 20.0, 2.0, exact=1.0) == 1


def test_q_falls_as_the_exact_part_grows():
    qs = [best_q(1.0, 50.0, 128.0, 2.0, exact=e) for e in (0.0, 0.1, 0.3, 1.0, 1.2, 1.28, 10.0)]
    assert qs == [57, 47, 33, 6, 2, 1, 1]


def test_best_q_is_the_integer_argmax_of_the_whole_step():
    cases = [(1.0, 7.0, 3.0, 1.0, 0.0), (0.3, 40.0, 11.0, 2.0, 0.01), (2.0, 1.0, 100.0, 0.5, 0.5)]
    cases += [(1.0, 300.0, 16.0, 2.0, 0.003), (1.0, 1000.0, 400.0, 1.0, 0.02), (0.5, 20.0, 9.0, 3.0, 5.0)]
    for signal, noise, fixed, per, exact in cases:
        rates = [whole_step_rate(q, signal, noise, fixed, per, exact) for q in range(1, 65)]
        assert best_q(signal, noise, fixed, per, exact=exact) == 1 + int(np.argmax(rates))
        assert progress_rate(3, signal, noise, fixed, per, exact) == pytest.approx(rates[2] / 1.0)
    with pytest.raises(ValueError):
        best_q(1.0, 1.0, 1.0, 1.0, exact=-1.0)


def test_direction_statistics_are_unbiased():
    rng = np.random.default_rng(0)
    g, sigma, q, d = rng.normal(size=50), 3.0, 4, 50
    signals, noises = [], []
    for _ in range(4000):
        est = g + sigma * rng.normal(size=(q, d))
        s, v = direction_statistics(est.sum(0), float((est * est).sum()), q)
        signals.append(s)
        noises.append(v)
    assert np.mean(noises) == pytest.approx(sigma**2 * d, rel=0.02)
    assert np.mean(signals) == pytest.approx(float(g @ g), rel=0.1)


def feed(rule, signal, noise, fixed, per_direction, steps, exact=0.0):
    for step in range(steps):
        progress = Progress(step, 0, 10**9)
        q = rule.next_q(progress)
        rule.observe_costs(fixed, per_direction)
        if q >= 2:
            rule.observe_estimates(progress, signal, noise, exact=exact)
    return rule


def test_the_scheduler_follows_the_measured_statistics():
    # a pass budget with an exact head: C_s = 1 pass, C_p = 2 passes; noise 8x the signal: q* = 2
    assert feed(ProgressRate(), 1.0, 8.0, 1.0, 2.0, 200).q == 2
    # device time with a large fixed cost (local gradients): q grows
    assert feed(ProgressRate(), 1.0, 8.0, 18.0, 2.0, 200).q == 8  # sqrt(8 x 9) = 8.5
    # the same, with an exact head and tail whose |g|^2 is as large as the estimated layers': q = 1
    assert feed(ProgressRate(), 1.0, 8.0, 18.0, 2.0, 200, exact=1.0).q == 1
    # no fixed cost: q = 1, and every tenth step still measures at q = 2
    rule = feed(ProgressRate(), 1.0, 8.0, 0.0, 2.0, 200)
    assert rule.q == 1
    assert [rule.next_q(Progress(s, 0, 10**9)) for s in range(10)] == [1] * 9 + [2]


def test_the_scheduler_state_round_trips():
    rule = feed(ProgressRate(), 1.0, 8.0, 18.0, 2.0, 35, exact=0.01)
    assert rule.exact > 0
    again = ProgressRate()
    again.load(json.loads(json.dumps(rule.state())))
    assert again.state() == rule.state()
    assert isinstance(parse_scheduler("rate:16"), ProgressRate) and parse_scheduler("rate:16").q_max == 16


def test_split_half_statistics_agree_with_the_per_direction_ones():
    rng = np.random.default_rng(1)
    g, sigma, q, d = rng.normal(size=30), 2.0, 6, 30
    pairs = []
    for _ in range(4000):
        est = g + sigma * rng.normal(size=(q, d))
        pairs.append(split_half_statistics(est[: q // 2].sum(0), est[q // 2 :].sum(0), q))
    signal, noise = np.mean(pairs, axis=0)
    assert noise == pytest.approx(sigma**2 * d, rel=0.03)
    assert signal == pytest.approx(float(g @ g), rel=0.1)
    with pytest.raises(ValueError):
        split_half_statistics(g, g, 3)


def test_the_trainer_feeds_the_rule_its_costs_and_estimates(tiny, tmp_path):
    from zo.trainer import TrainConfig, Trainer

    model, data = tiny
    base = dict(model=str(model), data=str(data), batch=16, trainable="last:2", q="rate", seed=0)
    base["estimator"] = "weights"  # the estimator whose per-direction vectors the trainer streams
    t = Trainer(TrainConfig(**base, budget=600), tmp_path / "passes")
    t.run()
    # a pass budget: the head's pass is the fixed cost, a direction two passes
    assert (t.scheduler.fixed, t.scheduler.per_direction) == (1.0, 2.0)
    assert t.scheduler.measured > 0 or t.scheduler.changes
    t = Trainer(TrainConfig(**base, budget_ms=2000.0), tmp_path / "ms")
    fixed, per_direction = t.step_cost_split(1)
    one = t.step_overhead(1, 1)
    # device time: the split reproduces the step's fixed work at q = 1, in passes of equal time
    assert fixed + per_direction == pytest.approx(3 + one / t.device_seconds_per_pass)
    assert fixed > 1.0 and per_direction > 2.0


@pytest.fixture
def deep(tmp_path):
    """The tiny classifier with two 1x1 convs: the upper one is the exact tail, the lower one below it
    (activity perturbation)."""
    from zo_fixtures import color_dataset, tiny_classifier

    model = tmp_path / "deep.tflite"
    model.write_bytes(tiny_classifier(convs=2))
    data = tmp_path / "colors.npz"
    np.savez(data, **color_dataset())
    return model, data


def hybrid(model, data, out, scheduler=None, **kw):
    from zo.trainer import TrainConfig, Trainer

    base = dict(model=str(model), data=str(data), batch=16, trainable="last:3", checkpoint_every=10**6)
    return Trainer(TrainConfig(**(base | kw)), out, scheduler=scheduler)


def test_the_default_q_adapts_under_the_activity_estimator(deep, tmp_path):
    """--q qscheduler (the default) is the rate rule for the hybrid trainer: it measures the activity
    estimates' spread from two groups of directions and moves q."""
    model, data = deep
    t = hybrid(model, data, tmp_path / "run", budget=3000)
    assert isinstance(t.scheduler, ProgressRate) and t.activity is not None and not t.blocks
    windows = recorded_windows(t)
    assert (t.scheduler.fixed, t.scheduler.per_direction) == (1.0, 2.0)  # a pass budget
    assert len(windows) >= 2 and all(noise > 0 for _, noise, _, _ in windows)  # it measured the spread
    assert all(exact > 0 for _, _, exact, _ in windows)  # and the exact head's and tail's |g|^2
    q = 2  # the rule's start; then each decision is best_q of what it measured
    for signal, noise, exact, step in windows:
        q = dict(t.scheduler.changes).get(step, q)
        assert q == best_q(signal, noise, 1.0, 2.0, exact=exact)
    # a step that measured formed its estimate from q directions in two groups: 2q passes still
    assert t.forward_passes <= 3000


def recorded_windows(t) -> list:
    """Run t, recording the (signal, noise, exact) sums of each window its rate rule decided on, and
    the step of the decision."""
    rule, windows, seen = t.scheduler, [], []
    observe = rule.observe_estimates

    def record(progress, signal, noise, exact=0.0):
        seen.append((signal, noise, exact))
        if len(seen) == rule.window:
            windows.append((*np.sum(seen, axis=0), progress.step))
            seen.clear()
        observe(progress, signal, noise, exact=exact)

    rule.observe_estimates = record
    t.run()
    return windows


def test_the_rate_rule_takes_more_directions_when_a_step_costs_more(deep, tmp_path, monkeypatch):
    """Under --budget-ms the rule weighs the step's priced parts (zo/cost.step_parts: the M55's local
    gradients against the NPU's suffix passes) and the spread it measured: each decision is best_q of
    the measured sums and the priced split. An M55 1000 times slower makes a step's fixed part larger
    against a direction's, and on the same measured statistics the rule takes more directions (no
    constant of the rule changes)."""
    import zo.cost

    model, data = deep
    fast = hybrid(model, data, tmp_path / "fast", ProgressRate(window=5), budget_ms=6000.0)
    fast_split = fast.step_cost_split(1)
    monkeypatch.setattr(zo.cost, "M55_SUSTAINED_FRACTION", zo.cost.M55_SUSTAINED_FRACTION / 1000)
    slow = hybrid(model, data, tmp_path / "slow", ProgressRate(window=5), budget_ms=30000.0)
    slow_split = slow.step_cost_split(1)
    # the split is the priced step: the round robin's step_parts, in passes of equal device time
    parts = zo.cost.step_parts(slow.model.interp, [p.tensor for p in slow.model.params], 1, 16)
    per_pass = slow.device_seconds_per_pass
    assert slow_split == pytest.approx((parts["fixed_s"] / per_pass, parts["per_direction_s"] / per_pass))
    assert slow_split[0] / slow_split[1] > 5 * fast_split[0] / fast_split[1]
    windows = recorded_windows(slow)
    assert len(windows) >= 2
    assert (slow.scheduler.fixed, slow.scheduler.per_direction) == pytest.approx(slow_split)
    changes = dict(slow.scheduler.changes)
    for signal, noise, exact, step in windows:  # each decision: the measured sums against the priced split
        q = best_q(signal, noise, *slow_split, exact=exact)
        assert changes.get(step, q) == q
    slow_qs = [best_q(s, v, *slow_split, exact=e) for s, v, e, _ in windows]
    fast_qs = [best_q(s, v, *fast_split, exact=e) for s, v, e, _ in windows]
    assert all(a >= b for a, b in zip(slow_qs, fast_qs))
    # Here the exact head and tail carry most of a step's progress (their |g|^2 is several times the
    # estimated layer's), so both take few directions; the estimated part's own answer to the priced
    # split, on the same measured spread, is what the exact part then weighs down:
    slow_qs = [best_q(s, v, *slow_split) for s, v, _, _ in windows]
    fast_qs = [best_q(s, v, *fast_split) for s, v, _, _ in windows]
    assert all(a >= b for a, b in zip(slow_qs, fast_qs)) and slow_qs != fast_qs
