"""npusim (profile "tflm") against TFLite Micro, bit for bit, one operator at a time.

Every example builds a one-op int8 .tflite model (tests/oracle.py), runs TFLM on a random batch
(one invoke per element) and npusim on the whole batch, and requires identical outputs.
Parameters are drawn in tests/cases.py; a failure message names the op, its parameters, the seed of
the arrays and the first differing element.
"""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.testing import oracle as O

import cases as C
from kernel_paths import DEPTHWISE_PATHS, PATHS, kernel_path

SCALE = float(os.environ.get("NPUSIM_TEST_SCALE", "1"))


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


def check(case: C.Case, profile: str = "tflm", allow_refusal: bool = False):
    expected = O.run_tflm(case.model, case.xs)
    try:
        got = O.run_npusim(case.model, case.xs, profile)
    except Exception as e:  # noqa: BLE001 - a clean refusal is acceptable only where allowed
        import npusim

        if allow_refusal and isinstance(e, npusim.NpusimError):
            return
        raise AssertionError(f"{case.desc}\n  npusim raised {type(e).__name__}: {e}") from e
    O.assert_same(expected, got, case.desc)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(300))
@given(p=C.conv_params(), seed=C.seeds)
def test_conv2d(path, p, seed):
    with kernel_path(path):
        check(C.make_conv(p, seed))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(30))
@given(p=C.conv_params(max_hw=6, max_ch=64), seed=C.seeds)
def test_conv2d_deep(path, p, seed):
    """More input channels: accumulators beyond 2^24 with extreme data (float32 GEMM is not exact
    there), reductions beyond the BLAS path's chunk of 1024."""
    with kernel_path(path):
        check(C.make_conv(p, seed))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(40))
@given(p=C.conv_params(max_hw=5, max_ch=12, max_cout=200), seed=C.seeds)
def test_conv2d_wide(path, p, seed):
    """Up to 200 output channels: several 64-channel blocks of the VNNI kernel and a partial one."""
    with kernel_path(path):
        check(C.make_conv(p, seed))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@settings(max_examples=examples(300))
@given(p=C.conv_params(depthwise=True), seed=C.seeds)
def test_depthwise_conv2d(path, p, seed):
    with kernel_path(path):
        check(C.make_depthwise(p, seed))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@settings(max_examples=examples(40))
@given(p=C.conv_params(depthwise=True, max_hw=20, max_ch=80), seed=C.seeds)
def test_depthwise_conv2d_wide(path, p, seed):
    """Up to 80 channels (times the multiplier) and 20 x 20 images: whole and partial 64-channel blocks and
    long runs of interior pixels for the vector path."""
    with kernel_path(path):
        check(C.make_depthwise(p, seed))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@settings(max_examples=examples(60))
@given(p=C.conv_params(depthwise=True, max_hw=20, max_ch=32, channel_step=16), seed=C.seeds)
def test_depthwise_conv2d_16_and_32_channels(path, p, seed):
    """16 or 32 channels: with multiplier 1 and stride 1 along the width, 4 or 2 adjacent pixels
    share one 64-lane vector (runs of interior pixels of every length modulo 4)."""
    with kernel_path(path):
        check(C.make_depthwise(p, seed))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@pytest.mark.parametrize("channels", [4, 8, 12, 16, 24, 32])
@pytest.mark.parametrize("run", range(1, 10))
def test_depthwise_pixels_per_vector(path, channels, run):
    """Stride 1 along the width: 16 or 32 channels, 4 or 2 pixels per vector; on the AVX2 form also
    4, 8, 12 and 24 channels, 16, 8, 4 and 2 pixels (depthwise.replicas_for). Interior runs of 1
    to 9 pixels (every remainder, after none or some full vectors), and border rows as runs (SAME,
    stride 1 and 2 along the height)."""
    with kernel_path(path):
        for stride_h in (1, 2):
            check(C.depthwise_case(channels, (5, run + 2), (stride_h, 1)))


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@pytest.mark.parametrize("channels", [48, 80, 128])
@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_depthwise_channel_blocks(path, channels, stride):
    """A partial 64-channel block, a full one and a partial one, and two full ones."""
    with kernel_path(path):
        check(C.depthwise_case(channels, (6, 9), stride))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(60))
