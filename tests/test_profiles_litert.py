"""The other rounding profiles, and the oracles themselves.

- profile "xnnpack" against LiteRT's default interpreter (OpResolverType.AUTO, which hands int8
  CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED to XNNPACK), bit for bit.
- profile "single": no runtime with single rounding is installed here, so it is checked against a
  small independent numpy reference (reference_conv2d below) that applies the documented
  single-rounding formula to exact accumulators. The same reference with double rounding must
  equal TFLM, which is what makes it trustworthy; single and double rounding may then differ by at
  most 1 LSB.
- the test-model builder: TFLM and LiteRT BUILTIN_REF agree on every op but FULLY_CONNECTED.
"""

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim import quant
from npusim.testing import oracle as O

import cases as C
from kernel_paths import DEPTHWISE_PATHS, PATHS, kernel_path

SCALE = float(os.environ.get("NPUSIM_TEST_SCALE", "1"))

# Tie-rich scales make the profiles disagree often, so a wrong profile cannot pass by luck.
LITERT_MODES = ["typical", "typical", "near_one", "pow2", "pow2_small", "pow2_small", "pow2_small"]


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def check_xnnpack(case: C.Case):
    assert O.litert_delegated(case.model), f"LiteRT did not delegate to XNNPACK: {case.desc}"
    expected = O.run_litert(case.model, case.xs, "AUTO")
    got = O.run_npusim(case.model, case.xs, "xnnpack")
    O.assert_same(expected, got, f"profile xnnpack vs LiteRT AUTO: {case.desc}")


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(80))
@given(p=C.conv_params(no_bias=False, mult_modes=LITERT_MODES), seed=C.seeds)
def test_conv2d_xnnpack(path, p, seed):
    with kernel_path(path):
        check_xnnpack(C.make_conv(p, seed))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(10))
@given(p=C.conv_params(no_bias=False, max_hw=6, max_ch=64, mult_modes=LITERT_MODES), seed=C.seeds)
def test_conv2d_deep_xnnpack(path, p, seed):
    with kernel_path(path):
        check_xnnpack(C.make_conv(p, seed))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(15))
@given(
    p=C.conv_params(
        no_bias=False,
        max_hw=40,
        min_hw=16,
        max_ch=128,
        channel_step=16,
        max_cout=100,
        max_kernel=3,
        mult_modes=LITERT_MODES,
    ),
    seed=C.seeds,
)
def test_conv2d_large_xnnpack(path, p, seed):
    """The shapes of the AMX path (see test_ops_tflm.test_conv2d_large)."""
    with kernel_path(path):
        check_xnnpack(C.make_conv(p, seed))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@settings(max_examples=examples(80))
@given(p=C.conv_params(depthwise=True, mult_modes=LITERT_MODES), seed=C.seeds)
def test_depthwise_conv2d_xnnpack(path, p, seed):
    with kernel_path(path):
        check_xnnpack(C.make_depthwise(p, seed))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@pytest.mark.parametrize(
    "channels, hw, stride",
    [(16, (5, 10), (1, 1)), (32, (5, 9), (2, 1)), (80, (6, 9), (2, 2)), (128, (5, 6), (1, 1))],
)
def test_depthwise_vector_layouts_xnnpack(path, channels, hw, stride):
    """The xnnpack output stage in every depthwise vector layout: 4 and 2 pixels per vector, a
    partial second block, two full blocks."""
    with kernel_path(path):
        check_xnnpack(C.depthwise_case(channels, hw, stride))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(60))
@given(p=C.fc_params(mult_modes=LITERT_MODES), seed=C.seeds)
def test_fully_connected_xnnpack(path, p, seed):
    with kernel_path(path):
        check_xnnpack(C.make_fc(p, seed))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(15))
@given(p=C.fc_params(max_k=3000, mult_modes=LITERT_MODES), seed=C.seeds)
def test_fully_connected_long_xnnpack(path, p, seed):
    """|acc| beyond 2^24: XNNPACK's float32(acc) is itself rounded there."""
    with kernel_path(path):
        check_xnnpack(C.make_fc(p, seed))


# ----------------------------------------------------------------------------------------------
# The clamp range of the fused activation under XNNPACK
# ----------------------------------------------------------------------------------------------
# The LiteRT delegate hands XNNPACK the real bounds (RELU6: 0 and 6) and XNNPACK quantizes them
# with xnn_qs8_quantize, lrintf(clamp(f / scale + (float) zero_point, -128, 127)): the zero point
# is added before rounding, and ties go to even. TFLM rounds 6 / scale half away from zero and
# then adds the zero point. Scales that make f / scale a tie separate the two rules.


