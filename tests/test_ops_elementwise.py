"""LOGISTIC, MUL and SUB: npusim (profile "tflm") against TFLite Micro, bit for bit.

LOGISTIC and the binary ops are functions of the input bytes: the exhaustive tests run every code
(256) or every pair of codes (65,536) through both; the hypothesis tests cover shapes, broadcasting
(graph inputs and constants), scales, zero points, fused activations and int8 extremes.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops_tflm import check, examples

from npusim.testing import oracle as O

import cases as C

EVERY_CODE = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)


# ----------------------------------------------------------------------------------------------
# LOGISTIC
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(80))
@given(scale=C.log_scale(1e-4, 5.0), zp=C.zero_points)
def test_logistic_every_code(scale, zp):
    """All 256 input codes through TFLM's fixed-point logistic (saturation radius, Q4.27 rescale)."""
    check(C.Case(O.logistic_model((1, 256), scale, zp), EVERY_CODE, f"LOGISTIC scale={scale}, zp={zp}"))


@pytest.mark.parametrize("scale", [1.0 / 16, 0.1, 0.5, 2.0**-7, 0.0235294122248888])
def test_logistic_every_code_typical_scales(scale):
    for zp in (-128, -1, 0, 37, 127):
        check(C.Case(O.logistic_model((1, 256), scale, zp), EVERY_CODE, f"LOGISTIC scale={scale}, zp={zp}"))


@settings(max_examples=examples(20))
@given(shape=C.small_shape, q=C.qparams, n=C.batch, mode=C.data_modes, seed=C.seeds)
def test_logistic_shapes(shape, q, n, mode, seed):
    rng = np.random.default_rng(seed)
    x = O.random_int8(rng, (n, *shape[1:]), mode)
    check(C.Case(O.logistic_model(shape, *q), x, f"LOGISTIC shape={shape}, q={q}, seed={seed}"))


def test_logistic_refuses_output_zero_point():
    import npusim

    model = O.logistic_model((1, 4), 0.1, 0, out_zp=0)
    with pytest.raises(npusim.NpusimError, match="zero point 0, expected -128"):
        npusim.Interpreter(npusim.load_model(model))


# ----------------------------------------------------------------------------------------------
# MUL, SUB
# ----------------------------------------------------------------------------------------------


@st.composite
def binary_params(draw, kind):
    p = draw(C.add_params())
    if kind == "MUL":
        # TFLM's BroadcastMul4DSlow: at most 4 dimensions when broadcasting.
        s1, s2 = p["shapes"]
        if len(s1) > 4 or len(s2) > 4:
            p["shapes"] = (
                tuple(s1[:4]),
                tuple(s2[-min(len(s2), 4) :]) if len(s2) < len(s1) else tuple(s2[:4]),
            )
        try:
            np.broadcast_shapes(*p["shapes"])
        except ValueError:
            p["shapes"] = (p["shapes"][0], p["shapes"][0])
        # output scale around s1 * s2 * typical |product| / 64 (multipliers up to ~2^8 when small)
        p["s_out"] = float(np.float32(p["s1"] * p["s2"] * 10.0 ** draw(st.floats(-0.5, 3.5))))
        if draw(st.integers(0, 3)) == 0:
            p["s_out"] = C.pow2(p["s_out"])
    return p


def make_binary(kind: str, p: dict, seed: int) -> C.Case:
    rng = np.random.default_rng(seed)
    s1, s2 = p["shapes"]
    const = p["kind"].startswith("const")
    c2 = O.random_int8(rng, s2, p["x_mode"]) if const else None
    model = O.binary_model(
        kind, s1, s2, p["s1"], p["z1"], p["s2"], p["z2"], p["s_out"], p["z_out"], p["activation"], const2=c2
    )
    x1 = O.random_int8(rng, (p["n"], *s1[1:]), p["x_mode"])
    xs = x1 if const else [x1, O.random_int8(rng, (p["n"], *s2[1:]), p["x_mode"])]
    return C.Case(model, xs, f"{kind} {p}, seed={seed}")


@settings(max_examples=examples(200))
@given(p=binary_params("MUL"), seed=C.seeds)
def test_mul(p, seed):
    check(make_binary("MUL", p, seed))


@settings(max_examples=examples(200))
@given(p=binary_params("SUB"), seed=C.seeds)
def test_sub(p, seed):
    check(make_binary("SUB", p, seed))


