"""TANH, HARD_SWISH, LEAKY_RELU, MAXIMUM, MINIMUM and PRELU: npusim (profile "tflm") against
TFLite Micro, bit for bit.

The unary ops are functions of the input byte: every test runs all 256 codes through both, over many
random scales and zero points (TFLM refusing a model, npusim must refuse it too). The binary ops
run every pair of codes (65,536) and hypothesis cases over shapes, broadcasting (graph inputs and
constants) and int8 extremes.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops_tflm import check, examples

from npusim.testing import oracle as O

import cases as C

EVERY_CODE = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)


def check_or_both_refuse(case: C.Case):
    """TFLM and npusim agree bit for bit, or both refuse the model (npusim with an NpusimError)."""
    import npusim

    try:
        expected = O.run_tflm(case.model, case.xs)
    except Exception:  # noqa: BLE001 - TFLM refused to prepare
        with pytest.raises(npusim.NpusimError):
            O.run_npusim(case.model, case.xs)
        return
    O.assert_same(expected, O.run_npusim(case.model, case.xs), case.desc)


# ----------------------------------------------------------------------------------------------
# TANH, HARD_SWISH, LEAKY_RELU: every code
# ----------------------------------------------------------------------------------------------

unary_q = st.tuples(C.log_scale(1e-5, 50.0), C.zero_points, st.floats(-3.0, 5.0), C.zero_points)


def unary_case(kind, q, alpha=None) -> C.Case:
    s_in, z_in, ratio, z_out = q
    s_out = float(np.float32(s_in * 10.0**ratio))
    if kind == "LEAKY_RELU":
        model = O.leaky_relu_model((1, 256), s_in, z_in, s_out, z_out, alpha)
    else:
        model = O.unary_model(kind, (1, 256), s_in, z_in, s_out, z_out)
    return C.Case(model, EVERY_CODE, f"{kind} in=({s_in}, {z_in}) out=({s_out}, {z_out}) alpha={alpha}")


@settings(max_examples=examples(150))
@given(q=unary_q)
def test_tanh_every_code(q):
    check_or_both_refuse(unary_case("TANH", q))


@pytest.mark.parametrize("scale", [1.0 / 16, 0.1, 0.5, 2.0**-7, 0.0235294122248888, 8.0])
def test_tanh_every_code_typical_scales(scale):
    for zp in (-128, -1, 0, 37, 127):
        check(unary_case("TANH", (scale, zp, 0.0, 0)))


@settings(max_examples=examples(200))
@given(q=unary_q)
def test_hard_swish_every_code(q):
    """Output scales far above the input's reach the int16 RoundingDivideByPOT by 16 or more."""
    check_or_both_refuse(unary_case("HARD_SWISH", q))


@pytest.mark.parametrize(
    "q",
    [
        (0.0235294122, -128, 0.0, -128),
        (0.05, 3, 0.3, -100),
        (2.0**-4, 0, 0.0, 0),  # powers of two: ties
        (0.02, 127, 6.0, 5),  # output multiplier exponent below -16
        (1e-7, -7, 0.0, 9),  # reluish multiplier flushed to zero
    ],
)
def test_hard_swish_every_code_cases(q):
    check_or_both_refuse(unary_case("HARD_SWISH", q))


def test_hard_swish_refuses_output_multiplier_above_one():
    import npusim

    model = O.unary_model("HARD_SWISH", (1, 4), 1.0, 0, 0.001, 0)
    with pytest.raises(npusim.NpusimError, match="multiplier exponent"):
        npusim.Interpreter(npusim.load_model(model))


@settings(max_examples=examples(200))
@given(
    q=unary_q,
    alpha=st.one_of(
        st.sampled_from([0.0, 0.01, 0.1, 0.2, 0.3, 1.0, -1.0]), st.floats(-20.0, 20.0, allow_subnormal=False)
    ),
)
def test_leaky_relu_every_code(q, alpha):
    check_or_both_refuse(unary_case("LEAKY_RELU", q, alpha))


@pytest.mark.parametrize("alpha", [-0.125, -0.25, -0.5, -1.5, -3.0, -0.3, -7.0])
def test_leaky_relu_negative_alpha_ties(alpha):
    """Exact multipliers (scales 1, powers of two): the products of a negative alpha land on ties,
    which TFLM rounds toward zero."""
    for s_in, z_in, s_out, z_out in ((1.0, 0, 1.0, 0), (0.5, 127, 0.25, -3), (2.0**-5, -20, 2.0**-6, 9)):
        model = O.leaky_relu_model((1, 256), s_in, z_in, s_out, z_out, alpha)
        check(
            C.Case(model, EVERY_CODE, f"LEAKY_RELU alpha={alpha} in=({s_in}, {z_in}) out=({s_out}, {z_out})")
        )


@settings(max_examples=examples(20))
@given(
    kind=st.sampled_from(["TANH", "HARD_SWISH", "LEAKY_RELU"]),
    shape=C.small_shape,
    q=C.qparams,
    out_q=C.qparams,
    n=C.batch,
    mode=C.data_modes,
    seed=C.seeds,
)
def test_unary_shapes(kind, shape, q, out_q, n, mode, seed):
    rng = np.random.default_rng(seed)
    x = O.random_int8(rng, (n, *shape[1:]), mode)
    if kind == "LEAKY_RELU":
        model = O.leaky_relu_model(shape, *q, *out_q, 0.2)
    else:
        model = O.unary_model(kind, shape, *q, *out_q)
    check_or_both_refuse(C.Case(model, x, f"{kind} shape={shape} q={q} out={out_q} seed={seed}"))


