"""QScheduler v5 (zo/schedulers.py, ProgressRate): q from measured per-direction statistics and the
step's measured cost split, maximising expected progress per unit of cost (docs/zo.md)."""

from __future__ import annotations

import json
import math

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
    estimates' spread from two groups of directions, and each decision is the rule's on the resolved
    signal of what it measured: a q, or the skip (q = 0) where the exact part alone steps faster."""
    model, data = deep
    t = hybrid(model, data, tmp_path / "run", budget=3000)
    assert isinstance(t.scheduler, ProgressRate) and t.activity is not None and not t.blocks
    decisions = recorded_decisions(t)
    rule = t.scheduler
    assert (rule.fixed, rule.per_direction, rule.exact_only) == (1.0, 2.0, 1.0)  # a pass budget
    assert len(decisions) >= 2 and all(noise > 0 for _, noise, _, _ in decisions)  # it measured the spread
    assert all(exact > 0 for _, _, exact, _ in decisions)  # and the exact head's and tail's |g|^2
    for resolved, noise, exact, skipped in decisions:
        q = best_q(resolved, noise, 1.0, 2.0, exact=exact)
        assert skipped == (progress_rate(q, resolved, noise, 1.0, 2.0, exact) < exact / 1.0)
    # a step that measured formed its estimate from q directions in two groups: 2q passes still
    assert t.forward_passes <= 3000


def recorded_decisions(t) -> list:
    """Run t, recording at each decision of its rate rule the resolved signal, the summed noise and
    exact part it decided on, and whether it then skipped the estimated layers."""
    rule, decisions = t.scheduler, []
    observe = rule.observe_estimates

    def record(progress, signal, noise, exact=0.0):
        n = rule.measured + 1
        decides = n % rule.window == 0
        if decides:  # the sums the rule is about to decide on, its signal z standard errors lower
            total, squares = rule.signal + signal, rule.signal_sq + signal * signal
            spread = np.sqrt(n * max(squares - total**2 / n, 0.0) / (n - 1))
            sums = (total - rule.z * spread, rule.noise + noise, rule.exact + exact)
        observe(progress, signal, noise, exact=exact)
        if decides:
            decisions.append(sums + (bool(rule.skipping),))

    rule.observe_estimates = record
    t.run()
    return decisions


def test_the_rate_rule_takes_more_directions_when_a_step_costs_more(deep, tmp_path, monkeypatch):
    """Under --budget-ms the rule weighs the step's priced parts (zo/cost.step_parts: the M55's local
    gradients against the NPU's suffix passes) and the spread it measured: each decision is best_q of
    the measured sums and the priced split. An M55 1000 times slower makes a step's fixed part larger
    against a direction's, and on the same measured statistics the rule takes more directions (no
    constant of the rule changes)."""
    import zo.cost

    model, data = deep
    fast = hybrid(model, data, tmp_path / "fast", ProgressRate(window=5), budget_ms=6000.0)
    fast_split = fast.step_cost_split(1)[:2]
    monkeypatch.setattr(zo.cost, "M55_SUSTAINED_FRACTION", zo.cost.M55_SUSTAINED_FRACTION / 1000)
    slow = hybrid(model, data, tmp_path / "slow", ProgressRate(window=5), budget_ms=30000.0)
    *slow_split, exact_only, layers = slow.step_cost_split(1)
    # the split is the priced step: the round robin's step_parts, in passes of equal device time; and a
    # step of the exact part alone, priced without the perturbed layer
    tensors = [p.tensor for p in slow.model.params]
    parts = zo.cost.step_parts(slow.model.interp, tensors, 1, 16)
    alone = zo.cost.step_parts(slow.model.interp, tensors, 1, 16, estimated=False)
    per_pass = slow.device_seconds_per_pass
    assert slow_split == pytest.approx([parts["fixed_s"] / per_pass, parts["per_direction_s"] / per_pass])
    assert exact_only == pytest.approx(alone["fixed_s"] / per_pass) and exact_only < slow_split[0]
    assert layers == len(slow.activity.layers) == 1
    assert slow_split[0] / slow_split[1] > 5 * fast_split[0] / fast_split[1]
    decisions = recorded_decisions(slow)
    assert len(decisions) >= 2
    assert (slow.scheduler.fixed, slow.scheduler.per_direction) == pytest.approx(slow_split)
    for resolved, noise, exact, skipped in decisions:  # the resolved sums against the priced split
        q = best_q(resolved, noise, *slow_split, exact=exact)
        assert skipped == (progress_rate(q, resolved, noise, *slow_split, exact) < exact / exact_only)
    # On the same measured spread the slower M55 (a larger fixed part) asks for more directions
    # (the estimated part's own answer; the exact part weighs it down to few here):
    slow_qs = [best_q(abs(s), v, *slow_split) for s, v, _, _ in decisions]
    fast_qs = [best_q(abs(s), v, *fast_split) for s, v, _, _ in decisions]
    assert all(a >= b for a, b in zip(slow_qs, fast_qs)) and slow_qs != fast_qs


def feed_steps(rule, signals, noise, fixed, per_direction, exact, exact_only=0.0, layers=1, start=0):
    """Feed the rule one measured step per signal (the steps where it asks for q >= 2), with its
    costs; returns the step after the last."""
    step, fed = start, 0
    while fed < len(signals):
        rule.observe_costs(fixed, per_direction, exact_only, layers)
        if rule.next_q(Progress(step, 0, 10**9)) >= 2:
            rule.observe_estimates(Progress(step, 0, 10**9), signals[fed], noise, exact=exact)
            fed += 1
        step += 1
    return step


def spread_out(mean, spread, n, seed=0):
    """n per-step signals of the given mean whose scatter is `spread` (a measured estimate's)."""
    values = np.random.default_rng(seed).normal(size=n)
    return mean + spread * (values - values.mean()) / values.std(ddof=1)


def test_an_unresolved_signal_does_not_drive_q_up():
    """The rule weighs the signal its window resolves (its sum less 2 standard errors from the
    per-step spread), not the point estimate: a positive mean swamped by its own scatter counts as
    none. Under the rule before, the same window's mean (0.01 of noise 3 a step, sums 0.2 and 60 over
    20 steps) against a small exact part (0.002 a step) and a large fixed cost gave q = 64."""
    signals = spread_out(0.01, 0.5, 20)  # se of the sum 0.5 sqrt(20) = 2.2 > its 0.2
    assert best_q(0.2, 60.0, 200.0, 1.0, exact=0.04) == 64  # the point estimate's answer
    rule = ProgressRate()
    feed_steps(rule, signals, 3.0, 200.0, 1.0, 0.002)
    assert rule.q == 1 and rule.changes and rule.changes[-1][1] == 1
    # the same mean resolved (a scatter 100 times smaller) keeps its answer
    rule = ProgressRate()
    feed_steps(rule, spread_out(0.01, 0.005, 20), 3.0, 200.0, 1.0, 0.002)
    assert rule.q == best_q(0.2 - 2 * 0.005 * math.sqrt(20), 60.0, 200.0, 1.0, exact=0.04) == 64


def test_the_estimated_layers_are_skipped_while_they_cannot_pay_for_their_cost():
    """With an exact part that can step alone (exact_only > 0: the hybrid trainer's), the rule starts
    by only measuring the estimated layers (q = 0, a round of them at q = 2 every `every` rounds),
    skips them while a step with them makes less progress per unit of cost than the exact part
    alone, measures them ever more rarely while the evidence accumulates, and takes them back when
    their resolved signal pays."""
    rule = ProgressRate(window=4, every=5)
    rule.observe_costs(10.0, 1.0, exact_only=6.0, layers=2)
    assert rule.skipping and rule.notes  # one line: what it does until the signal is resolved
    qs = [rule.next_q(Progress(s, 0, 10**9)) for s in range(20)]
    assert qs == [0] * 8 + [2, 2] + [0] * 8 + [2, 2]  # a round of both layers every 5 rounds
    # noise swamps the signal: skipped; the interval doubles and the evidence is kept
    step = feed_steps(rule, spread_out(0.01, 1.0, 4), 50.0, 10.0, 1.0, 1.0, 6.0, 2)
    assert rule.skipping and rule.interval == 10 and rule.measured == 4
    step = feed_steps(rule, spread_out(0.01, 1.0, 4, seed=1), 50.0, 10.0, 1.0, 1.0, 6.0, 2, start=step)
    assert rule.skipping and rule.interval == 20 and rule.measured == 8
    # every layer is still measured: both steps of a round, whatever the interval
    measured = [s for s in range(200) if rule.measures(s)]
    assert measured == [38, 39, 78, 79, 118, 119, 158, 159, 198, 199]
    # a strong resolved signal (its progress outweighs the extra cost): the layers train again
    notes = len(rule.notes)
    feed_steps(rule, [40.0] * 8, 50.0, 10.0, 1.0, 1.0, 6.0, 2, start=step)
    assert not rule.skipping and rule.q >= 1 and rule.changes[-1][1] == rule.q
    assert len(rule.notes) == notes + 1 and "train again" in rule.notes[-1]
    state = json.loads(json.dumps(rule.state()))
    again = ProgressRate(window=4, every=5)
    again.load(state)
    assert again.state() == rule.state()


def test_the_skip_weighs_the_rates_not_the_signal_alone():
    """A resolved but small signal whose step costs more than it adds is skipped too: the rate with
    the layers at the best q, (E + q s^2 / (q s + v)) / (C_s + q C_p), against the exact part's E / C_0."""
    rule = ProgressRate(window=4)
    feed_steps(rule, [3.0] * 4, 10.0, 10.0, 1.0, 2.0, exact_only=6.0)
    q = best_q(12.0, 40.0, 10.0, 1.0, exact=8.0)
    assert q == 3 and progress_rate(q, 12.0, 40.0, 10.0, 1.0, 8.0) < 8.0 / 6.0
    assert rule.skipping and rule.changes == []  # it started skipped and stays so
    # the same statistics, a dearer step of the exact part alone: a step with the layers pays
    rule = ProgressRate(window=4)
    feed_steps(rule, [3.0] * 4, 10.0, 10.0, 1.0, 2.0, exact_only=9.5)
    assert progress_rate(q, 12.0, 40.0, 10.0, 1.0, 8.0) > 8.0 / 9.5
    assert not rule.skipping and rule.q == q and rule.changes[-1][1] == q


def test_a_skipped_step_moves_the_exact_part_and_costs_what_it_alone_costs(deep, tmp_path):
    """The trainer at q = 0: one pass, the step priced without the perturbed layer (zo/cost.step_parts
    estimated=False), the estimated layers' gradient zero, and the rule's lines printed."""
    model, data = deep
    lines = []
    t = hybrid(model, data, tmp_path / "run", budget_ms=4000.0)
    t.report = lines.append
    assert t.step_passes(0, 1) == 1
    t.scheduler.observe_costs(*t.step_cost_split(1))
    exact = t.step_overhead(0, 1) + t.device_seconds_per_pass
    with_layer = t.step_overhead(1, 1) + 3 * t.device_seconds_per_pass
    assert exact == pytest.approx(t.hybrid_parts["exact"][0]) and exact < with_layer
    t.run()
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    steps = [dict(zip(header, r.split(","))) for r in rows[1:]]
    qs = [int(r["q"]) for r in steps if r["train_loss"]]
    assert 0 in qs and 2 in qs  # skipped steps, and the measuring rounds
    assert any("only measured" in line for line in lines)
