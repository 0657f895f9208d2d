"""SLICE, UNPACK, SQUEEZE, EXPAND_DIMS, SHAPE, TILE and GATHER: npusim against TFLite Micro, bit for
bit (every output of the multi-output ops).

TILE: the PyPI tflite-micro build registers no TILE kernel, so its oracle is LiteRT's reference
resolver (BUILTIN_REF, kernels/tile.cc); the op moves bytes only.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_ops_movement import check_outputs, tflm_refuses
from test_ops_tflm import check, examples

from npusim.testing import oracle as O

import cases as C

dims = st.lists(st.integers(1, 5), min_size=1, max_size=3)


def refuses(model: bytes, match: str):
    import npusim

    with pytest.raises(npusim.NpusimError, match=match):
        npusim.Interpreter(npusim.load_model(model))


def runs_by_image(model: bytes) -> str | None:
    """Why the model runs image by image (an op across axis 0: tests/test_batch_axis_ops.py runs
    each such op against TFLM), or None."""
    import npusim

    return npusim.Interpreter(npusim.load_model(model)).batch.why


# ----------------------------------------------------------------------------------------------
# SLICE
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(100))
@given(d=dims, data=st.data(), q=C.qparams, n=C.batch, seed=C.seeds, int64=st.booleans())
def test_slice(d, data, q, n, seed, int64):
    shape = (1, *d)
    begin, size = [0], [data.draw(st.sampled_from([1, -1]))]
    for s in d:
        b = data.draw(st.integers(0, s - 1))
        begin.append(b)
        size.append(data.draw(st.one_of(st.integers(1, s - b), st.just(-1))))
    model = O.slice_model(shape, begin, size, *q, index_dtype=np.int64 if int64 else np.int32)
    x = O.random_int8(np.random.default_rng(seed), (n, *d))
    check(C.Case(model, x, f"SLICE {shape} begin={begin} size={size}"))


def test_slice_of_axis_zero_runs_image_by_image_and_out_of_range_is_refused():
    why = runs_by_image(O.slice_model((2, 4), [1, 0], [1, 4], 0.1, 0))
    assert why == "op 0 (SLICE) slices axis 0 (1:2 of 2)"
    b = O.ModelBuilder()
    x = b.add_tensor((1, 4), np.int8, 0.1, 0)
    ts = [b.add_const(np.asarray(v, np.int32)) for v in ([0, 3], [1, 2])]
    y = b.add_tensor((1, 2), np.int8, 0.1, 0)
    b.add_op("SLICE", [x, *ts], [y], O.schema.SliceOptionsT())
    refuses(b.build([x], [y]), "outside the input")


# ----------------------------------------------------------------------------------------------
# UNPACK, SQUEEZE, EXPAND_DIMS
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(50))
@given(d=dims, data=st.data(), q=C.qparams, n=C.batch, seed=C.seeds)
def test_unpack(d, data, q, n, seed):
    shape = (1, *d)
    axis = data.draw(st.integers(1, len(shape) - 1))
    if data.draw(st.booleans()):
        axis -= len(shape)
    model = O.unpack_model(shape, axis, *q)
    x = O.random_int8(np.random.default_rng(seed), (n, *d))
    check_outputs(C.Case(model, x, f"UNPACK {shape} axis={axis}"))


@settings(max_examples=examples(50))
@given(d=st.lists(st.integers(1, 3), min_size=1, max_size=4), data=st.data(), q=C.qparams, n=C.batch)
def test_squeeze(d, data, q, n):
    shape = (1, *d)
    ones = [i for i, s in enumerate(shape) if s == 1 and i > 0]
    assume(ones)
    picked = data.draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))
    picked = [p - len(shape) if data.draw(st.booleans()) else p for p in picked]
    model = O.squeeze_model(shape, picked, *q)
    x = O.random_int8(np.random.default_rng(n), (n, *d))
    check(C.Case(model, x, f"SQUEEZE {shape} dims={picked}"))


def test_squeeze_of_axis_zero():
    """[1, 1, 3] -> [3] moves elements across axis 0; -> [1, 3] keeps one image per row."""
    why = "op 0 (SQUEEZE) moves elements across axis 0 ([1, 1, 3] into [3])"
    assert runs_by_image(O.squeeze_model((1, 1, 3), [], 0.1, 0)) == why
    assert runs_by_image(O.squeeze_model((1, 1, 3), [0], 0.1, 0)) is None


@settings(max_examples=examples(40))
@given(d=dims, data=st.data(), q=C.qparams, n=C.batch)
def test_expand_dims(d, data, q, n):
    shape = (1, *d)
    axis = data.draw(st.integers(1, len(shape)))
    if data.draw(st.booleans()):
        axis -= len(shape) + 1
    model = O.expand_dims_model(shape, axis, *q)
    x = O.random_int8(np.random.default_rng(n), (n, *d))
    check(C.Case(model, x, f"EXPAND_DIMS {shape} axis={axis}"))


# ----------------------------------------------------------------------------------------------
# SHAPE
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 4), (1, 3, 5, 2), (1, 2, 1, 2, 3)])
def test_shape(shape):
    model = O.shape_model(shape, 0.1, 3)
    x = O.random_int8(np.random.default_rng(0), shape)
    check(C.Case(model, x, f"SHAPE {shape}"))


def test_shape_feeds_reshape_at_any_batch():
    """SHAPE's int32 output as a RESHAPE's shape tensor; the graph also returns it."""
    model = O.shape_model((1, 3, 4), 0.1, 3, reshape=True)
    x = O.random_int8(np.random.default_rng(0), (1, 3, 4))
    check_outputs(C.Case(model, x, "SHAPE -> RESHAPE"))
    x3 = O.random_int8(np.random.default_rng(1), (3, 3, 4))
    y, s = O.run_npusim_outputs(model, x3)
    O.assert_same(x3, y, "RESHAPE at batch 3")
    O.assert_same(np.asarray([1, 3, 4], np.int32), s, "SHAPE at batch 3: the model's shape")


# ----------------------------------------------------------------------------------------------
# TILE (oracle: LiteRT BUILTIN_REF)
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(50))
@given(d=dims, data=st.data(), q=C.qparams, seed=C.seeds)
def test_tile_litert_ref(d, data, q, seed):
    """TFLM has no TILE: LiteRT's reference kernel is the oracle (one image per invoke)."""
    shape = (1, *d)
    reps = [1] + [data.draw(st.integers(1, 3)) for _ in d]
    model = O.tile_model(shape, reps, *q)
    x = O.random_int8(np.random.default_rng(seed), (2, *d))
    O.assert_same(O.run_litert(model, x, "REF"), O.run_npusim(model, x), f"TILE {shape} x {reps}")


