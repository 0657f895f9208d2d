"""The AVX2 kernels as an AVX2-only CPU runs them.

On an AVX-512 host, backend="avx2" (the oracle tests' avx2 path) compiles the AVX2 kernels for that
host, and LLVM may then use AVX-512 instructions in them (it fuses VPMADDWD and its add into
VPDPWSSD). Here a fresh process compiles them for Haswell (NUMBA_CPU_NAME=haswell with no extra
features: NUMBA_CPU_NAME alone keeps the host's features), where "auto" selects the avx2 engine and
the AVX2 depthwise form, checks that the machine code holds VPMADDWD on YMM registers and no ZMM
register, VPDPBUSD or VPDPWSSD, and holds CONV_2D, FULLY_CONNECTED and DEPTHWISE_CONV_2D to TFLM on
shapes that reach every branch (pixel and channel tails, odd channel counts, row runs and dilated
taps, strides, paddings, depth multipliers, batch), with extreme data where a stray product shows;
and the VPSHUFB byte-table lookup against numpy's indexing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rounding_ties import tie_cases

from npusim.kernels import host
from npusim.testing import oracle as O

import cases as C
from kernel_paths import run_compiled_for

CHILD = """
import pickle
from npusim.kernels import host
import numpy as np
from npusim.kernels import avx2, backend, depthwise, lookup
from npusim.testing import oracle as O

assert host.has_avx2() and not host.has_vnni() and not host.has_amx(), "not compiling for Haswell"
selection = backend.select()
assert selection.name == "avx2" and selection.depthwise_variant() == "avx2", selection
with open({cases!r}, "rb") as f:
    cases = pickle.load(f)
for name, model, xs, expected, profile in cases:
    O.assert_same(expected, O.run_npusim(model, xs, profile), name)
# Each kernel's serial and threaded forms, whichever the cases compiled (at least one of them, or
# the check would pass on nothing).
for kernel in (avx2.conv_avx2, avx2.conv_avx2_int8, depthwise.depthwise_kernel("avx2")):
    code = list(kernel.serial.inspect_asm().values()) + list(kernel.threaded.inspect_asm().values())
    assert code, kernel
    for asm in code:
        assert "vpmaddwd" in asm and "ymm" in asm, kernel
        for other in ("zmm", "vpdpbusd", "vpdpwssd"):
            assert other not in asm, (kernel, other)
# The byte-table lookup (VPSHUFB) at sizes around its vector and task sizes, every index value.
rng = np.random.default_rng(5)
for n in (1, 31, 32, 33, 256, 1000, lookup.CHUNK + 33):
    table = rng.integers(0, 256, 256, dtype=np.uint8)
    x = np.arange(n, dtype=np.uint8) if n == 256 else rng.integers(0, 256, n, dtype=np.uint8)
    assert np.array_equal(lookup.lookup(table, x, np.empty(n, np.uint8)), table[x]), n
