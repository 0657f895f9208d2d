"""The bench's one-shot section (experiments/bench/main.py): `npusim run` end to end, a fresh process from
its start to its output written, against a LiteRT script that does the same (load the model, set
the input, invoke, save the .npy), on 1 image and on the largest batch of each shared model.

    python -m experiments.bench.oneshot --shared ../shared [--batch 256] [--reps 5]

Both sides run as subprocesses of this one, round-robin (npusim, LiteRT, npusim, ...), so that a
change of load on the machine hits both. npusim runs `--profile xnnpack`, LiteRT's arithmetic, so
that the two files can be compared bit for bit (the xnnpack profile's claim is the MAC ops; a model
whose other ops round differently in XNNPACK says "no" here, as in the main table).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .machine import cpu_flags, cpu_model, kernel_path
from .timing import LITERT_THREADS, fmt_ms
from .workloads import ALL_MODELS, MODELS, YOLO_MODELS, bench_inputs

REPO = Path(__file__).resolve().parents[2]

# What a user of LiteRT writes for a one-shot run: its Python interpreter, XNNPACK by default.
LITERT_SCRIPT = f"""
import sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter
model, x_path, y_path = sys.argv[1:4]
x = np.load(x_path)
it = Interpreter(model_path=model, num_threads={LITERT_THREADS})
inp = it.get_input_details()[0]
if x.shape[0] != inp["shape"][0]:
    it.resize_tensor_input(inp["index"], list(x.shape), strict=False)
it.allocate_tensors()
it.set_tensor(inp["index"], x)
it.invoke()
np.save(y_path, it.get_tensor(it.get_output_details()[0]["index"]))
"""


# Where a one-shot run's time goes: the CPU seconds (time.process_time, unmoved by other processes'
# load as wall time is) of each step of `npusim run` in the order it takes them, in a fresh process.
# Numba's target is not set up on a warm cache (jit._FunctionCache): its registries are never imported.
PHASES_SCRIPT = """
import json, sys, time
c = time.process_time
marks = [("Python start", c())]
import numpy as np; marks.append(("numpy", c()))
import click; marks.append(("click", c()))
import numba; marks.append(("numba import", c()))
from npusim.kernels import jit; jit.sources_digest(); marks.append(("kernel-source digest (jit.py)", c()))
import npusim.app.cli, npusim.runtime.interpreter; marks.append(("npusim modules", c()))
it = npusim.runtime.interpreter.Interpreter(sys.argv[1], warm=False)  # as `npusim run` builds it
marks.append(("load + prepare (its kernels' loads)", c()))
x = np.load(sys.argv[2]); it.run(x); marks.append(("first run (its kernels' loads)", c()))
it.run(x); marks.append(("a second run", c()))
print(json.dumps([[k, v - (marks[i - 1][1] if i else 0.0)] for i, (k, v) in enumerate(marks)]))
"""


def startup_phases(model: Path, x_path: Path, reps: int) -> list[str]:
    """Table lines: the median CPU seconds of each phase over reps fresh processes."""
    runs = []
    for _ in range(reps + 1):  # the first process may compile: untimed
        done = subprocess.run(
            [sys.executable, "-c", PHASES_SCRIPT, str(model), str(x_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise SystemExit(f"one shot phases failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    runs = runs[1:]
    lines = ["| phase | CPU ms (median) |", "|---|---|"]
    lines += [
        f"| {name} | {fmt_ms(statistics.median(r[i][1] for r in runs))} |"
        for i, (name, _) in enumerate(runs[0])
    ]
    total = statistics.median(sum(v for _, v in r) for r in runs)
    return lines + [f"| total | {fmt_ms(total)} |"]


# The first Interpreter.run in a process against its warm runs: a fresh process, tuned as the main
# table's (npusim.tune_process: freed memory kept for reuse), builds the Interpreter (by default it
# loads the kernels it calls, Interpreter.warm_up; argv[4] "0" builds it with warm=False), then
# times its first run and WARM_RUNS more on the same batch, wall time as a user feels it.
FIRST_CALL_SCRIPT = """
import json, statistics, sys, time
import numpy as np
import npusim
from npusim.runtime.interpreter import Interpreter
npusim.tune_process()  # as the command lines and the bench's main table run
x = np.load(sys.argv[2])
kind = sys.argv[4]  # "cold": warm=False; "warm": the default; "batch": the warm-up told the batch too
batch = x.shape[0] if kind == "batch" else None
t0 = time.perf_counter()
it = Interpreter(sys.argv[1], warm=kind != "cold", batch=batch)
t1 = time.perf_counter()
times = []
for _ in range(1 + int(sys.argv[3])):
    s = time.perf_counter(); it.run(x); times.append(time.perf_counter() - s)
