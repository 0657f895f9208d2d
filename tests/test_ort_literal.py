"""--profile onnxruntime against ONNX Runtime with its optimizations off (ORT_DISABLE_ALL: every
DequantizeLinear, float op and QuantizeLinear run as written) on QDQ models from ORT's own
quantize_static: every output element equal, one-op models across Conv, Gemm, MatMul, Add, Mul, Sub,
Div, Concat, Resize, Sigmoid and Softmax, at several intra-op thread counts (MLAS's float Conv and
Gemm add their products in an order that follows the thread count; npusim follows
NPUSIM_ORT_THREADS, docs/numerics.md). The shared models are tests/test_onnxruntime_models.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import npusim  # noqa: E402
from npusim.profiles import ort_literal  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402


def codes_of(model: bytes, y) -> np.ndarray:
    scale, zp = oo.output_quantization(model)
    return oo.output_steps(y, scale, zp)


def assert_literal(model, threads: int = 1, n: int = 4, seed: int = 0, low=-1.0, high=1.0, **quant):
    """model (float ONNX) quantized to QDQ; npusim with NPUSIM_ORT_THREADS = threads equals ORT's
    unoptimized run with intra_op_num_threads = threads on every output element."""
    q = oo.quantize(model, "QDQ", seed=seed, **quant)
    feeds = oo.random_inputs(model, n, seed=seed + 100, low=low, high=high)
    names = list(feeds[0])
    xs = [np.concatenate([f[k] for f in feeds]) for k in names]
    literal = oo.run_ort(q, xs[0] if len(xs) == 1 else xs, optimize=False, threads=threads)
    graph = npusim.load_model(q)
    interp = npusim.Interpreter(graph, profile="onnxruntime")
    got = interp.evaluate({graph.inputs[k]: x for k, x in enumerate(xs)})[graph.outputs[0]]
    want, sim = codes_of(q, literal), codes_of(q, got)
    diff = np.argwhere(want != sim)
    assert diff.size == 0, (
        f"{len(diff)} of {want.size} codes differ from ORT-literal ({threads} threads), first at "
        f"{tuple(diff[0])}: ORT {want[tuple(diff[0])]}, npusim {sim[tuple(diff[0])]}"
    )
    return graph


@pytest.fixture(params=[1, 2, 4], ids=lambda t: f"threads{t}")
def threads(request, monkeypatch):
    monkeypatch.setenv(ort_literal.THREADS_ENV, str(request.param))
    return request.param


def weights(rng, *shape, scale=0.3):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# (x shape, out channels, kernel, stride, dilation, pads, group): pointwise, strided, dilated, padded,
# depthwise, reductions over 128 (several K blocks), outputs wide enough to be split over threads.
CONV = [
    ((1, 8, 12, 12), 16, 1, 1, 1, 0, 1),
    ((1, 3, 17, 17), 8, 3, 2, 1, 1, 1),
    ((1, 24, 20, 20), 32, 3, 1, 1, 1, 1),  # K = 216: two blocks of 128
    ((1, 160, 6, 6), 8, 1, 1, 1, 0, 1),  # pointwise, K = 160
    ((1, 64, 9, 9), 48, 3, 2, 1, 1, 1),  # K = 576, 25 outputs: fewer than the filters
    ((1, 16, 33, 31), 12, 3, 1, 2, 2, 1),
    ((1, 12, 16, 16), 12, 3, 1, 1, 1, 12),  # depthwise
    ((1, 8, 15, 15), 8, 5, 2, 1, 2, 8),
    ((1, 32, 40, 40), 1, 1, 1, 1, 0, 1),  # one filter: MLAS's M = 1 kernel
]


@pytest.mark.parametrize("p", CONV, ids=lambda p: "x{}o{}k{}s{}d{}p{}g{}".format(p[0][1:], *p[1:]))
def test_conv(p, threads):
    x_shape, out_c, k, s, d, pad, group = p
    rng = np.random.default_rng(sum(x_shape) + out_c * 7 + k)
    w = weights(rng, out_c, x_shape[1] // group, k, k)
    model = oo.conv_model(x_shape, w, weights(rng, out_c), (s, s), (pad,) * 4, (d, d), group)
    assert_literal(model, threads, per_channel=True)


def test_conv_relu_per_tensor(threads):
    from onnx import helper

    rng = np.random.default_rng(5)
    model = oo.conv_model((1, 20, 14, 14), weights(rng, 24, 20, 3, 3), weights(rng, 24), pads=(1, 1, 1, 1))
    model.graph.node[0].output[0] = "c"
    model.graph.node.append(helper.make_node("Relu", ["c"], ["y"]))
    assert_literal(model, threads, per_channel=False)


@pytest.mark.parametrize("kind", ["Gemm", "MatMul"])
@pytest.mark.parametrize("k,units", [(40, 7), (300, 33), (600, 10)])
def test_gemm_matmul(kind, k, units, threads):
    rng = np.random.default_rng(k + units)
    if kind == "Gemm":
        model = oo.gemm_model((1, k), weights(rng, units, k, scale=0.1), weights(rng, units))
    else:
        model = oo.matmul_model((1, k), weights(rng, k, units, scale=0.1))
    assert_literal(model, threads, per_channel=True)


def qdq_binary(kind: str, shape, b_const=None, seed: int = 0) -> bytes:
    """x -> QuantizeLinear -> DequantizeLinear -> kind(., b) -> QuantizeLinear -> DequantizeLinear, b a
    second input quantized the same way or a float constant, as a QDQ converter writes it (ORT's
    quantize_static leaves a lone Sub or Div in float)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    sx, sb, sy = (np.float32(rng.uniform(0.004, 0.03)) for _ in range(3))
    zx, zb, zy = (np.int8(rng.integers(-40, 40)) for _ in range(3))
    inits = [
        numpy_helper.from_array(np.asarray(v), n)
        for v, n in ((sx, "sx"), (zx, "zx"), (sb, "sb"), (zb, "zb"), (sy, "sy"), (zy, "zy"))
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["a", "sx", "zx"], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "sx", "zx"], ["ad"]),
    ]
    inputs = [oo._value("a", shape)]
    if b_const is None:
        inputs.append(oo._value("b", shape))
        nodes += [
            helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["bq"]),
            helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bd"]),
        ]
    else:
        inits.append(numpy_helper.from_array(np.asarray(b_const, np.float32), "bd"))
    nodes += [
        helper.make_node(kind, ["ad", "bd"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["rq"]),
        helper.make_node("DequantizeLinear", ["rq", "sy", "zy"], ["y"]),
    ]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return oo._model(nodes, inputs, [out], inits).SerializeToString()


def assert_literal_qdq(q: bytes, n: int = 8, seed: int = 0, low=-1.0, high=1.0):
    """A QDQ model as written: npusim equals ORT's unoptimized run on every element."""
    import onnx

    model = onnx.load_from_string(q)
    feeds = oo.random_inputs(model, n, seed=seed + 100, low=low, high=high)
    xs = [np.concatenate([f[k] for f in feeds]) for k in feeds[0]]
    literal = oo.run_ort(q, xs[0] if len(xs) == 1 else xs, optimize=False)
    graph = npusim.load_model(q)
    got = npusim.Interpreter(graph, profile="onnxruntime").evaluate(
        {graph.inputs[k]: x for k, x in enumerate(xs)}
    )[graph.outputs[0]]
    want, sim = codes_of(q, literal), codes_of(q, got)
    assert np.array_equal(want, sim), f"{np.sum(want != sim)} of {want.size} codes differ from ORT-literal"


@pytest.mark.parametrize("kind", ["Add", "Mul"])
@pytest.mark.parametrize("seed", range(2))
def test_binary_two_activations(kind, seed):
    rng = np.random.default_rng(seed)
    model = oo.binary_model(kind, (1, 4, 6, 6), (1, 4, 6, 6))
    assert_literal(model, seed=seed, n=8, low=float(rng.uniform(-3, -0.5)), high=float(rng.uniform(0.5, 3)))


@pytest.mark.parametrize("kind", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("seed", range(3))
def test_qdq_binary_two_activations(kind, seed):
    """Every pair of codes matters: two float32 values, one operation, one rounding."""
    assert_literal_qdq(qdq_binary(kind, (1, 3, 16, 16), seed=seed), seed=seed)


@pytest.mark.parametrize("kind", ["Add", "Sub", "Mul", "Div"])
def test_binary_float_constant(kind):
    """A float constant (box decoding's anchor points): ORT-literal computes with its float32 value,
    not the int8 codes the Graph's TFLite kernels take."""
    anchors = (np.arange(1, 65, dtype=np.float32) / 64).reshape(1, 1, 8, 8) + (1.0 if kind == "Div" else 0.0)
    assert_literal_qdq(qdq_binary(kind, (1, 2, 8, 8), b_const=anchors, seed=4))


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((1, 2, 24, 16), (1, 2, 16, 40)),
        ((1, 4, 1, 32), (1, 4, 32, 9)),
        ((1, 1, 130, 200), (1, 1, 200, 1)),
        ((1, 3, 64, 300), (1, 3, 300, 64)),
    ],
)
def test_matmul_two_activations(a_shape, b_shape, threads):
    """Attention's MatMul of two activations: MlasGemmBatch on a B that is not prepacked."""
    from onnx import helper

    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    model = oo._model([node], [oo._value("a", a_shape), oo._value("b", b_shape)], [oo._value("y", None)])
    assert_literal(model, threads, n=3)


