"""TRANSPOSE_CONV (int8, per-channel): npusim against TFLite Micro, bit for bit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops_tflm import check, examples

from npusim.testing import oracle as O

import cases as C


@st.composite
def transpose_conv_params(draw):
    p = {"n": draw(C.batch)}
    p["hw"] = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    p["cin"], p["cout"] = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    p["k"] = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    p["stride"] = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p["padding"] = draw(st.sampled_from(["SAME", "VALID"]))
    # The natural output size, or one row / column less or more (TFLM takes the declared size).
    natural = [
        h * s if p["padding"] == "SAME" else (h - 1) * s + k for h, s, k in zip(p["hw"], p["stride"], p["k"])
    ]
    p["out_hw"] = tuple(max(1, d + draw(st.sampled_from([0, 0, 0, -1, 1]))) for d in natural)
    p["activation"] = draw(st.sampled_from([None, "NONE", "RELU", "RELU6"]))
    p["bias"] = draw(st.sampled_from(["uniform", "zero", "large", "none"]))
    p["per_channel"] = draw(st.booleans())
    p["in_scale"] = draw(C.log_scale(1e-3, 0.5))
    p["in_zp"], p["out_zp"] = draw(C.zero_points), draw(C.zero_points)
    p["x_mode"], p["w_mode"] = draw(C.data_modes), draw(C.weight_modes)
    return p


def make_transpose_conv(p: dict, seed: int) -> C.Case:
    rng = np.random.default_rng(seed)
    taps = p["k"][0] * p["k"][1] * p["cin"]
    w = O.random_weights(rng, (p["cout"], *p["k"], p["cin"]), p["w_mode"])
    ws = O.f32(O.log_uniform(rng, 1e-3, 1e-1, p["cout"] if p["per_channel"] else 1))
    out_scale = O.random_out_scale(rng, p["in_scale"], ws, taps)
    bias = None if p["bias"] == "none" else O.random_bias(rng, p["cout"], taps, p["bias"])
    model = O.transpose_conv_model(
        (1, *p["hw"], p["cin"]),
        p["out_hw"],
        w,
        bias,
        p["in_scale"],
        p["in_zp"],
        ws,
        out_scale,
        p["out_zp"],
        p["stride"],
        p["padding"],
        p["activation"],
    )
    x = O.random_int8(rng, (p["n"], *p["hw"], p["cin"]), p["x_mode"])
    return C.Case(model, x, f"TRANSPOSE_CONV {p}, seed={seed}")


@settings(max_examples=examples(150))
@given(p=transpose_conv_params(), seed=C.seeds)
def test_transpose_conv(p, seed):
    check(make_transpose_conv(p, seed))


@pytest.mark.parametrize("channels", [(64, 64), (32, 80)])
def test_transpose_conv_yolo_upsampler(channels):
    """The YOLOv8-seg proto upsampler: 2x2 filter, stride 2, SAME, per channel, 16x16 -> 32x32."""
    cin, cout = channels
    p = dict(
        n=1,
        hw=(16, 16),
        cin=cin,
        cout=cout,
        k=(2, 2),
        stride=(2, 2),
        padding="SAME",
        out_hw=(32, 32),
        activation="NONE",
        bias="uniform",
        per_channel=True,
        in_scale=0.02,
        in_zp=-100,
        out_zp=5,
        x_mode="mixed",
        w_mode="mixed",
    )
    check(make_transpose_conv(p, seed=cin))


@pytest.mark.parametrize("kernel", [(1, 1), (2, 2), (3, 3), (2, 3), (4, 1)])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
def test_transpose_conv_with_one_tap_per_output_pixel(kernel, padding):
    """Stride = filter size (no padding, every output pixel reached once): the op runs as one
    pointwise convolution on the MAC engines, its taps interleaved into place (TransposeConv.pointwise)."""
    from npusim import Interpreter

    hw = (5, 7)
    p = dict(
        n=3,
        hw=hw,
        cin=19,
        cout=6,
        k=kernel,
        stride=kernel,
        padding=padding,
        out_hw=tuple(h * k for h, k in zip(hw, kernel)),
        activation="RELU",
        bias="large",
        per_channel=True,
        in_scale=0.03,
        in_zp=7,
        out_zp=-3,
        x_mode="mixed",
        w_mode="mixed",
    )
    case = make_transpose_conv(p, seed=sum(kernel))
    (kernel_,) = [k for k in Interpreter(case.model).kernels if k.kind == "TRANSPOSE_CONV"]
    assert kernel_.pointwise is not None
    check(case)
