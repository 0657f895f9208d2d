"""STRIDED_SLICE, SPLIT, SPLIT_V, PACK, CONCATENATION (many inputs), RESIZE_NEAREST_NEIGHBOR and
QUANTIZE int8 -> int8: npusim against TFLite Micro, bit for bit (multi-output ops on every output).
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_ops_tflm import check, examples

from npusim.ops.strided_slice import axis_indices
from npusim.testing import oracle as O

import cases as C
from kernel_paths import PATHS, kernel_path


def check_outputs(case: C.Case):
    expected = O.run_tflm_outputs(case.model, case.xs)
    got = O.run_npusim_outputs(case.model, case.xs)
    assert len(expected) == len(got), case.desc
    for k, (e, g) in enumerate(zip(expected, got)):
        O.assert_same(e, g, f"output {k}: {case.desc}")


def tflm_refuses(model: bytes, x) -> bool:
    try:
        O.run_tflm(model, x)
    except Exception:  # noqa: BLE001 - any failure to prepare or run
        return True
    return False


# ----------------------------------------------------------------------------------------------
# STRIDED_SLICE
# ----------------------------------------------------------------------------------------------


@st.composite
def strided_slice_params(draw):
    rank = draw(st.integers(2, 4))
    shape = [1] + [draw(st.integers(1, 7)) for _ in range(rank - 1)]
    begin, end, strides = [0], [1], [1]
    for d in shape[1:]:
        begin.append(draw(st.integers(-d - 2, d + 2)))
        end.append(draw(st.integers(-d - 2, d + 2)))
        strides.append(draw(st.sampled_from([1, 1, 2, 3, -1, -1, -2, -3])))
    masks = {}
    for name in ("begin_mask", "end_mask", "shrink_axis_mask"):
        bits = draw(st.integers(0, (1 << rank) - 1))
        masks[name] = bits & ~1 if name == "shrink_axis_mask" else bits
    for k in range(1, rank):
        b, e, s = (masks[n] >> k & 1 for n in ("begin_mask", "end_mask", "shrink_axis_mask"))
        idx = axis_indices(shape[k], begin[k], end[k], strides[k], bool(b), bool(e), bool(s))
        assume(idx and 0 <= idx[0] < shape[k])  # no empty axis, no read outside a shrunk axis
    return dict(
        shape=tuple(shape), begin=begin, end=end, strides=strides, q=draw(C.qparams), n=draw(C.batch), **masks
    )


@settings(max_examples=examples(150))
@given(p=strided_slice_params(), seed=C.seeds)
def test_strided_slice(p, seed):
    rng = np.random.default_rng(seed)
    model = O.strided_slice_model(
        p["shape"],
        p["begin"],
        p["end"],
        p["strides"],
        *p["q"],
        begin_mask=p["begin_mask"],
        end_mask=p["end_mask"],
        shrink_axis_mask=p["shrink_axis_mask"],
    )
    x = O.random_int8(rng, (p["n"], *p["shape"][1:]))
    check(C.Case(model, x, f"STRIDED_SLICE {p}, seed={seed}"))


def test_strided_slice_yolo_channel_split():
    """The YOLOv8 head's slices: channels [0:64] and [64:] of [1, 5376, 80]-like tensors."""
    cases = (([0, 0, 0], [1, 4, 21], 0, 0), ([0, 4, 0], [1, 6, 21], 0, 4), ([0, 0, 7], [1, 0, 0], 3, 7))
    for begin, end, begin_mask, end_mask in cases:
        model = O.strided_slice_model(
            (1, 6, 21), begin, end, [1, 1, 1], 0.05, 3, begin_mask=begin_mask, end_mask=end_mask
        )
        check(C.Case(model, O.random_int8(np.random.default_rng(0), (2, 6, 21)), f"{begin} {end}"))


