"""The generic vector code, as a host without AVX-512 VNNI runs it.

The ADD kernel picks VNNI instructions or generic LLVM vector code when Numba compiles it, by the
host's features; DEPTHWISE_CONV_2D takes its generic form from the backend selection (the oracle
tests run it in-process with backend="blas"), but on a VNNI host that code is still compiled for a
CPU with AVX-512. Here a fresh process compiles both for a plain x86-64 (NUMBA_CPU_NAME=generic, in
a temporary Numba cache), where "auto" selects the generic forms, and its outputs are held to TFLM's.
Numba empties the features itself for "generic"; NUMBA_CPU_FEATURES is set empty all the same, as
it must be for a named CPU such as haswell (test_avx2_cpu.py), whose name alone keeps the host's.
"""

from __future__ import annotations

from pathlib import Path

from test_rounding_ties import PAIR_TIES, tie_cases

from npusim.testing import oracle as O

import cases as C
from kernel_paths import run_compiled_for

CHILD = """
import pickle
from npusim.kernels import host
from npusim.kernels import backend
from npusim.testing import oracle as O

assert not host.has_vnni() and not host.has_amx(), "the generic code path was not selected"
assert not backend.select().runs_vnni(), "the depthwise kernel would take its VNNI form"
with open({cases!r}, "rb") as f:
    cases = pickle.load(f)
for name, model, xs, expected, profile in cases:
    got = O.run_npusim(model, xs, profile)
    O.assert_same(expected, got, name)
print("generic code path: all equal")
"""


def test_generic_vector_code_matches_tflm(tmp_path: Path):
    cases = []
    for channels, hw, stride in [
        (16, (5, 9), (1, 1)),
        (32, (4, 7), (2, 1)),
        (48, (6, 9), (2, 2)),
        (80, (5, 5), (1, 1)),
    ]:
        case = C.depthwise_case(channels, hw, stride)
        cases.append((case.desc, case.model, case.xs, O.run_tflm(case.model, case.xs), "tflm"))
    # every input code on the output stage's ties and on a multiplier that truncation would change
    for case in tie_cases(["CONV_2D 1x1", "DEPTHWISE_CONV_2D"]):
        cases.append((case.desc, case.model, case.xs, O.run_tflm(case.model, case.xs), "tflm"))
    pairs = C.every_int8_pair()
    add = O.add_model((1, 65536), (1, 65536), 0.05, 3, 0.02, -7, 0.07, 1, "RELU6")
    cases.append(("ADD of every int8 pair, profile tflm", add, pairs, O.run_tflm(add, pairs), "tflm"))
    # the xnnpack profile's ADD is XNNPACK's arithmetic, proven against LiteRT's default interpreter
    cases.append(("ADD of every int8 pair, profile xnnpack", add, pairs, O.run_litert(add, pairs), "xnnpack"))
    ties = O.add_model((1, 65536), (1, 65536), *PAIR_TIES[1])
    cases.append(
        (f"ADD of every int8 pair on ties, {PAIR_TIES[1]}", ties, pairs, O.run_tflm(ties, pairs), "tflm")
    )
    run_compiled_for("generic", CHILD, cases, tmp_path)
