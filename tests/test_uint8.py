"""TFLite's legacy uint8 models (npusim/runtime/uint8.py): under --profile xnnpack equal to LiteRT element
for element on one-op uint8 models made from the int8 ones (npusim/testing/uint8_models.py, with
asymmetric filters), and refused in one line under a profile with no uint8 kernels.

The kinds proven here (OPS, drawn by hypothesis, and ONE_OP, fixed models on three seeds) are the
registry's uint8=True entries (tests/test_registry.py holds the two equal); a uint8 model with any
other op is refused before any work, naming it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import npusim
from npusim.errors import NpusimError
from npusim.testing import movement_models as M
from npusim.testing import oracle as O
from npusim.testing import runners as R
from npusim.testing.uint8_models import as_uint8, as_uint8_input

import cases as C
from shared_paths import MOBILENET, RESNET, need

OPS = {
    "CONV_2D": (C.conv_params(), C.make_conv),
    "DEPTHWISE_CONV_2D": (C.conv_params(depthwise=True), C.make_depthwise),
    "FULLY_CONNECTED": (C.fc_params(max_k=64), C.make_fc),
    "ADD": (C.add_params(), C.make_add),
    "AVERAGE_POOL_2D": (C.pool_params(), lambda p, s: C.make_pool("AVERAGE_POOL_2D", p, s)),
    "MAX_POOL_2D": (C.pool_params(), lambda p, s: C.make_pool("MAX_POOL_2D", p, s)),
    "SOFTMAX": (C.softmax_params(), C.make_softmax),
    "RESHAPE": (C.reshape_params(), C.make_reshape),
    "CONCATENATION": (C.concat_params(), C.make_concat),
    "MEAN": (C.mean_params(), C.make_mean),
}

S = (1, 6, 6, 4)  # the one-op models' input (NHWC)
W = np.random.default_rng(5).integers(-127, 128, (4, 3, 3, 4))  # a TRANSPOSE_CONV filter [O, kh, kw, I]


def _one(model):
    return model, [S]


# (kind, variant) -> builder(s, z, so, zo, rng) -> (int8 model, its input shapes): the int8 twin of a
# uint8 model (as_uint8), (s, z) and (so, zo) the int8 input's and output's quantization.
ONE_OP = {
    ("MUL", "same shape"): lambda s, z, so, zo, rng: (
        O.binary_model("MUL", S, S, s, z, s * 1.3, z // 2, so * 3, zo),
        [S, S],
    ),
    ("MUL", "broadcast"): lambda s, z, so, zo, rng: (
        O.binary_model("MUL", S, (1, 1, 1, 4), s, z, s * 1.3, z // 2, so * 3, zo),
        [S, (1, 1, 1, 4)],
    ),
    ("SUB", "plain"): lambda s, z, so, zo, rng: (
        O.binary_model("SUB", S, S, s, z, s * 1.3, z // 2, so, zo),
        [S, S],
    ),
    ("SUB", "relu"): lambda s, z, so, zo, rng: (
        O.binary_model("SUB", S, S, s, z, s * 1.3, z // 2, so, zo, "RELU"),
        [S, S],
    ),
    ("MAXIMUM", ""): lambda s, z, so, zo, rng: (
        O.plain_binary_model("MAXIMUM", S, S, (s, z), (s, z), (s, z)),
        [S, S],
    ),
    ("MINIMUM", ""): lambda s, z, so, zo, rng: (
        O.plain_binary_model("MINIMUM", S, S, (s, z), (s, z), (s, z)),
        [S, S],
    ),
    ("PRELU", ""): lambda s, z, so, zo, rng: _one(
        O.plain_binary_model(
            "PRELU", S, (1, 1, 1, 4), (s, z), (so, zo), (s * 0.7, z // 3), const2=rng.integers(-128, 128, 4)
        )
    ),
    ("LOGISTIC", ""): lambda s, z, so, zo, rng: _one(O.logistic_model(S, s * 3, z)),
    ("TANH", ""): lambda s, z, so, zo, rng: _one(O.unary_model("TANH", S, s * 3, z, 1 / 128, 0)),
    ("HARD_SWISH", ""): lambda s, z, so, zo, rng: _one(O.unary_model("HARD_SWISH", S, s * 2, z, so, zo)),
    ("LEAKY_RELU", ""): lambda s, z, so, zo, rng: _one(O.leaky_relu_model(S, s, z, so, zo, 0.2)),
    ("SUM", ""): lambda s, z, so, zo, rng: _one(O.mean_model(S, s, z, so * 4, zo, kind="SUM")),
    ("REDUCE_MAX", ""): lambda s, z, so, zo, rng: _one(O.mean_model(S, s, z, s, z, kind="REDUCE_MAX")),
    ("RESIZE_NEAREST_NEIGHBOR", "plain"): lambda s, z, so, zo, rng: _one(
        M.resize_nearest_model(S, (9, 11), s, z)
    ),
    ("RESIZE_NEAREST_NEIGHBOR", "half pixel"): lambda s, z, so, zo, rng: _one(
        M.resize_nearest_model(S, (12, 12), s, z, half_pixel_centers=True)
    ),
    ("RESIZE_BILINEAR", "plain"): lambda s, z, so, zo, rng: _one(
        M.resize_nearest_model(S, (9, 11), s, z, bilinear=True)
    ),
    ("RESIZE_BILINEAR", "half pixel"): lambda s, z, so, zo, rng: _one(
        M.resize_nearest_model(S, (12, 12), s, z, half_pixel_centers=True, bilinear=True)
    ),
    ("RESIZE_BILINEAR", "align corners"): lambda s, z, so, zo, rng: _one(
        M.resize_nearest_model(S, (11, 11), s, z, align_corners=True, bilinear=True)
    ),
    ("SQUEEZE", ""): lambda s, z, so, zo, rng: (M.squeeze_model((1, 1, 6, 4), [1], s, z), [(1, 1, 6, 4)]),
    ("EXPAND_DIMS", ""): lambda s, z, so, zo, rng: _one(M.expand_dims_model(S, 1, s, z)),
    ("PAD", ""): lambda s, z, so, zo, rng: _one(M.pad_model(S, [[0, 0], [1, 2], [2, 1], [0, 0]], s, z)),
    ("PADV2", ""): lambda s, z, so, zo, rng: _one(
        M.pad_model(S, [[0, 0], [1, 2], [2, 1], [0, 0]], s, z, v2=True)
    ),
    ("TRANSPOSE", ""): lambda s, z, so, zo, rng: _one(M.transpose_model(S, [0, 2, 1, 3], s, z)),
    ("STRIDED_SLICE", ""): lambda s, z, so, zo, rng: _one(
        M.strided_slice_model(S, [0, 1, 0, 0], [1, 5, 6, 4], [1, 2, 1, 1], s, z)
    ),
    ("SLICE", ""): lambda s, z, so, zo, rng: _one(M.slice_model(S, [0, 1, 2, 0], [-1, 3, 2, 4], s, z)),
    ("SPLIT", ""): lambda s, z, so, zo, rng: _one(M.split_model(S, 3, 2, s, z)),
    ("SPLIT_V", ""): lambda s, z, so, zo, rng: _one(M.split_v_model(S, [1, 3], 3, s, z)),
    ("PACK", ""): lambda s, z, so, zo, rng: (M.pack_model(S, 2, 1, s, z), [S, S]),
    ("UNPACK", ""): lambda s, z, so, zo, rng: _one(M.unpack_model(S, 3, s, z)),
    ("TILE", ""): lambda s, z, so, zo, rng: _one(M.tile_model(S, [1, 2, 1, 1], s, z)),
    ("GATHER", ""): lambda s, z, so, zo, rng: _one(M.gather_model(S, [3, 0, 2], 3, s, z)),
    ("SHAPE", "into a RESHAPE"): lambda s, z, so, zo, rng: _one(M.shape_model(S, s, z, reshape=True)),
    ("QUANTIZE", "requantize"): lambda s, z, so, zo, rng: _one(
        M.quantize_model(S, np.int8, so, zo, in_scale=s, in_zp=z)
    ),
    ("DEQUANTIZE", ""): lambda s, z, so, zo, rng: _one(M.dequantize_model(S, s, z)),
    # the filter's zero point asymmetric (as_uint8); the scatter, the one-tap-per-pixel form, and
    # SAME with a stride beyond the filter (LiteRT's builtin kernel)
    ("TRANSPOSE_CONV", "3x3 stride 2"): lambda s, z, so, zo, rng: _one(
        O.transpose_conv_model(S, (12, 12), W, rng.integers(-500, 500, 4), s, z, 0.02, so * 4, zo)
    ),
    ("TRANSPOSE_CONV", "2x2 stride 2"): lambda s, z, so, zo, rng: _one(
        O.transpose_conv_model(S, (12, 12), W[:, :2, :2], None, s, z, 0.02, so * 4, zo, padding="VALID")
    ),
    ("TRANSPOSE_CONV", "1x1 stride 2 SAME"): lambda s, z, so, zo, rng: _one(
        O.transpose_conv_model(S, (11, 11), W[:, :1, :1], rng.integers(-500, 500, 4), s, z, 0.02, so, zo)
    ),
}
# The kinds this module proves in uint8 (the registry's uint8=True entries).
PROVEN = frozenset(OPS) | {kind for kind, _ in ONE_OP}


def _draws(seed: int):
    """(s, z, so, zo, rng) of one seed: the int8 twin's input and output quantization."""
    rng = np.random.default_rng(seed)
    s, z = float(rng.uniform(0.01, 0.1)), int(rng.integers(-60, 60))
    so, zo = float(rng.uniform(0.01, 0.1)), int(rng.integers(-60, 60))
    return s, z, so, zo, rng


