"""--profile onnxruntime against ONNX Runtime itself (onnxruntime 1.32, CPU, one thread).

One-op float models built with onnx.helper are quantized by ORT's quantize_static in QOperator
format (ORT then runs its integer kernels: QLinearConv, QGemm, QLinearMatMul, QLinearAdd,
QLinearMul, QLinearSigmoid, QLinearLeakyRelu, ...); npusim runs each model itself (through the ONNX
importer) and its .tflite twin (npusim/testing/onnx_twins.py: the same int8 parameters) under
--profile onnxruntime, and must give ORT's codes bit for bit.
The same ops in QDQ format, with ORT's optimizations off (the literal DequantizeLinear -> float op ->
QuantizeLinear), agree bit for bit on the .onnx model (ORT's float kernels, tests/test_ort_literal.py
has more); the .tflite twin, which runs the integer kernels, within one step for Conv, Gemm, Add, Mul.

uint8 activations with 8-bit weights are not claimed for the MAC ops: on an AVX2 host without VNNI,
ORT's u8s8 GEMM (VPMADDUBSW) saturates each pair of products to int16, which an exact integer sum
does not (docs/numerics.md); with reduce_range (7-bit weights) ORT is exact and so is npusim.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from npusim.errors import NpusimError  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402
from npusim.testing import onnx_twins as T  # noqa: E402
from npusim.testing import oracle as O  # noqa: E402


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def assert_bit_exact(case: T.Case):
    """npusim equals ORT on the twin and on the .onnx model itself (through the importer)."""
    ort = case.ort_codes()
    O.assert_same(ort, case.npusim_codes(), f"onnxruntime profile (twin) vs ORT: {case.desc}")
    try:
        sim = case.npusim_onnx_codes()
    except NpusimError as e:
        if "is unknown (no value_info" not in str(e):
            raise
        # A com.microsoft QLinear* op (QLinearAdd, QLinearMul, QLinearAveragePool) has no ONNX shape
        # inference and quantize_static writes no value_info for its output, which the importer
        # needs (its gap, not the profile's): import the model with the shapes ORT computes.
        case.onnx = oo.with_value_info(case.onnx)
        sim = case.npusim_onnx_codes()
    O.assert_same(ort, sim, f"onnxruntime profile (.onnx) vs ORT: {case.desc}")


# Shapes, strides, dilations, padding, per-channel or per-tensor weights: (x_shape, out_c, k, s, d, pad)
CONV = [
    ((1, 3, 9, 9), 5, 3, 2, 1, "SAME"),
    ((1, 4, 8, 8), 8, 3, 1, 1, "SAME"),
    ((1, 8, 7, 6), 4, 1, 1, 1, "VALID"),
    ((1, 5, 10, 10), 6, 3, 1, 2, "SAME"),
    ((1, 3, 11, 9), 7, 5, 2, 1, "VALID"),
    ((1, 16, 6, 6), 3, 3, 3, 1, "SAME"),
    ((1, 2, 12, 12), 9, 2, 2, 1, "VALID"),
    ((1, 40, 5, 5), 12, 3, 1, 1, "SAME"),  # a reduction of 360
]


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("p", CONV, ids=lambda p: "x{}o{}k{}s{}d{}{}".format(p[0][1:], *p[1:]))
def test_qlinearconv_int8(p, per_channel):
    rng = np.random.default_rng(seed_of((p, per_channel)))
    x_shape, out_c, k, s, d, pad = p
    assert_bit_exact(T.conv_case(rng, x_shape, out_c, k, s, d, pad, per_channel=per_channel))


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize(
    "p",
    [((1, 6, 8, 8), 3, 1, 1), ((1, 8, 9, 9), 3, 2, 1), ((1, 5, 10, 10), 3, 1, 2), ((1, 4, 7, 7), 5, 1, 1)],
)
def test_qlinearconv_depthwise(p, activation):
    """Depthwise (group = C): ORT's depthwise kernel sums exactly for uint8 too."""
    rng = np.random.default_rng(seed_of((p, activation)))
    x_shape, k, s, d = p
    assert_bit_exact(T.conv_case(rng, x_shape, 0, k, s, d, "SAME", depthwise=True, activation=activation))


@pytest.mark.parametrize("p", CONV[:4], ids=lambda p: "x{}o{}k{}s{}d{}{}".format(p[0][1:], *p[1:]))
def test_qlinearconv_uint8_reduce_range(p):
    rng = np.random.default_rng(seed_of(p))
    x_shape, out_c, k, s, d, pad = p
    assert_bit_exact(T.conv_case(rng, x_shape, out_c, k, s, d, pad, activation="uint8", reduce_range=True))


