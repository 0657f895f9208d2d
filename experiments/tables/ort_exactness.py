"""How often --profile onnxruntime equals ONNX Runtime, per one-op case family, on random geometries
and quantizations (quantize_static on seeded calibration data): the share of cases bit-exact and
of output elements equal, npusim running the .onnx model itself (importer) against ORT's optimized
run, and for the QDQ families against its unoptimized run (the literal QDQ semantics).

    python -m experiments.tables.ort_exactness --cases 12     # Markdown table on stdout
    python -m experiments.tables.ort_exactness --models 4 --shared ../shared   # the shared ONNX models
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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


def _either(rng) -> str:
    return str(rng.choice(["int8", "uint8"]))


def families():
    """{name: (make(rng) -> Case, whether ORT's optimized run is the reference)}."""
    from npusim.testing import onnx_twins as T

    def gemm(rng, **kw):
        kind = str(rng.choice(["Gemm", "MatMul"]))
        return T.gemm_case(
            rng, int(rng.integers(1, 300)), int(rng.integers(1, 24)), kind, bool(rng.integers(2)), **kw
        )

    def leaky(rng):
        return T.unary_case(rng, "LeakyRelu", "int8", alpha=float(rng.uniform(0.01, 0.5)))

    def pool(kind, shape, fmt="QOperator", **kw):
        return lambda rng: T.pool_case(rng, kind, shape, n=4, fmt=fmt, **kw)

    return {
        "Conv int8 (QOperator)": (_conv, True),
        "Conv uint8, 8-bit weights": (lambda rng: _conv(rng, activation="uint8"), True),
        "Conv uint8, reduce_range": (lambda rng: _conv(rng, activation="uint8", reduce_range=True), True),
        "depthwise Conv int8": (lambda rng: _conv(rng, depthwise=True), True),
        "depthwise Conv uint8": (lambda rng: _conv(rng, depthwise=True, activation="uint8"), True),
        "Gemm / MatMul int8": (gemm, True),
        "Gemm / MatMul uint8, 8-bit weights": (lambda rng: gemm(rng, activation="uint8"), True),
        "Add int8 (every pair)": (lambda rng: T.binary_case(rng, "Add"), True),
        "Add uint8 (every pair)": (lambda rng: T.binary_case(rng, "Add", "uint8"), True),
        "Mul int8 / uint8 (every pair)": (lambda rng: T.binary_case(rng, "Mul", _either(rng)), True),
        "Sigmoid (every code)": (lambda rng: T.unary_case(rng, "Sigmoid", _either(rng)), True),
        "LeakyRelu (every code)": (leaky, True),
        "AveragePool (QOperator)": (pool("AveragePool", (1, 3, 9, 9), kernel=(3, 3), stride=(2, 2)), True),
        "Softmax (QOperator)": (pool("Softmax", (1, 24)), True),
        "GlobalAveragePool (QDQ, fused)": (pool("GlobalAveragePool", (1, 8, 5, 6), "QDQ"), True),
        "QDQ Conv vs literal": (lambda rng: _conv(rng, qdq=True), False),
        "QDQ Add vs literal": (lambda rng: T.binary_case(rng, "Add", qdq=True), False),
        "QDQ Mul vs literal": (lambda rng: T.binary_case(rng, "Mul", qdq=True), False),
        "QDQ AveragePool vs literal": (pool("AveragePool", (1, 3, 8, 8), "QDQ"), False),
    }


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


MODELS = {
    "face landmarks 192": ("face_landmarks_v1_192_int8_pc.onnx", 192),
    "YOLO26n-256": ("yolo26_256_qdq_int8_od_coco-person-st.onnx", 256),
}


def measure_models(shared: Path, n: int) -> list[str]:
    """ST's shared QDQ models on n EuroSAT test images: each profile's share of output elements equal
    to and within one step of ORT's unoptimized run (ORT_DISABLE_ALL, at ORT's default thread count;
    npusim at the same, NPUSIM_ORT_THREADS unset) and of its optimized run, and cosines."""
    import npusim
    from experiments.bench.onnx_row import eurosat_batch
    from npusim.testing import onnx_oracle as oo

    lines = [
        f"| model ({n} EuroSAT images) | run | equal to ORT unoptimized | within 1 step of it "
        "| within 1 step of ORT optimized | cosine to unoptimized |",
        "|---|---|---|---|---|---|",
    ]
    for name, (fname, size) in MODELS.items():
        model = (shared / "models" / "onnx" / fname).read_bytes()
        x = eurosat_batch(shared, n, size)
        scale, zp = oo.output_quantization(model)
        runs = {
            "ORT optimized": oo.run_ort(model, x, threads=0),
            "ORT unoptimized": oo.run_ort(model, x, optimize=False, threads=0),
        }
        graph = npusim.load_model(model)
        for profile in ("onnxruntime", "tflm"):
            runs[f"npusim {profile}"] = npusim.Interpreter(graph, profile=profile).run(x)
        opt, lit = (oo.output_steps(runs[k], scale, zp) for k in ("ORT optimized", "ORT unoptimized"))
        for run, y in runs.items():
            c = oo.output_steps(y, scale, zp)
            lines.append(
                f"| {name} | {run} | {float(np.mean(c == lit)):.4f} | {oo.within_one_step(c, lit):.4f} | "
                f"{oo.within_one_step(c, opt):.4f} | {oo.cosine(y, runs['ORT unoptimized']):.6f} |"
            )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.tables.ort_exactness", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--cases", type=int, default=12, help="random cases per family")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--models", type=int, default=0, help="also ST's shared ONNX models on N EuroSAT images")
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    args = p.parse_args(argv)
    if args.models:
        print("\n".join(measure_models(args.shared, args.models)))
        return 0
    print(f"| family ({args.cases} cases each) | against | cases bit-exact | elements equal | largest diff |")
    print("|---|---|---|---|---|")
    for name, (make, optimized) in families().items():
        exact, share, worst = measure(make, optimized, args.cases, args.seed)
        against = "ORT (default)" if optimized else "ORT_DISABLE_ALL"
        print(f"| {name} | {against} | {exact}/{args.cases} | {share:.5f} | {worst} |", flush=True)
        print(f"  {name}: {exact}/{args.cases}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