@pytest.mark.parametrize("path", PATHS)
def test_fully_connected_relu6_bound_xnnpack(path):
    """Regression: K = 3, 6 units, RELU6, power-of-two scales (multiplier 2^-8), output scale 4 and
    zero point 1: 6 / 4 + 1 = 2.5, so XNNPACK clamps at rint(2.5) = 2 where TFLM's rule gives
    1 + round(1.5) = 3. npusim's xnnpack profile used TFLM's bound and gave 3 on every backend."""
    rng = np.random.default_rng(0)
    w = O.random_weights(rng, (6, 3))
    x = O.random_int8(rng, (8, 3))
    model = O.fully_connected_model((1, 3), w, None, 0.0625, 0, 0.25, 4.0, 1, activation="RELU6")
    assert O.litert_delegated(model)
    expected = O.run_litert(model, x, "AUTO")
    assert expected.max() == 2  # the case reaches the bound
    with kernel_path(path):
        got = O.run_npusim(model, x, "xnnpack")
    O.assert_same(expected, got, f"profile xnnpack vs LiteRT AUTO, backend {path}")


@pytest.mark.parametrize(
    "activation, scale, zero_point, tflm, xnnpack",
    [
        ("RELU6", 4.0, 1, (1, 3), (1, 2)),  # 6/4 + 1 = 2.5
        ("RELU6", 4.0, 0, (0, 2), (0, 2)),  # 1.5: both round up
        ("RELU6", 2.4, 0, (0, 3), (0, 2)),  # float32(6) / float32(2.4) = 2.5
        ("RELU_N1_TO_1", 2.0, 0, (-1, 1), (0, 0)),  # -0.5 and 0.5
        ("RELU_N1_TO_1", 2.0, 1, (0, 2), (0, 2)),  # 0.5 and 1.5
        ("RELU", 0.1, -128, (-128, 127), (-128, 127)),
        ("NONE", 0.1, 5, (-128, 127), (-128, 127)),
        ("RELU6", 0.01, 100, (100, 127), (100, 127)),  # 700 clamped
    ],
)
def test_activation_range_profiles(activation, scale, zero_point, tflm, xnnpack):
    assert quant.activation_range(activation, scale, zero_point) == tflm
    assert quant.activation_range(activation, scale, zero_point, quant.SINGLE) == tflm
    assert quant.activation_range(activation, scale, zero_point, quant.XNNPACK) == xnnpack


# Output scales whose 6 / scale or 1 / scale is a tie in float32 (x.5), and ordinary ones; with
# power-of-two scales only 4 (RELU6: 1.5) and 2 (RELU_N1_TO_1: 0.5) make ties.
TIE_SCALES = [4.0, 2.0, 2.4, 12 / 7, 4 / 3, 12 / 11, 2 / 3, 0.4, 12 / 13, 0.8]
PLAIN_SCALES = [0.05, 0.0123]
POW2_SCALES = [4.0, 2.0, 4.0, 2.0, 1.0, 0.25]


@st.composite
def bound_params(draw, conv: bool):
    p = {"conv": conv, "n": draw(st.integers(1, 3))}
    if conv:
        p["cin"], p["k"] = draw(st.integers(1, 8)), draw(st.sampled_from([1, 3]))
        p["hw"] = (draw(st.integers(p["k"], 6)), draw(st.integers(p["k"], 6)))
        taps = p["cin"] * p["k"] ** 2
    else:
        p["depth"] = draw(st.integers(1, 64))
        taps = p["depth"]
    p["units"] = draw(st.integers(1, 16))
    p["activation"] = draw(st.sampled_from(["RELU6", "RELU_N1_TO_1"] * 2 + ["RELU", "NONE"]))
    p["pow2"] = draw(st.booleans())
    p["per_channel"] = draw(st.booleans())
    scales = POW2_SCALES if p["pow2"] else TIE_SCALES + PLAIN_SCALES
    p["out_scale"] = float(np.float32(draw(st.sampled_from(scales))))
    p["out_zp"] = draw(st.one_of(st.integers(-8, 8), st.integers(-128, 127)))
    p["in_zp"] = draw(st.integers(-8, 8))
    # the multiplier puts the typical accumulator at 2^-2 to 2^3 times 64 output steps: the
    # bounds of RELU6 and RELU_N1_TO_1 (a few steps from the zero point) are reached
    typical = 64.0 / (127.0 * 75.0 * math.sqrt(taps))
    p["log2_mult"] = math.log2(typical) + draw(st.floats(-2.0, 3.0))
    if p["pow2"]:
        p["log2_mult"] = float(round(p["log2_mult"]))
    p["bias"] = conv or draw(st.booleans())  # LiteRT's CONV_2D requires a bias
    return p


