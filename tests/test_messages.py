"""The messages of issue 56 item 6: each one `error:` line naming what, where and what was expected,
given before the work starts (click's usage errors included), and golden's outputs-only record."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from test_robustness import one_line_error

import npusim.app.cli
import zo.cli

from zo_fixtures import tiny_classifier


def npusim_cli(*args):
    return CliRunner().invoke(npusim.app.cli.main, [str(a) for a in args], catch_exceptions=False)


def zo_cli(*args):
    return CliRunner().invoke(zo.cli.main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize(
    "cli,args,needles",
    [
        (npusim_cli, ["run", "--bogus"], ["run", "No such option", "--help"]),
        (npusim_cli, ["frobnicate"], ["No such command 'frobnicate'"]),
        (npusim_cli, ["golden", "record"], ["golden record", "Missing argument 'MODEL'"]),
        (npusim_cli, ["run", "m.tflite", "--input", "x.npy", "--output", "y.npy", "--profile", "zz"],
         ["--profile", "'zz' is not one of"]),
        (zo_cli, ["train", "--q"], ["train", "'--q' requires an argument"]),
        (zo_cli, ["train", "--nope"], ["train", "No such option"]),
    ],
)
def test_usage_errors_are_one_error_line(cli, args, needles):
    one_line_error(cli(*args), *needles)


def test_truncated_tflite_says_truncated_with_both_sizes(tmp_path):
    data = tiny_classifier()
    cut = tmp_path / "cut.tflite"
    cut.write_bytes(data[: len(data) // 2])
    line = one_line_error(npusim_cli("inspect", cut), str(cut), "truncated", f"{len(data) // 2:,}-byte file")
    assert line.count("(") == line.count(")"), line


def test_a_text_file_named_npy_is_not_called_pickled(tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(tiny_classifier())
    junk = tmp_path / "junk.npy"
    junk.write_text("hello\n")
    result = npusim_cli("run", model, "--input", junk, "--output", tmp_path / "y.npy")
    line = one_line_error(result, str(junk), "not a NumPy file")
    assert "pickled" not in line


def test_trainable_bogus_is_refused_before_the_data_loads(tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(tiny_classifier())
    data = tmp_path / "data.npz"
    data.write_text("not read")  # a data error would be the message if the data were read first
    run = tmp_path / "run"
    args = ["--model", model, "--data", data, "--out", run, "--trainable", "bogus", "--quiet"]
    result = zo_cli("train", *args)
    one_line_error(result, "--trainable", "'bogus'", "expected last:K")


def test_golden_outputs_only_stores_no_intermediate_and_still_checks(tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(tiny_classifier())
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).integers(-128, 128, (2, 4, 4, 3)).astype(np.int8))
    full, small = tmp_path / "full.npz", tmp_path / "small.npz"
    assert npusim_cli("golden", "record", model, "--input", x, "-o", full).exit_code == 0
    result = npusim_cli("golden", "record", model, "--input", x, "-o", small, "--outputs-only")
    assert result.exit_code == 0, result.output
    assert f"({small.stat().st_size:,} bytes)" in result.output
    with np.load(small) as z:
        assert not [k for k in z.files if k.startswith("tensor_")]
        assert "output_0" in z.files and "input_0" in z.files
    assert small.stat().st_size < full.stat().st_size
    check = npusim_cli("golden", "check", model, small)
    assert check.exit_code == 0 and check.output.startswith("OK"), check.output