def test_tile_not_in_tflm_and_across_axis_zero():
    model = O.tile_model((1, 2), [1, 2], 0.1, 0)
    assert tflm_refuses(model, np.zeros((1, 2), np.int8))
    assert runs_by_image(O.tile_model((1, 2), [2, 1], 0.1, 0)) == "op 0 (TILE) tiles axis 0 2 times"


# ----------------------------------------------------------------------------------------------
# GATHER
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(80))
@given(
    d=dims,
    data=st.data(),
    idx_shape=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    q=C.qparams,
    n=C.batch,
    seed=C.seeds,
)
def test_gather(d, data, idx_shape, q, n, seed):
    shape = (1, *d)
    axis = data.draw(st.integers(1, len(shape) - 1))
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, shape[axis], size=idx_shape).astype(np.int32)
    if data.draw(st.booleans()):
        axis -= len(shape)
    model = O.gather_model(shape, indices, axis, *q)
    x = O.random_int8(rng, (n, *d))
    check(C.Case(model, x, f"GATHER {shape} axis={axis} indices={indices.tolist()}"))


def test_gather_refuses_bad_index_and_runs_axis_zero_image_by_image():
    model = O.gather_model((1, 4, 2), [0, 4], 1, 0.1, 0)
    assert tflm_refuses(model, np.zeros((1, 4, 2), np.int8))
    refuses(model, "out of range")
    assert runs_by_image(O.gather_model((1, 4), [0], 0, 0.1, 0)) == "op 0 (GATHER) gathers along axis 0"
