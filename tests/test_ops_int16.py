"""16x8 ops (int16 activations, int8 weights, int64 or int32 bias) against TFLite Micro, bit for bit.

Each example builds a one-op int16 model, runs TFLM image by image and npusim on the batch, and
requires identical outputs. Data modes include the int16 extremes; output scales put the typical
accumulator anywhere from deep inside the int16 range to saturation.
"""

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npusim
from npusim.testing import oracle as O

SCALE = float(os.environ.get("NPUSIM_TEST_SCALE", "1"))
seeds = st.integers(0, 2**32 - 1)
data_modes = st.sampled_from(["uniform", "uniform", "extreme", "mixed", "narrow"])
weight_modes = st.sampled_from(["uniform", "uniform", "extreme", "mixed"])
bias_modes = st.sampled_from(["int64", "int64", "int64_large", "int32", "none"])


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def random_int16(rng, shape, mode):
    if mode == "extreme":
        return rng.choice(np.array([-32768, 32767], np.int16), size=shape)
    if mode == "narrow":
        return rng.integers(-64, 65, size=shape).astype(np.int16)
    x = rng.integers(-32768, 32768, size=shape).astype(np.int16)
    if mode == "mixed":
        m = rng.random(shape) < 0.25
        x[m] = rng.choice(np.array([-32768, 32767], np.int16), size=int(m.sum()))
    return x


def random_bias16(rng, n, taps, mode):
    """(bias array or None, bias dtype)."""
    if mode == "none":
        return None, None
    span = int(32767 * 64 * math.sqrt(max(taps, 1)))
    if mode == "int64_large":
        return rng.integers(-(1 << 40), (1 << 40) + 1, size=n), np.int64
    if mode == "int32":
        return rng.integers(-span, span + 1, size=n), np.int32
    return rng.integers(-span, span + 1, size=n), np.int64


def out_scale_for(rng, in_scale, w_scale, taps, spread):
    """An output scale putting the typical accumulator (~ 32767 * 75 * sqrt(taps)) at ~2^spread LSB."""
    ws = float(np.median(np.atleast_1d(w_scale)))
    typical = 32767.0 * 75.0 * math.sqrt(max(taps, 1))
    return float(np.float32(in_scale * ws * typical / 2.0**spread))


def check(model, x, desc):
    expected = O.run_tflm(model, x)
    assert expected.size > 0, f"{desc}: an empty output compares nothing"
    try:
        got = O.run_npusim(model, x)
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{desc}\n  npusim raised {type(e).__name__}: {e}") from e
    O.assert_same(expected, got, desc)


@st.composite
def mac_params(draw, kind):
    p = dict(
        n=draw(st.integers(1, 3)),
        x_mode=draw(data_modes),
        w_mode=draw(weight_modes),
        bias=draw(bias_modes),
        per_channel=draw(st.booleans()),
        activation=draw(st.sampled_from(["NONE", "NONE", "RELU", "RELU6", "RELU_N1_TO_1"])),
        in_scale=draw(st.floats(-5, -1).map(lambda e: float(np.float32(10.0**e)))),
        spread=draw(st.floats(4, 18)),
    )
    if kind == "fc":
        p.update(k=draw(st.integers(1, 300)), units=draw(st.integers(1, 20)))
        return p
    p.update(
        kh=draw(st.integers(1, 4)),
        kw=draw(st.integers(1, 4)),
        stride=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        dilation=draw(st.sampled_from([(1, 1), (1, 1), (2, 1), (1, 2), (2, 2)])),
        padding=draw(st.sampled_from(["SAME", "VALID"])),
        c=draw(st.integers(1, 8)),
    )
    # VALID needs the input at least as large as the dilated filter: smaller inputs have empty
    # outputs, which would compare nothing (30 and 35 of the 150 examples were, before).
    low_h, low_w = (
        ((p["kh"] - 1) * p["dilation"][0] + 1, (p["kw"] - 1) * p["dilation"][1] + 1)
        if p["padding"] == "VALID"
        else (1, 1)
    )
    p.update(h=draw(st.integers(low_h, low_h + 8)), w=draw(st.integers(low_w, low_w + 8)))
    if kind == "conv":
        p["cout"] = draw(st.integers(1, 12))
    else:
        p["mult"] = draw(st.sampled_from([1, 1, 2, 3]))
    return p