@pytest.mark.parametrize("shape", [(1, 6, 5, 5), (1, 16, 7, 3), (1, 8, 14, 14)])
def test_global_average_pool(shape):
    """MlasPoolGlobalKernel: four lane sums, then the rest, divided by H x W, in float32."""
    assert_literal(oo.unary_model("GlobalAveragePool", shape), n=8, force_input=True)


def test_concat():
    assert_literal(oo.concat_model([(1, 3, 5, 5), (1, 4, 5, 5)]), n=6)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize(mode):
    transform = "asymmetric" if mode == "nearest" else "half_pixel"
    assert_literal(oo.resize_model((1, 3, 6, 6), [1, 1, 2, 2], mode, transform), n=4, force_input=True)


def test_sigmoid():
    assert_literal(oo.unary_model("Sigmoid", (1, 4, 8, 8)), n=4, low=-6, high=6)


@pytest.mark.parametrize("shape", [(1, 10), (1, 33), (1, 4, 7)])
def test_softmax(shape):
    assert_literal(oo.unary_model("Softmax", shape, axis=-1), n=6, low=-4, high=4)


def test_default_threads_are_physical_cores(monkeypatch):
    """Without NPUSIM_ORT_THREADS the order is that of ORT's default session (intra_op_num_threads 0:
    the physical cores)."""
    monkeypatch.delenv(ort_literal.THREADS_ENV, raising=False)
    assert ort_literal.ort_threads() == ort_literal.physical_cores() >= 1
    monkeypatch.setenv(ort_literal.THREADS_ENV, "0")
    from npusim.errors import NpusimError

    with pytest.raises(NpusimError, match="NPUSIM_ORT_THREADS"):
        ort_literal.ort_threads()