@pytest.mark.parametrize("kind", ["Gemm", "MatMul"])
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("k,units", [(40, 7), (3, 16), (300, 10)])
def test_qgemm_qlinearmatmul_int8(kind, per_channel, k, units):
    rng = np.random.default_rng(seed_of((kind, per_channel, k)))
    assert_bit_exact(T.gemm_case(rng, k, units, kind, per_channel))


@pytest.mark.parametrize("kind", ["Gemm", "MatMul"])
def test_qgemm_uint8_reduce_range(kind):
    rng = np.random.default_rng(11)
    assert_bit_exact(T.gemm_case(rng, 64, 9, kind, True, "uint8", reduce_range=True))


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize("kind", ["Add", "Mul"])
@pytest.mark.parametrize("seed", range(3))
def test_qlinear_add_mul_every_pair(kind, activation, seed):
    """All 65,536 input pairs per case; operand scales from different calibration ranges.

    QLinearAdd's and QLinearMul's float steps see the stored codes: for a uint8 model, the uint8
    codes, which the importer records as Quantization.offset (128). The .onnx path is then bit for
    bit; a .tflite twin carries no such offset, so its uint8 cases are held within one step."""
    case = T.binary_case(np.random.default_rng(seed), kind, activation)
    if activation == "int8":
        return assert_bit_exact(case)
    ort, twin = case.ort_codes(), case.npusim_codes()
    assert np.abs(ort - twin).max() <= 1, f"{case.desc} (twin): {O.first_difference(ort, twin)}"
    case.onnx = oo.with_value_info(case.onnx)  # QLinear* outputs carry no shape (see assert_bit_exact)
    O.assert_same(ort, case.npusim_onnx_codes(), f"onnxruntime profile (.onnx) vs ORT: {case.desc}")


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize(
    "kind,attrs", [("Sigmoid", {}), ("LeakyRelu", {"alpha": 0.1}), ("LeakyRelu", {"alpha": 0.01})]
)
@pytest.mark.parametrize("seed", range(3))
def test_qlinear_unary_every_code(kind, attrs, activation, seed):
    assert_bit_exact(T.unary_case(np.random.default_rng(seed), kind, activation, **attrs))


@pytest.mark.parametrize("kind,attrs", [("Sigmoid", {}), ("LeakyRelu", {"alpha": 0.2})])
@pytest.mark.parametrize("seed", range(2))
def test_qdq_unary_literal(kind, attrs, seed):
    """QDQ, ORT_DISABLE_ALL: DequantizeLinear -> ORT's float Sigmoid / LeakyRelu -> QuantizeLinear is
    a function of the input code, the same table as the QLinear kernel: bit for bit."""
    case = T.unary_case(np.random.default_rng(seed), kind, "int8", fmt="QDQ", **attrs)
    literal = case.ort_codes(optimize=False)
    O.assert_same(literal, case.npusim_codes(), f"literal QDQ (twin): {case.desc}")
    O.assert_same(literal, case.npusim_onnx_codes(), f"literal QDQ (.onnx): {case.desc}")


@pytest.mark.parametrize(
    "make",
    [
        lambda rng: T.conv_case(rng, (1, 4, 8, 8), 6, 3, 1, 1, "SAME", qdq=True),
        lambda rng: T.conv_case(rng, (1, 6, 9, 9), 0, 3, 2, 1, "SAME", depthwise=True, qdq=True),
        lambda rng: T.gemm_case(rng, 48, 8, "Gemm", True, qdq=True),
        lambda rng: T.binary_case(rng, "Add", qdq=True),
        lambda rng: T.binary_case(rng, "Mul", qdq=True),
    ],
    ids=["conv", "depthwise", "gemm", "add", "mul"],
)
def test_qdq_literal(make, monkeypatch):
    """QDQ, ORT_DISABLE_ALL: ORT's float op on dequantized values, then QuantizeLinear. The .onnx
    model runs ORT's float kernels (profiles/ort_literal.py): bit for bit. Its .tflite twin has no ONNX
    node to follow and runs the integer kernels, whose results next to a rounding tie can move by
    one step: within one step everywhere, and equal on nearly all elements."""
    monkeypatch.setenv("NPUSIM_ORT_THREADS", "1")  # Case.ort_codes runs ORT on one thread
    case = make(np.random.default_rng(3))
    literal = case.ort_codes(optimize=False)
    O.assert_same(literal, case.npusim_onnx_codes(), f"literal QDQ (.onnx): {case.desc}")
    twin = case.npusim_codes()
    diff = np.abs(literal - twin)
    assert diff.max() <= 1, f"{case.desc} (twin): {O.first_difference(literal, twin)}"
    assert np.mean(diff == 0) >= 0.99, f"{case.desc} (twin): only {np.mean(diff == 0):.4f} equal"