def make_mac(kind, p, seed):
    rng = np.random.default_rng(seed)
    if kind == "fc":
        taps, channels = p["k"], p["units"]
        wshape = (channels, taps)
    elif kind == "conv":
        taps, channels = p["kh"] * p["kw"] * p["c"], p["cout"]
        wshape = (channels, p["kh"], p["kw"], p["c"])
    else:
        taps, channels = p["kh"] * p["kw"], p["c"] * p["mult"]
        wshape = (1, p["kh"], p["kw"], channels)
    w = O.random_weights(rng, wshape, p["w_mode"])
    w_scale = (
        O.log_uniform(rng, 0.002, 0.05, channels).astype(np.float32)
        if p["per_channel"]
        else float(np.float32(O.log_uniform(rng, 0.002, 0.05)))
    )
    bias, bias_dtype = random_bias16(rng, channels, taps, p["bias"])
    out_scale = out_scale_for(rng, p["in_scale"], w_scale, taps, p["spread"])
    common = dict(activation=p["activation"], dtype=np.int16, bias_dtype=bias_dtype)
    if kind == "fc":
        model = O.fully_connected_model((1, taps), w, bias, p["in_scale"], 0, w_scale, out_scale, 0, **common)
        xshape = (p["n"], taps)
    else:
        build = O.conv2d_model if kind == "conv" else O.depthwise_model
        extra = {} if kind == "conv" else dict(depth_multiplier=p["mult"])
        model = build(
            (1, p["h"], p["w"], p["c"]),
            w,
            bias,
            p["in_scale"],
            0,
            w_scale,
            out_scale,
            0,
            stride=p["stride"],
            padding=p["padding"],
            dilation=p["dilation"],
            **common,
            **extra,
        )
        xshape = (p["n"], p["h"], p["w"], p["c"])
    x = random_int16(rng, xshape, p["x_mode"])
    return model, x, f"{kind} {p} seed={seed}"


@settings(max_examples=examples(150), deadline=None)
@given(p=mac_params("fc"), seed=seeds)
def test_fully_connected_int16(p, seed):
    check(*make_mac("fc", p, seed))


@settings(max_examples=examples(150), deadline=None)
@given(p=mac_params("conv"), seed=seeds)
def test_conv2d_int16(p, seed):
    check(*make_mac("conv", p, seed))


@settings(max_examples=examples(150), deadline=None)
@given(p=mac_params("depthwise"), seed=seeds)
def test_depthwise_conv2d_int16(p, seed):
    # TFLM reads a depthwise bias as int64 whatever its type (npusim refuses int32), and segfaults
    # on a depthwise op without bias.
    if p["bias"] in ("int32", "none"):
        p["bias"] = "int64"
    check(*make_mac("depthwise", p, seed))


@pytest.mark.parametrize("k", [1, 2000, 70000])
def test_fully_connected_int16_int32_accumulator_wraps(k):
    """int32 bias: TFLM accumulates in int32; extreme data over long rows wraps it."""
    rng = np.random.default_rng(k)
    w = np.full((2, k), 127, np.int8)
    w[1] = -127
    x = np.full((2, k), 32767, np.int16)
    x[1] = -32768
    model = O.fully_connected_model(
        (1, k),
        w,
        np.array([5, -5]),
        0.001,
        0,
        0.01,
        0.001 * 0.01 * 4000,
        0,
        dtype=np.int16,
        bias_dtype=np.int32,
    )
    check(model, x, f"k={k}")
    model = O.fully_connected_model(
        (1, k), w, np.array([5, -5]), 0.001, 0, 0.01, 0.001 * 0.01 * 4000 * k, 0, dtype=np.int16
    )
    check(model, random_int16(rng, (3, k), "mixed"), f"k={k} int64")


