"""How the bench (experiments/bench/main.py) times a workload: npusim, LiteRT and TFLM on the same
inputs, with the exactness checks, one Row of the main table per batch; and the memory of a run,
measured alone in a fresh process."""

from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npusim.kernels import host
from npusim.testing import oracle

from .machine import busy_cores, current_rss_mb, process_peak_rss_mb, single_thread
from .workloads import ALL_MODELS, bench_inputs

LITERT_THREADS = 2


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


def interleaved(fns: dict, reps: dict, warmup: int = 1) -> dict:
    """{name: wall times} of each fn() of fns, reps[name] calls each after warmup untimed ones, the
    sides called in turn (one call of each per round), so that a change of load on the machine, which
    moves one side 2x here, hits both alike; the order flips every round, as a runtime's worker
    threads may still spin after its call and slow whichever call comes next."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    gc.collect()
    for r in range(max(reps.values())):
        for name, fn in list(fns.items())[:: 1 if r % 2 == 0 else -1]:
            if r < reps[name]:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
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
    # the same interleaved runs with one busy process per core but one (busy_cores), both sides
    npusim_loaded: float = float("nan")
    litert_loaded: float = float("nan")
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
        y_sim = sim.run(x)  # first call (kernels loaded by Interpreter(); its batch's memory is fresh)
        first = time.perf_counter() - t0
        lrt = oracle.BatchedLiteRT(model, n, threads=LITERT_THREADS)
        sides = {"npusim": lambda x=x: sim.run(x), "litert": lambda lrt=lrt, x=x: lrt(x)}
        both = interleaved(sides, {side: reps[side][n] for side in sides})
        ts, tl = both["npusim"], both["litert"]
        t_sim, t_lrt = statistics.median(ts), statistics.median(tl)
        with busy_cores(max(0, host.cpu_budget() - 1)):
            loaded = interleaved(sides, {side: reps[side][n] for side in sides})
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
            npusim_loaded=statistics.median(loaded["npusim"]),
            litert_loaded=statistics.median(loaded["litert"]),
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
            f"loaded: npusim {row.npusim_loaded * 1e3:.1f} ms, LiteRT {row.litert_loaded * 1e3:.2f} ms, "
            f"exact TFLM {row.exact_tflm}, exact LiteRT {row.exact_litert}"
        )
        rows.append(row)
        lrt = None  # release the runtime (and its threads) before the next batch
    return rows


def fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


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
    x, _ = bench_inputs(Path(shared), name, batch, t_in.shape, t_in.dtype)
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
        "from experiments.bench.timing import memory_child; "
        f"memory_child({str(shared)!r}, {name!r}, {batch}, {calls})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2]
    )
    if done.returncode:
        raise SystemExit(
            f"memory run of {name} at batch {batch} failed: {done.stderr.strip().splitlines()[-1:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])
