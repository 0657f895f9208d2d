"""experiments/bench/dw_sweep.py: the depthwise cost sweep runs and prints one line a case; bad input
is one line before any case is timed. No wall-time checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiments.bench import dw_sweep  # noqa: E402


def test_one_line_a_case(capsys):
    dw_sweep.main(["--batch", "1", "--channels", "16,64", "--kernels", "3", "--reps", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["C=16 k=3", "C=64 k=3"]
    assert all("GMAC/s" in line and "form)" in line for line in lines)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--channels", "a"], "comma-separated integers"),
        (["--batch", "0"], "must be positive"),
        (["--profile", "nosuch", "--channels", "16", "--kernels", "1", "--batch", "1"], "--profile nosuch"),
    ],
)
def test_bad_input(args, says, capsys):
    with pytest.raises(SystemExit) as stop:
        dw_sweep.main(args)
    assert stop.value.code == 2
    seen = capsys.readouterr()
    assert says in seen.err.strip().splitlines()[-1] and not seen.out