# The quantized outputs above move only where a float sum lands next to a rounding tie, which random
# one-op models rarely meet (the integer kernel often passes them too). The float sums themselves
# show the order: ORT's float Conv and MatMul (a float model, optimizations off) on inputs that are
# dequantized codes, against the engine's sums before QuantizeLinear, bit for bit.
FLOAT_CASES = [
    # (x [N, C, H, W], filters, kernel, stride, pad, group) for Conv
    ((1, 24, 20, 20), 32, 3, 1, 1, 1),  # segmented, K = 216 in blocks of 128
    ((1, 64, 9, 9), 48, 3, 2, 1, 1),  # more filters than outputs: im2col then the threaded GEMM
    ((1, 160, 12, 12), 24, 1, 1, 0, 1),  # pointwise, K = 160
    ((1, 16, 24, 24), 16, 3, 1, 1, 16),  # depthwise: the M = 1 kernel per group
    ((1, 96, 3, 3), 40, 3, 1, 0, 1),  # one output position: the N = 1 kernel, rows in 4, 2, 1
    ((1, 48, 30, 30), 1, 3, 1, 1, 1),  # one filter
    # mlas_tile's shapes: filters in several vectors and a partial one, few filters (8-lane
    # vectors), strides, a small reduction, a wide one (K blocks of 128 or 256), a depthwise stride
    ((1, 7, 19, 17), 70, 3, 1, 1, 1),
    ((1, 16, 26, 26), 8, 3, 2, 0, 1),
    ((1, 3, 34, 34), 16, 3, 2, 1, 1),
    ((1, 300, 8, 8), 24, 1, 1, 0, 1),
    ((1, 128, 10, 10), 64, 3, 2, 1, 1),
    ((1, 40, 21, 21), 40, 3, 2, 1, 40),
]


