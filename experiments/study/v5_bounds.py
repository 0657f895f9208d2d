"""The v5 study's cell selection, measured before any of its runs (docs/study.md, "Study v5"): for
each candidate (model, data, trainable set), the back-propagation bound of the whole set, of its exact
tail alone (the layers below the tail frozen) and of the head alone, each from the trainer's own start
with its own lr chosen on the held-out tenth (zo.backprop.bound_with_own_lr), seed 0.

    python -m experiments.study.v5_bounds --shared ../shared [--only NAME,...]

A cell qualifies when back-propagation into the layers below the tail adds more than 2 points over
the tail alone. Results are cached as JSON under experiments/results/v5-bounds/ and written as a
Markdown table there (table.md), which docs/study.md quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "results" / "v5-bounds"
THRESHOLD = 2.0  # points of back-propagation below the tail over the tail alone


@dataclass(frozen=True)
class Candidate:
    name: str
    model: str
    data: str
    trainable: str
    tail: (
        str  # the trainable set of its exact tail: the head and the layers with only parameter-free ops after
    )


RESNET8, MNV2 = "resnet8_cifar10_int8.tflite", "mobilenet_v2_0.35_128_flowers_int8.tflite"
REID = "stm32n6/mobilenetv2_a100_256_128_fft_int8.tflite"
# ResNet-8's last block feeds the final ADD (conv7, conv8 in the issue): `last:3` is its tail; in
# MobileNetV2 only the ReLU6 and the global pool follow the last 1x1 convolution: `last:2`.
CANDIDATES = (
    Candidate("r8-eurosat-last4", RESNET8, "eurosat32_subset.npz", "last:4", "last:3"),
    Candidate("r8-eurosat-last6", RESNET8, "eurosat32_subset.npz", "last:6", "last:3"),
    Candidate("r8-eurosat-last10", RESNET8, "eurosat32_subset.npz", "last:10", "last:3"),
    Candidate("mnv2-eurosat-last5", MNV2, "eurosat64_subset.npz", "last:5", "last:2"),
    Candidate("mnv2-eurosat-last8", MNV2, "eurosat64_subset.npz", "last:8", "last:2"),
    Candidate("mnv2-eurosat-last11", MNV2, "eurosat64_subset.npz", "last:11", "last:2"),
    Candidate("mnv2-cifar10-last5", MNV2, "cifar10_subset.npz", "last:5", "last:2"),
    Candidate("mnv2-cifar10-last8", MNV2, "cifar10_subset.npz", "last:8", "last:2"),
    Candidate("mnv2-1.0-eurosat-last5", REID, "eurosat64_subset.npz", "last:5", "last:2"),
)


def bound(shared: Path, model: str, data: str, trainable: str, below: str) -> dict:
    """bound_with_own_lr for one trainable set, cached by (model, data, trainable, below)."""
    from zo.backprop import bound_with_own_lr
    from zo.trainer import TrainConfig, Trainer

    key = f"{Path(model).stem}-{Path(data).stem}-{trainable.replace(':', '')}-{below}"
    path = OUT / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    start = time.perf_counter()
    config = TrainConfig(
        model=str(shared / "models" / model), data=str(shared / "data" / data), trainable=trainable,
        new_head=True, checkpoint_every=10**9,
    )  # fmt: skip
    trainer = Trainer(config, OUT / "_start" / key)
    lr, result = bound_with_own_lr(trainer, 0, below)
    out = {
        "lr": lr,
        "int8_test_accuracy": float(result["int8_test_accuracy"]),
        "float_test_accuracy": float(result.get("float_test_accuracy", float("nan"))),
        "start_accuracy": float(trainer.test_accuracy()),
        "seconds": time.perf_counter() - start,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return out


def measure(c: Candidate, shared: Path) -> dict:
    whole = bound(shared, c.model, c.data, c.trainable, "full")
    tail = bound(shared, c.model, c.data, c.tail, "full")
    head = bound(shared, c.model, c.data, c.tail, "frozen")
    gain = 100 * (whole["int8_test_accuracy"] - tail["int8_test_accuracy"])
    return {"whole": whole, "tail": tail, "head": head, "below_tail_gain": gain}


def table(rows: dict) -> str:
    lines = [
        "| candidate | trainable | tail | start | head alone | tail alone | whole set | below the tail "
        "| qualifies (> 2 points) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in CANDIDATES:
        if c.name not in rows:
            continue
        r = rows[c.name]
        pct = {k: f"{100 * r[k]['int8_test_accuracy']:.1f}" for k in ("head", "tail", "whole")}
        lines.append(
            f"| {c.name} | `{c.trainable}` | `{c.tail}` | {100 * r['whole']['start_accuracy']:.1f} | "
            f"{pct['head']} | {pct['tail']} | {pct['whole']} | {r['below_tail_gain']:+.1f} | "
            f"{'yes' if r['below_tail_gain'] > THRESHOLD else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    p.add_argument("--only", default=None, help="comma-separated candidate names")
    a = p.parse_args(argv)
    if not (a.shared / "models").is_dir():
        sys.exit(f"error: --shared {a.shared}: no models/ folder there, expected the shared data directory")
    names = a.only.split(",") if a.only else [c.name for c in CANDIDATES]
    unknown = set(names) - {c.name for c in CANDIDATES}
    if unknown:
        sys.exit(f"error: --only {','.join(sorted(unknown))}: not a candidate")
    rows = {}
    for c in CANDIDATES:
        if c.name in names:
            rows[c.name] = measure(c, a.shared)
            print(f"{c.name}: below the tail {rows[c.name]['below_tail_gain']:+.1f} points", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.md").write_text(
        f"Generated by `python -m experiments.study.v5_bounds {' '.join(argv or sys.argv[1:])}`.\n\n"
        + table(rows)
    )


if __name__ == "__main__":
    main()