@given(
    p=C.conv_params(max_hw=40, min_hw=16, max_ch=128, channel_step=16, max_cout=100, max_kernel=3),
    seed=C.seeds,
)
def test_conv2d_large(path, p, seed):
    """Output rows of 16 pixels or more and channels in multiples of 16: the shapes the AMX path
    takes (its last tile of a row moved back, reductions in chunks of 16 to 64 channels)."""
    with kernel_path(path):
        check(C.make_conv(p, seed))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "cin,kernel,padding", [(62, 3, "SAME"), (63, 1, "VALID"), (30, 3, "VALID"), (13, 1, "SAME")]
)
def test_conv2d_channels_not_a_multiple_of_4(path, cin, kernel, padding):
    """C not a multiple of 4 on output rows of 16+ pixels: the AMX (C = 62, 63, 30) and VNNI paths
    read each pixel's last quad or chunk into the next pixel's bytes, which meet zero weights, and
    the last pixel's into the copy's slack; extreme data makes any stray product visible."""
    p = dict(
        n=2,
        kh=kernel,
        kw=kernel,
        stride=(1, 1),
        dilation=(1, 1),
        padding=padding,
        hw=(18, 21),
        cin=cin,
        cout=40,
        activation="NONE",
        per_channel=True,
        in_scale=0.05,
        in_zp=-7,
        out_zp=3,
        mult_mode="typical",
        x_mode="extreme",
        w_mode="extreme",
        bias_mode="uniform",
    )
    with kernel_path(path):
        check(C.make_conv(p, seed=cin))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(200))
@given(p=C.fc_params(), seed=C.seeds)
def test_fully_connected(path, p, seed):
    with kernel_path(path):
        check(C.make_fc(p, seed))


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=examples(30))
@given(p=C.fc_params(max_k=3000, max_units=150), seed=C.seeds)
def test_fully_connected_long(path, p, seed):
    """Long dot products (K up to 3000): |acc| can exceed 2^24 with extreme data."""
    with kernel_path(path):
        check(C.make_fc(p, seed))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [1023, 1024, 1025, 2048, 2049])
@pytest.mark.parametrize("x_mode,w_mode", [("extreme", "extreme"), ("uniform", "extreme")])
def test_fully_connected_chunk_boundary(path, k, x_mode, w_mode):
    """Reductions at the BLAS path's chunk boundaries (1024), with int8 extremes (-128, 127) that
    push every partial sum to its largest magnitude."""
    p = dict(
        n=3,
        layout="2d",
        in_shape=(1, k),
        units=20,
        activation="NONE",
        per_channel=True,
        in_scale=0.02,
        in_zp=-128 if x_mode == "extreme" else 5,
        out_zp=3,
        mult_mode="typical",
        x_mode=x_mode,
        w_mode=w_mode,
        bias_mode="large",
    )
    with kernel_path(path):
        check(C.make_fc(p, seed=k))


@settings(max_examples=examples(300))
@given(p=C.add_params(), seed=C.seeds)
def test_add(p, seed):
    check(C.make_add(p, seed))


# (s1, z1, s2, z2, s_out, z_out, activation)
ADD_PAIR_CASES = [
    (0.05, 3, 0.02, -7, 0.07, 1, "NONE"),
    (0.5, 0, 0.25, 0, 0.125, 0, "NONE"),  # powers of two: exact multipliers, many ties
    (0.01, -128, 0.03, 127, 0.002, -5, "RELU6"),
    (0.1, 10, 0.1, 10, 0.2, -128, "RELU"),
    (0.003, -20, 0.2, 64, 0.15, 30, "NONE"),  # scales 70x apart
]


@pytest.mark.parametrize("params", ADD_PAIR_CASES)
def test_add_every_input_pair(params):
    """ADD's result depends only on the two input bytes: all 65,536 pairs through TFLM and npusim."""
    s1, z1, s2, z2, so, zo, activation = params
    model = O.add_model((1, 65536), (1, 65536), s1, z1, s2, z2, so, zo, activation)
    # The xnnpack profile's ADD is XNNPACK's: tests/test_xnnpack_elementwise.py, against LiteRT.
    check(C.Case(model, C.every_int8_pair(), f"ADD of every int8 pair, {params}"))