def make_bound_case(p: dict, seed: int) -> C.Case:
    rng = np.random.default_rng(seed)
    s_in = 0.125 if p["pow2"] else float(np.float32(0.0371))
    channels = p["units"]
    mult = 2.0 ** p["log2_mult"]
    ws = np.float32(mult * p["out_scale"] / s_in)
    if p["per_channel"]:  # per-channel factors 1, 1/2, 1/4: power-of-two multipliers stay so
        ws = O.f32(ws * 2.0 ** -rng.integers(0, 3, channels).astype(np.float64))
    taps = p["cin"] * p["k"] ** 2 if p["conv"] else p["depth"]
    bias = O.random_bias(rng, channels, taps) if p["bias"] else None
    if p["conv"]:
        w = O.random_weights(rng, (channels, p["k"], p["k"], p["cin"]))
        model = O.conv2d_model(
            (1, *p["hw"], p["cin"]),
            w,
            bias,
            s_in,
            p["in_zp"],
            ws,
            p["out_scale"],
            p["out_zp"],
            activation=p["activation"],
        )
        x = O.random_int8(rng, (p["n"], *p["hw"], p["cin"]))
    else:
        w = O.random_weights(rng, (channels, p["depth"]))
        model = O.fully_connected_model(
            (1, p["depth"]),
            w,
            bias,
            s_in,
            p["in_zp"],
            ws,
            p["out_scale"],
            p["out_zp"],
            activation=p["activation"],
        )
        x = O.random_int8(rng, (p["n"], p["depth"]))
    return C.Case(model, x, f"{'CONV_2D' if p['conv'] else 'FULLY_CONNECTED'} {p}, seed={seed}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("conv", [False, True], ids=["fully_connected", "conv2d"])
@settings(max_examples=examples(60))
@given(data=st.data(), seed=C.seeds)
def test_activation_bounds_xnnpack(conv, path, data, seed):
    """FC and CONV_2D, profile xnnpack vs LiteRT, on scales where the activation bounds are ties:
    K, units, every fused activation, power-of-two multipliers and not, odd and even zero points."""
    with kernel_path(path):
        check_xnnpack(make_bound_case(data.draw(bound_params(conv)), seed))


# ----------------------------------------------------------------------------------------------
# Single rounding, against an independent reference
# ----------------------------------------------------------------------------------------------


def quantize_multiplier(r: float):
    """QuantizeMultiplier as TFLM documents it (quantization_util.cc; docs/numerics.md, the rounding
    profiles), independent of npusim.quant."""
    if r == 0.0:
        return 0, 0
    q, e = math.frexp(r)
    m = int(math.floor(q * 2.0**31 + 0.5))
    if m == 2**31:
        m, e = 2**30, e + 1
    if e < -31:
        m, e = 0, 0
    return m, e


def mbqm_double(x: np.ndarray, m: int, e: int) -> np.ndarray:
    """TFLM's default MultiplyByQuantizedMultiplier (two roundings), on int64 arrays (exact)."""
    a = x.astype(np.int64) << max(e, 0)
    ab = a * np.int64(m)
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    num = ab + nudge
    h = np.where(num >= 0, num >> 31, -((-num) >> 31))  # C division: truncate toward zero
    s = max(-e, 0)
    mask = np.int64((1 << s) - 1)
    threshold = (mask >> 1) + (h < 0)
    return (h >> s) + ((h & mask) > threshold)


def mbqm_single(x: np.ndarray, m: int, e: int) -> np.ndarray:
    """TFLITE_SINGLE_ROUNDING: (x*M + 2^(30-e)) >> (31-e), ties toward +inf."""
    total = 31 - e
    return (x.astype(np.int64) * np.int64(m) + (np.int64(1) << (total - 1))) >> total


def reference_conv2d(model: bytes, x: np.ndarray, single: bool) -> np.ndarray:
    """CONV_2D from the model's own tensors, exact int64 accumulators, then requantization."""
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(model, 0)
    sg = m.subgraphs[0]
    op = sg.operators[0]
    t_in, t_w, t_out = (sg.tensors[i] for i in (op.inputs[0], op.inputs[1], op.outputs[0]))
    w = np.frombuffer(bytes(m.buffers[t_w.buffer].data), np.int8).reshape(t_w.shape).astype(np.int64)
    if op.inputs[2] >= 0:
        t_b = sg.tensors[op.inputs[2]]
        bias = np.frombuffer(bytes(m.buffers[t_b.buffer].data), np.int32).astype(np.int64)
    else:
        bias = np.zeros(w.shape[0], np.int64)
    opt = op.builtinOptions
    in_zp, out_zp = t_in.quantization.zeroPoint[0], t_out.quantization.zeroPoint[0]
    s_in, s_out = np.float32(t_in.quantization.scale[0]), np.float32(t_out.quantization.scale[0])
    w_scales = np.asarray(t_w.quantization.scale, np.float32)
    cout, kh, kw, cin = w.shape
    n, h, wd, _ = x.shape
    sh, sw, dh, dw = opt.strideH, opt.strideW, opt.dilationHFactor, opt.dilationWFactor
    same = opt.padding == schema.Padding.SAME
    oh = O.conv_out_size(h, kh, sh, dh, "SAME" if same else "VALID")
    ow = O.conv_out_size(wd, kw, sw, dw, "SAME" if same else "VALID")
    pt = max((oh - 1) * sh + (kh - 1) * dh + 1 - h, 0) // 2 if same else 0
    pl = max((ow - 1) * sw + (kw - 1) * dw + 1 - wd, 0) // 2 if same else 0
    # pad with the zero point (padding taps then contribute nothing)
    rows = max((oh - 1) * sh + (kh - 1) * dh + 1, pt + h)
    cols = max((ow - 1) * sw + (kw - 1) * dw + 1, pl + wd)
    big = np.full((n, rows, cols, cin), in_zp, np.int64)
    big[:, pt : pt + h, pl : pl + wd, :] = x
    acc = np.zeros((n, oh, ow, cout), np.int64) + bias
    for i in range(kh):
        for j in range(kw):
            patch = (
                big[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw, :]
                - in_zp
            )
            acc += np.einsum("nhwc,oc->nhwo", patch, w[:, i, j, :])
    out = np.empty_like(acc)
    act = {0: "NONE", 1: "RELU", 3: "RELU6"}[opt.fusedActivationFunction]
    lo, hi = -128, 127
    if act in ("RELU", "RELU6"):
        lo = max(lo, out_zp)
    if act == "RELU6":
        r6 = 6.0 / float(s_out)
        hi = min(hi, out_zp + int(math.floor(abs(r6) + 0.5)))
    for c in range(cout):
        ws = w_scales[c] if w_scales.size > 1 else w_scales[0]
        mult, e = quantize_multiplier(float(s_in) * float(ws) / float(s_out))
        f = mbqm_single if single else mbqm_double
        out[..., c] = f(acc[..., c], mult, e)
    return np.clip(out + out_zp, lo, hi).astype(np.int8)


SINGLE_MODES = ["typical", "typical", "near_one", "tiny", "pow2", "pow2_small", "pow2_small"]


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(60))
@given(p=C.conv_params(mult_modes=SINGLE_MODES), seed=C.seeds)
def test_conv2d_single_rounding(path, p, seed):
    case = C.make_conv(p, seed)
    tflm = O.run_tflm(case.model, case.xs)
    ref_double = reference_conv2d(case.model, case.xs, single=False)
    O.assert_same(tflm, ref_double, f"the numpy reference (double rounding) vs TFLM: {case.desc}")
    ref_single = reference_conv2d(case.model, case.xs, single=True)
    with kernel_path(path):
        got = O.run_npusim(case.model, case.xs, "single")
    O.assert_same(ref_single, got, f"profile single vs the numpy single-rounding reference: {case.desc}")
    diff = np.abs(got.astype(np.int32) - tflm.astype(np.int32))
    assert diff.max(initial=0) <= 1, f"single vs tflm differ by {diff.max()}: {case.desc}"


