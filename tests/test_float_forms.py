"""Every op's float form (ops/float_form.py, `float_form` on each kernel class) against LiteRT's
float kernels, on float one-op models across shapes and options, and on the shared float ResNet-8.

Each case is an int8 one-op model from npusim.testing.oracle; oracle.float_model makes its float32
twin (the same op and options, weights dequantized), which LiteRT runs with its reference kernels
(BUILTIN_REF). The float form runs on the float twin and on the int8 graph itself, where it is the
op's real-valued meaning on dequantized constants: both must agree with LiteRT.

Tolerance: each output element is a float32 sum (or product chain) whose terms npusim adds in
another order than LiteRT (BLAS blocks against LiteRT's loops); two float32 summations of K terms
differ by at most about K * 2^-24 * sum |terms|. The bound used, |npusim - LiteRT| <= 2e-5 *
(1 + max |LiteRT|), holds that with margin for the K <= 200 here; the largest difference measured
is printed by -s.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from npusim.errors import NpusimError
from npusim.formats.tflite_io import load_model
from npusim.ops import KERNELS
from npusim.runtime.reference import FloatInterpreter
from npusim.testing import oracle as O

from shared_paths import SHARED, need

RTOL = 2e-5


def litert_float(model: bytes, xs: list) -> list:
    """Every output of LiteRT's reference kernels, one invoke per batch element."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF, num_threads=1
    )
    it.allocate_tensors()
    ins, outs = it.get_input_details(), it.get_output_details()
    results = [[] for _ in outs]
    for i in range(xs[0].shape[0]):
        for d, x in zip(ins, xs):
            it.set_tensor(d["index"], np.ascontiguousarray(x[i : i + 1]))
        it.invoke()
        for r, d in zip(results, outs):
            r.append(np.array(it.get_tensor(d["index"]), copy=True))
    return [np.concatenate(r) for r in results]


def real_inputs(model: bytes, rng, n: int = 3) -> list:
    """Real-valued inputs the int8 model can hold: random int8 codes dequantized."""
    graph = load_model(model)
    xs = []
    for t in (graph.tensors[i] for i in graph.inputs):
        q = rng.integers(-128, 128, (n, *t.shape[1:])).astype(np.float64)
        xs.append((t.scale * (q - t.zero_point)).astype(np.float32))
    return xs


def float_outputs(graph, xs: list) -> list:
    interp = FloatInterpreter(graph)
    values = interp.evaluate(dict(zip(graph.inputs, xs)))
    return [values[t] for t in graph.outputs]


def w8(rng, shape):
    return rng.integers(-127, 128, shape).astype(np.int8)


def b32(rng, n):
    return rng.integers(-2000, 2000, n).astype(np.int32)