@settings(max_examples=examples(100))
@given(p=C.pool_params(), seed=C.seeds)
def test_average_pool_2d(p, seed):
    check(C.make_pool("AVERAGE_POOL_2D", p, seed))


@settings(max_examples=examples(100))
@given(p=C.pool_params(), seed=C.seeds)
def test_max_pool_2d(p, seed):
    check(C.make_pool("MAX_POOL_2D", p, seed))


@settings(max_examples=examples(120))
@given(p=C.mean_params(), seed=C.seeds)
def test_mean(p, seed):
    check(C.make_mean(p, seed))


@settings(max_examples=examples(30))
@given(p=C.mean_params(), axes=st.sampled_from([(1,), (2,), (3,), (1, 2, 3), (2, 1), (-3, -2)]), seed=C.seeds)
def test_mean_other_axes(p, axes, seed):
    """MEAN over other axes takes different TFLM code paths; npusim may refuse them cleanly."""
    check(C.make_mean(p, seed, axes), allow_refusal=True)


@settings(max_examples=examples(120))
@given(p=C.softmax_params(), seed=C.seeds)
def test_softmax(p, seed):
    check(C.make_softmax(p, seed))


@settings(max_examples=examples(40))
@given(p=C.reshape_params(), seed=C.seeds)
def test_reshape(p, seed):
    check(C.make_reshape(p, seed))


@settings(max_examples=examples(50))
@given(p=C.pad_params(), seed=C.seeds)
def test_pad(p, seed):
    check(C.make_pad(p, seed))


@pytest.mark.parametrize(
    "in_shape, last",
    [((1, 6, 5, 24), (0, 4)), ((1, 3, 7), (2, 1)), ((1, 9), (3, 0)), ((1, 2, 2, 5), (0, 0))],
)
@pytest.mark.parametrize("v2", [False, True])
def test_pad_of_the_last_axis_alone(in_shape, last, v2):
    """BlazeFace's channel pads (24 -> 28 before a residual ADD): the last axis alone, by rows."""
    paddings = [(0, 0)] * (len(in_shape) - 1) + [last]
    p = {"n": 3, "in_shape": in_shape, "paddings": paddings, "v2": v2, "q": (0.05, -7)}
    check(C.make_pad(p, seed=len(in_shape)))


@settings(max_examples=examples(50))
@given(p=C.transpose_params(), seed=C.seeds)
def test_transpose(p, seed):
    check(C.make_transpose(p, seed))


@settings(max_examples=examples(50))
@given(p=C.concat_params(), seed=C.seeds)
def test_concatenation(p, seed):
    check(C.make_concat(p, seed))


@settings(max_examples=examples(120))
@given(p=C.quantize_params(), seed=C.seeds)
def test_quantize(p, seed):
    check(C.make_quantize(p, seed))


@settings(max_examples=examples(50))
@given(p=C.dequantize_params(), seed=C.seeds)
def test_dequantize(p, seed):
    check(C.make_dequantize(p, seed))


# ----------------------------------------------------------------------------------------------
# Round trip: write_model(load_model(b)) is a model TFLM runs with the same outputs
# ----------------------------------------------------------------------------------------------

ROUND_TRIP = {
    "conv": (C.conv_params(), C.make_conv),
    "depthwise": (C.conv_params(depthwise=True), C.make_depthwise),
    "fc": (C.fc_params(), C.make_fc),
    "add": (C.add_params(), C.make_add),
    "avgpool": (C.pool_params(), lambda p, s: C.make_pool("AVERAGE_POOL_2D", p, s)),
    "mean": (C.mean_params(), C.make_mean),
    "softmax": (C.softmax_params(), C.make_softmax),
    "pad": (C.pad_params(), C.make_pad),
    "concat": (C.concat_params(), C.make_concat),
    "quantize": (C.quantize_params(), C.make_quantize),
}


@pytest.mark.parametrize("kind", sorted(ROUND_TRIP))
@settings(max_examples=examples(6))
@given(data=st.data(), seed=C.seeds)
def test_write_model_round_trip(kind, data, seed):
    import npusim

    strategy, make = ROUND_TRIP[kind]
    case = make(data.draw(strategy), seed)
    rewritten = npusim.write_model(npusim.load_model(case.model))
    assert isinstance(rewritten, (bytes, bytearray))
    # Compare each runtime with itself, so that a kernel bug does not show up as a writer bug.
    O.assert_same(
        O.run_tflm(case.model, case.xs),
        O.run_tflm(bytes(rewritten), case.xs),
        f"round trip, TFLM on the original vs the rewritten model: {case.desc}",
    )
    O.assert_same(
        O.run_npusim(case.model, case.xs),
        O.run_npusim(bytes(rewritten), case.xs),
        f"round trip, npusim on the original vs the rewritten model: {case.desc}",
    )


