"""Random one-op test cases: hypothesis strategies for the structure, a seeded numpy generator for
the arrays. Each make_* function turns (params, seed) into a Case: model bytes, a batch of inputs
(N on axis 0, in the model's input dtype; a list when the graph has several inputs) and a short
description for failure messages.

Shared by test_ops_tflm.py (npusim vs TFLM), test_profiles_litert.py (npusim vs LiteRT) and the
round-trip test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from npusim.testing import oracle as O

ACTIVATIONS = ["NONE", "RELU", "RELU6"]
seeds = st.integers(0, 2**32 - 1)
batch = st.integers(1, 3)
zero_points = st.one_of(st.integers(-128, 127), st.sampled_from([-128, 0, 127]))
data_modes = st.sampled_from(["uniform", "uniform", "mixed", "extreme", "narrow"])
weight_modes = st.sampled_from(["uniform", "uniform", "mixed", "extreme"])


def log_scale(lo: float, hi: float):
    """A scale drawn log-uniformly from [lo, hi], stored as float32 as in a .tflite file."""
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda e: float(np.float32(10.0**e)))


MULT_MODES = ["typical"] * 5 + ["near_one", "tiny", "pow2", "pow2_small"]


@dataclass
class Case:
    model: bytes
    xs: object  # one array, or a list of arrays for several graph inputs
    desc: str


def _fmt(p: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items())


# ----------------------------------------------------------------------------------------------
# CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED
# ----------------------------------------------------------------------------------------------


@st.composite
def conv_params(
    draw,
    depthwise: bool = False,
    max_hw: int = 10,
    max_ch: int = 8,
    no_bias: bool | None = None,
    mult_modes=None,
    max_cout: int | None = None,
    min_hw: int = 1,
    channel_step: int = 1,
    max_kernel: int = 5,
):
    """CONV_2D (or DEPTHWISE_CONV_2D) parameters. no_bias: whether models without a bias tensor are
    drawn; default only for CONV_2D, because TFLM (PyPI 0.dev20261023182759) dies with SIGSEGV on
    DEPTHWISE_CONV_2D without bias (and LiteRT refuses CONV_2D without bias)."""
    no_bias = (not depthwise) if no_bias is None else no_bias
    p = {}
    p["n"] = draw(batch)
    p["kh"], p["kw"] = draw(st.integers(1, max_kernel)), draw(st.integers(1, max_kernel))
    p["stride"] = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p["dilation"] = (draw(st.sampled_from([1, 1, 1, 2, 3])), draw(st.sampled_from([1, 1, 1, 2, 3])))
    p["padding"] = draw(st.sampled_from(["SAME", "VALID"]))
    h, w = draw(st.integers(min_hw, max_hw)), draw(st.integers(min_hw, max_hw))
    if p["padding"] == "VALID":  # keep the output non-empty
        h = max(h, (p["kh"] - 1) * p["dilation"][0] + 1)
        w = max(w, (p["kw"] - 1) * p["dilation"][1] + 1)
    p["hw"] = (h, w)
    p["cin"] = draw(st.integers(1, max_ch // channel_step)) * channel_step
    if depthwise:
        p["mult"] = draw(st.sampled_from([1, 1, 1, 2, 3]))
    else:
        p["cout"] = draw(st.integers(1, max_cout or max_ch))
    p["activation"] = draw(st.sampled_from(ACTIVATIONS))
    p["per_channel"] = draw(st.booleans()) or draw(st.booleans())  # 3/4 per-channel, as converters write
    p["in_scale"] = draw(log_scale(1e-3, 1.0))
    p["in_zp"] = draw(zero_points)
    p["out_zp"] = draw(zero_points)
    p["mult_mode"] = draw(st.sampled_from(mult_modes or MULT_MODES))
    p["x_mode"] = draw(data_modes)
    p["w_mode"] = draw(weight_modes)
    p["bias_mode"] = draw(
        st.sampled_from(["uniform", "uniform", "zero", "large"] + (["none"] if no_bias else []))
    )
    if p["mult_mode"] == "pow2_small":
        _small_operands(draw, p)
    return p


def _small_operands(draw, p):
    """pow2_small: small operands so that multipliers 2^-1..2^-4 do not saturate; about a quarter
    of the outputs are then exact rounding ties."""
    p["x_mode"], p["w_mode"] = "narrow", "narrow"
    p["in_zp"] = draw(st.integers(-4, 4))
    if p["bias_mode"] != "none":
        p["bias_mode"] = "small"


def pow2(x: float) -> float:
    """The power of two nearest to x (log scale): exact multipliers, so ties really happen."""
    return float(2.0 ** round(math.log2(x)))


def _scales_and_bias(rng, p, channels, taps, max_mult=0.999):
    """(in_scale, w_scales, out_scale, bias) for a conv-like op.

    mult_mode: typical (output scale puts the accumulator in the int8 range), near_one
    (multipliers in [0.3, 1)), tiny (1e-12 to 1e-5: shifts beyond 31 flush the multiplier to 0),
    pow2 (every scale a power of two: the multiplier is exactly 2^-k and rounding ties happen),
    pow2_small (the same with k in 1..4 and small operands: ties everywhere, which is what
    separates the rounding profiles)."""
    s_in = p["in_scale"]
    n_scales = channels if p["per_channel"] else 1
    if p["mult_mode"] in ("pow2", "pow2_small"):
        s_in = pow2(s_in)
        ws = O.f32(2.0 ** -rng.integers(7, 14, n_scales).astype(np.float64))
        if p["mult_mode"] == "pow2":
            typical = 64.0 / (127.0 * 75.0 * math.sqrt(max(taps, 1)))
            k = max(1, int(math.ceil(-math.log2(typical))) + int(rng.integers(-3, 4)))
        else:
            k = int(rng.integers(1, 5))
        out_scale = s_in * float(ws.max()) * 2.0**k
    else:
        if p["per_channel"]:
            ws = O.f32(O.log_uniform(rng, 1e-4, 1e-1) * O.log_uniform(rng, 0.1, 10.0, channels))
        else:
            ws = O.f32([O.log_uniform(rng, 1e-4, 1e-1)])
        if p["mult_mode"] == "typical":
            out_scale = O.random_out_scale(rng, s_in, ws, taps, max_mult)
        elif p["mult_mode"] == "near_one":
            m = float(rng.uniform(0.3, 0.98))
            out_scale = float(np.float32(s_in * float(ws.max()) / m))
            while np.any(np.float64(s_in) * ws.astype(np.float64) / np.float64(out_scale) >= max_mult):
                out_scale = float(np.float32(out_scale * 1.01))
        else:  # tiny
            m = float(O.log_uniform(rng, 1e-12, 1e-5))
            out_scale = float(np.float32(s_in * float(ws.max()) / m))
    mode = p["bias_mode"]
    bias = None if mode == "none" else O.random_bias(rng, channels, taps, mode)
    return s_in, ws, out_scale, bias


def make_conv(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    cin, cout, kh, kw = p["cin"], p["cout"], p["kh"], p["kw"]
    w = O.random_weights(rng, (cout, kh, kw, cin), p["w_mode"])
    s_in, ws, out_scale, bias = _scales_and_bias(rng, p, cout, kh * kw * cin)
    model = O.conv2d_model(
        (1, *p["hw"], cin),
        w,
        bias,
        s_in,
        p["in_zp"],
        ws if p["per_channel"] else ws[0],
        out_scale,
        p["out_zp"],
        stride=p["stride"],
        padding=p["padding"],
        dilation=p["dilation"],
        activation=p["activation"],
    )
    x = O.random_int8(rng, (p["n"], *p["hw"], cin), p["x_mode"])
    return Case(model, x, f"CONV_2D {_fmt(p)}, in_scale={s_in}, out_scale={out_scale}, seed={seed}")


def make_depthwise(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    c, m, kh, kw = p["cin"], p["mult"], p["kh"], p["kw"]
    w = O.random_weights(rng, (1, kh, kw, c * m), p["w_mode"])
    s_in, ws, out_scale, bias = _scales_and_bias(rng, p, c * m, kh * kw)
    model = O.depthwise_model(
        (1, *p["hw"], c),
        w,
        bias,
        s_in,
        p["in_zp"],
        ws if p["per_channel"] else ws[0],
        out_scale,
        p["out_zp"],
        stride=p["stride"],
        padding=p["padding"],
        dilation=p["dilation"],
        activation=p["activation"],
        depth_multiplier=m,
    )
    x = O.random_int8(rng, (p["n"], *p["hw"], c), p["x_mode"])
    return Case(model, x, f"DEPTHWISE_CONV_2D {_fmt(p)}, in_scale={s_in}, out_scale={out_scale}, seed={seed}")


def depthwise_case(channels: int, hw: tuple, stride: tuple, seed: int = 0) -> Case:
    """A fixed 3x3 SAME depthwise layer (multiplier 1, RELU6, per-channel scales): the tests that
    aim at particular vector layouts and run lengths."""
    p = dict(
        n=2,
        kh=3,
        kw=3,
        stride=stride,
        dilation=(1, 1),
        padding="SAME",
        hw=hw,
        cin=channels,
        mult=1,
        activation="RELU6",
        per_channel=True,
        in_scale=0.05,
        in_zp=-3,
        out_zp=5,
        mult_mode="typical",
        x_mode="uniform",
        w_mode="uniform",
        bias_mode="large",
    )
    return make_depthwise(p, seed)


@st.composite
def fc_params(draw, max_k: int = 300, mult_modes=None, max_units: int = 16):
    p = {}
    p["n"] = draw(batch)
    # input layout: [1, K]; [1, h, w, c] flattened; [1, t, c] with keep_num_dims (t rows of c)
    p["layout"] = draw(st.sampled_from(["2d", "2d", "4d", "keep3d"]))
    if p["layout"] == "2d":
        p["in_shape"] = (1, draw(st.integers(1, max_k)))
    elif p["layout"] == "4d":
        p["in_shape"] = (1, draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 8)))
    else:
        p["in_shape"] = (1, draw(st.integers(1, 4)), draw(st.integers(1, 64)))
    p["units"] = draw(st.integers(1, max_units))
    p["activation"] = draw(st.sampled_from(ACTIVATIONS))
    p["per_channel"] = draw(st.booleans())
    p["in_scale"] = draw(log_scale(1e-3, 1.0))
    p["in_zp"] = draw(zero_points)
    p["out_zp"] = draw(zero_points)
    p["mult_mode"] = draw(st.sampled_from(mult_modes or MULT_MODES))
    p["x_mode"] = draw(data_modes)
    p["w_mode"] = draw(weight_modes)
    p["bias_mode"] = draw(st.sampled_from(["uniform", "uniform", "zero", "large", "none"]))
    if p["mult_mode"] == "pow2_small":
        _small_operands(draw, p)
    return p


def make_fc(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    shape = p["in_shape"]
    keep = p["layout"] == "keep3d"
    k = shape[-1] if keep else int(np.prod(shape[1:]))
    w = O.random_weights(rng, (p["units"], k), p["w_mode"])
    s_in, ws, out_scale, bias = _scales_and_bias(rng, p, p["units"], k)
    model = O.fully_connected_model(
        shape,
        w,
        bias,
        s_in,
        p["in_zp"],
        ws if p["per_channel"] else ws[0],
        out_scale,
        p["out_zp"],
        activation=p["activation"],
        keep_num_dims=keep,
    )
    x = O.random_int8(rng, (p["n"], *shape[1:]), p["x_mode"])
    return Case(model, x, f"FULLY_CONNECTED {_fmt(p)}, in_scale={s_in}, out_scale={out_scale}, seed={seed}")


# ----------------------------------------------------------------------------------------------
# ADD
# ----------------------------------------------------------------------------------------------


@st.composite
def add_params(draw):
    p = {}
    p["n"] = draw(batch)
    rank = draw(st.sampled_from([4, 4, 4, 2, 3, 5]))
    full = [1] + [draw(st.integers(1, 5)) for _ in range(rank - 1)]
    kind = draw(
        st.sampled_from(
            [
                "same",
                "channel",
                "random",
                "const_full",
                "const_channel",
                "const_vector",
                "const_scalar",
                "const_bigger",
            ]
        )
    )
    p["kind"] = kind
    if kind == "same":
        s1, s2 = full, list(full)
    elif kind == "channel":  # [N,H,W,C] + [N,1,1,C], either order
        s1, s2 = full, [1] * (rank - 1) + [full[-1]]
        if draw(st.booleans()):
            s1, s2 = s2, s1
    elif kind == "random":  # both graph inputs, any broadcast pattern (batch axis kept)
        s1, s2 = list(full), list(full)
        for i in range(1, rank):
            r = draw(st.integers(0, 2))
            if r == 1:
                s1[i] = 1
            elif r == 2:
                s2[i] = 1
    elif kind == "const_full":  # x [N,...] + constant [1,...]
        s1, s2 = full, list(full)
    elif kind == "const_channel":
        s1, s2 = full, [1] * (rank - 1) + [full[-1]]
    elif kind == "const_vector":  # constant of lower rank: [C]
        s1, s2 = full, [full[-1]]
    elif kind == "const_scalar":
        s1, s2 = full, [1]
    else:  # const_bigger: x [N,1,..,C] + constant [1,H,W,C] -> output larger than the input
        s1, s2 = [1] * (rank - 1) + [full[-1]], full
    p["shapes"] = (tuple(s1), tuple(s2))
    p["s1"] = draw(log_scale(1e-3, 1.0))
    p["s2"] = float(np.float32(p["s1"] * 10.0 ** draw(st.floats(-2.0, 2.0))))
    # output scale relative to the larger input scale: below 1 makes the input multipliers > 1
    p["s_out"] = float(np.float32(max(p["s1"], p["s2"]) * 10.0 ** draw(st.floats(-0.9, 0.9))))
    if draw(st.integers(0, 3)) == 0:  # power-of-two scales: exact multipliers, frequent ties
        p["s1"], p["s2"], p["s_out"] = pow2(p["s1"]), pow2(p["s2"]), pow2(p["s_out"])
    p["z1"], p["z2"], p["z_out"] = draw(zero_points), draw(zero_points), draw(zero_points)
    p["activation"] = draw(st.sampled_from(ACTIVATIONS))
    p["x_mode"] = draw(data_modes)
    return p


def make_add(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    s1, s2 = p["shapes"]
    const = p["kind"].startswith("const")
    c2 = O.random_int8(rng, s2, p["x_mode"]) if const else None
    model = O.add_model(
        s1, s2, p["s1"], p["z1"], p["s2"], p["z2"], p["s_out"], p["z_out"], p["activation"], const2=c2
    )
    x1 = O.random_int8(rng, (p["n"], *s1[1:]), p["x_mode"])
    xs = x1 if const else [x1, O.random_int8(rng, (p["n"], *s2[1:]), p["x_mode"])]
    return Case(model, xs, f"ADD {_fmt(p)}, seed={seed}")


def every_int8_pair() -> list[np.ndarray]:
    """Two [1, 65536] int8 inputs that hold every pair of int8 values once."""
    values = np.arange(-128, 128, dtype=np.int8)
    return [np.repeat(values, 256).reshape(1, 65536), np.tile(values, 256).reshape(1, 65536)]


# ----------------------------------------------------------------------------------------------
# Pools, MEAN, SOFTMAX
# ----------------------------------------------------------------------------------------------


@st.composite
def pool_params(draw):
    p = {}
    p["n"] = draw(batch)
    p["filter"] = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    p["stride"] = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p["padding"] = draw(st.sampled_from(["SAME", "VALID"]))
    h, w = draw(st.integers(1, 10)), draw(st.integers(1, 10))
    if draw(st.integers(0, 5)) == 0:  # global pooling: one window over the whole image
        p["filter"], p["stride"], p["padding"] = (h, w), (1, 1), "VALID"
    if p["padding"] == "VALID":
        h, w = max(h, p["filter"][0]), max(w, p["filter"][1])
    p["hwc"] = (h, w, draw(st.integers(1, 6)))
    p["scale"] = draw(log_scale(1e-3, 1.0))
    p["zp"] = draw(zero_points)
    p["activation"] = draw(st.sampled_from(ACTIVATIONS))
    p["x_mode"] = draw(data_modes)
    return p


def make_pool(kind: str, p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    fn = O.avg_pool_model if kind == "AVERAGE_POOL_2D" else O.max_pool_model
    model = fn((1, *p["hwc"]), p["scale"], p["zp"], p["filter"], p["stride"], p["padding"], p["activation"])
    x = O.random_int8(rng, (p["n"], *p["hwc"]), p["x_mode"])
    return Case(model, x, f"{kind} {_fmt(p)}, seed={seed}")


@st.composite
def mean_params(draw):
    p = {}
    p["n"] = draw(batch)
    p["hwc"] = (draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 8)))
    p["keep_dims"] = draw(st.booleans())
    p["in_scale"] = draw(log_scale(1e-3, 1.0))
    p["in_zp"] = draw(zero_points)
    same = draw(st.booleans())  # MobileNet-style global pooling often keeps the quantization
    p["out_scale"] = (
        p["in_scale"] if same else float(np.float32(p["in_scale"] * 10.0 ** draw(st.floats(-1.0, 0.5))))
    )
    p["out_zp"] = p["in_zp"] if same else draw(zero_points)
    if draw(st.integers(0, 3)) == 0:
        p["in_scale"], p["out_scale"] = pow2(p["in_scale"]), pow2(p["out_scale"])
    p["x_mode"] = draw(data_modes)
    return p


def make_mean(p: dict, seed: int, axes=(1, 2)) -> Case:
    rng = np.random.default_rng(seed)
    model = O.mean_model(
        (1, *p["hwc"]),
        p["in_scale"],
        p["in_zp"],
        p["out_scale"],
        p["out_zp"],
        axes=axes,
        keep_dims=p["keep_dims"],
    )
    x = O.random_int8(rng, (p["n"], *p["hwc"]), p["x_mode"])
    return Case(model, x, f"MEAN axes={list(axes)} {_fmt(p)}, seed={seed}")


@st.composite
def softmax_params(draw):
    p = {}
    p["n"] = draw(batch)
    p["shape"] = draw(
        st.sampled_from(
            [
                (1, draw(st.integers(1, 40))),
                (1, draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 12))),
                (1, draw(st.integers(1, 5)), draw(st.integers(1, 16))),
            ]
        )
    )
    p["in_scale"] = draw(log_scale(1e-3, 4.0))
    p["in_zp"] = draw(zero_points)
    p["beta"] = (
        draw(st.sampled_from([1.0, 1.0, 1.0, 0.5, 2.0]))
        if draw(st.booleans())
        else float(np.float32(draw(st.floats(0.05, 4.0))))
    )
    p["x_mode"] = draw(data_modes)
    return p


def make_softmax(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    model = O.softmax_model(p["shape"], p["in_scale"], p["in_zp"], p["beta"])
    x = O.random_int8(rng, (p["n"], *p["shape"][1:]), p["x_mode"])
    return Case(model, x, f"SOFTMAX {_fmt(p)}, seed={seed}")


# ----------------------------------------------------------------------------------------------
# Data movement
# ----------------------------------------------------------------------------------------------

qparams = st.tuples(log_scale(1e-3, 1.0), zero_points)
small_shape = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(lambda s: (1, *s))


@st.composite
def reshape_params(draw):
    p = {"n": draw(batch), "in_shape": draw(small_shape)}
    size = int(np.prod(p["in_shape"]))
    # a random factorization of the per-sample size, batch kept on axis 0
    dims, rest = [], size
    for _ in range(draw(st.integers(0, 3))):
        divs = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divs))
        dims.append(d)
        rest //= d
    dims.append(rest)
    dims = draw(st.permutations(dims))
    if draw(st.booleans()):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    p["new_shape"] = (1, *dims)
    p["shape_tensor"] = draw(st.booleans()) or draw(st.booleans())
    p["q"] = draw(qparams)
    return p


def make_reshape(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    model = O.reshape_model(p["in_shape"], p["new_shape"], *p["q"], shape_tensor=p["shape_tensor"])
    x = O.random_int8(rng, (p["n"], *p["in_shape"][1:]))
    return Case(model, x, f"RESHAPE {_fmt(p)}, seed={seed}")


@st.composite
def pad_params(draw):
    p = {"n": draw(batch), "in_shape": draw(small_shape)}
    p["paddings"] = [(0, 0)] + [(draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in p["in_shape"][1:]]
    p["v2"] = draw(st.booleans())
    p["q"] = draw(qparams)
    return p


def make_pad(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    model = O.pad_model(p["in_shape"], p["paddings"], *p["q"], v2=p["v2"])
    x = O.random_int8(rng, (p["n"], *p["in_shape"][1:]))
    return Case(model, x, f"{'PADV2' if p['v2'] else 'PAD'} {_fmt(p)}, seed={seed}")


@st.composite
def transpose_params(draw):
    p = {"n": draw(batch)}
    p["in_shape"] = (1, *draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    rank = len(p["in_shape"])
    p["perm"] = (0, *draw(st.permutations(list(range(1, rank)))))  # batch stays on axis 0
    p["q"] = draw(qparams)
    return p


def make_transpose(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    model = O.transpose_model(p["in_shape"], p["perm"], *p["q"])
    x = O.random_int8(rng, (p["n"], *p["in_shape"][1:]))
    return Case(model, x, f"TRANSPOSE {_fmt(p)}, seed={seed}")


@st.composite
def concat_params(draw):
    p = {"n": draw(batch)}
    base = (1, *draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    rank = len(base)
    axis = draw(st.integers(1, rank - 1))
    k = draw(st.integers(1, 4))
    shapes = []
    for _ in range(k):
        s = list(base)
        s[axis] = draw(st.integers(1, 4))
        shapes.append(tuple(s))
    p["shapes"] = shapes
    p["axis"] = axis - rank if draw(st.booleans()) else axis  # negative axes too
    p["consts"] = [False] + [draw(st.booleans()) for _ in range(k - 1)]
    p["q"] = draw(qparams)
    return p


def make_concat(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    consts = [O.random_int8(rng, s) if c else None for s, c in zip(p["shapes"], p["consts"])]
    model = O.concat_model(p["shapes"], p["axis"], *p["q"], consts=consts)
    xs = [O.random_int8(rng, (p["n"], *s[1:])) for s, c in zip(p["shapes"], p["consts"]) if not c]
    return Case(model, xs if len(xs) > 1 else xs[0], f"CONCATENATION {_fmt(p)}, seed={seed}")


# ----------------------------------------------------------------------------------------------
# QUANTIZE / DEQUANTIZE
# ----------------------------------------------------------------------------------------------


@st.composite
def quantize_params(draw):
    p = {"n": draw(batch), "shape": draw(small_shape)}
    p["in_dtype"] = draw(st.sampled_from(["float32", "uint8"]))
    p["out_scale"] = draw(log_scale(1e-3, 1.0))
    p["out_zp"] = draw(zero_points)
    if p["in_dtype"] == "uint8":
        if draw(st.booleans()):  # the common case: same scale, zero point shifted by 128
            p["in_scale"], p["in_zp"] = p["out_scale"], p["out_zp"] + 128
        else:
            p["in_scale"] = float(np.float32(p["out_scale"] * 10.0 ** draw(st.floats(-1.5, 1.5))))
            p["in_zp"] = draw(st.integers(0, 255))
            if draw(st.booleans()):
                p["in_scale"], p["out_scale"] = pow2(p["in_scale"]), pow2(p["out_scale"])
    p["x_mode"] = draw(st.sampled_from(["normal", "ties", "wide"]))
    return p


def make_quantize(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    shape = (p["n"], *p["shape"][1:])
    if p["in_dtype"] == "float32":
        model = O.quantize_model(p["shape"], np.float32, p["out_scale"], p["out_zp"])
        s = np.float32(p["out_scale"])
        if p["x_mode"] == "ties":  # values at and next to half-way points
            k = rng.integers(-140, 140, shape).astype(np.float32)
            x = ((k + np.float32(0.5)) * s).astype(np.float32)
            nudge = rng.integers(-1, 2, shape)
            toward = np.where(nudge > 0, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32)
            x = np.where(nudge == 0, x, np.nextafter(x, toward))
        elif p["x_mode"] == "wide":
            x = (rng.standard_normal(shape) * 500 * s).astype(np.float32)
        else:
            x = (rng.standard_normal(shape) * 50 * s).astype(np.float32)
        x = x.astype(np.float32)
    else:
        model = O.quantize_model(p["shape"], np.uint8, p["out_scale"], p["out_zp"], p["in_scale"], p["in_zp"])
        x = rng.integers(0, 256, shape, dtype=np.uint8)
        if p["x_mode"] == "wide":
            x[rng.random(shape) < 0.5] = rng.choice(np.array([0, 255], np.uint8))
    return Case(model, x, f"QUANTIZE {_fmt(p)}, seed={seed}")


@st.composite
def dequantize_params(draw):
    return {
        "n": draw(batch),
        "shape": draw(small_shape),
        "scale": draw(log_scale(1e-4, 10.0)),
        "zp": draw(zero_points),
        "x_mode": draw(data_modes),
    }


def make_dequantize(p: dict, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    model = O.dequantize_model(p["shape"], p["scale"], p["zp"])
    x = O.random_int8(rng, (p["n"], *p["shape"][1:]), p["x_mode"])
    return Case(model, x, f"DEQUANTIZE {_fmt(p)}, seed={seed}")