forms = (lookup.lookup_avx2.serial, lookup.lookup_avx2.threaded)
code = [asm for form in forms for asm in form.inspect_asm().values()]
assert code and all("vpshufb" in asm and "zmm" not in asm for asm in code)
print("avx2 code path: all equal")
"""

BASE_CONV = dict(
    n=2,
    kh=3,
    kw=3,
    stride=(1, 1),
    dilation=(1, 1),
    padding="SAME",
    hw=(9, 11),
    cin=16,
    cout=16,
    activation="NONE",
    per_channel=True,
    in_scale=0.05,
    in_zp=-7,
    out_zp=3,
    mult_mode="typical",
    x_mode="extreme",
    w_mode="extreme",
    bias_mode="uniform",
)
CONV = [
    dict(),
    dict(cin=3, cout=16, stride=(2, 2), hw=(13, 12), activation="RELU6", x_mode="uniform"),
    dict(cin=1, cout=8, kh=5, kw=3, padding="VALID"),
    dict(cin=7, cout=17, dilation=(2, 2)),
    dict(cin=33, cout=40, dilation=(1, 2), stride=(1, 2)),
    dict(cin=64, cout=64, hw=(6, 7), n=3, activation="RELU"),
    dict(cin=8, cout=48, kh=1, kw=1, hw=(8, 8)),
    dict(cin=13, cout=1, kh=1, kw=1, padding="VALID", w_mode="uniform"),
    dict(cin=96, cout=24, kh=1, kw=1, stride=(2, 2), hw=(5, 5)),
    dict(cin=5, cout=9, kh=2, kw=4, stride=(2, 3), dilation=(2, 1), padding="VALID", hw=(10, 13)),
    # pointwise layers of up to 16 output channels on the int8 input itself (avx2.conv_avx2_int8),
    # the zero point in the offset; above 16, on the widened copy
    dict(cin=64, cout=16, kh=1, kw=1, in_zp=-128, hw=(7, 5)),
    dict(cin=2, cout=9, kh=1, kw=1, stride=(2, 1), padding="VALID", in_zp=127, hw=(5, 6)),
    dict(cin=64, cout=40, kh=1, kw=1, in_zp=-128, hw=(7, 5)),
    dict(cin=2, cout=17, kh=1, kw=1, stride=(2, 1), padding="VALID", in_zp=127, hw=(5, 6)),
]
BASE_FC = dict(
    n=5,
    layout="2d",
    in_shape=(1, 37),
    units=20,
    activation="NONE",
    per_channel=True,
    in_scale=0.02,
    in_zp=-128,
    out_zp=3,
    mult_mode="typical",
    x_mode="extreme",
    w_mode="extreme",
    bias_mode="large",
)
FC = [dict(), dict(in_shape=(1, 1), units=1), dict(in_shape=(1, 2049), units=33, in_zp=5), dict(units=64)]
DEPTHWISE = [
    (8, (5, 5), (1, 1)),
    (16, (5, 9), (1, 1)),
    (32, (4, 7), (2, 1)),
    (48, (6, 9), (2, 2)),
    (72, (7, 6), (1, 2)),
    (80, (5, 5), (1, 1)),
    (200, (5, 4), (2, 2)),
]
BASE_DEPTHWISE = dict(
    n=2,
    kh=3,
    kw=3,
    stride=(1, 1),
    dilation=(1, 1),
    padding="SAME",
    hw=(6, 7),
    cin=24,
    mult=1,
    activation="NONE",
    per_channel=True,
    in_scale=0.05,
    in_zp=-128,
    out_zp=5,
    mult_mode="typical",
    x_mode="extreme",
    w_mode="extreme",
    bias_mode="uniform",
)
DEPTHWISE_MORE = [
    dict(),
    dict(cin=67, kh=5, kw=5, dilation=(2, 1), in_zp=9),
    dict(cin=6, mult=2, stride=(2, 2)),
    dict(cin=64, kh=2, kw=2, padding="VALID", hw=(9, 9)),
]


def all_cases() -> list:
    cases = []
    for i, p in enumerate(CONV):
        cases.append(C.make_conv(dict(BASE_CONV, **p), seed=i))
    for i, p in enumerate(FC):
        cases.append(C.make_fc(dict(BASE_FC, **p), seed=i))
    for i, (channels, hw, stride) in enumerate(DEPTHWISE):
        cases.append(C.depthwise_case(channels, hw, stride, seed=i))
    for i, p in enumerate(DEPTHWISE_MORE):
        cases.append(C.make_depthwise(dict(BASE_DEPTHWISE, **p), seed=i))
    # every input code on the output stage's ties and on a multiplier that truncation would change
    cases += tie_cases(["CONV_2D 1x1", "CONV_2D 3x3", "FULLY_CONNECTED", "DEPTHWISE_CONV_2D"])
    return cases


@pytest.mark.skipif(not host.has_avx2(), reason="this CPU has no AVX2: the AVX2 path is NOT tested here")
def test_avx2_code_matches_tflm(tmp_path: Path):
    cases = []
    for case in all_cases():
        expected = O.run_tflm(case.model, case.xs)
        cases.append((case.desc, case.model, case.xs, expected, "tflm"))
    case = C.make_conv(dict(BASE_CONV, cin=20, cout=24), seed=99)
    cases.append((case.desc + ", xnnpack", case.model, case.xs, O.run_litert(case.model, case.xs), "xnnpack"))
    run_compiled_for("haswell", CHILD, cases, tmp_path)