def test_public_api_batch():
    """The documented API: load_model -> Interpreter(graph, profile) -> run(batch)."""
    import npusim

    case = C.make_conv(
        dict(
            n=3,
            kh=3,
            kw=3,
            stride=(1, 1),
            dilation=(1, 1),
            padding="SAME",
            hw=(6, 5),
            cin=3,
            cout=4,
            activation="RELU6",
            per_channel=True,
            in_scale=0.02,
            in_zp=-7,
            out_zp=3,
            mult_mode="typical",
            x_mode="uniform",
            w_mode="uniform",
            bias_mode="uniform",
        ),
        1234,
    )
    graph = npusim.load_model(case.model)
    y = npusim.Interpreter(graph, profile="tflm").run(case.xs)
    assert y.dtype == np.int8 and y.shape == (3, 6, 5, 4)
    O.assert_same(O.run_tflm(case.model, case.xs), y, case.desc)
    # one element at a time gives the same rows as the batch
    for i in range(3):
        O.assert_same(
            y[i : i + 1], npusim.Interpreter(graph, profile="tflm").run(case.xs[i : i + 1]), f"row {i}"
        )


# ----------------------------------------------------------------------------------------------
# Quirks of real files (docs/numerics.md, "Quirks handled as TFLM does")
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DEPTHWISE_PATHS)
@settings(max_examples=examples(10))
@given(p=C.conv_params(depthwise=True, mult_modes=["typical"]), seed=C.seeds)
def test_depthwise_bias_quantized_dimension_3(path, p, seed):
    """person_detect carries a 1-D per-channel bias with quantized_dimension = 3: TFLM runs it, and
    so must npusim."""
    p = dict(p, per_channel=True)
    rng = np.random.default_rng(seed)
    c, m = p["cin"], p["mult"]
    w = O.random_weights(rng, (1, p["kh"], p["kw"], c * m))
    ws = O.f32(O.log_uniform(rng, 1e-3, 1e-1, c * m))
    out_scale = O.random_out_scale(rng, p["in_scale"], ws, p["kh"] * p["kw"])
    model = O.depthwise_model(
        (1, *p["hw"], c),
        w,
        O.random_bias(rng, c * m, p["kh"] * p["kw"]),
        p["in_scale"],
        p["in_zp"],
        ws,
        out_scale,
        p["out_zp"],
        stride=p["stride"],
        padding=p["padding"],
        dilation=p["dilation"],
        activation=p["activation"],
        depth_multiplier=m,
        bias_axis=3,
    )
    with kernel_path(path):
        check(
            C.Case(
                model, O.random_int8(rng, (p["n"], *p["hw"], c)), f"DEPTHWISE bias axis 3, {p}, seed={seed}"
            )
        )


def test_uint8_model_refused():
    """Old uint8 asymmetric models are outside the scheme: a clear NpusimError naming the type.
    (No oracle here: TFLM itself fails to allocate tensors for this uint8 CONV_2D.)"""
    import npusim

    b = O.ModelBuilder()
    x = b.add_tensor((1, 4, 4, 2), np.uint8, 0.02, 128, name="input")
    w = b.add_const(np.full((3, 1, 1, 2), 130, np.uint8), scale=0.01, zero_point=128, name="weights")
    bias = b.add_const(np.zeros(3, np.int32), scale=0.0002, zero_point=0, name="bias")
    y = b.add_tensor((1, 4, 4, 3), np.uint8, 0.05, 128, name="output")
    opt = O.schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = O.schema.Padding.SAME, 1, 1
    b.add_op("CONV_2D", [x, w, bias], [y], opt, version=1)
    model = b.build([x], [y])
    with pytest.raises(npusim.NpusimError, match="(?i)uint8"):
        npusim.Interpreter(npusim.load_model(model), profile="tflm").run(np.zeros((1, 4, 4, 2), np.uint8))