# (s1, z1, s2, z2, s_out, z_out, activation)
MUL_PAIR_CASES = [
    (0.05, 3, 0.02, -7, 0.003, 1, "NONE"),
    (0.5, 0, 0.25, 0, 0.125, 0, "NONE"),  # powers of two: exact multipliers, many ties
    (0.01, -128, 0.03, 127, 0.0002, -5, "RELU6"),
    (0.1, 10, 0.1, 10, 0.2, -128, "RELU"),
    (0.0039215689, -128, 0.0235294122, -128, 0.0039215689, -128, "NONE"),  # YOLO x * sigmoid(x)
    (0.003, -20, 0.2, 64, 0.00001, 30, "NONE"),  # multiplier above 1
]
SUB_PAIR_CASES = [
    (0.05, 3, 0.02, -7, 0.07, 1, "NONE"),
    (0.5, 0, 0.25, 0, 0.125, 0, "NONE"),
    (0.01, -128, 0.03, 127, 0.002, -5, "RELU6"),
    (0.1, 10, 0.1, 10, 0.2, -128, "RELU"),
    (0.003, -20, 0.2, 64, 0.15, 30, "NONE"),
    (0.1234567, 5, 0.0987654, -3, 0.0333333, -1, "NONE"),
    # Multipliers computed in float32 (as some sub_common.cc versions write it) would differ here.
    (0.0037476415745913982, 28, 0.00743595976382494, -68, 0.0008927088929340243, 77, "NONE"),
    (0.04469260200858116, -79, 1.088233470916748, -58, 0.16051629185676575, 63, "NONE"),
    (0.2566356956958771, -54, 0.0361865758895874, 34, 0.7067188024520874, -43, "NONE"),
]


@pytest.mark.parametrize(
    "kind,params", [("MUL", p) for p in MUL_PAIR_CASES] + [("SUB", p) for p in SUB_PAIR_CASES]
)
def test_binary_every_input_pair(kind, params):
    """The result depends only on the two input bytes: all 65,536 pairs through TFLM and npusim."""
    model = O.binary_model(kind, (1, 65536), (1, 65536), *params)
    check(C.Case(model, C.every_int8_pair(), f"{kind} of every int8 pair, {params}"))


@pytest.mark.parametrize("kind", ["ADD", "SUB"])
@settings(max_examples=examples(40))
@given(
    s1=C.log_scale(1e-3, 1.0),
    ratio=st.floats(-2.0, 2.0),
    out=st.floats(-1.0, 1.0),
    z=st.tuples(C.zero_points, C.zero_points, C.zero_points),
    activation=st.sampled_from(["NONE", "RELU", "RELU6"]),
)
def test_every_input_pair_random_scales(kind, s1, ratio, out, z, activation):
    """Random scales over every pair catch a multiplier off by one LSB (float32 vs double Prepare),
    and for ADD its input rescale's 32-bit form (kernels/elementwise.shifted_high_mul) against TFLM's 64-bit
    SaturatingRoundingDoublingHighMul, for multipliers of every size."""
    s2 = float(np.float32(s1 * 10.0**ratio))
    so = float(np.float32(max(s1, s2) * 10.0**out))
    model = O.binary_model(kind, (1, 65536), (1, 65536), s1, z[0], s2, z[1], so, z[2], activation)
    check(C.Case(model, C.every_int8_pair(), f"{kind} of every int8 pair, {(s1, s2, so, z, activation)}"))


def test_mul_refuses_uint8():
    import npusim

    b = O.ModelBuilder()
    x = b.add_tensor((1, 4), np.uint8, 0.1, 128, name="input1")
    x2 = b.add_tensor((1, 4), np.uint8, 0.1, 128, name="input2")
    y = b.add_tensor((1, 4), np.uint8, 0.1, 128, name="output")
    b.add_op("MUL", [x, x2], [y], O.schema.MulOptionsT())
    legacy = r"a uint8 model \(TFLite's legacy quantization: op 0 \(MUL\) computes on uint8"
    with pytest.raises(npusim.NpusimError, match=legacy):
        npusim.Interpreter(npusim.load_model(b.build([x, x2], [y])))


@pytest.mark.parametrize("kind", ["ADD", "SUB", "MUL"])
def test_binary_constant_across_the_batch_axis(kind):
    """ADD shares the pairwise family's checks (pairwise.BinaryKernel): a constant [2, ...] against
    an activation [1, ...] broadcasts on the declared shapes, the model run image by image, for ADD
    as for SUB and MUL, bit for bit with TFLM."""
    import npusim

    c = np.arange(6, dtype=np.int8).reshape(2, 3) * 20 - 50
    model = O.binary_model(kind, (1, 3), (2, 3), 0.05, 0, 0.05, 0, 0.1, 0, const2=c)
    why = npusim.Interpreter(npusim.load_model(model)).batch.why
    assert why == f"op 0 ({kind}) takes constant 'const2' of shape [2, 3] along axis 0"
    x = np.random.default_rng(0).integers(-128, 128, (3, 3)).astype(np.int8)
    O.assert_same(O.run_tflm(model, x), O.run_npusim(model, x), kind)


@pytest.mark.parametrize("kind", ["ADD", "SUB"])
def test_add_and_sub_refuse_an_output_multiplier_of_one_or_more(kind):
    """TFLM's QuantizeMultiplierSmallerThanOneExp CHECK-fails (aborts) there; npusim says why."""
    import npusim

    model = O.binary_model(kind, (1, 3), (1, 3), 1.0, 0, 1.0, 0, 1e-7, 0)
    with pytest.raises(npusim.NpusimError, match="output multiplier .* is not below 1"):
        npusim.Interpreter(npusim.load_model(model))