@pytest.mark.parametrize(
    "kind,variant", sorted(ONE_OP), ids=[f"{k}-{v}" if v else k for k, v in sorted(ONE_OP)]
)
def test_uint8_one_op_matches_litert_under_xnnpack(kind, variant):
    for seed in range(3):
        s, z, so, zo, rng = _draws(seed)
        model, shapes = ONE_OP[kind, variant](s, z, so, zo, rng)
        model = as_uint8(model, seed)
        xs = [rng.integers(0, 256, (3, *shape[1:])).astype(np.uint8) for shape in shapes]
        x = xs if len(xs) > 1 else xs[0]
        R.assert_same(
            R.run_litert(model, x, "AUTO"), R.run_npusim(model, x, "xnnpack"), f"uint8 {kind} seed {seed}"
        )


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_uint8_requantize_is_xnnpacks_qu8_vcvt(seed):
    """A uint8 -> uint8 QUANTIZE (a graph that is only that is no legacy model, so it runs unshifted):
    LiteRT's XNNPACK delegate takes it (qu8-vcvt); LiteRT's builtin NEON form differed on these
    seeds by one step on 4 to 69 of the 256 codes."""
    s, z, so, zo, _ = _draws(seed)
    model = as_uint8(M.quantize_model((1, 4, 4, 4), np.int8, so, zo, in_scale=s, in_zp=z))
    assert R.litert_delegated(model)
    x = np.arange(256, dtype=np.uint8).reshape(4, 4, 4, 4)
    R.assert_same(
        R.run_litert(model, x, "AUTO"), R.run_npusim(model, x, "xnnpack"), f"requantize seed {seed}"
    )


