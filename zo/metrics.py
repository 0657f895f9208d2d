"""metrics.csv of a training run: one row per step (train loss) and per evaluation (test accuracy).

The rows are kept in memory and the whole file is written at every checkpoint, to a temporary name
then renamed (npusim/app/atomic.py): a full disk or a kill leaves the file of the last checkpoint, never
a half row. A resumed run keeps the rows up to its checkpoint (the later ones are redone) and writes
the header only once. One line end, "\\n", whatever a file of an older run held (csv's default is
"\\r\\n", which a resumed file then mixed with the "\\n" of its kept rows).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from npusim.app import atomic

METRIC_FIELDS = [
    "step",
    "q",
    "forward_passes",
    "train_loss",
    "test_accuracy",
    "val_accuracy",
    "wall_seconds",
    "macs",
    "device_seconds",
    "lr",
    "zero_differences",
]


class MetricsLog:
    """The rows of metrics.csv; `rows` counts the data rows the file holds (the header aside)."""

    def __init__(self, path: str | Path, rows: int = 0):
        self.path = Path(path)
        self.rows = rows
        self._lines: list[str] = []

    def open(self):
        """The header and the first `rows` rows of the file (a resumed run's), in memory."""
        kept = []
        if self.rows and self.path.exists():
            with open(self.path, encoding="utf-8", newline=None) as f:  # "\r\n" or "\n" alike
                kept = [line.rstrip("\n") + "\n" for line in f][: self.rows + 1]
        self._lines = kept or [",".join(METRIC_FIELDS) + "\n"]
        self.rows = len(self._lines) - 1

    def write(self, row: dict):
        text = io.StringIO()
        csv.DictWriter(text, fieldnames=METRIC_FIELDS, lineterminator="\n").writerow(row)
        self._lines.append(text.getvalue())
        self.rows += 1

    def flush(self):
        """The file as the rows stand now, whole (atomic.WriteFailed, an OSError, where it cannot be)."""
        atomic.write_text(self.path, "".join(self._lines), newline="")

    def close(self):
        pass
