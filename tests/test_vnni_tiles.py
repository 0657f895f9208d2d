"""The VNNI micro-kernel's narrow tiles (microkernel._paired_stage) and its unsigned copy of deep
one-tap reductions (vnni.UNSIGNED_DEPTH):
layers of at most 8 output channels run one output stage per two pixels. One-op CONV_2D and
FULLY_CONNECTED models across output widths, pixel counts (odd, past a 12-pixel block, one pixel),
strides, padding, per-channel scales and activations, held to TFLM (tflm), LiteRT (xnnpack) and
the blas engine (every profile)."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.kernels import host
from npusim.testing import oracle as O

pytestmark = pytest.mark.skipif(
    not host.has_vnni(), reason="this CPU has no AVX-512 VNNI: the VNNI tiles are NOT tested on this machine"
)

CASES = [
    # (hw, cin, cout, k, stride, padding, activation)
    ((7, 5), 16, 8, 1, 1, "SAME", "NONE"),
    ((4, 4), 8, 8, 1, 1, "SAME", "RELU6"),
    ((3, 5), 48, 7, 1, 1, "SAME", "RELU"),
    ((5, 5), 3, 1, 3, 2, "SAME", "NONE"),
    ((6, 6), 12, 5, 3, 1, "VALID", "RELU6"),
    ((1, 1), 24, 2, 1, 1, "SAME", "NONE"),
    ((9, 2), 20, 9, 1, 1, "SAME", "NONE"),  # 9 channels: one stage per pixel
    ((8, 8), 16, 16, 1, 1, "SAME", "RELU6"),
    ((3, 3), 96, 24, 1, 1, "SAME", "NONE"),  # a deep one-tap reduction: the unsigned copy
    ((2, 5), 68, 6, 1, 1, "SAME", "RELU6"),
]


def model(case, seed, per_channel):
    hw, cin, cout, k, stride, padding, act = case
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (cout, k, k, cin), dtype=np.int8)
    bias = rng.integers(-3000, 3000, cout).astype(np.int32)
    w_scale = rng.uniform(0.002, 0.02, cout) if per_channel else 0.01
    return O.conv2d_model(
        (1, *hw, cin), w, bias, 0.05, -3, w_scale, 0.3, 4, (stride, stride), padding, activation=act
    )


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}->{c[2]} k{c[3]}s{c[4]}" for c in CASES])
@pytest.mark.parametrize("per_channel", [False, True])
def test_narrow_convolutions_are_exact(case, per_channel):
    m = model(case, 3, per_channel)
    hw, cin = case[0], case[1]
    for n in (1, 3):
        x = np.random.default_rng(n).integers(-128, 128, (n, *hw, cin), dtype=np.int8)
        O.assert_same(O.run_tflm(m, x), O.run_npusim(m, x, backend="vnni"), f"tflm {case} n={n}")
        for profile in ("single", "xnnpack"):
            O.assert_same(
                O.run_npusim(m, x, profile, backend="blas"),
                O.run_npusim(m, x, profile, backend="vnni"),
                f"{profile} {case} n={n}",
            )
    x = np.random.default_rng(9).integers(-128, 128, (2, *hw, cin), dtype=np.int8)
    O.assert_same(O.run_litert(m, x), O.run_npusim(m, x, "xnnpack", backend="vnni"), f"litert {case}")


@pytest.mark.parametrize("cout", [1, 5, 8, 13])
@pytest.mark.parametrize("depth", [40, 200])
def test_narrow_fully_connected_is_exact(cout, depth):
    rng = np.random.default_rng(cout)
    w = rng.integers(-127, 128, (cout, depth), dtype=np.int8)
    m = O.fully_connected_model(
        (1, depth), w, rng.integers(-500, 500, cout).astype(np.int32), 0.05, 2, 0.01, 0.2, -1
    )
    for n in (1, 13, 25):
        x = rng.integers(-128, 128, (n, depth), dtype=np.int8)
        O.assert_same(O.run_tflm(m, x), O.run_npusim(m, x, backend="vnni"), f"fc {cout} n={n}")
