"""How often --profile onnxruntime equals ONNX Runtime, per one-op case family, on random geometries
and quantizations (quantize_static on seeded calibration data): the share of cases bit-exact and
of output elements equal, npusim running the .onnx model itself (importer) against ORT's optimized
run, and for the QDQ families against its unoptimized run (the literal QDQ semantics).

    python -m experiments.ort_exactness --cases 12     # Markdown table on stdout
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def _conv(rng, depthwise=False, **kw):
    from npusim.testing import onnx_twins as T

    c = int(rng.integers(1, 17))
    h, w = int(rng.integers(3, 13)), int(rng.integers(3, 13))
    k = int(rng.choice([1, 2, 3, 5]))
    stride, dilation = int(rng.integers(1, 4)), int(rng.choice([1, 1, 2]))
    if (k - 1) * dilation + 1 > min(h, w):
        dilation = 1
    padding = str(rng.choice(["SAME", "VALID"])) if k <= min(h, w) else "SAME"
    per_channel = bool(rng.integers(2))
    out_c = int(rng.integers(1, 17))
    return T.conv_case(rng, (1, c, h, w), out_c, k, stride, dilation, padding, depthwise, per_channel, **kw)


def families():
    from npusim.testing import onnx_twins as T

    rng_gemm = lambda rng, **kw: T.gemm_case(  # noqa: E731
        rng, int(rng.integers(1, 300)), int(rng.integers(1, 24)), str(rng.choice(["Gemm", "MatMul"])),
        bool(rng.integers(2)), **kw,
    )  # fmt: skip
    return {
        "Conv int8 (QOperator)": (lambda rng: _conv(rng), True),
        "Conv uint8, 8-bit weights": (lambda rng: _conv(rng, activation="uint8"), True),
        "Conv uint8, reduce_range": (lambda rng: _conv(rng, activation="uint8", reduce_range=True), True),
        "depthwise Conv int8": (lambda rng: _conv(rng, depthwise=True), True),
        "depthwise Conv uint8": (lambda rng: _conv(rng, depthwise=True, activation="uint8"), True),
        "Gemm / MatMul int8": (lambda rng: rng_gemm(rng), True),
        "Gemm / MatMul uint8, 8-bit weights": (lambda rng: rng_gemm(rng, activation="uint8"), True),
        "Add int8 (every pair)": (lambda rng: T.binary_case(rng, "Add"), True),
        "Add uint8 (every pair)": (lambda rng: T.binary_case(rng, "Add", "uint8"), True),
        "Mul int8 / uint8 (every pair)": (lambda rng: T.binary_case(rng, "Mul", str(rng.choice(["int8", "uint8"]))), True),
        "Sigmoid (every code)": (lambda rng: T.unary_case(rng, "Sigmoid", str(rng.choice(["int8", "uint8"]))), True),
        "LeakyRelu (every code)": (
            lambda rng: T.unary_case(rng, "LeakyRelu", "int8", alpha=float(rng.uniform(0.01, 0.5))), True,
        ),
        "AveragePool (QOperator)": (
            lambda rng: T.pool_case(rng, "AveragePool", (1, 3, 9, 9), (3, 3), (2, 2), n=4), True,
        ),
        "Softmax (QOperator)": (lambda rng: T.pool_case(rng, "Softmax", (1, int(rng.integers(2, 40))), n=8), True),
        "GlobalAveragePool (QDQ, fused)": (
            lambda rng: T.pool_case(rng, "GlobalAveragePool", (1, 8, 5, 6), n=4, fmt="QDQ"), True,
        ),
        "QDQ Conv vs literal": (lambda rng: _conv(rng, qdq=True), False),
        "QDQ Add vs literal": (lambda rng: T.binary_case(rng, "Add", qdq=True), False),
        "QDQ Mul vs literal": (lambda rng: T.binary_case(rng, "Mul", qdq=True), False),
        "QDQ AveragePool vs literal": (
            lambda rng: T.pool_case(rng, "AveragePool", (1, 3, 8, 8), n=4, fmt="QDQ"), False,
        ),
    }  # fmt: skip


def measure(make, optimized: bool, cases: int, seed: int):
    from npusim.errors import NpusimError
    from npusim.testing import onnx_oracle as oo

    exact = equal = total = worst = 0
    for i in range(cases):
        case = make(np.random.default_rng([seed, i]))
        ref = case.ort_codes(optimize=optimized)
        try:
            sim = case.npusim_onnx_codes()
        except NpusimError:  # a com.microsoft output without a shape (see the tests)
            case.onnx = oo.with_value_info(case.onnx)
            sim = case.npusim_onnx_codes()
        d = np.abs(ref - sim)
        exact += int(d.max() == 0)
        equal += int(np.sum(d == 0))
        total += d.size
        worst = max(worst, int(d.max()))
    return exact, equal / total, worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.ort_exactness", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--cases", type=int, default=12, help="random cases per family")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(
        f"| family ({args.cases} cases each) | against | cases bit-exact | elements equal | largest difference |"
    )
    print("|---|---|---|---|---|")
    for name, (make, optimized) in families().items():
        exact, share, worst = measure(make, optimized, args.cases, args.seed)
        against = "ORT (default)" if optimized else "ORT_DISABLE_ALL"
        print(f"| {name} | {against} | {exact}/{args.cases} | {share:.5f} | {worst} |", flush=True)
        print(f"  {name}: {exact}/{args.cases}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
