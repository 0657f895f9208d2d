"""Speed benchmark: npusim against LiteRT (XNNPACK) and TFLite Micro, with exactness checks.

    python -m experiments.bench --shared ../shared [--quick] [--out experiments/results/bench.md]
                                [--only all|conv|paths|models|yolo|onnx|zo|oneshot] [--conv-batches 1,16]
                                [--model-batches 64,256] [--yolo-batches 8] [--no-haswell]

One run times
  1. a one-op CONV_2D 1x56x56x64 -> 64, 3x3, SAME, stride 1, per-channel int8 weights, RELU (built
     by npusim.testing.oracle, the builder of the tests) at batch 1 and 16;
  2. each shared model (ResNet-8 CIFAR-10, MobileNetV2 0.35 128 flowers) at batch 64 and 256;
  3. ST's YOLOv8n-256 person detector for the STM32N6 (uint8 input, float output) at batch 8, on
     EuroSAT-64 images resized to 256x256 (PIL bilinear);
  4. ST's YOLO26n-256 QDQ ONNX model at batch 8 under --profile onnxruntime against ONNX Runtime
     (experiments/bench/onnx_row.py, its own section of the report);
  5. one shot: `npusim run` in a fresh process against a LiteRT script, each shared model on 1 image
     and the largest --model-batches (experiments/bench/oneshot.py, its own section);
with npusim (profile tflm, `Interpreter.run` on the whole batch), LiteRT's default interpreter
(XNNPACK, 2 threads, input resized to the batch) and TFLM (batch 1 per invoke: a few single images
are timed and the per-image median is multiplied by N). Every time is the median over repetitions
after a warm-up call (npusim's first call loads or compiles its Numba kernels; XNNPACK packs its
weights on the first invoke), npusim's and LiteRT's repetitions in turn (bench_timing.interleaved).

Exactness is checked on the timed inputs: npusim (tflm) against TFLM on the images TFLM ran, and
npusim (xnnpack profile) against LiteRT on the whole timed batch. Speed without exactness means
nothing, so every row says whether its outputs were equal.
Unless --quick or --no-breakdown, a breakdown section times the stages of Conv2D.__call__ and the
time spent per step of Interpreter.run in each model (the kernels run() folds away named).
Unless --no-haswell, a fresh process compiled for Haswell (NUMBA_CPU_NAME=haswell, VNNI and AMX
off: the avx2 path) times the conv and both models at their largest batch on the same inputs, checks
its outputs against this process's, and measures the avx2 kernel paths, set beside this run's LiteRT
and TFLM figures: AVX2 code on this host, not an AVX2-only CPU (skipped where AVX2 code cannot run).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from pathlib import Path

import numpy as np

from . import onnx_row as bench_onnx
from .haswell import haswell_unsupported, run_haswell
from .machine import cpu_ticks
from .oneshot import bench_one_shot, first_call_lines
from .paths import conv_stages, kernel_path_rates, op_breakdown, path_settings
from .report import Results, render
from .timing import bench_workload, fmt_ms, median_time, memory_of_run, timings
from .workloads import ALL_MODELS, MODELS, TFLM_ARENA, YOLO_MODELS, bench_inputs, conv_model

__all__ = ["ALL_MODELS", "MODELS", "YOLO_MODELS", "build_parser", "haswell_unsupported", "main"]


DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "bench.md"


def parse_batches(s: str) -> list[int]:
    try:
        b = [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes, got {s!r}") from None
    if not b or any(v < 1 for v in b):
        raise argparse.ArgumentTypeError(f"expected positive batch sizes, got {s!r}")
    return b


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shared", type=Path, default=Path("../shared"), help="the shared folder (models/, data/)"
    )
    p.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="Markdown report (default experiments/results/bench.md)"
    )
    p.add_argument(
        "--only",
        choices=("all", "conv", "paths", "models", "yolo", "onnx", "zo", "oneshot"),
        default="all",
        help="which workloads to run",
    )
    p.add_argument("--conv-batches", type=parse_batches, default=[1, 16], help="default 1,16")
    p.add_argument("--model-batches", type=parse_batches, default=[64, 256], help="default 64,256")
    p.add_argument("--yolo-batches", type=parse_batches, default=[8], help="YOLOv8n-256, default 8")
    p.add_argument("--no-breakdown", action="store_true", help="skip the per-stage / per-op breakdown")
    p.add_argument(
        "--no-haswell",
        action="store_true",
        help="skip the AVX2 code compiled for Haswell (a child process; its first run compiles)",
    )
    return p


def bench_zo_step(shared: Path, reps: int, q: int = 16, batch: int = 32) -> list[str]:
    """Simulator wall time of one ZO step over the time of its 2q forward passes run plainly (full
    model, batch by batch), both on npusim: what the prefix cache and the batched probes save."""
    import npusim
    from zo.data import load_dataset, subset
    from zo.inputs import prepare_inputs
    from zo.trainer import TrainConfig, Trainer

    model = shared / "models" / MODELS["resnet8"]
    data_path = shared / "data" / "eurosat32_subset.npz"
    data = subset(load_dataset(data_path), 1024, 200)
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(
            model=str(model),
            data=str(data_path),
            trainable="last:4",
            q=f"fixed:{q}",
            batch=batch,
            budget=10**9,
            checkpoint_every=10**9,
        )
        trainer = Trainer(cfg, out, dataset=data)
        trainer.train_step(q)  # warm-up: compiles or loads the kernels
        step_times = timings(lambda: trainer.train_step(q), reps, warmup=0)
    interp = npusim.Interpreter(model)
    x = prepare_inputs(data.x_train[:batch], trainer.model.graph)
    forward = median_time(lambda: interp.run(x), reps)
    step = float(np.median(step_times))
    ratio = step / (2 * q * forward)
    names = ", ".join(p.name.split("/")[-1][:40] for p in trainer.model.params)
    return [
        "## ZO step against plain forward passes",
        "",
        "| workload | batch | q | ZO step ms | one forward pass of "
        "the batch ms | 2q forward passes ms | ratio (target < 0.5) |",
        "|---|---|---|---|---|---|---|",
        f"| ResNet-8 last:4 (last residual block + classifier) | {batch} | {q} | {fmt_ms(step)} | "
        f"{fmt_ms(forward)} | {fmt_ms(2 * q * forward)} | {ratio:.3f} "
        f"{'(met)' if ratio < 0.5 else '(MISSED)'} |",
        "",
        f"Trainable tensors: {names}. The step includes gathering the batch, the 2q perturbed passes of the "
        "trainable suffix on the cached prefix activations (one batched call), the host loss, regenerating "
        f"the directions, the Adam update and the int8 write-back. Median of {len(step_times)} steps; "
        "forward: median of `Interpreter.run` on the batch.",
        "",
    ]


def repetitions(args, batches, fast: int, slow: int) -> dict:
    """Timed calls per batch size: `fast` for small batches, `slow` for large ones, 2 with --quick."""
    return {n: (2 if args.quick else (fast if n <= 16 else slow)) for n in batches}


def bench_conv(args, results: Results, log):
    log("CONV_2D 1x56x56x64 -> 64, 3x3, SAME")
    model = conv_model()
    n_max = max(args.conv_batches)
    x = np.random.default_rng(2).integers(-128, 128, (n_max, 56, 56, 64), dtype=np.int8)
    reps = {
        "npusim": repetitions(args, args.conv_batches, 15, 5),
        "litert": repetitions(args, args.conv_batches, 15, 5),
    }
    results.inputs["conv"] = (model, x, reps["npusim"])
    results.rows += bench_workload(
        "conv", model, x, args.conv_batches, reps, tflm_images=1 if args.quick else 3, log=log
    )
    results.notes.append(
        f"conv: {results.rows[-1].macs / 1e6:.1f} MMAC per image = 56*56*64*3*3*64 (npusim "
        "Interpreter.macs(); counted as 2 operations per MAC it is 231 M operations, and rates in GOPS "
        "are twice the GMAC/s of this table); random int8 input, per-channel weights, RELU."
    )
    if args.quick or args.no_breakdown:
        return
    nb_ = 16 if 16 in args.conv_batches else n_max
    log(f"  breakdown of Conv2D.__call__ at batch {nb_}")
    stages = conv_stages(model, np.ascontiguousarray(x[:nb_]), reps=7)
    macs = results.rows[-1].macs
    results.breakdown += [
        f"### Conv2D.__call__ stages, conv at batch {nb_} (median ms, tflm profile)",
        "",
        "| stage | ms | GMAC/s equiv. | ms, 1 thread | GMAC/s equiv., 1 thread |",
        "|---|---|---|---|---|",
    ]
    results.breakdown += [
        f"| {label} | {fmt_ms(t)} | {macs * nb_ / t / 1e9:.1f} | {fmt_ms(t1)} | {macs * nb_ / t1 / 1e9:.1f} |"
        for label, t, t1 in stages
    ]
    results.breakdown.append("")


def bench_models(args, results: Results, log):
    for name, fname in MODELS.items():
        bench_model(args, results, log, name, fname, args.model_batches, tflm_images=2 if args.quick else 16)


def bench_yolo(args, results: Results, log):
    """YOLOv8n-256 (STM32N6 person detector) at --yolo-batches: TFLM runs every image of the largest
    batch (about half a second each), 1 with --quick."""
    for name, fname in YOLO_MODELS.items():
        bench_model(
            args,
            results,
            log,
            name,
            fname,
            args.yolo_batches,
            tflm_images=1 if args.quick else max(args.yolo_batches),
            fast=5,
        )
        results.notes.append(
            f"{name}: float32 output (DEQUANTIZE of the int8 head): exact means bit-equal floats; LiteRT "
            "is fed image by image if its RESHAPEs keep batch 1 (see the row's note)."
        )


def bench_model(args, results: Results, log, name, fname, batches, tflm_images: int, fast: int = 11):
    """One shared model: its rows of the main table, its memory row and (unless --quick or
    --no-breakdown) its per-op breakdown at the largest batch."""
    import npusim

    path = args.shared / "models" / fname
    if not path.exists():
        raise SystemExit(f"{path}: not found (pass --shared, the folder that holds models/)")
    model = path.read_bytes()
    t_in = npusim.load_model(model).input(0)
    x, desc = bench_inputs(args.shared, name, max(batches), t_in.shape, t_in.dtype)
    results.notes.append(f"{name} inputs: {desc}.")
    log(f"{name} ({fname}), inputs: {desc}")
    reps = {"npusim": repetitions(args, batches, fast, 7), "litert": repetitions(args, batches, fast, 7)}
    results.inputs[name] = (model, x, reps["npusim"])
    results.rows += bench_workload(
        name, model, x, batches, reps, tflm_images=tflm_images, log=log, tflm_arena=TFLM_ARENA.get(name)
    )
    nb_ = max(batches)
    mem = memory_of_run(args.shared, name, nb_)
    growth = max(mem["after"]) - mem["after"][0]
    results.memory.append(
        f"| {name} | {nb_} | {mem['input_mb']:.1f} | {mem['setup']:.0f} | {mem['peak']:.0f} | "
        f"{mem['peak'] - mem['setup']:.0f} | "
        f"{' '.join(f'{v:.0f}' for v in mem['after'])} | {growth:+.1f} |"
    )
    if args.quick or args.no_breakdown:
        return
    log(f"  per-op breakdown at batch {nb_}")
    ops, folded = op_breakdown(model, np.ascontiguousarray(x[:nb_]), reps=3)
    total = sum(t for _, _, t, _ in ops)
    total1 = sum(t1 for _, _, _, t1 in ops)
    results.breakdown += [
        f"### {name} per step of Interpreter.run at batch {nb_} (median ms)",
        "",
        "| op kind | count | ms | share | ms, 1 thread | share, 1 thread |",
        "|---|---|---|---|---|---|",
    ]
    results.breakdown += [
        f"| {k} | {c} | {fmt_ms(t)} | {100 * t / total:.0f}% | {fmt_ms(t1)} | {100 * t1 / total1:.0f}% |"
        for k, c, t, t1 in ops
    ]
    results.breakdown += [
        f"| total | {sum(c for _, c, _, _ in ops)} | {fmt_ms(total)} | | {fmt_ms(total1)} | |",
        "",
        f"Folded away by run() (no time of their own): {folded}; PADs into the convolution that "
        "reads them, the other kernels into an elementwise chain's one lookup (runtime/chains.py).",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    import npusim

    npusim.tune_process()  # as the npusim and zo command lines run
    command = "python -m experiments.bench " + " ".join(argv)
    started = _dt.datetime.now().astimezone()
    load_start = os.getloadavg()
    ticks_start = cpu_ticks()

    def log(msg: str):
        print(msg, file=sys.stderr, flush=True)

    from .machine import cpu_family_model, cpu_flags, cpu_model

    log(f"CPU: {cpu_model()} ({cpu_family_model()}); features: {cpu_flags()}")
    results = Results()
    if args.only in ("all", "conv", "paths"):
        log("kernel paths")
        results.paths = kernel_path_rates(*path_settings(args), log)
    if args.only in ("all", "conv"):
        bench_conv(args, results, log)
    if args.only in ("all", "models"):
        bench_models(args, results, log)
    if args.only in ("all", "yolo"):
        bench_yolo(args, results, log)
    if args.only in ("all", "onnx"):  # YOLO26-256 ONNX against ONNX Runtime (experiments/bench/onnx_row.py)
        results.onnx = bench_onnx.bench_yolo26(args.shared, batch=8, reps=2 if args.quick else 5, log=log)
    if args.only in ("all", "oneshot"):  # fresh processes, start to output written (bench_oneshot.py)
        log("one shot: npusim run against a LiteRT script, 1 image and the largest model batch")
        sizes = [1, max(args.model_batches)]
        results.oneshot = bench_one_shot(
            args.shared, dict.fromkeys(MODELS, sizes), 1 if args.quick else 5, log
        )
        log("first call: a process's first Interpreter.run against its warm runs")
        firsts = {**dict.fromkeys(MODELS, sizes[1]), **dict.fromkeys(YOLO_MODELS, max(args.yolo_batches))}
        results.oneshot += first_call_lines(args.shared, firsts, 1 if args.quick else 5, log)
    run_haswell(args, results, log)
    if args.only in ("all", "zo"):
        log("ZO step: ResNet-8, last residual block + classifier (last:4), batch 32, q = 16")
        results.zo = bench_zo_step(args.shared, reps=3 if args.quick else 10)
    report = render(results, command, args.quick, started, load_start, ticks_start)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    log(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