def test_int16_refusals():
    w = np.ones((2, 3, 3, 4), np.int8)
    x = np.zeros((1, 5, 5, 4), np.int16)
    bad_zp = O.conv2d_model((1, 5, 5, 4), w, None, 0.01, 3, 0.01, 0.1, 0, dtype=np.int16)
    dw32 = O.depthwise_model(
        (1, 5, 5, 4),
        np.ones((1, 3, 3, 4), np.int8),
        np.zeros(4),
        0.01,
        0,
        0.01,
        0.1,
        0,
        dtype=np.int16,
        bias_dtype=np.int32,
    )
    fc = O.fully_connected_model(
        (1, 4), np.ones((2, 4), np.int8), None, 0.01, 0, 0.01, 0.1, 0, dtype=np.int16
    )
    for model, xs, profile, match in [
        (bad_zp, x, "tflm", "zero point 3"),
        (dw32, x, "tflm", "int64"),
        (fc, np.zeros((1, 4), np.int16), "single", "tflm rounding profile"),
    ]:
        with pytest.raises(npusim.NpusimError, match=match):
            O.run_npusim(model, xs, profile)


@st.composite
def binary_params(draw):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 5)) for _ in range(rank)]
    shape[0] = 1
    other = [d if draw(st.booleans()) else 1 for d in shape]
    if draw(st.booleans()):
        shape, other = other, shape
    return dict(
        n=draw(st.integers(1, 3)),
        shape1=tuple(shape),
        shape2=tuple(other),
        const2=draw(st.sampled_from([False, False, True])),
        s1=draw(st.floats(-5, 0).map(lambda e: float(np.float32(10.0**e)))),
        ratio2=draw(st.sampled_from([1.0, 0.5, 2.0]) | st.floats(-2, 2).map(lambda e: 10.0**e)),
        ratio_out=draw(st.floats(-2.5, 2.5).map(lambda e: 10.0**e)),
        activation=draw(st.sampled_from(["NONE", "NONE", "RELU", "RELU6", "RELU_N1_TO_1"])),
        x_mode=draw(data_modes),
    )


def make_binary(kind, p, seed):
    rng = np.random.default_rng(seed)
    s1 = p["s1"]
    s2 = float(np.float32(s1 * p["ratio2"]))
    so = float(np.float32((s1 * s2 * 32768.0 if kind == "MUL" else max(s1, s2)) * p["ratio_out"]))
    const = random_int16(rng, p["shape2"], p["x_mode"]) if p["const2"] else None
    model = O.binary_model(
        kind, p["shape1"], p["shape2"], s1, 0, s2, 0, so, 0, p["activation"], const, dtype=np.int16
    )
    x1 = random_int16(rng, (p["n"],) + p["shape1"][1:], p["x_mode"])
    if const is not None:
        return model, x1, f"{kind} {p} seed={seed}"
    x2 = random_int16(rng, (p["n"],) + p["shape2"][1:], p["x_mode"])
    return model, [x1, x2], f"{kind} {p} seed={seed}"


@settings(max_examples=examples(200), deadline=None)
@given(p=binary_params(), seed=seeds)
def test_add_int16(p, seed):
    check(*make_binary("ADD", p, seed))


@settings(max_examples=examples(200), deadline=None)
@given(p=binary_params(), seed=seeds)
def test_mul_int16(p, seed):
    check(*make_binary("MUL", p, seed))


@settings(max_examples=examples(200), deadline=None)
@given(p=binary_params(), seed=seeds)
def test_sub_int16(p, seed):
    check(*make_binary("SUB", p, seed))


@pytest.mark.parametrize("kind", ["ADD", "MUL", "SUB"])
@pytest.mark.parametrize("ratio", [1.0, 0.37, 3.1])
def test_binary_int16_every_extreme_pair(kind, ratio):
    """The int16 extremes and their neighbours against each other, both operands."""
    v = np.array([-32768, -32767, -16384, -1, 0, 1, 16383, 32766, 32767], np.int16)
    a, b = np.repeat(v, v.size), np.tile(v, v.size)
    s = 0.001
    so = float(np.float32((s * s * 32768.0 if kind == "MUL" else s) * ratio))
    model = O.binary_model(kind, (1, a.size), (1, a.size), s, 0, s * 0.7, 0, so, 0, dtype=np.int16)
    check(model, [a[None], b[None]], f"{kind} ratio={ratio}")


ALL_INT16 = np.arange(-32768, 32768, dtype=np.int16)[None]


@pytest.mark.parametrize(
    "scale",
    [2.0**-12, 2.0**-12 * 1.0004, 2.0**-10, 2.0**-15, 0.001, 1e-4, 3.7e-6, 1e-9, 0.5, 3.0, 30.0],
)
def test_logistic_int16_every_code(scale):
    """Every int16 input code; 2^-12 (and within CheckedLog2's tolerance of it) is TFLM's power-of-two
    case, large scales overflow the int32 rescale (wrapping in TFLM too)."""
    check(O.logistic_model(ALL_INT16.shape, scale, 0, dtype=np.int16), ALL_INT16, f"scale={scale}")


