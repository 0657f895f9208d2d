"""experiments/tables/defaults.py: one row end to end on the real ResNet-8 (a short budget), its
resume, and the generated table."""

from __future__ import annotations

import json
import math

import pytest

from experiments.tables import defaults as defaults_table

from shared_paths import SHARED

pytestmark = pytest.mark.skipif(
    not (SHARED / "models").exists(), reason=f"SHARED DATA MISSING: {SHARED} not found (set NPU_SHARED)"
)


def test_one_row_trains_records_and_resumes(tmp_path, capsys):
    args = [
        "--shared",
        str(SHARED),
        "--budget",
        "400",
        "--workers",
        "1",
        "--rows",
        "resnet8-eurosat32_subset-last1",
        "--runs",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "results"),
    ]
    defaults_table.main(args)
    row = json.loads((tmp_path / "runs" / "resnet8-eurosat32_subset-last1-seed0.json").read_text())
    assert row["forward_passes"] <= 400 and row["chance"] == pytest.approx(0.1)
    assert row["mapping"].startswith("--input-range 0:255 (auto)")  # ResNet-8: int8, scale 1, zp -128
    # the initialized head starts far above chance, its passes (one per batch of 32 of the 9,000
    # training images left beside the 1,000 held out) paid from the budget; the bound starts there too
    assert row["init_passes"] == 282 and row["start_accuracy"] > 0.5
    assert row["bound_accuracy"] > 0.5 and row["zo_accuracy"] > 0.5
    # last:1 has nothing below the head: the bound restricted below it is the bound itself
    assert row["frozen_accuracy"] == row["bound_accuracy"] and row["restricted"] == defaults_table.RESTRICTED
    # the goal is issue 53's: the gain over the head alone, here the bound itself (no gain to share),
    # so the row's goal is the trainer at or above it; below its start is marked strictly
    assert math.isnan(row["fraction"]) and math.isnan(defaults_table.share(row))
    assert defaults_table.goal_met(row) == (row["zo_accuracy"] >= row["frozen_accuracy"])
    deeper = {**row, "frozen_accuracy": 0.6, "bound_accuracy": 0.8, "start_accuracy": 0.55}
    assert defaults_table.share({**deeper, "zo_accuracy": 0.7}) == pytest.approx(0.5)
    assert defaults_table.goal_met({**deeper, "zo_accuracy": 0.7})
    assert not defaults_table.goal_met({**deeper, "zo_accuracy": 0.69})
    assert defaults_table.below_start({**deeper, "zo_accuracy": 0.5499})
    assert not defaults_table.below_start({**deeper, "zo_accuracy": 0.55})
    table = (tmp_path / "results" / "table.md").read_text()
    assert "| resnet8 | eurosat32_subset | `last:1` | 650 |" in table
    assert "row(s) end below their start" in table and "head alone" in table
    # A finished row is read back, not trained again.
    (tmp_path / "runs" / "resnet8-eurosat32_subset-last1-seed0.json").write_text(
        json.dumps({**row, "zo_accuracy": 0.5})
    )
    defaults_table.main(args)
    assert "| 50.0 |" in (tmp_path / "results" / "table.md").read_text()
    # A row stored before the restricted bound gets it added, and is not trained again.
    stored = tmp_path / "runs" / "resnet8-eurosat32_subset-last1-seed0.json"
    old = {k: v for k, v in row.items() if k not in ("frozen_accuracy", "restricted")}
    stored.write_text(json.dumps({**old, "zo_accuracy": 0.5}))
    defaults_table.main(args)
    again = json.loads(stored.read_text())
    assert again["zo_accuracy"] == 0.5 and again["frozen_accuracy"] == row["bound_accuracy"]
    with pytest.raises(SystemExit, match="no such row"):
        defaults_table.main(["--shared", str(SHARED), "--rows", "nope"])