def reference_add(a, b, s1, z1, s2, z2, so, zo, lo, hi, single: bool) -> np.ndarray:
    """TFLM's int8 ADD (reference_integer_ops/add.h) in int64 numpy: inputs brought to twice the
    larger scale with 20 bits of headroom, added, requantized to the output scale."""
    f = mbqm_single if single else mbqm_double
    s1, s2, so = (float(np.float32(s)) for s in (s1, s2, so))
    twice_max = 2.0 * max(s1, s2)
    x1 = f((a.astype(np.int64) - z1) << 20, *quantize_multiplier(s1 / twice_max))
    x2 = f((b.astype(np.int64) - z2) << 20, *quantize_multiplier(s2 / twice_max))
    return np.clip(f(x1 + x2, *quantize_multiplier(twice_max / ((1 << 20) * so))) + zo, lo, hi).astype(
        np.int8
    )


@pytest.mark.parametrize("scales", [(0.05, 0.02, 0.07), (0.5, 0.25, 0.125), (0.003, 0.2, 0.15)])
def test_add_single_rounding_every_pair(scales):
    """The single profile's ADD on all 65,536 input pairs against the numpy reference, which
    with double rounding must equal TFLM."""
    s1, s2, so = scales
    z1, z2, zo = 3, -7, 1
    a, b = C.every_int8_pair()
    model = O.add_model((1, 65536), (1, 65536), s1, z1, s2, z2, so, zo, "NONE")
    O.assert_same(
        O.run_tflm(model, [a, b]),
        reference_add(a, b, s1, z1, s2, z2, so, zo, -128, 127, single=False),
        "the numpy ADD reference (double rounding) vs TFLM",
    )
    O.assert_same(
        reference_add(a, b, s1, z1, s2, z2, so, zo, -128, 127, single=True),
        O.run_npusim(model, [a, b], "single"),
        "profile single vs the numpy single-rounding ADD reference",
    )