print(json.dumps({"prepare": t1 - t0, "first": times[0], "warm": statistics.median(times[1:])}))
"""
WARM_RUNS = 5


def first_call(model: Path, x_path: Path, reps: int) -> dict:
    """{"batch": the warm-up told the batch, "warm": the default warm-up, "cold": none} -> medians over
    reps fresh processes each (after one untimed round, which may compile), the kinds in turn, of the
    Interpreter's construction, the first run and the median warm run, in seconds, and of each
    process's first/warm ratio."""
    runs = {"batch": [], "warm": [], "cold": []}
    for r in range(reps + 1):
        for kind in runs:
            argv = [sys.executable, "-c", FIRST_CALL_SCRIPT, str(model), str(x_path), str(WARM_RUNS)]
            done = subprocess.run([*argv, kind], cwd=REPO, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"first call failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
            if r:
                runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        kind: {
            **{k: statistics.median(r[k] for r in rs) for k in ("prepare", "first", "warm")},
            "ratio": statistics.median(r["first"] / r["warm"] for r in rs),
        }
        for kind, rs in runs.items()
    }


def first_call_lines(shared: Path, batches: dict, reps: int, log=print) -> list[str]:
    """The table of the first run in a process against a warm one, per model at its batch
    (batches: a name of bench_workloads.ALL_MODELS -> batch): with the warm-up told the batch, with
    the default warm-up and with none."""
    import npusim

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, n in batches.items():
            model = shared / "models" / ALL_MODELS[name]
            if not model.exists():
                raise SystemExit(f"{model}: not found (pass --shared, the folder that holds models/)")
            t_in = npusim.load_model(str(model)).input(0)
            x, _ = bench_inputs(shared, name, n, t_in.shape, t_in.dtype)
            x_path = Path(tmp) / f"{name}_{n}.npy"
            np.save(x_path, np.ascontiguousarray(x[:n]))
            kinds = first_call(model, x_path, reps)
            b, r, cold = kinds["batch"], kinds["warm"], kinds["cold"]
            log(
                f"  first call {name} batch {n}: {b['first']:.3f} s told the batch, {r['first']:.3f} s "
                f"by default, {cold['first']:.3f} s without the warm-up; warm {b['warm']:.3f} s"
            )
            rows.append(
                f"| {name} | {n} | {fmt_ms(b['prepare'])} | {fmt_ms(b['first'])} | {fmt_ms(b['warm'])} | "
                f"{b['ratio']:.2f}x | {fmt_ms(r['prepare'])} | {fmt_ms(r['first'])} | {r['ratio']:.2f}x | "
                f"{fmt_ms(cold['prepare'])} | {fmt_ms(cold['first'])} | {cold['ratio']:.2f}x |"
            )
    return [
        "| model | batch | batch=n: Interpreter() ms | first run ms | warm run ms | first / warm | "
        "default: Interpreter() ms | first run ms | first / warm | "
        "warm=False: Interpreter() ms | first run ms | first / warm |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Each a fresh process (experiments/bench/oneshot.py FIRST_CALL_SCRIPT, npusim.tune_process() "
        f"first, as the main table), median of {reps} after one untimed round, the three kinds in turn: the "
        "wall time of building the Interpreter (model load, prepare and, by default, the loads of its "
        f"kernels: Interpreter.warm_up), of its first run, and the median of {WARM_RUNS} more on the same "
        "batch; first / warm is the median of each process's own ratio. `batch=n`: the Interpreter is "
        "told the batch its runs will have, as LiteRT's allocate_tensors is, and its warm-up also runs "
        "zeros of that batch once, faulting in the memory the runs take (the construction pays it). "
        "The default loads the kernels only: the first run still faults in its batch's memory. "
        "`warm=False` (what the command lines build, since they run each input once) leaves the "
        "kernels' loads to the first run.",
        "",
    ]


def commands(model: Path, x_path: Path, out_dir: Path, resident_env: dict) -> dict:
    """The one-shot commands on one input file: name -> (argv, where it writes its output, its
    environment). "resident" is the same `npusim run` as the `npusim` script runs it by default on
    Linux, a call to the resident server (npusim/app/resident.py) that resident_env points to; "npusim"
    runs it in a process of its own (NPUSIM_RESIDENT=0)."""
    y_sim, y_res, y_lrt = out_dir / "npusim.npy", out_dir / "resident.npy", out_dir / "litert.npy"
    run = ["run", str(model), "--input", str(x_path), "--profile", "xnnpack", "--output"]
    return {
        "npusim": ([sys.executable, "-m", "npusim.app.cli", *run, str(y_sim)], y_sim, None),
        "resident": ([sys.executable, "-m", "npusim.app.resident", *run, str(y_res)], y_res, resident_env),
        "litert": ([sys.executable, "-c", LITERT_SCRIPT, str(model), str(x_path), str(y_lrt)], y_lrt, None),
    }


@contextlib.contextmanager
def resident_server():
    """The environment of a resident server of the bench's own (a private runtime folder), stopped
    and removed after."""
    from npusim.app import resident

    folder = tempfile.mkdtemp(prefix="npb", dir="/tmp")  # short: a socket path is at most 100 bytes
    env = dict(os.environ, XDG_RUNTIME_DIR=folder)
    if resident.DEFAULT_ON:  # measure the default, as a user's call gets it
        env.pop("NPUSIM_RESIDENT", None)
    else:
        env["NPUSIM_RESIDENT"] = "1"
    try:
        yield env
    finally:
        resident.stop(env)
        shutil.rmtree(folder, ignore_errors=True)


