"""Two checkouts of npusim against each other on the bench's workloads: `python -m experiments.bench.ab
--before DIR --after DIR --shared ../shared`.

A speed change is judged by an A/B, not by two bench runs hours apart (docs/performance.md: this
class of VM drifts by tens of percent within minutes). The workloads' models and inputs are written
once by this checkout; then each side runs in its own process (its npusim imported from its own
tree), the sides alternating for --rounds rounds, each process timing npusim and LiteRT in turn on
every workload. It prints each side's median npusim time, the median after/before ratio, the
LiteRT ratios, and whether the two sides' outputs are bit-identical and equal to LiteRT's
(xnnpack profile).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# (workload, batch, repetitions a process)
CASES = [
    ("conv", 1, 21),
    ("conv", 16, 11),
    ("resnet8", 64, 15),
    ("resnet8", 256, 7),
    ("mobilenet_v2", 64, 7),
    ("mobilenet_v2", 256, 5),
]

# Run inside each side's process: imports only npusim and LiteRT, so the harness is the same on both.
CHILD = r"""
import sys, time, statistics, json
import numpy as np, npusim
from ai_edge_litert.interpreter import Interpreter
work, side, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for name, b, reps in cases:
    model = open(f"{work}/{name}.tflite", "rb").read()
    x = np.ascontiguousarray(np.load(f"{work}/{name}_x.npy")[:b])
    sim = npusim.Interpreter(model, profile="xnnpack")
    lite = Interpreter(model_content=model, num_threads=2)
    i0, o0 = lite.get_input_details()[0]["index"], lite.get_output_details()[0]["index"]
    lite.resize_tensor_input(i0, x.shape)
    lite.allocate_tensors()
    def litert():
        lite.set_tensor(i0, x); lite.invoke(); return lite.get_tensor(o0)
    y = np.asarray(sim.run(x))
    np.save(f"{work}/out_{side}_{name}_{b}.npy", y)
    exact = bool(np.array_equal(y, litert()))
    ts, tl = [], []
    for _ in range(reps):
        t = time.perf_counter(); sim.run(x); ts.append(time.perf_counter() - t)
        t = time.perf_counter(); litert(); tl.append(time.perf_counter() - t)
    print(json.dumps([name, b, statistics.median(ts), statistics.median(tl), exact]), flush=True)
"""


def write_workloads(shared: Path, work: Path) -> None:
    import npusim

    from .workloads import MODELS, bench_inputs, conv_model

    (work / "conv.tflite").write_bytes(conv_model())
    rng = np.random.default_rng(2)
    np.save(work / "conv_x.npy", rng.integers(-128, 128, (16, 56, 56, 64), dtype=np.int8))
    for name in ("resnet8", "mobilenet_v2"):
        model = (shared / "models" / MODELS[name]).read_bytes()
        (work / f"{name}.tflite").write_bytes(model)
        t = npusim.load_model(model).input(0)
        x, _ = bench_inputs(shared, name, 256, t.shape, t.dtype)
        np.save(work / f"{name}_x.npy", np.ascontiguousarray(x[:256]))


def run_side(tree: Path, work: Path, side: str) -> list:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cases = json.dumps(CASES)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(work), side, cases],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"ab: the {side} side ({tree}) failed: {out.stderr.strip().splitlines()[-1]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="a checkout's root (has npusim/)")
    ap.add_argument("--after", type=Path, default=Path("."), help="default: this checkout")
    ap.add_argument("--shared", type=Path, default=Path("../shared"))
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    for side in (a.before, a.after):
        if not (side / "npusim" / "__init__.py").is_file():
            raise SystemExit(f"ab: {side}: expected a checkout's root with npusim/__init__.py")
    if not (a.shared / "models").is_dir():
        raise SystemExit(f"ab: {a.shared}: expected the shared folder (models/, data/)")
    if a.rounds < 1:
        raise SystemExit(f"ab: --rounds: expected a positive integer, got {a.rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_workloads(a.shared, work)
        run_side(a.before.resolve(), work, "warm")  # compiles the before side's kernels, untimed
        rows: dict = {}
        for _ in range(a.rounds):
            for side, tree in (("after", a.after), ("before", a.before)):
                for name, b, ms, ml, exact in run_side(tree.resolve(), work, side):
                    rows.setdefault((name, b), {}).setdefault(side, []).append((ms, ml, exact))
        same = {
            key: np.array_equal(
                np.load(work / f"out_after_{key[0]}_{key[1]}.npy"),
                np.load(work / f"out_before_{key[0]}_{key[1]}.npy"),
            )
            for key in rows
        }
    print(f"load average at the end: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    print(
        "| workload | batch | before npusim ms | after npusim ms | after / before | LiteRT/npusim before | "
        "after | outputs equal | exact vs LiteRT |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (name, b), sides in rows.items():
        med = {s: statistics.median(v[0] for v in sides[s]) for s in sides}
        lr = {s: statistics.median(v[1] / v[0] for v in sides[s]) for s in sides}
        exact = all(v[2] for s in sides for v in sides[s])
        print(
            f"| {name} | {b} | {1e3 * med['before']:.2f} | {1e3 * med['after']:.2f} | "
            f"{med['after'] / med['before']:.3f} | {lr['before']:.2f} | {lr['after']:.2f} | "
            f"{'yes' if same[(name, b)] else 'NO'} | {'yes' if exact else 'NO'} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
