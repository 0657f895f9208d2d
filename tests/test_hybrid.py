"""Dynamic-range ("hybrid") float models: int8 weights, float activations. validate's reference
runs their MAC layers as LiteRT's hybrid kernels do (npusim/runtime/hybrid.py), proven against LiteRT's
builtin kernels on one-op models and end to end on ResNet-8's dynamic-range twin."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.runtime.reference import FloatInterpreter
from npusim.testing import builder, oracle
from npusim.testing.runners import run_litert

from shared_paths import SHARED, need

pytest.importorskip("ai_edge_litert")


def _cases(rng):
    def codes(*shape):
        return rng.integers(-127, 128, shape).astype(np.int8)

    def bias(n):
        return rng.integers(-500, 500, n).astype(np.int32)

    def scales(n):
        return rng.uniform(0.005, 0.02, n).astype(np.float32)

    yield (
        "fc per channel",
        oracle.fully_connected_model((1, 20), codes(6, 20), bias(6), 0.05, 3, scales(6), 0.3, -2),
        (4, 20),
    )
    yield (
        "fc per tensor relu",
        oracle.fully_connected_model(
            (1, 20), codes(6, 20), bias(6), 0.05, 3, np.float32(0.01), 0.3, -2, activation="RELU"
        ),
        (4, 20),
    )
    yield (
        "conv",
        oracle.conv2d_model(
            (1, 9, 9, 4),
            codes(8, 3, 3, 4),
            bias(8),
            0.05,
            3,
            scales(8),
            0.3,
            -2,
            stride=(2, 2),
            activation="RELU6",
        ),
        (3, 9, 9, 4),
    )
    yield (
        "depthwise",
        oracle.depthwise_model(
            (1, 9, 9, 6), codes(1, 3, 3, 6), bias(6), 0.05, 3, scales(6), 0.3, -2, activation="RELU"
        ),
        (3, 9, 9, 6),
    )


@pytest.mark.parametrize("case", range(4))
def test_one_op_hybrid_models_equal_litert(case):
    """Each hybrid MAC op on inputs of either sign and on non-negative ones (the range's zero at
    the type's minimum, where a tie such as 79 / (158 / 255) = 127.5 decides a code)."""
    rng = np.random.default_rng(case)
    name, model, shape = list(_cases(rng))[case]
    hybrid = builder.hybrid_model(model)
    for x in (rng.standard_normal(shape) * 3, np.round(rng.uniform(0, 158, shape))):
        x = x.astype(np.float32)
        truth = run_litert(hybrid, x, resolver="NODELEGATE")
        got = FloatInterpreter(hybrid).run(x)
        np.testing.assert_allclose(got, truth, rtol=0, atol=4e-7 * np.abs(truth).max(), err_msg=name)


def test_validate_on_a_dynamic_range_twin_gives_litert_float_against_tflm_int8():
    """ResNet-8 int8 against its dynamic-range twin: validate's per-output metrics are those of
    LiteRT running the twin against TFLM running the int8 model (cos 0.99313 against 0.99353 when
    the twin's layers were computed in float)."""
    from npusim.app.metrics import ErrorStats
    from npusim.app.validate import split_inputs, validate
    from npusim.formats.model_io import load_model
    from npusim.runtime.reference import dequantize
    from npusim.testing.runners import run_tflm

    int8 = open(need(SHARED / "models" / "resnet8_cifar10_int8.tflite"), "rb").read()
    twin = builder.hybrid_model(int8)
    x = np.load(need(SHARED / "data" / "cifar10_subset.npz"))["x_test"][:8].astype(np.float32)
    result = validate(int8, x, twin)
    graph = load_model(int8)
    x_int8, x_real = split_inputs(x, graph)
    stats = ErrorStats()
    stats.add(
        run_litert(twin, x_real, resolver="NODELEGATE").astype(np.float64).ravel(),
        dequantize(graph.output(0), run_tflm(int8, x_int8)).astype(np.float64).ravel(),
    )
    truth, got = stats.result(), result.outputs[0]
    for k in ("cos", "rmse", "mae", "l2r", "nse", "sqnr_db", "max_abs"):
        assert got[k] == pytest.approx(truth[k], rel=1e-5), k
    assert result.notes and "as LiteRT's hybrid kernels do" in result.notes[0]
