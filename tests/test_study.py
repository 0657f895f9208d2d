"""The study's sweep machinery on the tiny `ci` grid: local pool and Ray agree, a sweep resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.study import main as study

from shared_paths import SHARED

pytestmark = pytest.mark.skipif(
    not (SHARED / "models").exists(), reason=f"SHARED DATA MISSING: {SHARED} not found (set NPU_SHARED)"
)


def results(runs_dir: Path) -> dict:
    out = {}
    for path in sorted(runs_dir.rglob("result.json")):
        r = json.loads(path.read_text())
        out[r["key"]] = (
            r["test_accuracy"],
            r["steps"],
            r["forward_passes"],
            (path.parent / "model.tflite").read_bytes(),
        )
    return out


def test_local_and_ray_sweeps_agree_and_resume(tmp_path, capsys):
    local, ray_dir = tmp_path / "local", tmp_path / "ray"
    study.main(
        [
            "--grid",
            "ci",
            "--shared",
            str(SHARED),
            "--runs",
            str(local),
            "--results",
            str(tmp_path / "report"),
            "--workers",
            "1",
            "--no-baseline",
        ]
    )
    first = results(local)
    assert len(first) == len(study.runs_of(study.GRIDS["ci"]))
    table = (tmp_path / "report" / "table.md").read_text()
    assert "qscheduler" in table and "Verdict" in table
    assert (tmp_path / "report" / "accuracy_vs_passes.png").stat().st_size > 0

    # Resume: a finished run is not redone; a removed one is, with the same result.
    victim = sorted(local.rglob("result.json"))[0]
    victim.unlink()
    # A report while runs are missing (a sweep still running): the unfinished cell is named, not tabled.
    args = [
        "--grid",
        "ci",
        "--shared",
        str(SHARED),
        "--runs",
        str(local),
        "--results",
        str(tmp_path / "partial"),
    ]
    study.main(args + ["--no-baseline", "--report-only"])
    capsys.readouterr()
    assert not (tmp_path / "partial" / "table.md").exists()  # the ci grid's only cell is unfinished
    study.main(
        [
            "--grid",
            "ci",
            "--shared",
            str(SHARED),
            "--runs",
            str(local),
            "--results",
            str(tmp_path / "report"),
            "--workers",
            "1",
            "--no-baseline",
        ]
    )
    assert "1 to do" in capsys.readouterr().out
    assert results(local) == first

    pytest.importorskip("ray")
    study.main(
        [
            "--grid",
            "ci",
            "--shared",
            str(SHARED),
            "--runs",
            str(ray_dir),
            "--results",
            str(tmp_path / "report-ray"),
            "--executor",
            "ray",
            "--workers",
            "2",
            "--no-baseline",
        ]
    )
    assert results(ray_dir) == first
