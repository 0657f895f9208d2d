"""TFLite's legacy uint8 models (npusim/runtime/uint8.py): under --profile xnnpack equal to LiteRT element
for element on one-op uint8 models made from the int8 ones (npusim/testing/uint8_models.py, with
asymmetric filters), and refused in one line under a profile with no uint8 kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import npusim
from npusim.errors import NpusimError
from npusim.testing import runners as R
from npusim.testing.uint8_models import as_uint8, as_uint8_input

import cases as C

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


def test_uint8_golden_under_xnnpack(tmp_path):
    from npusim.app import golden

    case = C.depthwise_case(4, (5, 5), (1, 1))
    model = tmp_path / "m.tflite"
    model.write_bytes(as_uint8(case.model))
    golden.record(model, as_uint8_input(case.xs), tmp_path / "g.npz", profile="xnnpack")
    assert golden.check(model, tmp_path / "g.npz").ok