def float_conv_sums(x_shape, filters, k, stride, pad, group, threads, rng):
    """(ORT's float Conv output, the engine's sums) on dequantized int8 codes, NHWC."""
    from npusim.kernels import mlas_float

    codes = rng.integers(-128, 128, size=x_shape).astype(np.int8)
    scale, zp = np.float32(0.0173), -7
    x = (codes.astype(np.int64) - zp).astype(np.float32) * scale
    w = weights(rng, filters, x_shape[1] // group, k, k)
    bias = weights(rng, filters)
    model = oo.conv_model(x_shape, w, bias, (stride, stride), (pad,) * 4, (1, 1), group)
    ort_y = oo.run_ort(model.SerializeToString(), x, optimize=False, threads=threads)
    groups, per = group, filters // group
    cg = x_shape[1] // group
    wt = np.ascontiguousarray(w.reshape(groups, per, cg * k * k).transpose(0, 2, 1))
    oh, ow = ort_y.shape[2:]
    pointwise = k == 1 and stride == 1 and pad == 0
    blocks, fblocks = mlas_float.conv_blocks(per, groups, oh * ow, cg * k * k, pointwise, threads)
    out = np.empty((1, oh, ow, filters), np.int8)
    sums = np.empty((1, oh, ow, filters), np.float32)
    geometry = [k, k, stride, stride, 1, 1, pad, pad]
    if groups > 1:  # the engine's depthwise layout: groups of one input channel
        wt = np.ascontiguousarray(w.reshape(groups, per, k * k).transpose(0, 2, 1))
    mlas_float.conv(
        np.ascontiguousarray(codes.transpose(0, 2, 3, 1)), scale, zp, wt, bias, False, geometry,
        blocks, fblocks, 1.0, 0, out, sums,
    )  # fmt: skip
    return ort_y.transpose(0, 2, 3, 1), sums


@pytest.mark.parametrize("p", FLOAT_CASES, ids=lambda p: "x{}o{}k{}s{}p{}g{}".format(p[0][1:], *p[1:]))
def test_float_conv_sums_bit_for_bit(p, threads):
    rng = np.random.default_rng(sum(p[0]) + p[1])
    ort_y, sums = float_conv_sums(*p, threads, rng)
    differ = int(np.sum(ort_y.view(np.int32) != sums.view(np.int32)))
    assert differ == 0, f"{differ} of {sums.size} float sums differ from ORT's float Conv ({threads} threads)"


def test_float_sums_follow_the_thread_count():
    """The premise of NPUSIM_ORT_THREADS: ORT's own float bits change with the thread count, and the
    engine's sums for one thread count are not another's."""
    p = ((1, 24, 20, 20), 32, 3, 1, 1, 1)
    one, sums_one = float_conv_sums(*p, 1, np.random.default_rng(0))
    four, sums_four = float_conv_sums(*p, 4, np.random.default_rng(0))
    assert np.any(one.view(np.int32) != four.view(np.int32))
    assert np.any(sums_one.view(np.int32) != sums_four.view(np.int32))


@pytest.mark.parametrize("kind", ["Gemm", "MatMul"])
def test_float_gemm_sums_bit_for_bit(kind):
    """A constant B is prepacked (K in slices of 256); Gemm's bias goes into C first."""
    from npusim.kernels import mlas_float

    rng = np.random.default_rng(7)
    k, units, rows = 700, 24, 5
    codes = rng.integers(-128, 128, size=(1, rows, k)).astype(np.int8)
    scale, zp = np.float32(0.021), 3
    x = (codes.astype(np.int64) - zp).astype(np.float32) * scale
    w, bias = weights(rng, k, units, scale=0.1), weights(rng, units)
    if kind == "Gemm":
        model = oo.gemm_model((rows, k), w, bias, trans_b=False)
        sess = oo.session(model.SerializeToString(), optimize=False)
        ort_y = sess.run(None, {"x": x[0]})[0]
    else:
        model, bias = oo.matmul_model((1, rows, k), w), np.zeros(units, np.float32)
        ort_y = oo.run_ort(model.SerializeToString(), x, optimize=False)[0]
    out = np.empty((1, 1, rows, units), np.int8)
    sums = np.empty((1, 1, rows, units), np.float32)
    blocks = np.full(rows, mlas_float.PACKED_STRIDE_K, np.int64)
    mlas_float.conv(
        codes.reshape(1, 1, rows, k), scale, zp, w.reshape(1, k, units), bias, kind == "Gemm",
        [1, 1, 1, 1, 1, 1, 0, 0], blocks, np.zeros(units, np.int64), 1.0, 0, out, sums,
    )  # fmt: skip
    assert np.array_equal(ort_y.reshape(rows, units).view(np.int32), sums.reshape(rows, units).view(np.int32))


def test_weights_given_at_run_time_are_refused():
    """The float kernels run the file's weights: other weights (a trainer's) end in one line, not in
    results that silently ignore them."""
    from npusim.errors import NpusimError

    rng = np.random.default_rng(1)
    model = oo.conv_model((1, 4, 6, 6), weights(rng, 5, 4, 3, 3), weights(rng, 5), pads=(1, 1, 1, 1))
    graph = npusim.load_model(oo.quantize(model, "QDQ", per_channel=True))
    interp = npusim.Interpreter(graph, profile="onnxruntime")
    conv = next(op for op in graph.ops if op.kind == "CONV_2D")
    w = graph.tensors[conv.inputs[1]].data.copy()
    x = oo.random_inputs(model, 1)[0]["x"]
    with pytest.raises(NpusimError, match="weights given at run time"):
        interp.evaluate({graph.inputs[0]: x}, overrides={conv.inputs[1]: w})


# The engine's fast kernels (kernels/mlas_tile.py: the register tiles and the depthwise form) against
# its plain loops (mlas_float._conv), sums and codes bit for bit, where ORT's own blocks cannot reach:
# several images, K blocks that change from one output position to the next, a Gemm's bias first.
ENGINE_CASES = [
    # (x NHWC, filters, kernel, stride, pad, dilation, depthwise)
    ((2, 13, 11, 5), 16, 3, 1, 1, 1, False),
    ((3, 10, 10, 7), 70, 3, 1, 2, 2, False),
    ((2, 17, 15, 16), 8, 3, 2, 1, 1, False),
    ((1, 8, 8, 300), 5, 1, 1, 0, 1, False),
    ((2, 11, 13, 24), 40, 3, 1, 1, 1, False),
    ((2, 12, 10, 64), 1, 1, 1, 0, 1, False),  # one filter: the M = 1 kernel
    ((2, 9, 11, 6), 1, 3, 2, 1, 1, False),
    ((2, 13, 11, 16), 16, 3, 1, 1, 1, True),
    ((2, 9, 9, 24), 24, 5, 1, 2, 2, True),
    ((1, 20, 20, 64), 64, 3, 2, 1, 1, True),
]


@pytest.mark.parametrize("p", ENGINE_CASES, ids=lambda p: "x{}o{}k{}s{}p{}d{}dw{}".format(*p))
@pytest.mark.parametrize("bias_first", [False, True])
def test_fast_conv_equals_the_loops(p, bias_first):
    from npusim.kernels import mlas_float

    (n, h, w, c), filters, k, s, pad, dil, depthwise = p
    if depthwise and bias_first:
        pytest.skip("a Conv's bias comes last")
    rng = np.random.default_rng(n * h + filters)
    codes = rng.integers(-128, 128, size=(n, h, w, c)).astype(np.int8)
    shape = (c, k * k, 1) if depthwise else (1, c * k * k, filters)
    wt, bias = weights(rng, *shape), weights(rng, filters)
    oh, ow = ((h + 2 * pad - dil * (k - 1) - 1) // s + 1, (w + 2 * pad - dil * (k - 1) - 1) // s + 1)
    m1 = depthwise or filters == 1
    steps = np.where(np.arange(oh * ow) % 7 < 3, 2, 16 if m1 else 128)  # blocks that change
    blocks = (mlas_float.M1_FLAG if m1 else 0) + steps.astype(np.int64)
    fblocks = np.zeros(shape[2], np.int64)
    form = "depthwise" if depthwise else ("one filter" if filters == 1 else "tile")
    assert mlas_float.fast_form(wt, blocks, fblocks, bias_first) == form
    geometry = np.asarray([k, k, s, s, dil, dil, pad, pad], np.int64)
    fast = np.empty((n, oh, ow, filters), np.int8), np.empty((n, oh, ow, filters), np.float32)
    mlas_float.conv(codes, 0.0173, -7, wt, bias, bias_first, geometry, blocks, fblocks, 0.05, 3, *fast)
    need = ((oh - 1) * s + (k - 1) * dil + 1, (ow - 1) * s + (k - 1) * dil + 1)
    xp = np.zeros((n, c, max(need[0], pad + h), max(need[1], pad + w)), np.float32)
    mlas_float._dequantize_padded(codes, np.float32(0.0173), np.int32(-7), pad, pad, xp)
    loops = np.empty_like(fast[0]), np.empty_like(fast[1])
    mlas_float._conv(
        xp, wt, bias, bias_first, geometry, blocks, fblocks, np.float32(0.05), np.int32(3), *loops
    )
    assert np.array_equal(fast[1].view(np.int32), loops[1].view(np.int32))
    assert np.array_equal(fast[0], loops[0])