def _uint8_case(make, p, seed):
    if p.get("per_channel"):
        p = dict(p, per_channel=False)  # uint8 filters are per-tensor
    if p.get("bias_mode") == "none":
        p = dict(p, bias_mode="uniform")  # LiteRT's uint8 convolutions require a bias
    case = make(p, seed)
    xs = [as_uint8_input(x) for x in (case.xs if isinstance(case.xs, list) else [case.xs])]
    return as_uint8(case.model, seed), xs if len(xs) > 1 else xs[0], case.desc


@pytest.mark.parametrize("kind", sorted(OPS))
def test_uint8_matches_litert_under_xnnpack(kind):
    params, make = OPS[kind]

    @settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(params, C.seeds)
    def check(p, seed):
        model, x, desc = _uint8_case(make, p, seed)
        try:
            expected = R.run_litert(model, x, "AUTO")
        except (RuntimeError, ValueError):
            return  # a parameter set LiteRT's uint8 kernel does not prepare
        R.assert_same(expected, R.run_npusim(model, x, "xnnpack"), f"uint8 {desc}")

    check()


def test_uint8_refused_under_tflm_naming_xnnpack():
    case = C.depthwise_case(4, (5, 5), (1, 1))
    graph = npusim.load_model(as_uint8(case.model))
    with pytest.raises(NpusimError) as e:
        npusim.Interpreter(graph, profile="tflm")
    message = str(e.value)
    assert "\n" not in message and "uint8" in message and "profile tflm has no uint8 kernels" in message
    assert "--profile xnnpack" in message


def test_uint8_io_stays_uint8():
    case = C.depthwise_case(4, (5, 5), (1, 1))
    interp = npusim.Interpreter(npusim.load_model(as_uint8(case.model)), profile="xnnpack")
    y = interp.run(as_uint8_input(case.xs))
    assert y.dtype == np.uint8


@pytest.mark.parametrize("convs", [1, 2])
def test_uint8_classifier_end_to_end_matches_litert(convs):
    """A small uint8 classifier (CONV_2D + RELU, AVERAGE_POOL_2D, RESHAPE, FULLY_CONNECTED, SOFTMAX;
    uint8 in and out, asymmetric filters) under xnnpack: every output element equal to LiteRT's."""
    from zo_fixtures import tiny_classifier

    model = as_uint8(tiny_classifier(side=8, hidden=8, convs=convs, seed=convs), seed=convs)
    x = np.random.default_rng(convs).integers(0, 256, (4, 8, 8, 3)).astype(np.uint8)
    expected = R.run_litert(model, x, "AUTO")
    R.assert_same(expected, R.run_npusim(model, x, "xnnpack"), "uint8 classifier")


