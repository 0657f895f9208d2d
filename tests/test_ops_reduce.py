"""SUM and REDUCE_MAX (int8, any axes but the batch, keep_dims): npusim against TFLite Micro, bit for
bit. SUM requantizes as TFLM's QuantizedMeanOrSum with compute_sum (no 1/n in the multiplier);
REDUCE_MAX needs the output quantization equal to the input's (TFLM refuses anything else).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops_tflm import check, examples

from npusim.testing import oracle as O

import cases as C


@st.composite
def reduce_params(draw, kind):
    rank = draw(st.integers(2, 5))
    shape = (1, *[draw(st.integers(1, 6)) for _ in range(rank - 1)])
    axes = draw(st.lists(st.integers(1, rank - 1), min_size=1, max_size=rank - 1))
    axes = [a - rank if draw(st.booleans()) else a for a in axes]  # negative axes, duplicates
    s_in, z_in = draw(C.qparams)
    if kind == "SUM":
        count = int(np.prod([shape[a % rank] for a in set(a % rank for a in axes)]))
        # output scale around the sum's spread: sqrt(count) .. count input steps per output step
        s_out = float(np.float32(s_in * count ** draw(st.floats(0.0, 1.2)) * 10.0 ** draw(st.floats(-1, 1))))
        z_out = draw(C.zero_points)
        if draw(st.integers(0, 3)) == 0:
            s_in, s_out = C.pow2(s_in), C.pow2(s_out)
    else:
        s_out, z_out = s_in, z_in
    return dict(
        shape=shape,
        axes=axes,
        keep_dims=draw(st.booleans()),
        q=(s_in, z_in, s_out, z_out),
        n=draw(C.batch),
        mode=draw(C.data_modes),
    )


def make_reduce(kind, p, seed) -> C.Case:
    model = O.mean_model(p["shape"], *p["q"], axes=p["axes"], keep_dims=p["keep_dims"], kind=kind)
    x = O.random_int8(np.random.default_rng(seed), (p["n"], *p["shape"][1:]), p["mode"])
    return C.Case(model, x, f"{kind} {p}, seed={seed}")


@settings(max_examples=examples(150))
@given(p=reduce_params("SUM"), seed=C.seeds)
def test_sum(p, seed):
    check(make_reduce("SUM", p, seed))


@settings(max_examples=examples(100))
@given(p=reduce_params("REDUCE_MAX"), seed=C.seeds)
def test_reduce_max(p, seed):
    check(make_reduce("REDUCE_MAX", p, seed))


@pytest.mark.parametrize("mode", ["extreme", "uniform"])
def test_sum_saturates_and_rounds_like_tflm(mode):
    """Large sums with a multiplier above 1 and below: saturation and ties."""
    for s_out, z_out in ((0.5, 0), (0.0625, -128), (100.0, 127), (2.0, 5)):
        model = O.mean_model((1, 8, 8, 4), 0.5, -3, s_out, z_out, axes=(1, 2), keep_dims=True, kind="SUM")
        x = O.random_int8(np.random.default_rng(7), (2, 8, 8, 4), mode)
        check(C.Case(model, x, f"SUM out=({s_out}, {z_out}) {mode}"))


def test_reduce_max_refuses_requantization():
    import npusim

    model = O.mean_model((1, 4, 4, 2), 0.1, 0, 0.2, 0, axes=(1, 2), kind="REDUCE_MAX")
    with pytest.raises(npusim.NpusimError, match="TFLM requires them equal"):
        npusim.Interpreter(npusim.load_model(model))


def test_reduce_over_axis_zero_runs_image_by_image():
    """Against TFLM in tests/test_batch_axis_ops.py."""
    import npusim

    for kind in ("SUM", "REDUCE_MAX"):
        model = O.mean_model((1, 4, 2), 0.1, 0, 0.1, 0, axes=(0, 1), kind=kind)
        assert npusim.Interpreter(npusim.load_model(model)).batch.why == f"op 0 ({kind}) reduces axis 0"