def _cases():
    """(id, builder(rng) -> int8 model bytes): every op kind npusim supports, several options each."""
    c = []
    for k, s, pad, act, dil in [
        (3, 1, "SAME", "NONE", 1),
        (3, 2, "VALID", "RELU", 1),
        (1, 1, "VALID", "RELU6", 1),
        (5, 2, "SAME", "NONE", 1),
        (3, 1, "SAME", "RELU", 2),
    ]:
        c.append(
            (
                f"conv{k}s{s}{pad}{act}d{dil}",
                lambda r, k=k, s=s, pad=pad, act=act, dil=dil: O.conv2d_model(
                    (1, 9, 8, 5),
                    w8(r, (6, k, k, 5)),
                    b32(r, 6),
                    0.05,
                    3,
                    r.uniform(0.002, 0.01, 6),
                    0.2,
                    -5,
                    stride=(s, s),
                    padding=pad,
                    dilation=(dil, dil),
                    activation=act,
                ),
            )
        )
    for k, s, m, pad, act in [
        (3, 1, 1, "SAME", "RELU6"),
        (3, 2, 2, "VALID", "NONE"),
        (5, 1, 1, "SAME", "RELU"),
    ]:
        c.append(
            (
                f"depthwise{k}s{s}m{m}{pad}{act}",
                lambda r, k=k, s=s, m=m, pad=pad, act=act: O.depthwise_model(
                    (1, 8, 7, 4),
                    w8(r, (1, k, k, 4 * m)),
                    b32(r, 4 * m),
                    0.05,
                    -2,
                    r.uniform(0.005, 0.02, 4 * m),
                    0.1,
                    1,
                    stride=(s, s),
                    padding=pad,
                    activation=act,
                    depth_multiplier=m,
                ),
            )
        )
    for act, shape in [("NONE", (1, 40)), ("RELU", (1, 2, 3, 4)), ("RELU6", (1, 200))]:
        k = int(np.prod(shape[1:]))
        c.append(
            (
                f"fc{act}{k}",
                lambda r, act=act, shape=shape, k=k: O.fully_connected_model(
                    shape, w8(r, (7, k)), b32(r, 7), 0.04, 1, 0.01, 0.3, 2, activation=act
                ),
            )
        )
    for s, pad in [(2, "SAME"), (1, "VALID"), (2, "VALID")]:
        c.append(
            (
                f"transpose_conv{s}{pad}",
                lambda r, s=s, pad=pad: O.transpose_conv_model(
                    (1, 4, 5, 3),
                    (4 * s + (2 if pad == "VALID" else 0), 5 * s + (2 if pad == "VALID" else 0)),
                    w8(r, (2, 3, 3, 3)),
                    b32(r, 2),
                    0.05,
                    0,
                    0.01,
                    0.1,
                    0,
                    stride=(s, s),
                    padding=pad,
                ),
            )
        )
    for kind in ("ADD", "SUB", "MUL"):
        for act in ("NONE", "RELU6"):
            c.append(
                (
                    f"{kind}{act}",
                    lambda r, kind=kind, act=act: O.binary_model(
                        kind, (1, 3, 4, 5), (1, 1, 4, 1), 0.05, 2, 0.03, -1, 0.08, 3, activation=act
                    ),
                )
            )
        c.append(
            (
                f"{kind}const",
                lambda r, kind=kind: O.binary_model(
                    kind, (1, 3, 5), (5,), 0.05, 2, 0.03, -1, 0.08, 3, const2=w8(r, (5,))
                ),
            )
        )
    for kind in ("MAXIMUM", "MINIMUM", "PRELU"):
        c.append(
            (
                kind,
                lambda r, kind=kind: O.plain_binary_model(
                    kind, (1, 3, 4, 2), (1, 1, 4, 2), (0.05, 2), (0.04, -3), (0.05, 1)
                ),
            )
        )
    c.append(
        (
            "PRELUconst",
            lambda r: O.plain_binary_model(
                "PRELU", (1, 3, 4, 2), (1, 1, 2), (0.05, 2), (0.01, 0), (0.05, 1), const2=w8(r, (1, 1, 2))
            ),
        )
    )
    for kind, builder in (("avg", O.avg_pool_model), ("max", O.max_pool_model)):
        for f, s, pad, act in [(2, 2, "VALID", "NONE"), (3, 2, "SAME", "RELU"), (3, 1, "SAME", "RELU6")]:
            c.append(
                (
                    f"{kind}pool{f}s{s}{pad}{act}",
                    lambda r, b=builder, f=f, s=s, pad=pad, act=act: b(
                        (1, 7, 6, 3), 0.05, -3, (f, f), (s, s), pad, act
                    ),
                )
            )
    for kind in ("MEAN", "SUM", "REDUCE_MAX"):
        for axes, keep in [((1, 2), True), ((-1,), False), ((1, 3), False)]:
            c.append(
                (
                    f"{kind}{axes}{keep}",
                    lambda r, kind=kind, axes=axes, keep=keep: O.mean_model(
                        (1, 4, 5, 3), 0.05, 2, 0.04, -1, axes=axes, keep_dims=keep, kind=kind
                    ),
                )
            )
    for beta in (1.0, 0.3):
        c.append((f"softmax{beta}", lambda r, beta=beta: O.softmax_model((1, 2, 10), 0.2, 5, beta=beta)))
    c.append(("logistic", lambda r: O.logistic_model((1, 4, 6), 0.08, -3)))
    for kind in ("TANH", "HARD_SWISH"):
        c.append((kind, lambda r, kind=kind: O.unary_model(kind, (1, 4, 6), 0.05, 4, 1 / 128, 0)))
    c.append(("leaky_relu", lambda r: O.leaky_relu_model((1, 4, 6), 0.05, 4, 0.04, -10, 0.2)))
    for align, half in [(False, False), (True, False), (False, True)]:
        for bilinear in (False, True):
            c.append(
                (
                    f"resize{'bl' if bilinear else 'nn'}{align}{half}",
                    lambda r, a=align, h=half, b=bilinear: O.resize_nearest_model(
                        (1, 3, 4, 2), (7, 6), 0.05, 1, a, h, bilinear=b
                    ),
                )
            )
    c.append(("reshape", lambda r: O.reshape_model((1, 4, 6), (1, 3, -1), 0.05, 1)))
    c.append(("pad", lambda r: O.pad_model((1, 3, 4, 2), [[0, 0], [1, 2], [0, 1], [0, 0]], 0.05, 7)))
    c.append(("padv2", lambda r: O.pad_model((1, 3, 4), [[0, 0], [2, 0], [1, 1]], 0.05, -4, v2=True)))
    c.append(("transpose", lambda r: O.transpose_model((1, 2, 3, 4), (0, 3, 1, 2), 0.05, 1)))
    c.append(("concat", lambda r: O.concat_model([(1, 2, 3), (1, 2, 5)], 2, 0.05, 1)))
    c.append(
        (
            "concat_const",
            lambda r: O.concat_model([(1, 2, 3), (1, 2, 2)], -1, 0.05, 1, consts=[None, w8(r, (1, 2, 2))]),
        )
    )
    c.append(
        (
            "strided_slice",
            lambda r: O.strided_slice_model((1, 6, 5), (0, 1, 4), (1, 6, 0), (1, 2, -1), 0.05, 1),
        )
    )
    c.append(
        (
            "strided_slice_shrink",
            lambda r: O.strided_slice_model(
                (1, 6, 5), (0, 2, 0), (1, 3, 5), (1, 1, 1), 0.05, 1, shrink_axis_mask=2
            ),
        )
    )
    c.append(("split", lambda r: O.split_model((1, 6, 4), 1, 3, 0.05, 1)))
    c.append(("split_v", lambda r: O.split_v_model((1, 6, 4), (1, -1, 2), 1, 0.05, 1)))
    c.append(("pack", lambda r: O.pack_model((1, 3, 2), 3, 2, 0.05, 1)))
    c.append(("unpack", lambda r: O.unpack_model((1, 3, 2), 1, 0.05, 1)))
    c.append(("slice", lambda r: O.slice_model((1, 5, 4), (0, 1, 1), (1, 3, -1), 0.05, 1)))
    c.append(("squeeze", lambda r: O.squeeze_model((1, 3, 1, 4), (2,), 0.05, 1)))
    c.append(("expand_dims", lambda r: O.expand_dims_model((1, 3, 4), 2, 0.05, 1)))
    c.append(("shape", lambda r: O.shape_model((1, 3, 4), 0.05, 1)))
    c.append(("tile", lambda r: O.tile_model((1, 2, 3), (1, 2, 3), 0.05, 1)))
    c.append(("gather", lambda r: O.gather_model((1, 5, 3), [4, 0, 2, 2], 1, 0.05, 1)))
    for adj_x, adj_y in [(False, False), (True, False), (False, True)]:
        c.append(
            (
                f"batch_matmul{adj_x}{adj_y}",
                lambda r, ax=adj_x, ay=adj_y: O.batch_matmul_model(
                    (1, 2, 3, 4) if not ax else (1, 2, 4, 3),
                    (1, 2, 4, 5) if not ay else (1, 2, 5, 4),
                    (0.05, 1),
                    (0.04, -2),
                    (0.1, 3),
                    adj_x=ax,
                    adj_y=ay,
                ),
            )
        )
    c.append(
        (
            "batch_matmul_const",
            lambda r: O.batch_matmul_model(
                (1, 3, 4), (4, 2), (0.05, 1), (0.04, 0), (0.1, 3), rhs_const=w8(r, (4, 2))
            ),
        )
    )
    return c