# ----------------------------------------------------------------------------------------------
# MAXIMUM, MINIMUM, PRELU
# ----------------------------------------------------------------------------------------------


def make_plain_binary(kind: str, p: dict, seed: int) -> C.Case:
    rng = np.random.default_rng(seed)
    s1, s2 = p["shapes"]
    const = p["kind"].startswith("const")
    c2 = O.random_int8(rng, s2, p["x_mode"]) if const else None
    q1, q2, qo = (p["s1"], p["z1"]), (p["s2"], p["z2"]), (p["s_out"], p["z_out"])
    model = O.plain_binary_model(kind, s1, s2, q1, q2, qo, const2=c2)
    x1 = O.random_int8(rng, (p["n"], *s1[1:]), p["x_mode"])
    xs = x1 if const else [x1, O.random_int8(rng, (p["n"], *s2[1:]), p["x_mode"])]
    return C.Case(model, xs, f"{kind} {p}, seed={seed}")


@pytest.mark.parametrize("kind", ["MAXIMUM", "MINIMUM"])
@settings(max_examples=examples(100))
@given(p=C.add_params(), seed=C.seeds)
def test_maximum_minimum(kind, p, seed):
    check(make_plain_binary(kind, p, seed))


@settings(max_examples=examples(150))
@given(p=C.add_params(), seed=C.seeds)
def test_prelu(p, seed):
    check(make_plain_binary("PRELU", p, seed))


@pytest.mark.parametrize("kind", ["MAXIMUM", "MINIMUM"])
def test_maximum_minimum_every_pair_ignores_quantization(kind):
    """TFLM compares raw codes whatever the scales: npusim too."""
    model = O.plain_binary_model(kind, (1, 65536), (1, 65536), (0.1, 3), (0.7, -20), (0.05, 9))
    check(C.Case(model, C.every_int8_pair(), f"{kind} of every int8 pair"))


@settings(max_examples=examples(30))
@given(
    q=st.tuples(C.qparams, C.qparams, C.qparams),
    ratio=st.floats(-1.0, 1.0),
)
def test_prelu_every_pair(q, ratio):
    (s1, z1), (s2, z2), (_, zo) = q
    so = float(np.float32(s1 * 10.0**ratio))
    model = O.plain_binary_model("PRELU", (1, 65536), (1, 65536), (s1, z1), (s2, z2), (so, zo))
    check(C.Case(model, C.every_int8_pair(), f"PRELU of every int8 pair, {q}, out scale {so}"))


def test_prelu_channel_alpha_typical():
    """The converter's layout: input [N, H, W, C], constant alpha [1, 1, C]."""
    rng = np.random.default_rng(3)
    alpha = O.random_int8(rng, (1, 1, 8))
    model = O.plain_binary_model(
        "PRELU", (1, 5, 6, 8), (1, 1, 8), (0.05, -3), (0.002, 0), (0.04, -10), const2=alpha
    )
    check(C.Case(model, O.random_int8(rng, (3, 5, 6, 8), "mixed"), "PRELU [1,5,6,8] alpha [1,1,8]"))


@pytest.mark.parametrize("kind", ["PRELU", "MAXIMUM", "MINIMUM"])
def test_broadcast_rank_5_and_6(kind):
    """The PyPI TFLM broadcasts these ops beyond 4 dimensions (ForEachBroadcastedElement)."""
    rng = np.random.default_rng(5)
    for s1, s2 in (((1, 2, 3, 1, 2), (1, 1, 3, 2, 2)), ((1, 2, 1, 2, 2, 3), (1, 1, 3, 2, 1, 3))):
        model = O.plain_binary_model(kind, s1, s2, (0.1, 4), (0.03, -9), (0.08, 2))
        xs = [O.random_int8(rng, (2, *s1[1:]), "mixed"), O.random_int8(rng, (2, *s2[1:]), "mixed")]
        check(C.Case(model, xs, f"{kind} {s1} x {s2}"))


def test_maximum_refuses_float():
    import npusim

    b = O.ModelBuilder()
    x = b.add_tensor((1, 4), np.float32, name="input1")
    x2 = b.add_tensor((1, 4), np.float32, name="input2")
    y = b.add_tensor((1, 4), np.float32, name="output")
    b.add_op("MAXIMUM", [x, x2], [y])
    with pytest.raises(npusim.NpusimError, match="a float model: npusim runs int8 models"):
        npusim.Interpreter(npusim.load_model(b.build([x, x2], [y])))


@pytest.mark.parametrize("kind", ["PRELU", "MAXIMUM"])
def test_constant_across_the_batch_axis(kind):
    """A constant [2, ...] against an activation [1, ...]: broadcast on the declared shapes, the
    model run image by image, bit for bit with TFLM."""
    import npusim

    c = np.arange(6, dtype=np.int8).reshape(2, 3) * 20 - 50
    model = O.plain_binary_model(kind, (1, 3), (2, 3), (0.1, 0), (0.1, 0), (0.1, 0), const2=c)
    why = npusim.Interpreter(npusim.load_model(model)).batch.why
    assert why == f"op 0 ({kind}) takes constant 'const2' of shape [2, 3] along axis 0"
    x = np.random.default_rng(0).integers(-128, 128, (3, 3)).astype(np.int8)
    O.assert_same(O.run_tflm(model, x), O.run_npusim(model, x), kind)
