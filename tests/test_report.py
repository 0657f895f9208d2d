"""The study report's statistics: paired confidence intervals and the flattening criterion."""

import numpy as np
import pytest

from experiments.report import late_gain, paired_interval


def test_paired_interval_is_the_t_interval_of_the_differences():
    mean, lo, hi = paired_interval(np.array([1.0, 2.0, 3.0]))
    half = 4.302652729911275 * 1.0 / np.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert (mean, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert np.isnan(paired_interval(np.array([0.5]))[1])


def test_late_gain_reads_the_last_third_of_the_curve():
    evals = np.array([[0, 0.1], [300, 0.5], [600, 0.6], [900, 0.64]])
    runs = [{"evals": evals}, {"evals": evals + [0, 0.02]}]
    assert late_gain(runs, 900) == pytest.approx(0.04)
