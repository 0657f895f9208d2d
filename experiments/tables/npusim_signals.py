"""SIGINT, SIGTERM and SIGHUP (in turn) at random moments of `npusim run` (ResNet-8, 64 images) in its
own process, from outside: how each try ended (exit status, a traceback or not, stderr lines).

    python -m experiments.tables.npusim_signals --shared ../shared --tries 15 [--sources DIR]

--sources runs another checkout's npusim (a folder holding npusim/, e.g. `git archive REV npusim`
unpacked), to compare. The delay is uniform over 30 to 100% of one undisturbed run's wall time.
"""

from __future__ import annotations

import argparse
import collections
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default="../shared")
    ap.add_argument("--tries", type=int, default=15)
    ap.add_argument("--sources", default=str(ROOT), help="the folder holding the npusim package to run")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="npusim-signals-"))
    np.save(work / "x.npy", np.random.default_rng(0).integers(-128, 128, (64, 32, 32, 3), dtype=np.int8))
    model = Path(args.shared) / "models" / "resnet8_cifar10_int8.tflite"
    cmd = [sys.executable, "-m", "npusim.app.resident", "run", str(model), "--input", str(work / "x.npy")]
    cmd += ["--output", str(work / "y.npy")]
    env = {"PYTHONPATH": args.sources, "NPUSIM_RESIDENT": "0", "PATH": "/usr/bin:/bin"}
    env["HOME"] = str(Path.home())
    # Run from the scratch folder: `python -m` puts the working directory first on the path.
    subprocess.run(cmd, env=env, cwd=work, check=True)  # kernels compiled or loaded into the cache
    start = time.monotonic()
    subprocess.run(cmd, env=env, cwd=work, check=True)
    full = time.monotonic() - start
    rng, ended = random.Random(1), collections.Counter()
    for k in range(args.tries):
        proc = subprocess.Popen(cmd, env=env, cwd=work, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.3 * full, full))
        proc.send_signal(SIGNALS[k % len(SIGNALS)])
        err = proc.communicate()[1]
        traceback = "Traceback" in err or "Exception ignored" in err
        ended[(proc.returncode, traceback, len(err.splitlines()))] += 1
        if proc.returncode != 130:
            print(f"try {k}: {SIGNALS[k % len(SIGNALS)].name}, exit {proc.returncode}: {err[-300:]!r}")
    print(f"one run {full:.2f} s; {args.tries} tries, (exit status, traceback, stderr lines): count")
    for (code, traceback, lines), n in sorted(ended.items()):
        print(f"  ({code}, {traceback}, {lines}): {n}")


if __name__ == "__main__":
    main()
