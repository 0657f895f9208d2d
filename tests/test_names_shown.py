"""Names from a model file reach the terminal escaped (npusim/app/display.py): an escape sequence or a line
end in a tensor name shows as `\\x1b`, `\\x0a` in inspect, compare, validate and error lines, and never
runs or breaks a table; a long list of tensors in inspect's text is abbreviated."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from npusim.app.display import abbreviated, shown
from npusim.testing import oracle as O

HOSTILE = "evil\x1b[2J\x1b[31mred\nline2\x07"


def hostile_model() -> bytes:
    b = O.ModelBuilder()
    x = b.add_tensor((1, 4, 6), np.int8, 0.1, -3, name="in\x1b]0;title\x07put")
    y = b.add_tensor((1, 4, 6), np.int8, 1.0 / 256, -128, name=HOSTILE)
    b.add_op("LOGISTIC", [x], [y])
    return b.build([x], [y])


def split_model(n: int = 128) -> bytes:
    b = O.ModelBuilder()
    axis = b.add_const(np.asarray(2, np.int32).reshape(()), name="axis")
    x = b.add_tensor((1, 4, n), np.int8, 0.1, -3, name="input")
    parts = [b.add_tensor((1, 4, 1), np.int8, 0.1, -3, name=f"part{k}") for k in range(n)]
    opt = O.schema.SplitOptionsT()
    opt.numSplits = n
    b.add_op("SPLIT", [axis, x], parts, opt)
    return b.build([x], parts)


def npusim(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "npusim.app.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def clean(text: str) -> bool:
    """No control character, and the name's own line end no line end (escaped, or repr's \\n)."""
    lines = text.splitlines()
    return not any(c in text for c in "\x1b\x07") and not any(line.startswith("line2") for line in lines)


def test_shown_escapes_control_characters_only():
    assert shown("conv2d/Relu;add:0 é ü 名") == "conv2d/Relu;add:0 é ü 名"
    assert shown("a\x1b[31mb\nc\x7f\x85") == "a\\x1b[31mb\\x0ac\\x7f\\x85"
    assert shown("\u2028") == "\\u2028"
    assert abbreviated(["a", "b", "c", "d", "e", "f"], "outputs") == "a, b, c, d, e, f"
    assert abbreviated([f"t{k}" for k in range(128)], "outputs") == "128 outputs: t0, t1, ... t127"


def test_inspect_compare_and_validate_show_names_escaped(tmp_path):
    (tmp_path / "m.tflite").write_bytes(hostile_model())
    np.save(tmp_path / "x.npy", np.random.default_rng(0).integers(-128, 128, (2, 4, 6), dtype=np.int8))
    for args in (
        ["inspect", "m.tflite"],
        ["compare", "m.tflite", "--input", "x.npy", "--a", "tflm", "--b", "single"],
        ["validate", "m.tflite", "--input", "x.npy"],
        ["validate", "m.tflite", "--input", "x.npy", "--format", "csv"],
    ):
        done = npusim(*args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert clean(done.stdout), (args, done.stdout)
        assert "evil\\x1b[2J\\x1b[31mred\\" in done.stdout, (args, done.stdout)
    inspect = npusim("inspect", "m.tflite", cwd=tmp_path).stdout.splitlines()
    assert inspect[1].startswith("  in\\x1b]0;title\\x07put")  # one line per tensor, the table whole
    assert inspect[3].startswith("  evil\\x1b[2J")
    assert inspect[4] == "#  op        inputs  outputs  MACs  params  weights"


def test_an_error_line_shows_names_escaped(tmp_path):
    (tmp_path / "m.tflite").write_bytes(hostile_model())
    np.save(tmp_path / "x.npy", np.zeros((2, 4, 5), np.int8))  # the wrong shape: the error names the input
    done = npusim("run", "m.tflite", "--input", "x.npy", "--output", "y.npy", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and clean(done.stderr), done.stderr


def test_a_split_of_128_outputs_is_one_short_row(tmp_path):
    (tmp_path / "s.tflite").write_bytes(split_model())
    done = npusim("inspect", "s.tflite", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "SPLIT" in line)
    assert "128 outputs: 1x4x1, 1x4x1, ... 1x4x1" in row and len(row) < 120, row
