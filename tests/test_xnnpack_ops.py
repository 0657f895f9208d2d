"""profile xnnpack against LiteRT's default interpreter (OpResolverType.AUTO) itself, one-op models
of every op beyond the MAC layers (those: test_profiles_litert.py) and the binary elementwise ops,
bit for bit. What XNNPACK takes is asserted per op (test_what_xnnpack_takes); an op it does not take
runs on LiteRT's builtin kernel, which the profile must equal as well.

CPU: the LiteRT answers were measured on x86-64 with AVX2 (no AVX-512, no VNNI). The lookup-table
ops, LEAKY_RELU (integer), RESIZE_BILINEAR (integer blend) and the data movement do not depend on
the ISA; MEAN and SUM do in principle: XNNPACK's x86 AVX2 reduce multiplies and adds in float32
without FMA, and a build that fuses them (ARM, AVX-512 kernels) may break a tie the other way.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_ops_activations import make_plain_binary
from test_ops_batch_matmul import bmm_params, make_bmm
from test_ops_transpose_conv import make_transpose_conv, transpose_conv_params
from test_profiles_litert import examples

from npusim.testing import oracle as O

import cases as C

EVERY_CODE = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 1, 256)


def check(case: C.Case):
    expected = O.run_litert(case.model, case.xs, "AUTO")
    got = O.run_npusim(case.model, case.xs, "xnnpack")
    O.assert_same(expected, got, f"profile xnnpack vs LiteRT AUTO: {case.desc}")


def mismatches(model, xs, profile) -> int:
    return int((O.run_litert(model, xs, "AUTO") != O.run_npusim(model, xs, profile)).sum())


# ----------------------------------------------------------------------------------------------
# What XNNPACK takes (ai-edge-litert 2.3.0)
# ----------------------------------------------------------------------------------------------

_X = (1, 6, 6, 4)
TAKES = {
    "MEAN": (lambda: O.mean_model(_X, 0.05, 3, 0.02, -1), True),
    "SUM": (lambda: O.mean_model(_X, 0.05, 3, 0.5, -1, kind="SUM"), True),
    "REDUCE_MAX": (lambda: O.mean_model(_X, 0.05, 3, 0.05, 3, kind="REDUCE_MAX"), True),
    "MAX_POOL_2D": (lambda: O.max_pool_model(_X, 0.05, 3), True),
    "AVERAGE_POOL_2D": (lambda: O.avg_pool_model(_X, 0.05, 3), False),
    "SOFTMAX": (lambda: O.softmax_model((1, 10), 0.05, 3), False),
    "LOGISTIC": (lambda: O.logistic_model(_X, 0.05, 3), True),
    "TANH": (lambda: O.unary_model("TANH", _X, 0.05, 3, 1 / 128, 0), True),
    "HARD_SWISH": (lambda: O.unary_model("HARD_SWISH", _X, 0.05, 3, 0.03, -100), False),
    "LEAKY_RELU": (lambda: O.leaky_relu_model(_X, 0.05, 3, 0.04, 1, 0.1), True),
    "PRELU": (
        lambda: O.plain_binary_model(
            "PRELU", _X, (1, 1, 1, 4), (0.05, 3), (0.01, 0), (0.04, 1), const2=np.arange(4, dtype=np.int8)
        ),
        False,
    ),
    "RESIZE_BILINEAR": (lambda: O.resize_nearest_model(_X, (12, 12), 0.05, 3, bilinear=True), True),
    "RESIZE_NEAREST_NEIGHBOR": (lambda: O.resize_nearest_model(_X, (12, 12), 0.05, 3), False),
    "CONCATENATION": (lambda: O.concat_model([_X, _X], 3, 0.05, 3), True),
    "PAD": (lambda: O.pad_model(_X, [[0, 0], [1, 1], [1, 1], [0, 0]], 0.05, 3), True),
    "PADV2": (lambda: O.pad_model(_X, [[0, 0], [1, 1], [1, 1], [0, 0]], 0.05, 3, v2=True), False),
    "TRANSPOSE": (lambda: O.transpose_model(_X, (0, 3, 1, 2), 0.05, 3), True),
    "RESHAPE": (lambda: O.reshape_model(_X, (1, 144), 0.05, 3), True),
    "SLICE": (lambda: O.slice_model(_X, (0, 1, 1, 0), (1, 3, -1, 2), 0.05, 3), False),
    "STRIDED_SLICE": (
        lambda: O.strided_slice_model(_X, (0, 1, 0, 0), (1, 6, 6, 4), (1, 2, 2, 1), 0.05, 3),
        False,
    ),
    "SPLIT": (lambda: O.split_model(_X, 3, 2, 0.05, 3), True),
    "SPLIT_V": (lambda: O.split_v_model(_X, [1, 3], 3, 0.05, 3), False),
    "BATCH_MATMUL": (
        lambda: O.batch_matmul_model((1, 4, 6), (1, 6, 5), (0.05, 3), (0.04, 0), (0.3, 1)),
        True,
    ),
}


@pytest.mark.parametrize("kind", sorted(TAKES))
def test_what_xnnpack_takes(kind):
    """The op kinds LiteRT's XNNPACK delegate takes in int8 (and does not), on a typical model: where
    it does not, the profile must equal LiteRT's builtin kernel instead."""
    build, delegated = TAKES[kind]
    assert O.litert_delegated(build()) == delegated, f"{kind}: XNNPACK delegation changed"


