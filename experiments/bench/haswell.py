"""The bench's section "AVX2 code compiled for Haswell, on this host" (experiments/bench/main.py): a
child process compiled for Haswell times the conv and the models on the main table's inputs."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .machine import compile_target, cpu_flags, cpu_model, kernel_path, single_thread
from .paths import kernel_path_rates, path_settings
from .report import Results
from .timing import Row, describe_difference, equal, fmt_ms, median_time, timings

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
    wider = [f for f in ("avx512f", "avxvnni") if features.get(f, False)]
    if not wider:
        return (
            "this CPU has AVX2 and neither AVX-512 nor AVX-VNNI: the main table already runs the "
            "AVX2 code on an AVX2-only CPU"
        )
    return None


def haswell_child(spec_path: str, out_path: str) -> None:
    """Run in a fresh process compiled for Haswell (see haswell_run): time each workload of the spec
    with the default threads and with one thread, after an untimed first call that compiles the
    kernels (or loads them from Numba's cache, whose entries are keyed by the CPU compiled for), and
    the avx2 kernel path rates; pickle the times, the outputs and what the process compiled for."""
    import pickle

    import numba

    import npusim
    from npusim.kernels import backend

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
            "from experiments.bench.haswell import haswell_child; "
            f"haswell_child({str(spec_path)!r}, {str(out_path)!r})"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
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
