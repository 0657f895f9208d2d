"""experiments/bench/ab.py: two checkouts timed in alternate processes. Here the same checkout is both
sides, so the outputs must be reported equal (and exact against LiteRT); bad input stops before any
work. No wall-time checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shared_paths import RESNET, SHARED, need

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from experiments.bench import ab  # noqa: E402

pytest.importorskip("ai_edge_litert", reason="LiteRT (the oracle) is not installed")


def test_same_checkout_both_sides(monkeypatch, capsys):
    need(RESNET)
    monkeypatch.setattr(ab, "CASES", [("conv", 1, 2), ("resnet8", 64, 2)])
    assert (
        ab.main(["--before", str(ROOT), "--after", str(ROOT), "--shared", str(SHARED), "--rounds", "1"]) == 0
    )
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| conv") or line.startswith("| resnet8")
    ]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[-2:] == ["yes", "yes"], row


@pytest.mark.parametrize(
    "args, says",
    [
        (["--before", "/nonexistent"], "expected a checkout's root"),
        (["--before", str(ROOT), "--shared", "/nonexistent"], "expected the shared folder"),
        (["--before", str(ROOT), "--rounds", "0"], "expected a positive integer"),
    ],
)
def test_bad_input_is_one_line(args, says):
    if "--shared" not in args:
        args = args + ["--shared", str(SHARED)]
        if "/nonexistent" not in args:
            need(RESNET)
    with pytest.raises(SystemExit) as stop:
        ab.main(args)
    assert says in str(stop.value) and "\n" not in str(stop.value)