def test_strided_slice_refuses_shrink_outside_axis():
    """begin = size on a shrunk axis: start is clamped to size and TFLM reads past the axis."""
    import npusim

    model = O.strided_slice_model((1, 3, 4), [0, 3, 0], [1, 4, 4], [1, 1, 1], 0.1, 0, shrink_axis_mask=2)
    with pytest.raises(npusim.NpusimError, match="out of bounds"):
        npusim.Interpreter(npusim.load_model(model))


@pytest.mark.parametrize("mask", ["ellipsis_mask", "new_axis_mask"])
def test_strided_slice_ellipsis_and_new_axis_as_tflm(mask):
    """TFLM ignores ellipsis_mask and new_axis_mask (its Prepare zeroes them): with the output shape
    TFLM computes, both run and agree; with the shape TensorFlow would give, TFLM refuses the model
    and npusim raises a clear NpusimError."""
    import npusim

    shape, begin, end, strides = (1, 4, 5, 3), [0, 1, 0, 0], [1, 3, 4, 2], [1, 1, 2, 1]
    x = O.random_int8(np.random.default_rng(1), (2, 4, 5, 3))
    model = O.strided_slice_model(shape, begin, end, strides, 0.1, 0, **{mask: 2})
    check(C.Case(model, x, f"STRIDED_SLICE with {mask}=2 (ignored)"))
    tf_shape = (1, 1, 4, 5, 3) if mask == "new_axis_mask" else (1, 2, 5, 3)  # [:, None] / [:, ...]
    bad = O.strided_slice_model(shape, begin, end, strides, 0.1, 0, output_shape=tf_shape, **{mask: 2})
    assert tflm_refuses(bad, x)
    with pytest.raises(npusim.NpusimError, match="ignored, as TFLM does"):
        npusim.Interpreter(npusim.load_model(bad))


def test_strided_slice_of_axis_zero_runs_image_by_image():
    """Against TFLM in tests/test_batch_axis_ops.py."""
    import npusim

    model = O.strided_slice_model((2, 4), [1, 0], [2, 4], [1, 1], 0.1, 0)
    why = npusim.Interpreter(npusim.load_model(model)).batch.why
    assert why == "op 0 (STRIDED_SLICE) slices axis 0 (begin 1, end 2, stride 1)"


# ----------------------------------------------------------------------------------------------
# SPLIT, SPLIT_V, PACK
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(50))
@given(
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    data=st.data(),
    q=C.qparams,
    n=C.batch,
    seed=C.seeds,
)
def test_split(dims, data, q, n, seed):
    shape = [1, *dims]
    axis = data.draw(st.integers(1, len(shape) - 1))
    parts = data.draw(st.integers(1, 4))
    shape[axis] *= parts
    model = O.split_model(shape, axis - len(shape) if data.draw(st.booleans()) else axis, parts, *q)
    x = O.random_int8(np.random.default_rng(seed), (n, *shape[1:]))
    check_outputs(C.Case(model, x, f"SPLIT shape={shape} axis={axis} parts={parts}, seed={seed}"))


@settings(max_examples=examples(50))
@given(
    dims=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    data=st.data(),
    q=C.qparams,
    n=C.batch,
    seed=C.seeds,
)
def test_split_v(dims, data, q, n, seed):
    shape = [1, *dims]
    axis = data.draw(st.integers(1, len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    shape[axis] = sum(sizes)
    if data.draw(st.booleans()):
        sizes[data.draw(st.integers(0, len(sizes) - 1))] = -1
    model = O.split_v_model(shape, sizes, axis, *q)
    x = O.random_int8(np.random.default_rng(seed), (n, *shape[1:]))
    check_outputs(C.Case(model, x, f"SPLIT_V shape={shape} sizes={sizes} axis={axis}, seed={seed}"))


@settings(max_examples=examples(40))
@given(
    dims=st.lists(st.integers(1, 5), min_size=0, max_size=3),
    count=st.integers(1, 5),
    data=st.data(),
    q=C.qparams,
    n=C.batch,
    seed=C.seeds,
)
def test_pack(dims, count, data, q, n, seed):
    shape = (1, *dims)
    rank = len(shape) + 1
    axis = data.draw(st.integers(1, rank - 1))
    if data.draw(st.booleans()):
        axis -= rank
    model = O.pack_model(shape, count, axis, *q)
    rng = np.random.default_rng(seed)
    xs = [O.random_int8(rng, (n, *shape[1:])) for _ in range(count)]
    check(C.Case(model, xs if count > 1 else xs[0], f"PACK shape={shape} count={count} axis={axis}"))


# ----------------------------------------------------------------------------------------------
# CONCATENATION of many inputs
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 5, 10])
def test_concatenation_many_inputs(count):
    shapes = [(1, 3, 2, k + 1) for k in range(count)]
    rng = np.random.default_rng(count)
    xs = [O.random_int8(rng, (2, *s[1:])) for s in shapes]
    check(C.Case(O.concat_model(shapes, 3, 0.05, -3), xs, f"CONCATENATION of {count} inputs"))


