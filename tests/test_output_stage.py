"""The MAC ops' vector output stage (kernels/output_stage.py) against the scalar TFLM arithmetic of
quant.py, on parameters and accumulators chosen to sit on its edges: channels with a left shift,
M = 2^30 and M = 0, right shifts up to 31, narrow clamp ranges, and accumulators at every rounding
boundary near the clamp range, at the clamp cells' ends and at the ends of int32.

tflm_checked computes in float32 and falls back to the integer form near a rounding boundary; a
wrong bound or a wrong fallback test shows here as a wrong byte. The oracle tests (test_ops_tflm.py,
test_rounding_ties.py) hold the same code to TFLM itself."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from npusim.kernels.output_stage import (
    PARAMETER_ROWS,
    checked_parameters,
    output_parameters,
    output_stage_row,
)
from npusim.kernels.requant import OutputStage
from npusim.quant import (
    TFLM,
    multiply_by_quantized_multiplier,
    multiply_by_quantized_multiplier_array,
    requantize_to_output,
)


@njit(cache=False)
def vector_stage(acc, params, profile, zero_point, lo, hi, out):
    for r in range(acc.shape[0]):
        output_stage_row(
            acc[r].ctypes.data, params.ctypes.data, params.shape[1] * 4, out[r].ctypes.data,
            acc.shape[1], profile, zero_point, lo, hi,
        )  # fmt: skip
    return out


@njit(cache=False)
def scalar_multiply(x, m, shift):
    out = np.empty(x.size, np.int64)
    for i in range(x.size):
        out[i] = multiply_by_quantized_multiplier(x[i], m[i], shift[i])
    return out


@njit(cache=False)
def scalar_stage(acc, offset, m, shift, scale, profile, zero_point, lo, hi):
    out = np.empty(acc.shape, np.int64)
    for r in range(acc.shape[0]):
        for c in range(acc.shape[1]):
            x = np.int64(np.int32(np.int64(acc[r, c]) + np.int64(offset[c])))
            out[r, c] = requantize_to_output(x, m[c], shift[c], scale[c], profile, zero_point, lo, hi)
    return out


def random_stage(rng, channels: int) -> tuple[OutputStage, np.ndarray]:
    m = rng.integers(1 << 30, 1 << 31, channels)
    shift = rng.integers(-12, 1, channels)
    shift[: channels // 4] = rng.integers(-31, 4, channels // 4)  # large right shifts, and left ones
    m[0], m[1], shift[1] = 1 << 30, 0, 0
    zero_point = int(rng.integers(-128, 128))
    lo, hi = np.sort(rng.integers(-128, 128, 2))
    if rng.random() < 0.3:
        lo, hi = -128, 127
    ones = np.ones(channels, np.float32)
    stage = OutputStage(m.astype(np.int32), shift, ones, zero_point, int(lo), int(hi))
    return stage, rng.integers(-(1 << 31), 1 << 31, channels)


def edge_accumulators(rng, stage, offset) -> np.ndarray:
    """Rows of accumulators per channel: random ones over int32 and near zero, the ends of int32,
    the first x of every output value within 3 of the clamp range (and its neighbours), and the
    checked form's own bounds."""
    channels = offset.size
    m, shift = stage.multiplier.astype(np.int64), stage.shift.astype(np.int64)
    rows = [rng.integers(-(1 << 31), 1 << 31, channels) for _ in range(8)]
    rows += [rng.integers(-3000, 3000, channels) for _ in range(8)]
    rows += [np.full(channels, -(1 << 31)), np.full(channels, (1 << 31) - 1)]
    xs = []
    for target in range(stage.lo - stage.zero_point - 3, stage.hi - stage.zero_point + 4):
        lo, hi = np.full(channels, -(1 << 31)), np.full(channels, (1 << 31) - 1)
        for _ in range(33):  # the least x with y(x) >= target
            mid = (lo + hi) >> 1
            ok = multiply_by_quantized_multiplier_array(mid, m, shift) >= target
            lo, hi = np.where(ok, lo, mid + 1), np.where(ok, mid, hi)
        xs += [lo - 1, lo, lo + 1]
    bounds = checked_parameters(stage)[:2].astype(np.int64)
    xs += [bounds[0], bounds[0] - 1, bounds[1], bounds[1] + 1]
    # x = acc + offset: accumulators that give these x (wrapping as int32 does)
    rows += [(((x - offset) + (1 << 31)) & 0xFFFFFFFF) - (1 << 31) for x in xs]
    return np.stack(rows).astype(np.int32)


@pytest.mark.parametrize("seed", range(12))
def test_vector_output_stage_equals_tflm_scalar_on_edges(seed):
    rng = np.random.default_rng(seed)
    stage, offset = random_stage(rng, 48)
    params = output_parameters(offset.reshape(1, -1), stage, 16)[0]
    assert params.shape[0] == PARAMETER_ROWS
    acc = edge_accumulators(rng, stage, offset)
    out = vector_stage(
        acc, params, np.int64(TFLM), np.int64(stage.zero_point), np.int64(stage.lo), np.int64(stage.hi),
        np.zeros(acc.shape, np.int8),
    )  # fmt: skip
    expected = scalar_stage(
        acc, offset, stage.multiplier.astype(np.int64), stage.shift.astype(np.int64), stage.real_scale,
        TFLM, stage.zero_point, stage.lo, stage.hi,
    )  # fmt: skip
    wrong = np.argwhere(out != expected)
    assert wrong.size == 0, (
        f"{len(wrong)} outputs differ, first at {wrong[0]}: acc {acc[tuple(wrong[0])]}, "
        f"M {stage.multiplier[wrong[0][1]]}, shift {stage.shift[wrong[0][1]]}, got "
        f"{out[tuple(wrong[0])]}, expected {expected[tuple(wrong[0])]}"
    )


def test_checked_form_covers_ordinary_channels_and_not_left_shifts():
    """The float form must serve the usual channels (a right shift, a clamp range the output
    reaches), or the vector code pays both forms; a left shift always takes the integer form."""
    rng = np.random.default_rng(0)
    m = rng.integers(1 << 30, 1 << 31, 64)
    shift = rng.integers(-12, 1, 64)
    shift[:4] = [1, 2, 3, 4]
    stage = OutputStage(m.astype(np.int32), shift, np.ones(64, np.float32), -5, -128, 127)
    scale = checked_parameters(stage)[2].view(np.float32)
    assert np.all(scale[:4] == 0)
    assert np.all(scale[4:] > 0)


def test_numpy_multiplier_equals_the_scalar_one():
    """The numpy form that checked_parameters searches with, against quant's scalar form: every
    shift from 31 right to 4 left (which wraps), M = 2^30 and 0, accumulators over all of int32."""
    rng = np.random.default_rng(7)
    n = 100_000
    m = rng.integers(1 << 30, 1 << 31, n)
    m[:100], m[100:200] = 1 << 30, 0
    shift = rng.integers(-31, 5, n)
    x = np.concatenate([rng.integers(-(1 << 31), 1 << 31, n // 2), rng.integers(-5000, 5000, n - n // 2)])
    x[:50], x[50:100] = -(1 << 31), (1 << 31) - 1
    assert np.array_equal(multiply_by_quantized_multiplier_array(x, m, shift), scalar_multiply(x, m, shift))
