"""Speed benchmark: npusim against LiteRT (XNNPACK) and TFLite Micro, with exactness checks.

    python -m experiments.bench --shared ../shared [--quick] [--out experiments/results/bench.md]
                                [--only all|conv|paths|models|yolo|zo] [--conv-batches 1,16]
                                [--model-batches 64,256] [--yolo-batches 8] [--no-haswell]

One run times
  1. a one-op CONV_2D 1x56x56x64 -> 64, 3x3, SAME, stride 1, per-channel int8 weights, RELU (built
     by npusim.testing.oracle, the builder of the tests) at batch 1 and 16;
  2. each shared model (ResNet-8 CIFAR-10, MobileNetV2 0.35 128 flowers) at batch 64 and 256;
  3. ST's YOLOv8n-256 person detector for the STM32N6 (uint8 input, float output) at batch 8, on
     EuroSAT-64 images resized to 256x256 (PIL bilinear);
with npusim (profile tflm, `Interpreter.run` on the whole batch), LiteRT's default interpreter
(XNNPACK, 2 threads, input resized to the batch) and TFLM (batch 1 per invoke: a few single images
are timed and the per-image median is multiplied by N). Every time is the median over repetitions
after a warm-up call (npusim's first call loads or compiles its Numba kernels; XNNPACK packs its
weights on the first invoke).

Exactness is checked on the timed inputs: npusim (tflm) against TFLM on the images TFLM ran, and
npusim (xnnpack profile) against LiteRT on the whole timed batch. Speed without exactness means
nothing, so every row says whether its outputs were equal.
Unless --quick or --no-breakdown, a breakdown section times the stages of Conv2D.__call__ and the
time spent per op kind in each model.
Unless --no-haswell, a fresh process compiled for Haswell (NUMBA_CPU_NAME=haswell, VNNI and AMX
off: the avx2 path) times the conv and both models at their largest batch on the same inputs, checks
its outputs against this process's, and measures the avx2 kernel paths, set beside this run's LiteRT
and TFLM figures: AVX2 code on this host, not an AVX2-only CPU (skipped where AVX2 code cannot run).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npusim.testing import oracle

from . import bench_onnx
from .machine import (
    blas_threads,
    compile_target,
    cpu_flags,
    cpu_model,
    current_rss_mb,
    kernel_path,
    peak_rss_mb,
    process_peak_rss_mb,
    single_thread,
    versions,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench.md"
MODELS = {
    "resnet8": "resnet8_cifar10_int8.tflite",
    "mobilenet_v2": "mobilenet_v2_0.35_128_flowers_int8.tflite",
}
YOLO_MODELS = {"yolov8n_256": "stm32n6/yolov8n_256_quant_pc_uf_od_coco-person.tflite"}
ALL_MODELS = {**MODELS, **YOLO_MODELS}  # name -> path under <shared>/models
# TFLM arena per model where the default (oracle.tflm_interpreter) is too small
TFLM_ARENA = {"yolov8n_256": 64 << 20}
LITERT_THREADS = 2

# Floors and targets of the speed issue (throughput ratios, higher is better for npusim).
FLOOR_TFLM, FLOOR_LITERT = 20.0, 0.25
TARGET_TFLM, TARGET_LITERT = 50.0, 1.0


# ----------------------------------------------------------------------------------------------
# The one-op conv model
# ----------------------------------------------------------------------------------------------


def conv_model(seed: int = 0) -> bytes:
    """CONV_2D 1x56x56x64 -> 64, 3x3, SAME, stride 1, per-channel int8 weights, int32 bias, RELU."""
    rng = np.random.default_rng(seed)
    h, w, c, o, k = 56, 56, 64, 64, 3
    in_scale, in_zp = np.float32(0.05), -10
    w_scale = np.exp(rng.uniform(np.log(0.002), np.log(0.01), o)).astype(np.float32)
    weights = rng.integers(-127, 128, (o, k, k, c), dtype=np.int8)
    taps = k * k * c
    # Output scale: put a typical accumulator (~127*73*sqrt(taps)) at ~40 LSB of the output.
    typical = float(in_scale) * float(np.median(w_scale)) * 127 * 73 * np.sqrt(taps)
    out_scale, out_zp = np.float32(typical / 40.0), -20
    span = int(127 * 64 * np.sqrt(taps))
    bias = rng.integers(-span, span + 1, o).astype(np.int32)
    return oracle.conv2d_model(
        (1, h, w, c),
        weights,
        bias,
        in_scale,
        in_zp,
        w_scale,
        out_scale,
        out_zp,
        padding="SAME",
        activation="RELU",
    )


# ----------------------------------------------------------------------------------------------
# Timing and runtimes
# ----------------------------------------------------------------------------------------------


def timings(fn, reps: int, warmup: int = 1) -> list[float]:
    """Wall times of reps calls of fn(), after warmup calls that are not timed."""
    for _ in range(warmup):
        fn()
    times = []
    gc.collect()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn, reps: int, warmup: int = 1) -> float:
    return statistics.median(timings(fn, reps, warmup))


def tflm_run(
    model: bytes, x: np.ndarray, images: int, arena_size: int | None = None
) -> tuple[float, np.ndarray]:
    """TFLM on the first `images` images of x, one invoke each (after one untimed warm-up invoke).
    Returns the median seconds per image and the outputs."""
    it = oracle.tflm_interpreter(model, x, arena_size)
    it.set_input(np.ascontiguousarray(x[:1]), 0)
    it.invoke()
    times, outs = [], []
    for i in range(images):
        xi = np.ascontiguousarray(x[i : i + 1])
        t0 = time.perf_counter()
        it.set_input(xi, 0)
        it.invoke()
        out = np.array(it.get_output(0), copy=True)
        times.append(time.perf_counter() - t0)
        outs.append(out)
    return statistics.median(times), np.concatenate(outs)


def equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))


def describe_difference(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return f"{int((d != 0).sum())}/{a.size} differ, max |diff| {d.max():g}"


# ----------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    batch: int
    macs: int  # per image
    npusim: float  # seconds for the batch (median)
    npusim_min: float
    npusim_1t: float  # median with 1 Numba thread and 1 BLAS thread
    litert: float
    tflm: float  # extrapolated: per-image median x batch
    tflm_images: int
    litert_batched: bool
    exact_tflm: str
    exact_litert: str
    notes: list = field(default_factory=list)
    # npusim's output of the timed batch (tflm profile), which the Haswell section compares against
    output: np.ndarray | None = field(default=None, repr=False, compare=False)

    def gmacs(self, seconds: float) -> float:
        return self.macs * self.batch / seconds / 1e9

    def ips(self, seconds: float) -> float:
        return self.batch / seconds


def bench_workload(
    name: str,
    model: bytes,
    inputs: np.ndarray,
    batches,
    reps: dict,
    tflm_images: int,
    log,
    tflm_arena: int | None = None,
) -> list[Row]:
    import npusim

    sim = npusim.Interpreter(model, profile="tflm")
    sim_x = npusim.Interpreter(model, profile="xnnpack")
    macs = sim.macs()
    tflm_images = min(tflm_images, inputs.shape[0])
    t_img, tflm_out = tflm_run(model, inputs, tflm_images, tflm_arena)
    log(f"  TFLM: {t_img * 1e3:.2f} ms/image over {tflm_images} image(s)")
    rows = []
    for n in batches:
        x = np.ascontiguousarray(inputs[:n])
        if x.shape[0] != n:
            raise SystemExit(f"{name}: only {inputs.shape[0]} input images, need {n}")
        t0 = time.perf_counter()
        y_sim = sim.run(x)  # first call: Numba kernels load from the cache (or compile)
        first = time.perf_counter() - t0
        ts = timings(lambda x=x: sim.run(x), reps["npusim"][n], warmup=1)
        t_sim = statistics.median(ts)
        lrt = oracle.BatchedLiteRT(model, n, threads=LITERT_THREADS)
        tl = timings(lambda lrt=lrt, x=x: lrt(x), reps["litert"][n], warmup=1)
        t_lrt = statistics.median(tl)
        with single_thread():
            t_1t = median_time(lambda x=x: sim.run(x), reps["npusim"][n], warmup=1)
        y_lrt = lrt(x)
        y_simx = sim_x.run(x)
        k = min(tflm_images, n)
        ok_t = equal(y_sim[:k], tflm_out[:k])
        ok_l = equal(y_simx, y_lrt)
        row = Row(
            name,
            n,
            macs,
            t_sim,
            min(ts),
            t_1t,
            t_lrt,
            t_img * n,
            tflm_images,
            lrt.batched,
            f"{'yes' if ok_t else 'no'} ({k} img)",
            f"{'yes' if ok_l else 'no'} ({n} img)",
            output=y_sim,
        )
        if not ok_t:
            row.notes.append(f"npusim tflm vs TFLM: {describe_difference(y_sim[:k], tflm_out[:k])}")
        if not ok_l:
            row.notes.append(f"npusim xnnpack vs LiteRT: {describe_difference(y_simx, y_lrt)}")
        if not lrt.batched:
            row.notes.append("LiteRT could not resize the batch; images fed one by one")
        log(
            f"  batch {n}: npusim {t_sim * 1e3:.1f} ms [{min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f}] "
            f"(first call {first * 1e3:.0f} ms), npusim 1 thread {t_1t * 1e3:.1f} ms, "
            f"LiteRT {t_lrt * 1e3:.2f} ms [{min(tl) * 1e3:.2f}-{max(tl) * 1e3:.2f}], "
            f"exact TFLM {row.exact_tflm}, exact LiteRT {row.exact_litert}"
        )
        rows.append(row)
        lrt = None  # release the runtime (and its threads) before the next batch
    return rows


# ----------------------------------------------------------------------------------------------
# Breakdowns (where npusim's time goes)
# ----------------------------------------------------------------------------------------------


def conv_stages(model: bytes, x: np.ndarray, reps: int) -> list[tuple[str, float, float]]:
    """Time each stage of Conv2D.__call__ on the AMX and VNNI paths (same calls, same arrays: the stages
    do not pay the page faults of fresh buffers that a real call pays), and the whole call on every
    kernel path, with the default threads and with one Numba and one BLAS thread."""
    import npusim
    from npusim import host
    from npusim.engines import aligned, amx, vnni
    from npusim.engines.gemm import accumulator_offset
    from npusim.engines.microkernel import pack_filters
    from npusim.engines.output_stage import output_parameters
    from npusim.engines.padding import pad_input

    sim = npusim.Interpreter(model, profile="tflm")
    kern = sim.kernels[0]
    w = sim.graph.tensors[kern.op.inputs[1]].data
    b = sim.graph.tensors[kern.op.inputs[2]].data
    o, c, zp = kern.options, x.shape[3], kern.inputs[0].zero_point
    sh, sw, dh, dw = (
        o.get("stride_h", 1),
        o.get("stride_w", 1),
        o.get("dilation_h_factor", 1),
        o.get("dilation_w_factor", 1),
    )
    wg = w[None]
    cp = (c + 3) // 4 * 4
    hp, wp = (kern.out_h - 1) * sh + (kern.kh - 1) * dh + 1, (kern.out_w - 1) * sw + (kern.kw - 1) * dw + 1
    xp = aligned.empty((x.shape[0], hp, wp, cp), np.int8)
    taps = np.array(
        [(ky * dh * wp + kx * dw) * cp for ky in range(kern.kh) for kx in range(kern.kw)], dtype=np.int64
    )
    packed = pack_filters(wg.reshape(1, kern.out_channels, kern.kh * kern.kw, c), cp, vnni.ISA)
    s = kern.stage
    out = aligned.empty((x.shape[0] * kern.out_h * kern.out_w, kern.out_channels), np.int8)
    stage_args = (np.int64(kern.profile), np.int64(s.zero_point), np.int64(s.lo), np.int64(s.hi))

    stages = [
        (
            "pad_input (Numba: the padded int8 copy)",
            lambda: pad_input(x, kern.pad_top, kern.pad_left, np.int8(zp), xp),
        ),
        (
            "pack_filters (Numba)",
            lambda: pack_filters(wg.reshape(1, kern.out_channels, kern.kh * kern.kw, c), cp, vnni.ISA),
        ),
    ]
    paths = []
    if host.has_amx():
        chunk = amx.chunk_for(cp)
        params = output_parameters(accumulator_offset(wg, b, zp), s)
        stages.append(
            (
                "conv_amx (AMX tiles + vector output stage)",
                lambda: amx.conv_amx(
                    xp,
                    packed,
                    taps,
                    cp,
                    chunk,
                    kern.out_h,
                    kern.out_w,
                    sh,
                    sw,
                    1,
                    False,
                    kern.out_channels,
                    params,
                    *stage_args,
                    amx.tile_config(chunk),
                    out,
                ),
            )
        )
        paths.append("AMX")
    if host.has_vnni():
        params_u = output_parameters(accumulator_offset(wg, b, zp + 128), s)
        stages.append(
            (
                "conv_vnni (VNNI micro-kernel + vector output stage)",
                lambda: vnni.conv_vnni(
                    xp,
                    packed,
                    taps,
                    cp // 4,
                    kern.out_h,
                    kern.out_w,
                    sh,
                    sw,
                    1,
                    False,
                    kern.out_channels,
                    params_u,
                    *stage_args,
                    out,
                ),
            )
        )
        paths.append("VNNI")
    paths.append("BLAS")
    for name in paths:
        what = {
            "AMX": "AMX",
            "VNNI": "VNNI",
            "BLAS": "float32 BLAS (im2col + sgemm; here under Numba's OpenMP layer, which fights "
            "OpenBLAS's threads: a host without VNNI runs it under the workqueue layer)",
        }[name]
        on_path = npusim.Interpreter(model, profile="tflm", backend=name.lower()).kernels[0]
        stages.append((f"whole Conv2D.__call__, {what} path", lambda k=on_path: k(x, w, b)))
    stages.append(("whole Interpreter.run (default path)", lambda: sim.run(x)))
    default = [median_time(fn, reps, warmup=1) for _, fn in stages]
    with single_thread():
        one = [median_time(fn, reps, warmup=1) for _, fn in stages]
    return [(label, t, t1) for (label, _), t, t1 in zip(stages, default, one)]


def path_models(seed: int = 1) -> list[tuple[str, bytes, tuple]]:
    """One-op models that each kernel path runs: the conv of the main table, a MobileNet-style 3x3
    depthwise layer and a fully connected layer; (label, model, input shape per image, batch
    relative to the conv's: a fully connected layer needs many rows to be worth threads)."""
    rng = np.random.default_rng(seed)
    c = 96
    dw = oracle.depthwise_model(
        (1, 28, 28, c),
        rng.integers(-127, 128, (1, 3, 3, c), dtype=np.int8),
        rng.integers(-5000, 5000, c).astype(np.int32),
        0.05,
        -10,
        np.exp(rng.uniform(np.log(0.002), np.log(0.01), c)).astype(np.float32),
        0.1,
        -20,
        activation="RELU6",
    )
    k, units = 1024, 1000
    fc = oracle.fully_connected_model(
        (1, k),
        rng.integers(-127, 128, (units, k), dtype=np.int8),
        rng.integers(-50000, 50000, units).astype(np.int32),
        0.05,
        -10,
        0.004,
        4.0,
        3,
    )
    return [
        ("CONV_2D 56x56x64 -> 64, 3x3", conv_model(), (56, 56, 64), 1),
        (f"DEPTHWISE_CONV_2D 28x28x{c}, 3x3", dw, (28, 28, c), 1),
        (f"FULLY_CONNECTED {k} -> {units}", fc, (k,), 16),
    ]


def path_settings(args) -> tuple[int, int]:
    """(batch, repetitions) of the kernel path rates, for the host's paths and the Haswell code's alike."""
    return (1, 2) if args.quick else (16, 7)


def kernel_path_rates(batch: int, reps: int, log, only=None) -> list[str]:
    """One line per kernel path that this host runs (each backend forced in turn; DEPTHWISE_CONV_2D's
    vector form follows it), or per path named in `only` among them: GMAC/s with the default threads
    and with one thread, and whether the output has the same bits as the BLAS path's (itself held to
    TFLM by the tests)."""
    import npusim
    from npusim.engines import backend

    names = [b.name for b in backend.BACKENDS if b.available() and (only is None or b.name in only)]
    lines = [
        "| op | kernel path | batch | GMAC/s | GMAC/s, 1 thread | same bits as blas |",
        "|---|---|---|---|---|---|",
    ]
    for label, model, shape, scale in path_models():
        n = batch * scale
        x = np.random.default_rng(2).integers(-128, 128, (n, *shape), dtype=np.int8)
        reference = npusim.Interpreter(model, profile="tflm", backend="blas").run(x)
        seen = set()
        for name in names:
            sim = npusim.Interpreter(model, profile="tflm", backend=name)
            kern = sim.kernels[0]
            path = kern.engine.name if hasattr(kern, "engine") else f"{kern.variant} form"
            if path in seen:  # e.g. DEPTHWISE_CONV_2D on amx and vnni: the same VNNI form
                continue
            seen.add(path)
            log(f"  kernel path {path}: {label}")
            same = "yes" if equal(sim.run(x), reference) else "NO"
            t = median_time(lambda s=sim, x=x: s.run(x), reps)
            with single_thread():
                t1 = median_time(lambda s=sim, x=x: s.run(x), reps)
            rate, rate1 = sim.macs() * n / t / 1e9, sim.macs() * n / t1 / 1e9
            lines.append(f"| {label} | {path} | {n} | {rate:.1f} | {rate1:.1f} | {same} |")
    return lines


def op_breakdown(model: bytes, x: np.ndarray, reps: int) -> list[tuple[str, int, float, float]]:
    """Median time per op kind, running the plan one kernel at a time (Interpreter.evaluate), with the
    default threads and with one Numba and one BLAS thread."""
    default = _op_times(model, x, reps)
    with single_thread():
        one = _op_times(model, x, reps)
    return [(kind, c, t, one[kind][1]) for kind, (c, t) in sorted(default.items(), key=lambda kv: -kv[1][1])]


def _op_times(model: bytes, x: np.ndarray, reps: int) -> dict:
    import npusim

    sim = npusim.Interpreter(model, profile="tflm")
    sim.run(x)
    totals: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for _ in range(reps):
        values = {sim.graph.inputs[0]: sim.check_input(x)}
        per = {}
        for kern in sim.kernels:
            t0 = time.perf_counter()
            sim.evaluate(values, kernels=[kern])
            per[kern.kind] = per.get(kern.kind, 0.0) + time.perf_counter() - t0
        for kind, t in per.items():
            totals.setdefault(kind, []).append(t)
    for kern in sim.kernels:
        counts[kern.kind] = counts.get(kern.kind, 0) + 1
    return {kind: (counts[kind], statistics.median(ts)) for kind, ts in totals.items()}


def memory_child(shared: str, name: str, batch: int, calls: int) -> None:
    """Run in a fresh process (see memory_of_run): one model at one batch, alone. Prints JSON with the
    resident memory after setup, the peak of the first run, and the resident memory after each of
    `calls` further runs (flat if no allocation outlives a call)."""
    import json

    import npusim

    npusim.tune_process()
    model = (Path(shared) / "models" / ALL_MODELS[name]).read_bytes()
    sim = npusim.Interpreter(model, profile="tflm")
    t_in = sim.graph.input(0)
    x, _ = model_inputs(Path(shared), name, batch, t_in.shape, t_in.dtype)
    x = np.ascontiguousarray(x)
    gc.collect()
    setup = current_rss_mb()
    sim.run(x)
    peak = process_peak_rss_mb()
    after = []
    for _ in range(calls):
        sim.run(x)
        gc.collect()
        after.append(current_rss_mb())
    print(json.dumps({"setup": setup, "peak": peak, "after": after, "input_mb": x.nbytes / 2**20}))


def memory_of_run(shared: Path, name: str, batch: int, calls: int = 10) -> dict:
    """memory_child in a fresh interpreter, so that the peak is this run's alone."""
    import json
    import subprocess

    code = (
        "from experiments.bench import memory_child; "
        f"memory_child({str(shared)!r}, {name!r}, {batch}, {calls})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]
    )
    if done.returncode:
        raise SystemExit(
            f"memory run of {name} at batch {batch} failed: {done.stderr.strip().splitlines()[-1:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------
# AVX2 code compiled for Haswell, on this host
# ----------------------------------------------------------------------------------------------

# The environment in which Numba compiles npusim for Haswell and "auto" picks the avx2 engine: an
# empty NUMBA_CPU_FEATURES is required (a named CPU keeps the host's features otherwise), and the
# switches keep VNNI and AMX out even where the compile target would not exclude them.
HASWELL_ENV = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "", "NPUSIM_VNNI": "0", "NPUSIM_AMX": "0"}
# The workloads of the main table that the Haswell code runs, each at the largest batch of the table.
HASWELL_WORKLOADS = ("conv", "resnet8", "mobilenet_v2")
# What LLVM's haswell target emits beyond SSE: a host without one of these cannot run its code.
HASWELL_FEATURES = ("avx2", "fma", "bmi", "bmi2", "f16c", "movbe", "lzcnt", "popcnt")


def haswell_unsupported() -> str | None:
    """Why code compiled for Haswell cannot run on this host, or None if it can."""
    import llvmlite.binding

    machine = platform.machine()
    if machine.lower() not in ("x86_64", "amd64"):
        return f"this host is {machine}, not x86-64: code compiled for Haswell does not run here"
    features = llvmlite.binding.get_host_cpu_features()
    missing = [f for f in HASWELL_FEATURES if not features.get(f, False)]
    if missing:
        return f"this CPU lacks {', '.join(missing)}: code compiled for Haswell does not run here"
    return None


def haswell_child(spec_path: str, out_path: str) -> None:
    """Run in a fresh process compiled for Haswell (see haswell_run): time each workload of the spec
    with the default threads and with one thread, after an untimed first call that compiles the
    kernels (or loads them from Numba's cache, whose entries are keyed by the CPU compiled for), and
    the avx2 kernel path rates; pickle the times, the outputs and what the process compiled for."""
    import pickle

    import numba

    import npusim
    from npusim.engines import backend

    npusim.tune_process()  # as the parent runs

    def log(msg: str):
        print(msg, file=sys.stderr, flush=True)

    selection = backend.select()
    if selection.name != "avx2" or selection.depthwise_variant() != "avx2":
        raise SystemExit(f"not the avx2 path under {HASWELL_ENV}: {selection}")
    with open(spec_path, "rb") as f:
        spec = pickle.load(f)
    rows = {}
    for name, model, x, reps in spec["workloads"]:
        sim = npusim.Interpreter(model, profile="tflm")
        t0 = time.perf_counter()
        y = sim.run(x)  # compiles (or loads) the Haswell code: not timed
        first = time.perf_counter() - t0
        ts = timings(lambda sim=sim, x=x: sim.run(x), reps, warmup=1)
        with single_thread():
            t1 = median_time(lambda sim=sim, x=x: sim.run(x), reps, warmup=1)
        log(
            f"{name} batch {x.shape[0]}: {statistics.median(ts) * 1e3:.1f} ms, 1 thread {t1 * 1e3:.1f} ms "
            f"(first call {first * 1e3:.0f} ms)"
        )
        rows[name] = {"t": statistics.median(ts), "t_min": min(ts), "t1": t1, "output": y}
    batch, reps = spec["paths"]
    paths = kernel_path_rates(batch, reps, log, only=("avx2",))
    done = {
        "rows": rows,
        "paths": paths,
        "kernels": kernel_path(),
        "target": compile_target(),
        "threads": f"{numba.get_num_threads()} (layer {numba.threading_layer()})",
    }
    with open(out_path, "wb") as f:
        pickle.dump(done, f)


def haswell_run(spec: dict, log) -> dict:
    """haswell_child in a fresh interpreter under HASWELL_ENV (no NPUSIM_AVX2 inherited), its progress
    forwarded to log; raises RuntimeError with the end of its stderr if it fails."""
    import collections
    import pickle
    import subprocess
    import tempfile

    env = {**os.environ, **HASWELL_ENV}
    env.pop("NPUSIM_AVX2", None)
    with tempfile.TemporaryDirectory(prefix="npusim-haswell-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.pkl", Path(tmp) / "out.pkl"
        with open(spec_path, "wb") as f:
            pickle.dump(spec, f)
        code = (
            "from experiments.bench import haswell_child; "
            f"haswell_child({str(spec_path)!r}, {str(out_path)!r})"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        tail = collections.deque(maxlen=4)
        for line in proc.stderr:  # live progress: the first calls compile for a while
            log(f"  haswell: {line.rstrip()}")
            tail.append(line.strip())
        if proc.wait():
            raise RuntimeError(f"exit {proc.returncode}: {' / '.join(tail)}")
        with open(out_path, "rb") as f:
            return pickle.load(f)


def haswell_spec(args, results: Results) -> dict:
    """The child's work: each HASWELL_WORKLOADS entry that the main table ran, at its largest batch
    there, on the same inputs and with the same repetitions; the kernel path rates as the Kernel
    paths section runs them."""
    workloads = []
    for name in HASWELL_WORKLOADS:
        batches = [r.batch for r in results.rows if r.workload == name]
        if not batches:
            continue
        n = max(batches)
        model, x, reps = results.inputs[name]
        workloads.append((name, model, np.ascontiguousarray(x[:n]), reps[n]))
    return {"workloads": workloads, "paths": path_settings(args)}


def run_haswell(args, results: Results, log):
    """The section "AVX2 code compiled for Haswell, on this host": the child's rows beside this run's
    LiteRT and TFLM figures, or why it was skipped or failed."""
    spec = haswell_spec(args, results)
    if not spec["workloads"]:
        return  # --only without conv or the models: nothing to set the Haswell code beside
    reason = "--no-haswell" if args.no_haswell else haswell_unsupported()
    if reason is not None:
        results.haswell = [f"Skipped: {reason}.", ""]
        log(f"AVX2 code compiled for Haswell: skipped ({reason})")
        return
    log("AVX2 code compiled for Haswell, in a child process (its first calls compile)")
    try:
        child = haswell_run(spec, log)
    except RuntimeError as e:
        results.haswell = [f"FAILED: the child process compiled for Haswell stopped ({e}).", ""]
        log(f"  haswell: FAILED ({e})")
        return
    results.haswell = haswell_lines(results.rows, child)


def haswell_lines(rows: list[Row], child: dict) -> list[str]:
    """The section's text and tables from the child's results and the main table's rows."""
    lines = [
        f"Host: {cpu_model()}; CPU features: {cpu_flags()}. A fresh process ran npusim compiled for "
        f"Haswell (`{' '.join(f'{k}={v}' for k, v in HASWELL_ENV.items())}`; kernels: {child['kernels']}; "
        f"compiled for {child['target']}; Numba threads {child['threads']}) on the main table's inputs, "
        "each workload at its largest batch there, timed as the main table (median after an untimed "
        "first call that compiles, and a warm-up call). LiteRT and TFLM: this run's figures of the main "
        "table, on this host.",
        "",
        "**This is Haswell code run on this host, not on a Haswell**: it executes with this CPU's "
        "timings, not an AVX2-only CPU's"
        + (
            ", and LiteRT here runs its AVX-512 kernels (XNNPACK picks them from the CPU it runs on)"
            if "avx512f" in cpu_flags()
            else ""
        )
        + ". So the ratio to LiteRT is not issue 16's acceptance figure, which needs an AVX2-only CPU.",
        "",
        "| workload | batch | MMAC/img | npusim-haswell ms | ms, 1 thread | GMAC/s | GMAC/s, 1 thread | "
        "img/s | LiteRT ms | TFLM ms* | npusim-haswell/LiteRT | npusim-haswell/TFLM | "
        "npusim-haswell/LiteRT, 1 thread | npusim-haswell/TFLM, 1 thread | outputs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for name, got in child["rows"].items():
        r = max((r for r in rows if r.workload == name), key=lambda r: r.batch)
        t, t1 = got["t"], got["t1"]
        same = equal(got["output"], r.output)
        if not same:
            notes.append(f"- {name} batch {r.batch}: {describe_difference(got['output'], r.output)}")
        lines.append(
            f"| {name} | {r.batch} | {r.macs / 1e6:.1f} | {fmt_ms(t)} | {fmt_ms(t1)} | {r.gmacs(t):.2f} | "
            f"{r.gmacs(t1):.2f} | {r.ips(t):.0f} | {fmt_ms(r.litert)} | {fmt_ms(r.tflm)} | "
            f"{r.litert / t:.2f}x | {r.tflm / t:.1f}x | {r.litert / t1:.2f}x | {r.tflm / t1:.1f}x | "
            f"{'bit-exact' if same else 'NOT bit-exact'} ({r.batch} img) |"
        )
    lines += [
        "",
        "outputs: the Haswell code's output of the whole batch against npusim's on this host's code in "
        "the main table (which that table holds to TFLM). *TFLM extrapolated from batch 1, as in the main "
        "table. Ratios are throughput ratios (>1: npusim faster); the 1-thread ratios set one npusim "
        "thread against LiteRT's and TFLM's figures above.",
        *notes,
        "",
        "Kernel paths under the Haswell code (the avx2 engine forced; DEPTHWISE_CONV_2D takes its avx2 "
        "form), as in the Kernel paths section:",
        "",
        *child["paths"],
        "",
    ]
    return lines


# ----------------------------------------------------------------------------------------------
# Inputs for the shared models
# ----------------------------------------------------------------------------------------------


# name -> (file under <shared>/data, how x_test reaches the model's input size)
INPUT_DATA = {
    "resnet8": ("cifar10_subset.npz", "as is"),
    "mobilenet_v2": ("eurosat64_subset.npz", "nearest 2x"),
    "yolov8n_256": ("eurosat64_subset.npz", "bilinear"),
}


def model_inputs(shared: Path, name: str, n: int, shape, dtype) -> tuple[np.ndarray, str]:
    """Real images when the shared data is there (CIFAR-10 for ResNet-8, EuroSAT-64 upsampled 2x for
    MobileNetV2, EuroSAT-64 resized to 256x256 with PIL bilinear for YOLOv8n, cycled to n), random
    pixels otherwise."""
    h, w = shape[1], shape[2]
    fname, how = INPUT_DATA[name]
    path = shared / "data" / fname
    if path.exists():
        with np.load(path) as d:
            imgs = d["x_test"]
        desc = f"{fname} x_test"
        if how == "nearest 2x":
            imgs = imgs.repeat(2, axis=1).repeat(2, axis=2)
            desc += " upsampled 2x (nearest)"
        elif how == "bilinear" and imgs.shape[1:3] != (h, w):
            from PIL import Image

            imgs = imgs[:n]  # only the images the batch uses
            imgs = np.stack(
                [np.asarray(Image.fromarray(i).resize((w, h), Image.BILINEAR), dtype=np.uint8) for i in imgs]
            )
            desc += f" resized to {h}x{w} (PIL bilinear)"
        if imgs.shape[1:3] == (h, w):
            imgs = np.resize(imgs, (n,) + imgs.shape[1:])
            if dtype == np.int8:
                return (imgs.astype(np.int16) - 128).astype(np.int8), desc + ", pixel - 128"
            return imgs.astype(dtype), desc
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, (n,) + tuple(shape[1:]), dtype=dtype), "random pixels"


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def table(rows: list[Row]) -> list[str]:
    head = (
        "| workload | batch | MMAC/img | npusim ms | npusim min ms | npusim 1T ms | LiteRT ms | TFLM ms* | "
        "npusim GMAC/s | LiteRT GMAC/s | TFLM GMAC/s | npusim img/s | LiteRT img/s | TFLM img/s | "
        "npusim/TFLM | npusim/LiteRT | exact vs TFLM | exact vs LiteRT** |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lrt_note = "" if r.litert_batched else " (1-by-1)"
        lines.append(
            f"| {r.workload} | {r.batch} | {r.macs / 1e6:.1f} | {fmt_ms(r.npusim)} | {fmt_ms(r.npusim_min)} "
            f"| {fmt_ms(r.npusim_1t)} | {fmt_ms(r.litert)}{lrt_note} | {fmt_ms(r.tflm)} | "
            f"{r.gmacs(r.npusim):.2f} | {r.gmacs(r.litert):.2f} | {r.gmacs(r.tflm):.2f} | "
            f"{r.ips(r.npusim):.0f} | {r.ips(r.litert):.0f} | {r.ips(r.tflm):.1f} | {r.tflm / r.npusim:.1f}x "
            f"| {r.litert / r.npusim:.2f}x | {r.exact_tflm} | {r.exact_litert} |"
        )
    return lines


def targets(rows: list[Row]) -> list[str]:
    def check(r: Row, label: str, need_t: float, need_l: float) -> str:
        st, sl = r.tflm / r.npusim, r.litert / r.npusim
        st1, sl1 = r.tflm / r.npusim_1t, r.litert / r.npusim_1t
        ok = "met" if st >= need_t and sl >= need_l else "MISSED"
        return (
            f"- {r.workload} batch {r.batch} {label} (>= {need_t:g}x TFLM, >= {need_l:g}x LiteRT): "
            f"{st:.1f}x / {sl:.3f}x -> {ok} (npusim on 1 thread: {st1:.1f}x / {sl1:.3f}x)"
        )

    out = [
        check(r, "floor", FLOOR_TFLM, FLOOR_LITERT) for r in rows if r.workload == "conv" and r.batch == 16
    ]
    out += [
        check(r, "target", TARGET_TFLM, TARGET_LITERT)
        for r in rows
        if (r.workload == "conv" and r.batch == 16) or (r.workload != "conv" and r.batch == 256)
    ]
    return out


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


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
        choices=("all", "conv", "paths", "models", "yolo", "onnx", "zo"),
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


@dataclass
class Results:
    """What the workloads measured, section by section of the report."""

    rows: list = field(default_factory=list)  # list[Row]: the main table
    notes: list = field(default_factory=list)
    memory: list = field(default_factory=list)  # table lines of "Memory of a model run"
    breakdown: list = field(default_factory=list)  # lines of "Where npusim's time goes"
    paths: list = field(default_factory=list)  # lines of "Kernel paths"
    zo: list = field(default_factory=list)  # lines of the ZO step section
    # workload -> (model bytes, input images, npusim's repetitions by batch), for the Haswell section
    inputs: dict = field(default_factory=dict)
    haswell: list = field(default_factory=list)  # lines of "AVX2 code compiled for Haswell"
    onnx: list = field(default_factory=list)  # lines of "ONNX: YOLO26-256 against ONNX Runtime"


def repetitions(args, batches, fast: int, slow: int) -> dict:
    """Timed calls per batch size: `fast` for small batches, `slow` for large ones, 2 with --quick."""
    return {n: (2 if args.quick else (fast if n <= 16 else slow)) for n in batches}


def run_conv(args, results: Results, log):
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
        "Interpreter.macs(); the '231 MMAC' of int8-numerics.md is twice that, 2 operations per MAC: if its "
        "GMAC/s anchors divide 231 M by the time, they are twice the MAC rates of this table); random int8 "
        "input, per-channel weights, RELU."
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


def run_models(args, results: Results, log):
    for name, fname in MODELS.items():
        run_model(args, results, log, name, fname, args.model_batches, tflm_images=2 if args.quick else 16)


def run_yolo(args, results: Results, log):
    """YOLOv8n-256 (STM32N6 person detector) at --yolo-batches: TFLM runs every image of the largest
    batch (about half a second each), 1 with --quick."""
    for name, fname in YOLO_MODELS.items():
        run_model(
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


def run_model(args, results: Results, log, name, fname, batches, tflm_images: int, fast: int = 7):
    """One shared model: its rows of the main table, its memory row and (unless --quick or
    --no-breakdown) its per-op breakdown at the largest batch."""
    import npusim

    path = args.shared / "models" / fname
    if not path.exists():
        raise SystemExit(f"{path}: not found (pass --shared, the folder that holds models/)")
    model = path.read_bytes()
    t_in = npusim.load_model(model).input(0)
    x, desc = model_inputs(args.shared, name, max(batches), t_in.shape, t_in.dtype)
    results.notes.append(f"{name} inputs: {desc}.")
    log(f"{name} ({fname}), inputs: {desc}")
    reps = {"npusim": repetitions(args, batches, fast, 3), "litert": repetitions(args, batches, fast, 3)}
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
    ops = op_breakdown(model, np.ascontiguousarray(x[:nb_]), reps=3)
    total = sum(t for _, _, t, _ in ops)
    total1 = sum(t1 for _, _, _, t1 in ops)
    results.breakdown += [
        f"### {name} per op kind at batch {nb_} (median ms, one kernel at a time)",
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
    ]


def render(results: Results, command: str, quick: bool, started, load_start) -> str:
    """The Markdown report."""
    import numba

    rows = results.rows
    tflm_imgs = sorted({(r.workload, r.tflm_images) for r in rows})
    lines = [
        "# npusim speed benchmark",
        "",
        f"- date: {started.isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}; "
        f"{cpu_flags()}; {platform.platform()}",
        f"- command: `{command}`"
        + (" (--quick: a smoke test, few repetitions; not a measurement)" if quick else ""),
        f"- versions: {versions()}",
        f"- load average (1/5/15 min) at start {' '.join(f'{v:.2f}' for v in load_start)}, at end "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} "
        "(other processes on the machine skew every time here)",
        f"- threads: LiteRT num_threads={LITERT_THREADS}; numba.get_num_threads()={numba.get_num_threads()} "
        f"(layer {numba.threading_layer() if rows else 'n/a'}); BLAS: {blas_threads()}",
        f"- npusim MAC kernels (CONV_2D, FULLY_CONNECTED): {kernel_path()}",
        f"- npusim kernels compiled for: {compile_target()}",
        "",
        *table(rows),
        "",
        "Times are medians over repetitions after one untimed warm-up call, for the whole batch, including "
        "set_tensor/get_tensor (LiteRT) and the input check (npusim). npusim: `Interpreter(model, "
        "profile='tflm').run(x)` on the whole batch. LiteRT: default "
        "interpreter (XNNPACK delegate), input resized to the batch.",
        "*TFLM runs batch 1 per invoke: its time is the median per image over "
        + ", ".join(f"{n} image(s) ({w})" for w, n in tflm_imgs)
        + ", multiplied by the batch (extrapolated, not measured on the whole batch).",
        "npusim 1T: the same run with numba.set_num_threads(1) and OpenBLAS set to 1 thread (diagnostic; "
        "the ratios use the default threads).",
        "Ratios are throughput ratios (other runtime's time / npusim's time): >1 means npusim is faster.",
        "exact vs TFLM: npusim (tflm profile) output == TFLM output on the images TFLM ran. **exact vs "
        "LiteRT: npusim (xnnpack profile) output == LiteRT output on the whole timed batch; the claim for "
        "the conv, informational for whole models (the xnnpack profile is XNNPACK's requantization of the "
        "MAC ops; other ops such as ADD, MEAN and SOFTMAX may round differently in XNNPACK).",
        *[f"- {n}" for n in results.notes],
        *[f"- {r.workload} batch {r.batch}: {n}" for r in rows for n in r.notes],
        "",
    ]
    if rows:
        lines += ["## Floors and targets", "", *targets(rows), ""]
    lines += results.zo
    if results.onnx:
        lines += ["## ONNX: YOLO26-256 against ONNX Runtime", "", *results.onnx]
    if results.memory:
        lines += [
            "## Memory of a model run",
            "",
            "Each model at the largest batch, alone in a fresh process (`memory_child`): resident memory "
            "after loading the model and the input, the peak of the first run (VmHWM), and the resident "
            "memory after each of 10 further runs. A flat last column means no allocation outlives a call.",
            "",
            "| model | batch | input MB | RSS after setup MB | peak RSS of the run MB | peak - setup MB | "
            "RSS after each further run MB | growth over 10 runs MB |",
            "|---|---|---|---|---|---|---|---|",
            *results.memory,
            "",
        ]
    if results.paths:
        lines += [
            "## Kernel paths",
            "",
            f"CPU features: {cpu_flags()}; kernels compiled for {compile_target()}. Each path that this "
            "host runs, forced with `Interpreter(model, backend=...)` (median of whole `run` calls, tflm "
            "profile; DEPTHWISE_CONV_2D takes the vector form of the selection). A path missing here "
            "does not run on this host and was not measured.",
            "",
            *results.paths,
            "",
        ]
    if results.haswell:
        lines += ["## AVX2 code compiled for Haswell, on this host", "", *results.haswell]
    if results.breakdown:
        lines += ["## Where npusim's time goes", "", *results.breakdown]
    lines.append(f"Peak RSS of the bench process: {peak_rss_mb():.0f} MB (resource.getrusage ru_maxrss).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    import npusim

    npusim.tune_process()  # as the npusim and zo command lines run
    command = "python -m experiments.bench " + " ".join(argv)
    started = _dt.datetime.now().astimezone()
    load_start = os.getloadavg()

    def log(msg: str):
        print(msg, file=sys.stderr, flush=True)

    results = Results()
    if args.only in ("all", "conv", "paths"):
        log("kernel paths")
        results.paths = kernel_path_rates(*path_settings(args), log)
    if args.only in ("all", "conv"):
        run_conv(args, results, log)
    if args.only in ("all", "models"):
        run_models(args, results, log)
    if args.only in ("all", "yolo"):
        run_yolo(args, results, log)
    if args.only in ("all", "onnx"):  # YOLO26-256 ONNX against ONNX Runtime (experiments/bench_onnx.py)
        results.onnx = bench_onnx.bench_yolo26(args.shared, batch=8, reps=2 if args.quick else 5, log=log)
    run_haswell(args, results, log)
    if args.only in ("all", "zo"):
        log("ZO step: ResNet-8, last residual block + classifier (last:4), batch 32, q = 16")
        results.zo = bench_zo_step(args.shared, reps=3 if args.quick else 10)
    report = render(results, command, args.quick, started, load_start)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    log(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