@settings(max_examples=examples(60), deadline=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    n=st.integers(1, 3),
    scale=st.floats(-7, 1.5).map(lambda e: float(np.float32(10.0**e))),
    mode=data_modes,
    seed=seeds,
)
def test_logistic_int16(shape, n, scale, mode, seed):
    shape = (1, *shape[1:])
    x = random_int16(np.random.default_rng(seed), (n, *shape[1:]), mode)
    check(O.logistic_model(shape, scale, 0, dtype=np.int16), x, f"shape={shape} scale={scale}")


def test_logistic_int16_refusals():
    x = np.zeros((1, 4), np.int16)
    for model, match in [
        (O.logistic_model((1, 4), 0.001, 0, out_scale=2.0**-14, dtype=np.int16), "2\\^-15"),
        (O.logistic_model((1, 4), 0.001, 0, out_scale=1.0 / 30000, dtype=np.int16), "2\\^-15"),
        (O.logistic_model((1, 4), 0.001, 5, dtype=np.int16), "zero point 5"),
        (O.logistic_model((1, 4), 0.001, 0, out_zp=3, dtype=np.int16), "zero point 3"),
    ]:
        with pytest.raises(npusim.NpusimError, match=match):
            O.run_npusim(model, x)


@pytest.mark.parametrize(
    "scale,beta", [(10.0 / 65535.0, 1.0), (5e-5, 1.0), (1e-3, 1.0), (2e-5, 3.0), (4e-4, 0.25)]
)
def test_softmax_int16_every_difference(scale, beta):
    """Rows [32767, c] for every int16 code c: every input difference (at scale 10/65535 every entry
    and interpolation step of the exp table), and the reciprocal table over the sums they give."""
    c = ALL_INT16.reshape(256, 256, 1)
    x = np.concatenate([np.full_like(c, 32767), c], axis=-1)
    model = O.softmax_model((1, 256, 2), scale, 0, beta=beta, dtype=np.int16)
    check(model, x, f"scale={scale} beta={beta}")


@settings(max_examples=examples(150), deadline=None)
@given(
    outer=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    depth=st.integers(1, 300),
    n=st.integers(1, 3),
    scale=st.floats(-6, -1).map(lambda e: float(np.float32(10.0**e))),
    beta=st.sampled_from([1.0, 1.0, 0.5, 2.0]) | st.floats(0.1, 10.0),
    mode=st.sampled_from(["uniform", "extreme", "mixed", "narrow", "ties"]),
    seed=seeds,
)
def test_softmax_int16(outer, depth, n, scale, beta, mode, seed):
    rng = np.random.default_rng(seed)
    shape = (1, *outer, depth)
    if mode == "ties":  # many equal maxima: large sums of exponentials
        x = np.full((n, *shape[1:]), int(rng.integers(-32768, 32768)), np.int16)
        x[rng.random(x.shape) < 0.2] = -32768
    else:
        x = random_int16(rng, (n, *shape[1:]), mode)
    check(
        O.softmax_model(shape, scale, 0, beta=beta, dtype=np.int16),
        x,
        f"shape={shape} scale={scale} beta={beta}",
    )


def test_softmax_int16_refusals():
    x = np.zeros((1, 4), np.int16)
    for model, match in [
        (O.softmax_model((1, 4), 0.001, 0, dtype=np.int16, out_scale=1.0 / 256), "1/32768"),
        (O.softmax_model((1, 4), 0.001, 0, dtype=np.int16, out_scale=1.0 / 32700), "1/32768"),
        (O.softmax_model((1, 4), 0.001, 7, dtype=np.int16), "zero point 7"),
    ]:
        with pytest.raises(npusim.NpusimError, match=match):
            O.run_npusim(model, x)
    # within TF_LITE_ENSURE_NEAR's tolerance of 1/32768: accepted, as by TFLM
    model = O.softmax_model((1, 4), 0.001, 0, dtype=np.int16, out_scale=1.0005 / 32768)
    check(model, np.array([[1, 2, 3, -32768]], np.int16), "near 1/32768")
