"""The roundings that decide single codes, held to TFLM on inputs built to land on them.

Random scales almost never put a product within one unit of a rounding boundary: a multiplier off
by one in its last bit moves about one output in 10^7, and a tie rule shows only on exact ties. So
the random op tests barely see these paths. Every case here is built so that a large share of its
elements sits exactly on them, and runs on every MAC path (tests/kernel_paths.py):
- exact ties: real multipliers j / 2^p * 2^-k (j odd, j / 2^p in (1/2, 1)) over every input code,
  weights of both signs: SaturatingRoundingDoublingHighMul sees ties of both signs at k = 0 (TFLM
  rounds them up, toward +inf) and RoundingDivideByPOT at k > 0 (away from zero);
- the multiplier's own rounding: scales whose double product is r0 (1 - a^2), just below r0 = j / 2^p
  by less than half a unit of the multiplier's last bit. QuantizeMultiplier rounds it to r0 * 2^31
  exactly (its fraction is above one half); a truncating one gives r0 * 2^31 - 1, which moves the
  positive ties down;
- ADD and SUB over all 65,536 input pairs with power-of-two scale ratios: their rescale and output
  RoundingDivideByPOT on ties of both signs, for every tie class of the shift.
The oracle is TFLM itself. docs/numerics.md describes the roundings.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from npusim.testing import oracle as O

import cases as C
from kernel_paths import DEPTHWISE_PATHS, PATHS, kernel_path

EVERY_CODE = np.arange(-128, 128, dtype=np.int8)
SHIFTS = range(5)  # 2^-k of the real multiplier: k = 0 rounds in the high multiply alone
WEIGHTS = (1, -2)  # accumulators of every code, and of the even ones negated
R0 = [Fraction(3, 4), Fraction(5, 8), Fraction(7, 8)]  # j / 2^p, j odd


def channel_scales(family: str, r0: Fraction) -> tuple[float, np.ndarray, np.ndarray]:
    """(input scale, per-channel filter scales, per-channel weights) of one case, a channel per
    (shift, weight): input scale x filter scale is the real multiplier (output scale 1)."""
    p = int(math.log2(r0.denominator))
    if family == "exact":
        in_scale, base = 1.0, float(r0)
    else:
        # in = r0 (1 + a), filter = (1 - a) 2^-k, a = 2^p 2^-24: both exact in float32, their
        # double product r0 (1 - a^2) 2^-k (< 2^-22 relative: 48 bits, exact in double too).
        a = 2.0**p * 2.0**-24
        in_scale, base = float(r0) * (1 + a), 1 - a
        assert np.float32(in_scale) == in_scale and np.float32(base) == base
    scales, weights = [], []
    for k in SHIFTS:
        for w in WEIGHTS:
            scales.append(base * 2.0**-k)
            weights.append(w)
    return in_scale, np.array(scales, np.float32), np.array(weights, np.int8)


def assert_premise(family: str, r0: Fraction, in_scale: float, scales: np.ndarray):
    """What makes the case sensitive, checked on the scales themselves (plain arithmetic, not
    npusim's): exact ties need the multipliers exact in 31 bits; the other family a multiplier
    whose 2^31-scaled mantissa has a fraction in (1/2, 1), so that rounding and truncation differ."""
    for k, s in zip(np.repeat(list(SHIFTS), len(WEIGHTS)), scales):
        real = Fraction(in_scale) * Fraction(float(s))  # what TFLM computes in double, exactly
        mantissa = real * 2**k * 2**31  # frexp: real = (mantissa / 2^31) 2^-k, mantissa in [2^30, 2^31)
        if family == "exact":
            assert mantissa == r0 * 2**31
        else:
            assert r0 * 2**31 - 1 + Fraction(1, 2) < mantissa < r0 * 2**31, float(mantissa)


def mac_case(kind: str, family: str, r0: Fraction) -> C.Case:
    in_scale, scales, weights = channel_scales(family, r0)
    assert_premise(family, r0, in_scale, scales)
    channels = scales.size
    bias = np.zeros(channels, np.int32)
    desc = f"{kind}, {family} multipliers {r0} x 2^-k"
    if kind.startswith("CONV_2D"):
        # 1x1 (the pointwise kernels) or 3x3 with the weight at the centre (the general ones):
        # the same accumulators, x times the channel's weight, either way.
        x = EVERY_CODE.reshape(1, 16, 16, 1)
        size = 3 if kind.endswith("3x3") else 1
        w = np.zeros((channels, size, size, 1), np.int8)
        w[:, size // 2, size // 2, 0] = weights
        model = O.conv2d_model(x.shape, w, bias, in_scale, 0, scales, 1.0, 0)
    elif kind == "DEPTHWISE_CONV_2D":
        x = np.repeat(EVERY_CODE.reshape(1, 16, 16, 1), channels, axis=3)
        model = O.depthwise_model(
            x.shape, weights.reshape(1, 1, 1, channels), bias, in_scale, 0, scales, 1.0, 0
        )
    else:
        x = EVERY_CODE.reshape(1, 256, 1)
        model = O.fully_connected_model(
            x.shape, weights.reshape(channels, 1), bias, in_scale, 0, scales, 1.0, 0, keep_num_dims=True
        )
    return C.Case(model, x, desc)


def tie_cases(kinds, r0: Fraction = R0[0]) -> list[C.Case]:
    """Both families of each kind, for the tests that run cases in a process compiled for another
    CPU (test_generic_cpu.py, test_avx2_cpu.py)."""
    return [mac_case(kind, family, r0) for kind in kinds for family in FAMILIES]


def check_on(path: str, case: C.Case):
    expected = O.run_tflm(case.model, case.xs)
    assert expected.size >= 256 * len(SHIFTS) * len(WEIGHTS)
    with kernel_path(path):
        O.assert_same(expected, O.run_npusim(case.model, case.xs), f"{case.desc}, {path} path")


FAMILIES = ["exact", "just below"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("r0", R0, ids=str)
@pytest.mark.parametrize("kind", ["CONV_2D 1x1", "CONV_2D 3x3", "FULLY_CONNECTED"])
def test_mac_output_stage_on_ties(kind, r0, family, path):
    check_on(path, mac_case(kind, family, r0))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("r0", R0, ids=str)
def test_depthwise_output_stage_on_ties(r0, family, path):
    check_on(path, mac_case("DEPTHWISE_CONV_2D", family, r0))


# (s1, z1, s2, z2, s_out, z_out): the rescaled sum is (x1 - z1) s1 + (x2 - z2) s2 in units of s_out,
# a multiple of 2^-d with ties in every class of the final RoundingDivideByPOT.
PAIR_TIES = [
    (0.5, 0, 0.5, 0, 1.0, 0),  # (x1 + x2) / 2
    (0.25, 3, 0.5, -5, 1.0, 2),  # x1 / 4 + x2 / 2
    (0.1, -7, 0.1, 9, 0.4, -1),  # (x1 + x2) / 4 with float32 0.1 and 0.4 = 4 x 0.1
    (0.75, 0, 0.375, 0, 3.0, 0),  # x1 / 4 + x2 / 8, multipliers 3 x 2^-m
    (0.125, 0, 0.0625, 0, 2.0, 0),  # x1 / 16 + x2 / 32
]


def check_every_pair(kind: str, params: tuple):
    model = O.binary_model(kind, (1, 65536), (1, 65536), *params)
    pairs = C.every_int8_pair()
    expected = O.run_tflm(model, pairs)
    O.assert_same(expected, O.run_npusim(model, pairs), f"{kind} of every int8 pair, {params}")


@pytest.mark.parametrize("params", PAIR_TIES, ids=lambda p: "/".join(map(str, p)))
@pytest.mark.parametrize("kind", ["ADD", "SUB"])
def test_add_and_sub_every_pair_on_ties(kind, params):
    check_every_pair(kind, params)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("r0", R0, ids=str)
def test_mul_every_pair_on_ties(r0, family):
    """MUL's one multiplier s1 s2 / s_out is the MAC ops' in_scale x filter scale: the same two
    families, over the products of every pair (in units of 2^-6, mostly within int8)."""
    in_scale, scales, _ = channel_scales(family, r0)
    assert_premise(family, r0, in_scale, scales)
    check_every_pair("MUL", (in_scale, 0, float(scales[0]), 0, 64.0, 0))


def test_add_rescale_32_bit_form_equals_tflm_high_mul():
    """ADD's input rescale computes SaturatingRoundingDoublingHighMul((x - z) << 20, m) in 32-bit
    lanes (kernels/elementwise.shifted_high_mul). Its low bits almost never reach an output (they sit 20 bits
    below it), so the every-pair tests above cannot see an error there: held here to TFLM's 64-bit
    formula (nudge 2^30 or 1 - 2^30, division by 2^31 truncating toward zero) for every difference
    x - z and multipliers of every residue of the 11 bits the 32-bit form splits off."""
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from npusim.kernels.elementwise import shifted_high_mul

    @intrinsic
    def high_mul_lanes(typingctx, d_ptr, m_ptr, out_ptr, count):
        def codegen(context, builder, signature, args):
            v16 = ir.VectorType(ir.IntType(32), 16)
            d, m, out = (builder.inttoptr(a, v16.as_pointer()) for a in args[:3])
            with cgutils.for_range(builder, builder.sdiv(args[3], ir.Constant(args[3].type, 16))) as loop:
                i = loop.index
                d_i, m_i = (builder.load(builder.gep(a, [i]), align=4) for a in (d, m))
                builder.store(shifted_high_mul(builder, d_i, m_i), builder.gep(out, [i]), align=4)
            return context.get_dummy_value()

        return types.void(types.int64, types.int64, types.int64, types.int64), codegen

    @njit
    def run(d, m, out):
        high_mul_lanes(d.ctypes.data, m.ctypes.data, out.ctypes.data, d.size)
        return out

    rng = np.random.default_rng(0)
    high = np.concatenate([[0, 1, (1 << 20) - 1], rng.integers(0, 1 << 20, 5)])  # m >> 11
    m = (high[:, None] << 11 | np.arange(1 << 11)[None, :]).ravel()
    m = m[(m >= 0) & (m < (1 << 31))]
    d = np.arange(-256, 256)
    dd, mm = (a.ravel().astype(np.int32) for a in np.meshgrid(d, m, indexing="ij"))
    got = run(dd, mm, np.empty_like(dd))
    p = (dd.astype(np.int64) << 20) * mm.astype(np.int64)
    nudged = p + np.where(p >= 0, 1 << 30, 1 - (1 << 30))
    expected = np.where(nudged >= 0, nudged // (1 << 31), -((-nudged) // (1 << 31)))
    np.testing.assert_array_equal(got, expected)