def test_qoperator_runs_integer_kernels():
    """The premise of the bit-exact tests: ORT keeps the QOperator kernels after its optimizations."""
    rng = np.random.default_rng(0)
    case = T.conv_case(rng, (1, 3, 8, 8), 4, 3)
    assert "QLinearConv" in oo.optimized_op_types(case.onnx)
    assert "Conv" not in oo.optimized_op_types(case.onnx)


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize(
    "kind,shape,kernel,stride",
    [
        ("AveragePool", (1, 4, 8, 8), (2, 2), (2, 2)),
        ("AveragePool", (1, 3, 9, 7), (3, 3), (2, 1)),
        ("Softmax", (1, 10), None, None),
        ("Softmax", (1, 33), None, None),
    ],
)
def test_qoperator_pool_softmax(kind, shape, kernel, stride, activation):
    """QLinearAveragePool (float32 sums of dequantized taps, nearbyintf(y / y_scale + zp)) and
    QLinearSoftmax, which the profile runs as the float op then quantization: bit for bit here."""
    rng = np.random.default_rng(seed_of(kind, shape, activation))
    args = {} if kernel is None else {"kernel": kernel, "stride": stride}
    assert_bit_exact(T.pool_case(rng, kind, shape, activation=activation, n=8, **args))


@pytest.mark.parametrize("activation", ["int8", "uint8"])
@pytest.mark.parametrize("shape", [(1, 6, 5, 5), (1, 16, 7, 3), (1, 3, 1, 1)])
def test_qlinear_global_average_pool(shape, activation):
    """QDQ GlobalAveragePool, which ORT fuses into QLinearGlobalAveragePool: the exact int32 sum times
    float32 x_scale / (y_scale * N), round half to even (the twin's MEAN over H and W)."""
    rng = np.random.default_rng(seed_of(shape, activation))
    case = T.pool_case(rng, "GlobalAveragePool", shape, activation=activation, n=8, fmt="QDQ")
    assert "QLinearGlobalAveragePool" in oo.optimized_op_types(case.onnx)
    assert_bit_exact(case)


def test_qdq_average_pool_within_one_step():
    """QDQ AveragePool shares one scale between input and output, so many means fall on a rounding
    tie, which float32 rounding of the dequantized sum decides: ORT's own optimized and literal runs
    disagree on some 7% of such outputs, by one step; npusim is within one step of both."""
    case = T.pool_case(np.random.default_rng(1), "AveragePool", (1, 4, 8, 8), n=8, fmt="QDQ")
    sim = case.npusim_codes()
    for optimize in (True, False):
        assert np.abs(case.ort_codes(optimize) - sim).max() <= 1


def test_single_rounding_only_on_onnx_graphs():
    """A .tflite LOGISTIC followed by a QUANTIZE keeps both roundings under the profile (they are the
    model's); the same pair imported from ONNX (Sigmoid -> QuantizeLinear) rounds once."""
    import npusim
    from npusim.profiles.ort_kernels import Plan
    from npusim.testing.oracle import ModelBuilder

    b = ModelBuilder()
    x = b.add_tensor((1, 256), np.int8, 0.05, 3, name="input")
    mid = b.add_tensor((1, 256), np.int8, 1 / 256, -128, name="logistic")
    y = b.add_tensor((1, 256), np.int8, 1 / 255, -128, name="output")
    b.add_op("LOGISTIC", [x], [mid])
    b.add_op("QUANTIZE", [mid], [y])
    graph = npusim.load_model(b.build([x], [y]))
    assert not Plan(graph).out_quant
    codes = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    two = npusim.Interpreter(graph, profile="onnxruntime").run(codes)
    once = T.unary_case(np.random.default_rng(0), "Sigmoid", "int8", fmt="QDQ")
    imported = npusim.load_model(once.onnx)
    assert Plan(imported).out_quant  # the imported Sigmoid is planned
    # from the importer's record: the QUANTIZE it wrote after the LOGISTIC, and that LOGISTIC
    ((q, p),) = imported.source.single_rounding.items()
    assert imported.ops[q].kind == "QUANTIZE" and imported.ops[p].kind == "LOGISTIC"
    assert imported.ops[q].inputs == imported.ops[p].outputs
    assert not graph.source.single_rounding  # a .tflite records none
    # the .tflite pair: QLinearSigmoid's table to 1/256, then a second QuantizeLinear to 1/255
    from npusim.profiles import onnxruntime as ort

    first = ort.sigmoid_table(0.05, 3, 1 / 256, -128)[codes.view(np.uint8)]  # tables index by byte
    real = np.float32(1 / 256) * (first.astype(np.int64) + 128).astype(np.float32)
    expected = ort.quantize_linear(real, 1 / 255, -128).astype(np.int8)
    O.assert_same(expected, two, "tflite LOGISTIC + QUANTIZE under onnxruntime")
