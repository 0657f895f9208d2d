"""The ONNX row of `make bench`: ST's YOLO26n-256 QDQ model (../shared/models/onnx) on a batch of
EuroSAT images, npusim (--profile onnxruntime, the whole batch in one call) against ONNX Runtime on
2 intra-op threads (default optimizations; the model's batch is 1, so ORT runs the images one by
one in one session, as a user of this file would). The two sides' repetitions are interleaved
(npusim, ORT, npusim, ORT, ...) so that a change in the machine's load falls on both.

    python -m experiments.bench.onnx_row --shared ../shared   # this row alone
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

MODEL = "yolo26_256_qdq_int8_od_coco-person-st.onnx"
ORT_THREADS = 2


def eurosat_batch(shared: Path, n: int, size: int) -> np.ndarray:
    """n EuroSAT test images resized to size x size, NCHW float32 pixels on [0, 1] (the model's input)."""
    from zo.data import load_dataset, resize_images

    images = load_dataset(shared / "data" / "eurosat64_subset.npz").x_test[:n]
    x = np.transpose(resize_images(images, size), (0, 3, 1, 2)).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray(x)


def interleaved(fns: dict, reps: int) -> dict:
    """{name: [seconds per repetition]}, the functions called in turn, after one untimed call each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def bench_yolo26(shared: Path, batch: int = 8, reps: int = 5, log=print) -> list[str]:
    """The report's section: Markdown lines (a one-row table and its notes)."""
    import npusim
    from npusim.testing import onnx_oracle as oo

    path = shared / "models" / "onnx" / MODEL
    if not path.exists():
        return [f"Skipped: {path} not found (pass --shared, the folder that holds models/onnx/).", ""]
    model = path.read_bytes()
    x = eurosat_batch(shared, batch, 256)
    sim = npusim.Interpreter(npusim.load_model(model), profile="onnxruntime")
    sess = oo.session(model, optimize=True, threads=ORT_THREADS)
    name = sess.get_inputs()[0].name
    outputs: dict = {}

    def run_npusim():
        outputs["npusim"] = sim.run(x)

    def run_ort():
        outputs["ort"] = np.concatenate([sess.run(None, {name: x[i : i + 1]})[0] for i in range(batch)])

    log(f"YOLO26-256 (ONNX), batch {batch}: npusim onnxruntime vs ORT ({ORT_THREADS} threads), {reps} reps")
    times = interleaved({"npusim": run_npusim, "ort": run_ort}, reps)
    t_sim, t_ort = statistics.median(times["npusim"]), statistics.median(times["ort"])
    scale, zp = oo.output_quantization(model)
    literal = oo.run_ort(model, x, optimize=False)  # untimed: ORT's literal QDQ semantics
    sim_c, ort_c, lit_c = (
        oo.output_steps(y, scale, zp) for y in (outputs["npusim"], outputs["ort"], literal)
    )
    agree, ort_agree = oo.within_one_step(sim_c, ort_c), oo.within_one_step(lit_c, ort_c)
    log(f"  npusim {t_sim * 1e3:.0f} ms, ORT {t_ort * 1e3:.0f} ms, ratio {t_ort / t_sim:.2f}")

    def ms(ts):
        return f"{statistics.median(ts) * 1e3:.0f} [{min(ts) * 1e3:.0f}-{max(ts) * 1e3:.0f}]"

    return [
        "| model | batch | npusim onnxruntime ms | ORT 2 threads ms | ORT / npusim | within 1 step: npusim "
        "| within 1 step: ORT unoptimized |",
        "|---|---|---|---|---|---|---|",
        f"| YOLO26n-256 QDQ int8 | {batch} | {ms(times['npusim'])} | {ms(times['ort'])} | "
        f"{t_ort / t_sim:.2f} | {agree:.4f} | {ort_agree:.4f} |",
        "",
        f"Medians [min-max] of {reps} interleaved repetitions after one untimed call each, for the whole "
        f"batch of {batch} EuroSAT test images resized to 256x256 (pixels on [0, 1]). npusim: "
        "`Interpreter(model, profile='onnxruntime').run(x)` on the batch, default threads. ORT "
        f"{_ort_version()}: CPUExecutionProvider, ORT_ENABLE_ALL, intra_op_num_threads={ORT_THREADS}, "
        "one image per run (the file's batch is 1). The ratio is a throughput ratio (>1: npusim faster). "
        "The last two columns: the share of output elements within one output step of ORT's optimized "
        "(timed) run, for npusim and for ORT's own unoptimized run (ORT_DISABLE_ALL, the literal QDQ "
        "semantics; untimed); see docs/numerics.md.",
        "",
    ]


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.bench.onnx_row", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    import npusim

    npusim.tune_process()
    lines = bench_yolo26(
        args.shared, args.batch, args.reps, log=lambda m: print(m, file=sys.stderr, flush=True)
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