def test_single_rounding_differs_on_ties():
    """A tie-rich conv (multiplier 2^-k, small operands) on which single rounding and TFLM's double
    rounding must disagree somewhere, by exactly 1: the profiles are really different."""
    p = dict(
        n=2,
        kh=1,
        kw=1,
        stride=(1, 1),
        dilation=(1, 1),
        padding="VALID",
        hw=(8, 8),
        cin=4,
        cout=4,
        activation="NONE",
        per_channel=False,
        in_scale=0.5,
        in_zp=0,
        out_zp=0,
        mult_mode="pow2_small",
        x_mode="narrow",
        w_mode="narrow",
        bias_mode="small",
    )
    case = C.make_conv(p, 7)
    tflm = O.run_tflm(case.model, case.xs)
    single = O.run_npusim(case.model, case.xs, "single")
    O.assert_same(reference_conv2d(case.model, case.xs, single=True), single, case.desc)
    d = single.astype(np.int32) - tflm.astype(np.int32)
    assert np.abs(d).max() == 1, "single and double rounding should disagree on some ties, by 1"


# ----------------------------------------------------------------------------------------------
# The oracles agree with each other (checks the builder, independent of npusim)
# ----------------------------------------------------------------------------------------------

BUILDER_CASES = {
    "conv": (C.conv_params(no_bias=False), C.make_conv),
    "depthwise": (C.conv_params(depthwise=True), C.make_depthwise),
    "add": (C.add_params(), C.make_add),
    "avgpool": (C.pool_params(), lambda p, s: C.make_pool("AVERAGE_POOL_2D", p, s)),
    "maxpool": (C.pool_params(), lambda p, s: C.make_pool("MAX_POOL_2D", p, s)),
    "mean": (C.mean_params(), C.make_mean),
    "softmax": (C.softmax_params(), C.make_softmax),
    "reshape": (C.reshape_params(), C.make_reshape),
    "pad": (C.pad_params(), C.make_pad),
    "transpose": (C.transpose_params(), C.make_transpose),
    "concat": (C.concat_params(), C.make_concat),
    "quantize": (C.quantize_params(), C.make_quantize),
    "dequantize": (C.dequantize_params(), C.make_dequantize),
}


@pytest.mark.parametrize("kind", sorted(BUILDER_CASES))
@settings(max_examples=examples(8))
@given(data=st.data(), seed=C.seeds)
def test_builder_tflm_matches_litert_reference(kind, data, seed):
    strategy, make = BUILDER_CASES[kind]
    case = make(data.draw(strategy), seed)
    O.assert_same(
        O.run_tflm(case.model, case.xs),
        O.run_litert(case.model, case.xs, "REF"),
        f"TFLM vs LiteRT BUILTIN_REF: {case.desc}",
    )
