"""`make run`: fine-tune the shared ResNet-8 on EuroSAT-32, print accuracy before/after.

Equivalent to
    zo train --model SHARED/models/resnet8_cifar10_int8.tflite --data SHARED/data/eurosat32_subset.npz \
             --budget 20000 --out runs/default
(every option at zo train's default): a fresh 10-class head and the exact tail (the two convolutions
that reach it through parameter-free ops only) take their exact gradients forward-only.
A finished run directory is started afresh.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from zo.cli import main as zo_main

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "default")
    p.add_argument("--budget", type=int, default=20000)
    a = p.parse_args(argv)
    model = a.shared / "models" / "resnet8_cifar10_int8.tflite"
    data = a.shared / "data" / "eurosat32_subset.npz"
    for path in (model, data):
        if not path.exists():
            sys.exit(
                f"error: {path} not found; pass --shared DIR (or "
                "SHARED=DIR to make) pointing at the shared data"
            )
    shutil.rmtree(a.out, ignore_errors=True)
    zo_main(
        [
            "train",
            "--model",
            str(model),
            "--data",
            str(data),
            "--budget",
            str(a.budget),
            "--out",
            str(a.out),
        ],
        standalone_mode=True,
    )


if __name__ == "__main__":
    main()