CASES = _cases()


@pytest.mark.parametrize("name,build", CASES, ids=[c[0] for c in CASES])
def test_float_form_matches_litert(name, build):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    model = build(rng)
    twin = O.float_model(model)
    xs = real_inputs(model, rng)
    # SHAPE's output has no batch axis (ops/shapes.py): one invoke gives it.
    expected = litert_float(twin, [x[:1] for x in xs] if name == "shape" else xs)
    on_float = float_outputs(load_model(twin), xs)
    on_int8 = float_outputs(load_model(model), xs)
    for k, (e, f, q) in enumerate(zip(expected, on_float, on_int8)):
        assert f.shape == e.shape, f"{name} output {k}: shape {f.shape}, LiteRT {e.shape}"
        bound = RTOL * (1 + float(np.max(np.abs(e))))
        worst = float(np.max(np.abs(f.astype(np.float64) - e)))
        print(f"{name} output {k}: max |npusim - LiteRT| = {worst:.3g} (bound {bound:.3g})")
        assert worst <= bound, f"{name} output {k}: {worst} above {bound}"
        # On the int8 graph the constants are dequantized exactly as float_model writes them.
        np.testing.assert_array_equal(q, f, err_msg=f"{name} output {k}: int8 graph in float")


def test_every_kind_has_a_float_case():
    """Each op kind in KERNELS is covered above (QUANTIZE and DEQUANTIZE: the identity test)."""
    covered = set()
    rng = np.random.default_rng(0)
    for _, build in CASES:
        covered.update(op.kind for op in load_model(build(rng)).ops)
    missing = set(KERNELS) - covered - {"QUANTIZE", "DEQUANTIZE"}
    assert not missing, f"no float case for {sorted(missing)}"