@pytest.mark.parametrize("count", [11, 25])
def test_concatenation_beyond_tflm_limit(count):
    """TFLM's CONCATENATION takes at most 10 inputs (kMaxInputNum); npusim takes any number and
    equals numpy's concatenation (the op moves bytes only)."""
    shapes = [(1, 2, k % 3 + 1) for k in range(count)]
    rng = np.random.default_rng(count)
    xs = [O.random_int8(rng, (2, *s[1:])) for s in shapes]
    model = O.concat_model(shapes, -1, 0.05, -3)
    assert tflm_refuses(model, xs)
    O.assert_same(np.concatenate(xs, axis=-1), O.run_npusim(model, xs), f"CONCATENATION of {count}")


# ----------------------------------------------------------------------------------------------
# RESIZE_NEAREST_NEIGHBOR
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(120))
@given(
    hw=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    out=st.tuples(st.integers(1, 20), st.integers(1, 20)),
    c=st.integers(1, 4),
    align=st.booleans(),
    half=st.booleans(),
    q=C.qparams,
    n=C.batch,
    seed=C.seeds,
)
def test_resize_nearest_neighbor(hw, out, c, align, half, q, n, seed):
    assume(not (align and half))  # TFLite refuses both at once
    model = O.resize_nearest_model((1, *hw, c), out, *q, align_corners=align, half_pixel_centers=half)
    x = O.random_int8(np.random.default_rng(seed), (n, *hw, c))
    check(C.Case(model, x, f"RESIZE_NEAREST_NEIGHBOR {hw}->{out} c={c} align={align} half={half}"))


@pytest.mark.parametrize("half", [False, True])
def test_resize_nearest_neighbor_2x(half):
    """The 2x upsampling of YOLOv8's neck (the np.repeat path)."""
    model = O.resize_nearest_model((1, 8, 8, 16), (16, 16), 0.1, 5, half_pixel_centers=half)
    check(C.Case(model, O.random_int8(np.random.default_rng(0), (2, 8, 8, 16)), f"2x half={half}"))


# ----------------------------------------------------------------------------------------------
# QUANTIZE int8 -> int8 (requantize); uint8 -> int8 is in test_ops_tflm.py
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(60))
@given(
    in_q=C.qparams,
    ratio=st.floats(-1.5, 1.5),
    out_zp=C.zero_points,
    pow2=st.booleans(),
)
def test_quantize_int8_to_int8_every_code(in_q, ratio, out_zp, pow2):
    in_scale = in_q[0]
    out_scale = float(np.float32(in_scale * 10.0**ratio))
    if pow2:
        in_scale, out_scale = C.pow2(in_scale), C.pow2(out_scale)
    model = O.quantize_model((1, 256), np.int8, out_scale, out_zp, in_scale, in_q[1])
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    check(C.Case(model, x, f"QUANTIZE int8 ({in_scale}, {in_q[1]}) -> ({out_scale}, {out_zp})"))


