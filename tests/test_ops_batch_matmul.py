"""BATCH_MATMUL int8 x int8 -> int8: npusim against TFLite Micro (the PyPI build registers
BATCH_MATMUL, so TFLM is the oracle), bit for bit: adj_x / adj_y, broadcasting of the batch axes,
a constant right operand of lower rank, zero points, scales and int8 extremes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops_tflm import check, examples

from npusim.testing import oracle as O

import cases as C


@st.composite
def bmm_params(draw):
    rank = draw(st.integers(3, 5))
    batch = [1] + [draw(st.integers(1, 3)) for _ in range(rank - 3)]
    m, k, n = (draw(st.integers(1, 8)) for _ in range(3))
    const = draw(st.booleans())
    rb = list(batch)
    for i in range(1, len(rb)):  # the right operand broadcasts along some batch axes
        if draw(st.booleans()):
            rb[i] = 1
    if const:
        rb = rb[draw(st.integers(0, len(rb))) :]  # a constant may have fewer batch axes
    adj_x, adj_y = draw(st.booleans()), draw(st.booleans())
    ls = [*batch, *((k, m) if adj_x else (m, k))]
    rs = [*rb, *((n, k) if adj_y else (k, n))]
    s_l, z_l = draw(C.qparams)
    s_r = float(draw(C.log_scale(1e-3, 0.1)))
    z_r = draw(st.one_of(st.just(0), C.zero_points))
    spread = 64.0 * 75.0 * np.sqrt(k)  # |acc| of uniform data
    s_o = float(np.float32(s_l * s_r * spread / 64.0 * 10.0 ** draw(st.floats(-1.0, 1.0))))
    return dict(
        ls=ls,
        rs=rs,
        q=((s_l, z_l), (s_r, z_r), (s_o, draw(C.zero_points))),
        adj=(adj_x, adj_y),
        const=const,
        n=draw(C.batch),
        mode=draw(C.data_modes),
    )


def make_bmm(p, seed) -> C.Case:
    rng = np.random.default_rng(seed)
    c = O.random_int8(rng, p["rs"], p["mode"]) if p["const"] else None
    model = O.batch_matmul_model(p["ls"], p["rs"], *p["q"], *p["adj"], rhs_const=c)
    x = O.random_int8(rng, (p["n"], *p["ls"][1:]), p["mode"])
    xs = x if p["const"] else [x, O.random_int8(rng, (p["n"], *p["rs"][1:]), p["mode"])]
    return C.Case(model, xs, f"BATCH_MATMUL {p}, seed={seed}")


@settings(max_examples=examples(200))
@given(p=bmm_params(), seed=C.seeds)
def test_batch_matmul(p, seed):
    check(make_bmm(p, seed))


def test_batch_matmul_deep_extremes():
    """Depth 512 with only -128 / 127: large accumulators, saturated outputs."""
    rng = np.random.default_rng(2)
    model = O.batch_matmul_model((1, 4, 512), (1, 512, 6), (0.02, -128), (0.01, 127), (0.5, 3))
    xs = [O.random_int8(rng, (2, 4, 512), "extreme"), O.random_int8(rng, (2, 512, 6), "extreme")]
    check(C.Case(model, xs, "BATCH_MATMUL deep extremes"))


def test_batch_matmul_across_the_batch_axis_runs_image_by_image():
    """A rank-2 activation (its rows on axis 0) or a constant [2, 4, 5] against [1, 3, 4]: computed
    on the declared shapes (against TFLM in tests/test_batch_axis_ops.py)."""
    import npusim

    model = O.batch_matmul_model((3, 4), (4, 5), (0.1, 0), (0.1, 0), (0.1, 0))
    why = npusim.Interpreter(npusim.load_model(model)).batch.why
    assert why == "op 0 (BATCH_MATMUL) broadcasts activation 'lhs' of shape [3, 4] to [3, 5]"
    c = np.zeros((2, 4, 5), np.int8)
    model = O.batch_matmul_model((1, 3, 4), (2, 4, 5), (0.1, 0), (0.1, 0), (0.1, 0), rhs_const=c)
    why = npusim.Interpreter(npusim.load_model(model)).batch.why
    assert why == "op 0 (BATCH_MATMUL) takes constant 'rhs' of shape [2, 4, 5] along axis 0"
