"""Fitting the latency model's free constants on board measurements.

A calibration file is a CSV with the columns of the project's published.csv (ST's model-zoo figures
for the STM32N6570-DK, /work/shared/models/stm32n6/published.csv):

    file,model,input,npu_ms,cpu_mhz,npu_mhz,internal_ram_kib,external_ram_kib,weights_flash_kib,
    stedgeai_version,source

`file` (a .tflite, relative to the CSV's folder) and `npu_ms` (measured inference time) are required;
empty clocks mean the default clocks of CostModel; `internal_ram_kib` is compared with the memory
plan, never fitted. When one file has several rows (ST republishes figures with each ST Edge AI Core
release), the row of the newest `stedgeai_version` is used.

The fit: least squares on log(estimated / measured) over the measurements, in the free constants
FIT_PARAMETERS (NPU efficiency and epoch overhead; every other constant comes from ST documents, see
cost.COST_CONSTANTS). Relative errors, so a 5 ms and a 30 ms model weigh the same. With n models and
two constants, n - 2 degrees of freedom remain.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import NpusimError

CSV_COLUMNS = (
    "file",
    "model",
    "input",
    "npu_ms",
    "cpu_mhz",
    "npu_mhz",
    "internal_ram_kib",
    "external_ram_kib",
    "weights_flash_kib",
    "stedgeai_version",
    "source",
)
REQUIRED_COLUMNS = ("file", "npu_ms")
FIT_PARAMETERS = ("npu_efficiency", "epoch_overhead_s")
# Bounds of the free constants in the fit (the efficiency is a fraction of the peak).
FIT_BOUNDS = {"npu_efficiency": (1e-4, 1.0), "epoch_overhead_s": (1e-8, 1e-2)}


@dataclass
class Measurement:
    file: str
    path: Path
    npu_ms: float
    model: str = ""
    internal_ram_kib: float | None = None
    npu_mhz: float | None = None
    cpu_mhz: float | None = None
    stedgeai_version: str = ""
    source: str = ""


def _number(row: dict, column: str, line: int, required: bool = False) -> float | None:
    text = (row.get(column) or "").strip()
    if not text:
        if required:
            raise NpusimError(f"calibration line {line}: column {column} is empty")
        return None
    try:
        value = float(text)
    except ValueError:
        raise NpusimError(f"calibration line {line}: {column} {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        if column.endswith("_kib") and value == 0:
            return 0.0
        raise NpusimError(f"calibration line {line}: {column} must be a positive number, got {text}")
    return value


def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in version.strip().split(".")) if version.strip() else ()


def read_calibration_csv(path, model_dir=None) -> list:
    """Measurements of a calibration CSV, the newest ST Edge AI version per model file. Every problem
    (unreadable file, missing column, bad number, missing model) is one NpusimError line."""
    path = Path(path)
    folder = Path(model_dir) if model_dir is not None else path.parent
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise NpusimError(
                    f"calibration {path}: missing column(s) {', '.join(missing)} (expected the columns of "
                    f"published.csv: {','.join(CSV_COLUMNS)})"
                )
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise NpusimError(f"calibration {path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    newest: dict = {}
    for line, row in enumerate(rows, start=2):
        name = (row.get("file") or "").strip()
        if not name:
            raise NpusimError(f"calibration line {line}: column file is empty")
        m = Measurement(
            file=name,
            path=folder / name,
            npu_ms=_number(row, "npu_ms", line, required=True),
            model=(row.get("model") or "").strip(),
            internal_ram_kib=_number(row, "internal_ram_kib", line),
            npu_mhz=_number(row, "npu_mhz", line),
            cpu_mhz=_number(row, "cpu_mhz", line),
            stedgeai_version=(row.get("stedgeai_version") or "").strip(),
            source=(row.get("source") or "").strip(),
        )
        if not m.path.is_file():
            raise NpusimError(f"calibration line {line}: model file {m.path} not found")
        old = newest.get(name)
        if old is None or _version_key(m.stedgeai_version) >= _version_key(old.stedgeai_version):
            newest[name] = m
    if not newest:
        raise NpusimError(f"calibration {path}: no measurements")
    return list(newest.values())


def measurement_cost(base, m: Measurement):
    """The cost model of one measurement: `base` with the clocks the measurement was taken at."""
    changes = {}
    if m.npu_mhz:
        changes["npu_clock_hz"] = m.npu_mhz * 1e6
    if m.cpu_mhz:
        changes["m55_clock_hz"] = m.cpu_mhz * 1e6
    return replace(base, **changes) if changes else base


@dataclass
class Calibration:
    cost: object  # the fitted CostModel
    measurements: list  # list[Measurement]
    estimated_ms: list  # per measurement, with the fitted constants
    internal_ram_kib: list  # per measurement, the memory plan's internal RAM
    parameters: tuple = FIT_PARAMETERS
    structures: dict = field(default_factory=dict, repr=False)  # file -> DeviceStructure

    @property
    def degrees_of_freedom(self) -> int:
        return len(self.measurements) - len(self.parameters)

    @property
    def ratios(self) -> list:
        return [e / m.npu_ms for e, m in zip(self.estimated_ms, self.measurements)]

    def summary(self) -> str:
        fitted = ", ".join(f"{p} = {getattr(self.cost, p):.4g}" for p in self.parameters)
        worst = max(abs(r - 1) for r in self.ratios)
        return (
            f"calibrated on {len(self.measurements)} measurement(s): {fitted}; "
            f"{self.degrees_of_freedom} degree(s) of freedom left; largest latency error {100 * worst:.1f} %"
        )

    def to_dict(self) -> dict:
        return {
            "parameters": {p: getattr(self.cost, p) for p in self.parameters},
            "degrees_of_freedom": self.degrees_of_freedom,
            "measurements": [
                {
                    "file": m.file,
                    "published_ms": m.npu_ms,
                    "estimated_ms": e,
                    "published_internal_ram_kib": m.internal_ram_kib,
                    "estimated_internal_ram_kib": r,
                    "stedgeai_version": m.stedgeai_version,
                    "source": m.source,
                }
                for m, e, r in zip(self.measurements, self.estimated_ms, self.internal_ram_kib)
            ],
        }


def _structures(measurements, structures: dict | None) -> dict:
    from ..runtime.interpreter import Interpreter
    from .cost import device_structure

    structures = dict(structures or {})
    for m in measurements:
        if m.file not in structures:
            try:
                structures[m.file] = device_structure(Interpreter(str(m.path), warm=False))
            except NpusimError as e:
                raise NpusimError(f"calibration model {m.file}: {e}") from None
    return structures


def estimate_ms(structure, cost) -> float:
    from .cost import op_times

    total = 0.0
    for op, depth, bank in zip(structure.ops, structure.depth, structure.bank_bytes):
        compute, memory, overhead = op_times(op, depth, bank, cost)
        total += max(compute, memory) + overhead
    return total * 1e3


def fit_cost_model(measurements, base=None, parameters=FIT_PARAMETERS, structures: dict | None = None):
    """Fit `parameters` of `base` (default: a CostModel of the module constants) on `measurements`;
    returns a Calibration. `structures` ({file: DeviceStructure}) may hold models already planned."""
    from scipy.optimize import least_squares

    from .cost import CostModel

    base = base or CostModel()
    measurements = list(measurements)
    if len(measurements) < len(parameters):
        raise NpusimError(
            f"calibration: {len(measurements)} measurement(s) cannot fit {len(parameters)} constants "
            f"({', '.join(parameters)})"
        )
    structures = _structures(measurements, structures)
    lo = np.log([FIT_BOUNDS[p][0] for p in parameters])
    hi = np.log([FIT_BOUNDS[p][1] for p in parameters])
    x0 = np.clip(np.log([getattr(base, p) for p in parameters]), lo + 1e-9, hi - 1e-9)

    def model(x):
        return replace(base, **{p: float(v) for p, v in zip(parameters, np.exp(x))})

    def residuals(x):
        cost = model(x)
        return [
            math.log(estimate_ms(structures[m.file], measurement_cost(cost, m)) / m.npu_ms)
            for m in measurements
        ]

    result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, xtol=1e-12, ftol=1e-12)
    cost = model(result.x)
    return Calibration(
        cost=cost,
        measurements=measurements,
        estimated_ms=[estimate_ms(structures[m.file], measurement_cost(cost, m)) for m in measurements],
        internal_ram_kib=[structures[m.file].memory.internal_bytes / 1024 for m in measurements],
        parameters=tuple(parameters),
        structures=structures,
    )


def leave_one_out(
    measurements, base=None, parameters=FIT_PARAMETERS, structures: dict | None = None, fit=None
) -> list:
    """For each measurement: (measurement, estimated ms with the constants fitted on all the others,
    that fit's Calibration). fit(rest, structures) -> Calibration, when given, replaces
    fit_cost_model(rest, base, parameters, structures) (experiments/tables/stm32n6.py re-chooses the
    half-depth in it)."""
    measurements = list(measurements)
    structures = _structures(measurements, structures)
    out = []
    for i, held in enumerate(measurements):
        rest = measurements[:i] + measurements[i + 1 :]
        cal = fit(rest, structures) if fit else fit_cost_model(rest, base, parameters, structures)
        out.append((held, estimate_ms(structures[held.file], measurement_cost(cal.cost, held)), cal))
    return out