@pytest.mark.parametrize("in_zp,out_zp", [(128, 0), (0, -128), (100, -20)])
def test_quantize_uint8_to_int8_same_scale(in_zp, out_zp):
    model = O.quantize_model((1, 256), np.uint8, 0.0039215689, out_zp, 0.0039215689, in_zp)
    x = np.arange(256, dtype=np.uint8).reshape(1, 256)
    check(C.Case(model, x, f"QUANTIZE uint8 zp {in_zp} -> int8 zp {out_zp}"))


def pad_then_conv_model(pads, channels, stride, seed, pad_value=None) -> bytes:
    """PAD (paddings [[0, 0], [t, b], [l, r], [0, 0]]) then a 3x3 VALID CONV_2D, as converters write
    SAME stride-2 layers (YOLOv8's); pad_value: a PADV2 constant instead (not the zero point)."""
    from ai_edge_litert import schema_py_generated as schema

    rng = np.random.default_rng(seed)
    b = O.ModelBuilder()
    h, w = 9, 10
    zp = 5
    x = b.add_tensor((1, h, w, channels), np.int8, 0.05, zp, name="input")
    p = b.add_const(np.array(pads, np.int32), name="paddings")
    ph, pw = h + pads[1][0] + pads[1][1], w + pads[2][0] + pads[2][1]
    y = b.add_tensor((1, ph, pw, channels), np.int8, 0.05, zp, name="padded")
    if pad_value is None:
        b.add_op("PAD", [x, p], [y], schema.PadOptionsT())
    else:
        v = b.add_const(np.array([pad_value], np.int8), scale=0.05, zero_point=zp, name="pad_value")
        b.add_op("PADV2", [x, p, v], [y], schema.PadV2OptionsT())
    ws = np.full(8, 0.02, np.float32)
    wt = b.add_const(
        rng.integers(-127, 128, (8, 3, 3, channels)).astype(np.int8),
        scale=ws, zero_point=np.zeros(8, np.int64), axis=0, name="weights",
    )
    bt = b.add_const(
        rng.integers(-2000, 2000, 8).astype(np.int32),
        scale=O.bias_scale(0.05, ws), zero_point=np.zeros(8, np.int64), name="bias",
    )
    oh, ow = (ph - 3) // stride + 1, (pw - 3) // stride + 1
    out = b.add_tensor((1, oh, ow, 8), np.int8, 0.1, -3, name="output")
    opt = schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = schema.Padding.VALID, stride, stride
    opt.dilationHFactor = opt.dilationWFactor = 1
    b.add_op("CONV_2D", [y, wt, bt], [out], opt)
    return b.build([x], [out])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "pads,channels,stride",
    [
        ([[0, 0], [1, 1], [1, 1], [0, 0]], 16, 2),
        ([[0, 0], [0, 1], [0, 1], [0, 0]], 3, 2),  # TF's SAME stride 2: bottom and right only
        ([[0, 0], [2, 0], [0, 3], [0, 0]], 5, 1),
    ],
)
def test_conv_takes_over_the_pad_that_feeds_it(pads, channels, stride, path):
    """run() folds a PAD whose only reader is a CONV_2D into the convolution's own padding (the PAD's
    copy saved); every kernel path equals TFLM with the fold and the unfolded walk."""
    import npusim

    model = pad_then_conv_model(pads, channels, stride, seed=channels)
    x = np.random.default_rng(1).integers(-128, 128, (3, 9, 10, channels)).astype(np.int8)
    expected = O.run_tflm(model, x)
    with kernel_path(path):
        interp = npusim.Interpreter(model)
        assert len(interp._pad_sources) == 1
        assert np.array_equal(interp.run(x), expected)
        assert np.array_equal(interp.run_all(x)[interp.graph.outputs[0]], expected)


def test_a_pad_of_another_value_is_not_folded_into_the_conv():
    import npusim

    model = pad_then_conv_model([[0, 0], [1, 1], [1, 1], [0, 0]], 4, 2, seed=0, pad_value=-100)
    x = np.random.default_rng(2).integers(-128, 128, (2, 9, 10, 4)).astype(np.int8)
    interp = npusim.Interpreter(model)
    assert not interp._pad_sources
    assert np.array_equal(interp.run(x), O.run_tflm(model, x))