# ----------------------------------------------------------------------------------------------
# MEAN and SUM: XNNPACK's float32 reduce
# ----------------------------------------------------------------------------------------------

AXES = [(1, 2), (1, 2), (3,), (2,), (1,), (1, 2, 3), (2, 3), (1, 3)]


@st.composite
def reduce_params(draw, kind="MEAN"):
    p = draw(C.mean_params())
    p["axes"] = draw(st.sampled_from(AXES))
    n = int(np.prod([p["hwc"][a - 1] for a in p["axes"]]))
    if kind == "SUM":  # an output scale that keeps the sums in range
        p["out_scale"] = float(np.float32(p["in_scale"] * n * 10.0 ** draw(st.floats(-1.0, 0.3))))
    return p


def make_reduce(kind, p, seed) -> C.Case:
    rng = np.random.default_rng(seed)
    model = O.mean_model(
        (1, *p["hwc"]),
        p["in_scale"],
        p["in_zp"],
        p["out_scale"],
        p["out_zp"],
        axes=p["axes"],
        keep_dims=p["keep_dims"],
        kind=kind,
    )
    x = O.random_int8(rng, (p["n"], *p["hwc"]), p["x_mode"])
    return C.Case(model, x, f"{kind} {p}, seed={seed}")


@settings(max_examples=examples(120))
@given(p=reduce_params(), seed=C.seeds)
def test_mean(p, seed):
    check(make_reduce("MEAN", p, seed))


@settings(max_examples=examples(60))
@given(p=reduce_params("SUM"), seed=C.seeds)
def test_sum(p, seed):
    check(make_reduce("SUM", p, seed))