@pytest.mark.parametrize("path", [RESNET, MOBILENET], ids=["resnet8", "mobilenet_v2"])
def test_uint8_twin_of_a_shared_model_matches_litert(path):
    """The uint8 twin (as_uint8: per-tensor, asymmetric filters) of a shared int8 model, end to end
    under xnnpack: every output element equal to LiteRT's on random uint8 images."""
    model = as_uint8(open(need(path), "rb").read(), seed=1)
    shape = npusim.load_model(model).input().shape
    x = np.random.default_rng(1).integers(0, 256, (3, *shape[1:])).astype(np.uint8)
    R.assert_same(R.run_litert(model, x, "AUTO"), R.run_npusim(model, x, "xnnpack"), f"uint8 {path.name}")


def test_uint8_golden_under_xnnpack(tmp_path):
    from npusim.app import golden

    case = C.depthwise_case(4, (5, 5), (1, 1))
    model = tmp_path / "m.tflite"
    model.write_bytes(as_uint8(case.model))
    golden.record(model, as_uint8_input(case.xs), tmp_path / "g.npz", profile="xnnpack")
    assert golden.check(model, tmp_path / "g.npz").ok


def test_uint8_op_not_proven_is_refused_before_any_work():
    """BATCH_MATMUL (registry uint8=False): LiteRT runs no uint8 BATCH_MATMUL (its XNNPACK delegate
    fails to prepare it, its builtin kernel takes float32, int8 and int16), so there is nothing to
    prove it against; npusim refuses it in one line naming the op and what it runs in uint8."""
    model = as_uint8(O.batch_matmul_model((1, 2, 4, 6), (1, 2, 6, 5), (0.05, 3), (0.04, -7), (0.2, 10)))
    x = [np.zeros((1, 2, 4, 6), np.uint8), np.zeros((1, 2, 6, 5), np.uint8)]
    with pytest.raises(RuntimeError, match="BATCH_MATMUL"):
        R.run_litert(model, x, "AUTO")
    with pytest.raises(NpusimError) as e:
        npusim.Interpreter(npusim.load_model(model), profile="xnnpack")
    message = str(e.value)
    assert "\n" not in message and "op 0 (BATCH_MATMUL) in a uint8 model" in message
    assert "proven equal to LiteRT in uint8 only (ADD, " in message and "TRANSPOSE_CONV" in message


def _inspect(*args):
    from click.testing import CliRunner

    from npusim.app.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_inspect_lists_a_uint8_model(tmp_path):
    """inspect plans a uint8 model as it runs (shifted), shows the file's ops only (not the edge
    QUANTIZEs npusim adds), its uint8 edges and weights, and an op not proven as not run; the
    STM32N6 view refuses it in one line."""
    import json

    from zo_fixtures import tiny_classifier

    model = tmp_path / "u8.tflite"
    model.write_bytes(as_uint8(tiny_classifier(side=8, hidden=8, convs=1, seed=1), seed=1))
    r = _inspect("inspect", model, "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert [e["dtype"] for e in data["inputs"] + data["outputs"]] == ["uint8", "uint8"]
    ops = {o["op"]: o for o in data["ops"]}
    assert [o["index"] for o in data["ops"]] == list(range(len(data["ops"]))) and "QUANTIZE" not in ops
    assert ops["CONV_2D"]["weights"] == "uint8" and ops["CONV_2D"]["macs"] > 0 and data["unsupported"] == []
    text = _inspect("inspect", model).output
    assert "CONV_2D" in text and "uint8" in text and "unsupported" not in text
    r = _inspect("inspect", model, "--target", "stm32n6")
    lines = [line for line in r.output.splitlines() if line]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert lines[0].startswith(f"error: {model}: a uint8 model (TFLite's legacy quantization: op 0 (CONV_2D)")
    assert "the STM32N6 view takes int8 models only" in lines[0]

    bmm = tmp_path / "bmm.tflite"
    bmm.write_bytes(as_uint8(O.batch_matmul_model((1, 4, 6), (1, 6, 5), (0.05, 3), (0.04, -7), (0.2, 10))))
    data = json.loads(_inspect("inspect", bmm, "--format", "json").output)
    assert [o["op"] for o in data["ops"]] == ["BATCH_MATMUL"] and not data["ops"][0]["supported"]
    assert "in a uint8 model" in data["unsupported"][0]["reason"]