def test_quantize_and_dequantize_are_identities():
    """On real values a change of representation changes nothing."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 5)).astype(np.float32)
    for model in (
        O.quantize_model((1, 4, 5), np.float32, 0.05, 3),
        O.quantize_model((1, 4, 5), np.int8, 0.05, 3, in_scale=0.02, in_zp=-1),
        O.dequantize_model((1, 4, 5), 0.05, 3),
    ):
        np.testing.assert_array_equal(float_outputs(load_model(model), [x])[0], x)


def test_fused_activation_without_float_form_is_refused():
    m = O.binary_model("ADD", (1, 4), (1, 4), 0.05, 0, 0.05, 0, 0.1, 0)
    graph = load_model(m)
    graph.ops[0].options["fused_activation_function"] = "SIGN_BIT"
    with pytest.raises(NpusimError, match=r"^op 0 \(ADD\): fused activation SIGN_BIT has no float form$"):
        FloatInterpreter(graph)


def test_shared_float_resnet8_matches_litert():
    """The shared float ResNet-8 end to end: every tensor's value, against LiteRT's default float
    interpreter on the real CIFAR-10 images (4 of them); softmax probabilities to 2e-5."""
    model = open(need(SHARED / "models" / "resnet8_cifar10_float.tflite"), "rb").read()
    x = np.load(need(SHARED / "data" / "cifar10_subset.npz"))["x_test"][:4].astype(np.float32)
    expected = litert_float(model, [x])[0]
    got = FloatInterpreter(load_model(model)).run(x)
    worst = float(np.max(np.abs(got.astype(np.float64) - expected)))
    print(f"float ResNet-8: max |npusim - LiteRT| on the softmax = {worst:.3g}")
    assert worst <= 2e-5
    np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))


def test_float16_weights_through_dequantize():
    """A float model with half-precision weights (the converter's float16 quantization): DEQUANTIZE
    of a float16 constant feeds the conv, as LiteRT runs it."""
    rng = np.random.default_rng(8)
    b = O.ModelBuilder()
    x = b.add_tensor((1, 5, 5, 3), np.float32, name="input")
    w16 = b.add_const(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float16), name="w16")
    w = b.add_tensor((4, 3, 3, 3), np.float32, name="w")
    b.add_op("DEQUANTIZE", [w16], [w])
    y = b.add_tensor((1, 5, 5, 4), np.float32, name="output")
    opt = O.schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = O._PADDING["SAME"], 1, 1
    opt.fusedActivationFunction = O._ACTIVATION["RELU"]
    bias = b.add_const(rng.normal(0, 0.1, 4).astype(np.float32), name="bias")
    b.add_op("CONV_2D", [x, w, bias], [y], opt)
    model = b.build([x], [y])
    xs = [rng.normal(size=(3, 5, 5, 3)).astype(np.float32)]
    expected = litert_float(model, xs)[0]
    got = FloatInterpreter(load_model(model)).run(xs[0])
    assert got.dtype == np.float32
    assert float(np.max(np.abs(got - expected))) <= RTOL * (1 + float(np.max(np.abs(expected))))
