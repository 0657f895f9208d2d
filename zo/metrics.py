"""metrics.csv of a training run: one row per step (train loss) and per evaluation (test accuracy).

The file is appended to: a resumed run keeps the rows up to its checkpoint (checkpoint.truncate_csv
drops the later ones) and writes the header only into an empty log.
"""

from __future__ import annotations

import csv
from pathlib import Path

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
        self._file = None
        self._writer = None

    def open(self):
        """Open for appending; a log without rows gets the header first."""
        self._file = open(self.path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=METRIC_FIELDS)
        if self.rows == 0:
            self._writer.writeheader()

    def write(self, row: dict):
        self._writer.writerow(row)
        self.rows += 1

    def flush(self):
        self._file.flush()

    def close(self):
        self._file.close()