def time_round_robin(cmds: dict, reps: int, warmup: int = 1) -> dict:
    """Wall seconds of each command, process start to exit, reps times in turn after warmup untimed
    rounds (the first npusim process of a checkout compiles or loads its Numba cache from disk, the
    first resident call starts its server)."""
    times = {name: [] for name in cmds}
    for r in range(warmup + reps):
        for name, (argv, _, env) in cmds.items():
            t0 = time.perf_counter()
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env)
            elapsed = time.perf_counter() - t0
            if done.returncode:
                tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
                raise SystemExit(f"one shot: {name} failed (exit {done.returncode}): {tail}")
            if r >= warmup:
                times[name].append(elapsed)
    return times


def bench_one_shot(shared: Path, batches: dict, reps: int, log=print) -> list[str]:
    """The section's lines: per model and batch, the median wall time of each side, their ratio and
    whether the outputs are equal. batches: model name -> batch sizes."""
    import npusim

    rows = []
    with tempfile.TemporaryDirectory() as tmp, resident_server() as resident_env:
        tmp = Path(tmp)
        for name, sizes in batches.items():
            model = shared / "models" / MODELS[name]
            if not model.exists():
                raise SystemExit(f"{model}: not found (pass --shared, the folder that holds models/)")
            t_in = npusim.load_model(str(model)).input(0)
            x, _ = bench_inputs(shared, name, max(sizes), t_in.shape, t_in.dtype)
            for n in sizes:
                x_path = tmp / f"{name}_{n}.npy"
                np.save(x_path, np.ascontiguousarray(x[:n]))
                cmds = commands(model, x_path, tmp, resident_env)
                times = time_round_robin(cmds, reps)
                sim, res, lrt = (statistics.median(times[k]) for k in ("npusim", "resident", "litert"))
                a, r, b = (np.load(cmds[k][1]) for k in ("npusim", "resident", "litert"))
                exact = all(
                    v.shape == b.shape and v.dtype == b.dtype and np.array_equal(v, b) for v in (a, r)
                )
                log(
                    f"  one shot {name} batch {n}: own process {sim:.3f} s, resident {res:.3f} s, "
                    f"LiteRT {lrt:.3f} s, exact {exact}"
                )
                spread = {k: f"{fmt_ms(min(v))}-{fmt_ms(max(v))}" for k, v in times.items()}
                rows.append(
                    f"| {name} | {n} | {fmt_ms(sim)} [{spread['npusim']}] "
                    f"| {fmt_ms(res)} [{spread['resident']}] "
                    f"| {fmt_ms(lrt)} [{spread['litert']}] | {lrt / sim:.2f}x | {lrt / res:.2f}x "
                    f"| {'yes' if exact else 'no'} |"
                )
        first = next(iter(batches))
        x_path = tmp / f"{first}_1.npy"
        phases = startup_phases(shared / "models" / MODELS[first], x_path, reps) if x_path.exists() else []
    return [
        f"CPU: {cpu_model()}; features {cpu_flags()}; npusim MAC kernels: {kernel_path()}.",
        "",
        "| model | batch | own process ms [min-max] | resident (default) ms [min-max] "
        "| LiteRT script ms [min-max] | LiteRT/own process | LiteRT/resident | exact (xnnpack profile) |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Wall time of a fresh process, start to output written, median of {reps} runs after one untimed "
        "round, the three in turn. own process: `python -m npusim.app.cli run MODEL --input X.npy --output "
        "Y.npy --profile xnnpack`, what `npusim` does with NPUSIM_RESIDENT=0. resident: the same call as "
        "the `npusim` script makes it by default on Linux (`python -m npusim.app.resident run ...`), served "
        "by a server that the untimed round started and that stays up between calls, in a process it "
        "forks for the call (npusim/app/resident.py). LiteRT: a script that "
        f"loads the model (num_threads={LITERT_THREADS}, "
        "XNNPACK), resizes the input to the batch, invokes once and saves the output "
        "(experiments/bench/oneshot.py LITERT_SCRIPT). A ratio under 1 means npusim takes longer; what its "
        "start-up is made of: below and docs/performance.md.",
        "",
        *(
            [
                f"Where the time of `npusim run` on {first}, 1 image, goes: CPU time of each step in a fresh "
                f"process (experiments/bench/oneshot.py PHASES_SCRIPT), median of {reps} processes.",
                "",
                *phases,
                "",
            ]
            if phases
            else []
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m experiments.bench.oneshot", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--batch", type=int, default=256, help="the large batch (default 256), beside 1 image")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    lines = bench_one_shot(args.shared, {name: [1, args.batch] for name in MODELS}, args.reps, log=print)
    firsts = {**dict.fromkeys(MODELS, args.batch), **dict.fromkeys(YOLO_MODELS, 8)}
    lines += first_call_lines(args.shared, firsts, args.reps)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
