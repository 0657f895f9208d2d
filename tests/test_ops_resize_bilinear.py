"""RESIZE_BILINEAR int8: npusim against TFLite Micro's ResizeBilinearInteger, bit for bit
(align_corners, half_pixel_centers, up- and downsampling, int8 extremes)."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_ops_movement import tflm_refuses
from test_ops_tflm import check, examples

from npusim.testing import oracle as O

import cases as C


@settings(max_examples=examples(150))
@given(
    hw=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    out=st.tuples(st.integers(1, 20), st.integers(1, 20)),
    c=st.integers(1, 4),
    align=st.booleans(),
    half=st.booleans(),
    q=C.qparams,
    n=C.batch,
    mode=C.data_modes,
    seed=C.seeds,
)
def test_resize_bilinear(hw, out, c, align, half, q, n, mode, seed):
    assume(not (align and half))
    model = O.resize_nearest_model((1, *hw, c), out, *q, align, half, bilinear=True)
    x = O.random_int8(np.random.default_rng(seed), (n, *hw, c), mode)
    check(C.Case(model, x, f"RESIZE_BILINEAR {hw}->{out} c={c} align={align} half={half} {mode}"))


@pytest.mark.parametrize("align,half", [(False, False), (True, False), (False, True)])
def test_resize_bilinear_2x_and_odd(align, half):
    for hw, out in (((8, 8), (16, 16)), ((7, 5), (13, 3)), ((3, 3), (100, 1))):
        model = O.resize_nearest_model((1, *hw, 3), out, 0.1, 5, align, half, bilinear=True)
        x = O.random_int8(np.random.default_rng(0), (2, *hw, 3), "mixed")
        check(C.Case(model, x, f"{hw}->{out} align={align} half={half}"))


def test_resize_bilinear_refuses_both_flags():
    import npusim

    model = O.resize_nearest_model((1, 2, 2, 1), (4, 4), 0.1, 0, True, True, bilinear=True)
    assert tflm_refuses(model, np.zeros((1, 2, 2, 1), np.int8))
    with pytest.raises(npusim.NpusimError, match="both set"):
        npusim.Interpreter(npusim.load_model(model))