def tie_rows(n: int, zp: int) -> np.ndarray:
    """Rows of n codes whose sums minus n * zp run over every multiple of n / 2 in range: the means
    x.5 that a rounding rule decides."""
    rows = []
    for target in range(-128 * n, 128 * n, max(1, n // 2)):
        total = target + n * zp
        row = np.full(n, total // n)
        row[: total - n * (total // n)] += 1
        if row.min() >= -128 and row.max() <= 127:
            rows.append(row)
    return np.array(rows, dtype=np.int8)


@pytest.mark.parametrize(
    "n, zp_in, zp_out, ratio",
    [
        (26, 36, 14, 1.0),
        (36, 7, -31, 1.0),
        (16, -5, 0, 1.0),
        (49, 100, -100, 0.5),
        (10, 0, 3, 2.0),
        (26, -77, 3, 0.73),
    ],
)
def test_mean_ties(n, zp_in, zp_out, ratio):
    """Means on x.5 (global pooling of a [1, 1, n, 1] image): XNNPACK adds the zero points in float32
    before rounding half to even (float(sum) * scale + float(zp_out - n * zp_in * scale)), which
    decides ties in both directions; TFLM's fixed point rounds them away from zero."""
    s = 0.021643908694386482
    model = O.mean_model((1, 1, n, 1), s, zp_in, float(np.float32(s * ratio)), zp_out, axes=(1, 2))
    x = tie_rows(n, zp_in).reshape(-1, 1, n, 1)
    check(C.Case(model, x, f"MEAN ties n={n} zp=({zp_in}, {zp_out}) ratio={ratio}"))
    assert mismatches(model, x, "tflm") > 0, "the ties should separate TFLM's rounding from XNNPACK's"


# ----------------------------------------------------------------------------------------------
# Lookup-table ops on every code: LOGISTIC, TANH, LEAKY_RELU, HARD_SWISH
# ----------------------------------------------------------------------------------------------

in_q = st.tuples(C.log_scale(2e-3, 0.5), C.zero_points)


def unary_case(kind, q_in, q_out, alpha=None) -> C.Case:
    if kind == "LOGISTIC":
        model = O.logistic_model((1, 1, 1, 256), *q_in)
    elif kind == "LEAKY_RELU":
        model = O.leaky_relu_model((1, 1, 1, 256), *q_in, *q_out, alpha)
    else:
        model = O.unary_model(kind, (1, 1, 1, 256), *q_in, *q_out)
    return C.Case(model, EVERY_CODE, f"{kind} in={q_in} out={q_out} alpha={alpha}")


@settings(max_examples=examples(60))
@given(q=in_q)
def test_logistic_every_code(q):
    check(unary_case("LOGISTIC", q, None))


@settings(max_examples=examples(60))
@given(q=in_q, q_out=st.one_of(st.just((1 / 128, 0)), st.tuples(C.log_scale(3e-3, 0.05), C.zero_points)))
def test_tanh_every_code(q, q_out):
    """XNNPACK's table honours the output quantization; TFLM's fixed point assumes (1/128, 0)."""
    check(unary_case("TANH", q, q_out))


def test_logistic_near_tie():
    """Regression (a LOGISTIC of YOLOv8n-seg): code -73 at input (0.0552026, 20) has sigmoid * 256 =
    1.4999963; XNNPACK adds the zero point before rounding (-126.5000037 is -126.5 in float32) and
    rounds half to even: -126. Rounding before adding the zero point gives -127."""
    case = unary_case("LOGISTIC", (0.05520256236195564, 20), None)
    check(case)
    assert O.run_npusim(case.model, case.xs, "xnnpack").ravel()[-73 + 128] == -126


def test_tanh_output_scale_matters():
    case = unary_case("TANH", (0.02, -4), (0.008, 2))
    check(case)
    assert mismatches(case.model, case.xs, "tflm") > 100


@settings(max_examples=examples(80))
@given(
    q=in_q,
    ratio=st.floats(-1.5, 1.5),
    zp_out=C.zero_points,
    alpha=st.one_of(st.sampled_from([0.1, 0.2, 0.01, 0.3]), st.floats(-2.0, 3.0)),
)
def test_leaky_relu_every_code(q, ratio, zp_out, alpha):
    """Delegated (8-bit fixed point) or not (LiteRT's builtin kernel: TFLM's arithmetic)."""
    s_out = float(np.float32(q[0] * 10.0**ratio))
    check(unary_case("LEAKY_RELU", q, (s_out, zp_out), float(np.float32(alpha))))


@pytest.mark.parametrize(
    "alpha, delegated", [(0.1, True), (0.2, True), (-0.5, True), (0.001, False), (0.0, False)]
)
def test_leaky_relu_both_kernels(alpha, delegated):
    """A tiny alpha (|s_in * alpha / s_out| < 2^-8) is refused by XNNPACK: the builtin kernel runs."""
    case = unary_case("LEAKY_RELU", (0.05, 3), (0.04, 1), alpha)
    assert O.litert_delegated(case.model) == delegated
    check(case)


@settings(max_examples=examples(40))
@given(q=in_q, ratio=st.floats(-0.5, 1.0), zp_out=C.zero_points)
def test_hard_swish_every_code(q, ratio, zp_out):
    """Not delegated in int8: LiteRT's builtin HARD_SWISH, which is TFLM's."""
    s_out = float(np.float32(q[0] * 10.0**ratio))
    check(unary_case("HARD_SWISH", q, (s_out, zp_out)))


@settings(max_examples=examples(40))
@given(p=C.add_params(), seed=C.seeds)
def test_prelu(p, seed):
    """Not delegated in int8: LiteRT's builtin PRELU, which is TFLM's (LiteRT's requires the output
    to have the input's shape: alpha broadcasts into it)."""
    assume(np.broadcast_shapes(*p["shapes"]) == tuple(p["shapes"][0]))
    check(make_plain_binary("PRELU", p, seed))


# ----------------------------------------------------------------------------------------------
# Pooling, SOFTMAX
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@settings(max_examples=examples(60))
@given(p=C.pool_params(), seed=C.seeds)
def test_pool(kind, p, seed):
    check(C.make_pool(kind, p, seed))


@settings(max_examples=examples(80))
@given(p=C.softmax_params(), seed=C.seeds)
def test_softmax(p, seed):
    """Not delegated in int8: LiteRT's builtin softmax, a float lookup table (x86 build)."""
    check(C.make_softmax(p, seed))


def test_softmax_float_table_differs_from_tflm():
    """LiteRT's float-table softmax and TFLM's fixed point part on a few rows in thousands."""
    rng = np.random.default_rng(0)
    differ = 0
    for scale, zp, depth in [(0.1, -20, 40), (0.02, 0, 7), (0.5861897468566895, 81, 16)]:
        model = O.softmax_model((1, depth), scale, zp)
        x = O.random_int8(rng, (3000, depth))
        check(C.Case(model, x, f"SOFTMAX scale={scale} depth={depth}"))
        differ += mismatches(model, x, "tflm")
    assert differ > 0


# ----------------------------------------------------------------------------------------------
# Resizing
# ----------------------------------------------------------------------------------------------


@st.composite
def resize_params(draw):
    p = {
        "n": draw(C.batch),
        "hwc": (draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 12))),
    }
    p["size"] = (draw(st.integers(1, 20)), draw(st.integers(1, 20)))
    p["align"] = draw(st.booleans())
    p["half"] = draw(st.booleans()) and not p["align"]
    p["q"] = draw(C.qparams)
    p["x_mode"] = draw(C.data_modes)
    return p


@pytest.mark.parametrize("bilinear", [True, False], ids=["bilinear", "nearest"])
@settings(max_examples=examples(80))
@given(p=resize_params(), seed=C.seeds)
def test_resize(bilinear, p, seed):
    rng = np.random.default_rng(seed)
    model = O.resize_nearest_model(
        (1, *p["hwc"]), p["size"], *p["q"], p["align"], p["half"], bilinear=bilinear
    )
    x = O.random_int8(rng, (p["n"], *p["hwc"]), p["x_mode"])
    check(C.Case(model, x, f"RESIZE bilinear={bilinear} {p}, seed={seed}"))


def test_resize_bilinear_weights_matter():
    """XNNPACK's 11-bit weights and TFLM's 10-bit ones part on a 2x half-pixel upsampling."""
    rng = np.random.default_rng(0)
    model = O.resize_nearest_model((1, 5, 7, 8), (10, 14), 0.05, 3, half_pixel_centers=True, bilinear=True)
    x = O.random_int8(rng, (2, 5, 7, 8))
    check(C.Case(model, x, "RESIZE_BILINEAR 2x half-pixel"))
    assert mismatches(model, x, "tflm") > 0


# ----------------------------------------------------------------------------------------------
# Data movement, REDUCE_MAX, TRANSPOSE_CONV, BATCH_MATMUL
# ----------------------------------------------------------------------------------------------

MOVEMENT = {
    "reshape": (C.reshape_params(), C.make_reshape),
    "pad": (C.pad_params(), C.make_pad),
    "transpose": (C.transpose_params(), C.make_transpose),
    "concat": (C.concat_params(), C.make_concat),
}


@pytest.mark.parametrize("kind", sorted(MOVEMENT))
@settings(max_examples=examples(30))
@given(data=st.data(), seed=C.seeds)
def test_movement(kind, data, seed):
    strategy, make = MOVEMENT[kind]
    check(make(data.draw(strategy), seed))


@pytest.mark.parametrize(
    "build, shape",
    [
        (lambda: O.slice_model((1, 6, 5, 4), (0, 1, 1, 0), (1, 3, -1, 2), 0.05, 3), (3, 6, 5, 4)),
        (
            lambda: O.strided_slice_model((1, 6, 5, 4), (0, 1, 0, 0), (1, 6, 5, 4), (1, 2, 2, 1), 0.05, 3),
            (3, 6, 5, 4),
        ),
        (lambda: O.split_model((1, 6, 5, 4), 3, 2, 0.05, 3), (3, 6, 5, 4)),
        (lambda: O.split_v_model((1, 6, 5, 4), [1, 3], 3, 0.05, 3), (3, 6, 5, 4)),
        (lambda: O.pack_model((1, 4), 2, 1, 0.05, 3), [(3, 4), (3, 4)]),
        (lambda: O.unpack_model((1, 3, 4), 1, 0.05, 3), (3, 3, 4)),
        (lambda: O.squeeze_model((1, 4, 1, 3), [2], 0.05, 3), (3, 4, 1, 3)),
        (lambda: O.expand_dims_model((1, 4, 3), 1, 0.05, 3), (3, 4, 3)),
        (lambda: O.tile_model((1, 4, 3), (1, 2, 2), 0.05, 3), (1, 4, 3)),
        (lambda: O.gather_model((1, 6, 3), [0, 2, 5], 1, 0.05, 3), (3, 6, 3)),
        (lambda: O.mean_model((1, 5, 5, 7), 0.05, 3, 0.05, 3, kind="REDUCE_MAX"), (3, 5, 5, 7)),
    ],
    ids=[
        "slice",
        "strided_slice",
        "split",
        "split_v",
        "pack",
        "unpack",
        "squeeze",
        "expand_dims",
        "tile",
        "gather",
        "reduce_max",
    ],
)
def test_other_movement(build, shape):
    rng = np.random.default_rng(1)
    xs = (
        [O.random_int8(rng, s) for s in shape]
        if isinstance(shape, list)
        else O.random_int8(rng, shape, "extreme")
    )
    check(C.Case(build(), xs, "data movement"))


@settings(max_examples=examples(40))
@given(data=st.data(), seed=C.seeds)
def test_transpose_conv(data, seed):
    """LiteRT requires the natural output size (TFLM takes any declared one). Only what XNNPACK takes:
    SAME with a stride beyond the filter runs LiteRT's builtin kernel, which parts from TFLM's on a
    few outputs in 10^5 (docs/numerics.md; test_transpose_conv_delegation)."""
    p = data.draw(transpose_conv_params())
    natural = [
        h * s if p["padding"] == "SAME" else (h - 1) * s + k for h, s, k in zip(p["hw"], p["stride"], p["k"])
    ]
    assume(list(p["out_hw"]) == natural)
    assume(p["padding"] == "VALID" or all(s <= k for s, k in zip(p["stride"], p["k"])))
    check(make_transpose_conv(p, seed))


@pytest.mark.parametrize("kernel", [(1, 1), (2, 2), (3, 2)])
def test_transpose_conv_with_one_tap_per_output_pixel(kernel):
    """Stride = filter size: the pointwise form (TransposeConv.pointwise) against LiteRT's XNNPACK."""
    hw = (6, 4)
    p = {
        "n": 3, "hw": hw, "cin": 21, "cout": 9, "k": kernel, "stride": kernel, "padding": "SAME",
        "out_hw": tuple(h * k for h, k in zip(hw, kernel)), "activation": "RELU6", "bias": "uniform",
        "per_channel": True, "in_scale": 0.05, "in_zp": -9, "out_zp": 4, "x_mode": "mixed", "w_mode": "mixed",
    }  # fmt: skip
    case = make_transpose_conv(p, 11)
    assert O.litert_delegated(case.model)
    check(case)


@settings(max_examples=examples(40))
@given(data=st.data(), seed=C.seeds)
def test_batch_matmul(data, seed):
    """XNNPACK takes it when the right operand's zero point is 0 (test_batch_matmul_delegation)."""
    check(make_bmm(data.draw(bmm_params()), seed))


@pytest.mark.parametrize("zp_rhs, delegated", [(0, True), (1, False), (-5, False)])
@pytest.mark.parametrize("const", [False, True])
def test_batch_matmul_delegation(zp_rhs, delegated, const):
    """XNNPACK's qs8 BATCH_MATMUL has symmetric weights: with z_R != 0 LiteRT runs its builtin kernel
    (TFLM's rounding), and the profile must follow either way."""
    rng = np.random.default_rng(3)
    rhs = O.random_int8(rng, (1, 24, 5)) if const else None
    model = O.batch_matmul_model((1, 4, 24), (1, 24, 5), (0.5, 3), (0.25, zp_rhs), (2.0, 1), rhs_const=rhs)
    assert O.litert_delegated(model) == delegated
    x = O.random_int8(rng, (16, 4, 24))
    xs = x if const else [x, O.random_int8(rng, (16, 24, 5))]
    check(C.Case(model, xs, f"BATCH_MATMUL z_R={zp_rhs} const={const}"))


@pytest.mark.parametrize(
    "kernel, stride, padding, delegated",
    [
        ((3, 3), (2, 2), "SAME", True),
        ((1, 1), (1, 2), "SAME", False),
        ((1, 1), (2, 2), "VALID", True),
        ((2, 1), (2, 2), "SAME", False),
    ],
)
def test_transpose_conv_delegation(kernel, stride, padding, delegated):
    p = {
        "n": 2,
        "hw": (4, 5),
        "cin": 3,
        "cout": 6,
        "k": kernel,
        "stride": stride,
        "padding": padding,
        "activation": None,
        "bias": "uniform",
        "per_channel": True,
        "in_scale": 0.25,
        "in_zp": 3,
        "out_zp": -2,
        "x_mode": "uniform",
        "w_mode": "uniform",
    }
    p["out_hw"] = tuple(
        h * s if padding == "SAME" else (h - 1) * s + k for h, s, k in zip(p["hw"], stride, kernel)
    )
    case = make_transpose_conv(p, 5)
    assert O.litert_delegated(case.model) == delegated
    check(case)
