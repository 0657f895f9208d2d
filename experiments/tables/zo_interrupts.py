"""Ctrl-C at random moments of `zo train`, from outside: exit code, the last line, and how long the
line and the exit took after the signal.

    python -m experiments.tables.zo_interrupts --shared ../shared --tries 8 --within 2:16

Each try starts `python -m zo.cli train` on MobileNetV2-0.35 and EuroSAT-64 (setup: about 10 s on
an idle 2-core machine, more under load) in a fresh directory, sends one SIGINT after a random delay
in the --within window (seconds), and, when a checkpoint was written, runs the command the message
suggests and reports its exit code too.
"""

from __future__ import annotations

import argparse
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one_try(model: Path, data: Path, out: Path, delay: float, budget: int) -> dict:
    args = ["train", "--model", str(model), "--data", str(data), "--out", str(out), "--budget", str(budget)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "zo.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines, seen = [], {}

    def read():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith("error:"):
                seen["line"] = time.monotonic()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(delay)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait()
    exited = time.monotonic()
    reader.join()
    row = {
        "delay_s": round(delay, 1),
        "exit": proc.returncode,
        "line_after_s": round(seen["line"] - sent, 2) if "line" in seen else None,
        "exit_after_s": round(exited - sent, 2),
        "traceback": any("Traceback" in line for line in lines),
        "last": lines[-1] if lines else "",
    }
    if "continue with: " in row["last"]:
        command = shlex.split(row["last"].split("continue with: ")[1])
        resumed = subprocess.run(
            [sys.executable, "-m", "zo.cli", *command[1:], "--quiet"],
            capture_output=True,
        )
        row["resumed_exit"] = resumed.returncode
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    p.add_argument("--tries", type=int, default=8)
    p.add_argument("--within", default="2:16", help="LO:HI seconds after the start")
    p.add_argument("--budget", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    model = a.shared / "models" / "mobilenet_v2_0.35_128_flowers_int8.tflite"
    data = a.shared / "data" / "eurosat64_subset.npz"
    for path in (model, data):
        if not path.exists():
            sys.exit(f"error: {path} not found; pass --shared DIR pointing at the shared data")
    lo, hi = (float(v) for v in a.within.split(":"))
    rng = random.Random(a.seed)
    root = Path(tempfile.mkdtemp(prefix="zo-interrupts-"))
    try:
        for k in range(a.tries):
            print(one_try(model, data, root / f"run{k}", rng.uniform(lo, hi), a.budget), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
