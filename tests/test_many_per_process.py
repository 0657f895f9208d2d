"""Many models or inputs in one process, so that a CI job pays the start-up once: `npusim golden
check` on MODEL GOLDEN pairs or on a directory of goldens, and `npusim run` with repeated --input /
--output. Each pair's line is the single-pair message, prefixed with its golden; the exit code is the
worst pair's (2 bad input, 1 mismatch, 0 all match)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from npusim.app.cli import main

from shared_paths import MOBILENET, RESNET, need


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    """A directory with ResNet-8 and MobileNetV2 (symlinks to the shared models, under names of
    our own) and a golden of each on 2 images, recorded through the command line."""
    d = tmp_path_factory.mktemp("ci")
    (d / "sub").mkdir()
    models = {
        "resnet8": (d / "resnet8.tflite", RESNET),
        "mobilenet": (d / "sub" / "mobilenet.tflite", MOBILENET),
    }
    rng = np.random.default_rng(3)
    for name, (link, source) in models.items():
        link.symlink_to(need(source))
        shape = (2, 32, 32, 3) if name == "resnet8" else (2, 128, 128, 3)
        dtype = np.int8 if name == "resnet8" else np.uint8
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape).astype(dtype)
        np.save(d / f"{name}_x.npy", x)
        golden = link.with_name(f"{name}.golden.npz")
        result = cli("golden", "record", link, "--input", d / f"{name}_x.npy", "-o", golden)
        assert result.exit_code == 0, result.output
    return d


def _tampered(src, dst):
    """A copy of a golden whose stored output 0 differs in its first element."""
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    out = arrays["output_0"].copy()
    out.flat[0] = out.flat[0] + 1 if out.dtype.kind == "f" else out.flat[0] ^ 1  # int: its lowest bit
    arrays["output_0"] = out
    with open(dst, "wb") as f:
        np.savez_compressed(f, **arrays)
    return dst


def test_a_directory_checks_every_golden_with_the_single_pair_message(goldens):
    pairs = [
        (goldens / "sub" / "mobilenet.tflite", goldens / "sub" / "mobilenet.golden.npz"),
        (goldens / "resnet8.tflite", goldens / "resnet8.golden.npz"),
    ]
    singles = []
    for model, golden in pairs:
        one = cli("golden", "check", model, golden)
        assert one.exit_code == 0 and one.output.startswith("OK: "), one.output
        singles.append(f"{golden}: {one.output.strip()}")
    result = cli("golden", "check", goldens)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines == sorted(singles) + ["2 golden file(s) checked: 2 OK, 0 MISMATCH, 0 error(s)"]


def test_pairs_report_every_pair_and_a_tampered_golden_is_damaged(goldens, tmp_path):
    """A stored array that disagrees with its own hash is a damaged file (exit 2), never the model's
    mismatch; the other pair is still checked."""
    bad = _tampered(goldens / "sub" / "mobilenet.golden.npz", tmp_path / "mobilenet.golden.npz")
    resnet = (goldens / "resnet8.tflite", goldens / "resnet8.golden.npz")
    result = cli("golden", "check", goldens / "sub" / "mobilenet.tflite", bad, *resnet)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"error: {bad}: damaged golden file"), lines[0]
    assert lines[1].startswith(f"{resnet[1]}: OK: "), lines[1]
    assert lines[2] == "2 golden file(s) checked: 1 OK, 0 MISMATCH, 1 error(s)"


def test_a_bad_pair_is_one_error_line_and_exit_2_after_the_others(goldens, tmp_path):
    """A golden without its model in the directory, and a golden of another model given as a pair:
    each one `error:` line on stderr; the good pair is still checked; bad input outranks mismatch."""
    d = tmp_path / "ci"
    d.mkdir()
    (d / "resnet8.tflite").symlink_to(goldens / "resnet8.tflite")
    (d / "resnet8.golden.npz").symlink_to(goldens / "resnet8.golden.npz")
    _tampered(goldens / "resnet8.golden.npz", d / "orphan.golden.npz")
    result = cli("golden", "check", d)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {d / 'orphan.golden.npz'}: no model beside it, expected orphan.tflite or orphan.onnx; "
        f"name the pair: golden check MODEL {d / 'orphan.golden.npz'}"
    ]
    assert result.stdout.strip().splitlines()[0].startswith(f"{d / 'resnet8.golden.npz'}: OK: ")
    assert result.stdout.strip().splitlines()[1] == "2 golden file(s) checked: 1 OK, 0 MISMATCH, 1 error(s)"
    mobilenet = goldens / "sub" / "mobilenet.tflite"
    result = cli(
        "golden",
        "check",
        mobilenet,
        goldens / "resnet8.golden.npz",
        goldens / "resnet8.tflite",
        d / "orphan.golden.npz",
    )
    assert result.exit_code == 2, result.output
    wrong, damaged = result.stderr.strip().splitlines()  # the tampered orphan is a damaged file
    assert wrong.startswith(f"error: {mobilenet} (sha256 ") and "is not the model" in wrong, wrong
    assert damaged.startswith(f"error: {d / 'orphan.golden.npz'}: damaged golden file"), damaged
    assert result.stdout.strip().splitlines()[-1] == "2 golden file(s) checked: 0 OK, 0 MISMATCH, 2 error(s)"


@pytest.mark.parametrize(
    "args, message",
    [
        (["a.tflite"], "error: golden check a.tflite: expected MODEL GOLDEN, MODEL GOLDEN pairs or a DIR"),
        (
            ["a.tflite", "a.golden.npz", "b.tflite"],
            "error: golden check: 3 paths, expected MODEL GOLDEN pairs (an even number) or one DIR",
        ),
    ],
)
def test_arguments_that_are_no_pairs_exit_2(tmp_path, args, message):
    result = cli("golden", "check", *[tmp_path / a if a.endswith(".npz") else a for a in args])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        message.replace("a.golden.npz", str(tmp_path / "a.golden.npz"))
    ]
    assert result.stdout == ""


def test_a_directory_without_goldens_exits_2(tmp_path):
    result = cli("golden", "check", tmp_path)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == f"error: {tmp_path}: no *.golden.npz golden file in the directory or below\n"


def test_run_with_several_inputs_writes_what_one_run_each_writes(goldens, tmp_path):
    model = goldens / "resnet8.tflite"
    x = np.load(goldens / "resnet8_x.npy")
    np.save(tmp_path / "a.npy", x[:1])
    np.save(tmp_path / "b.npy", x[::-1])  # another batch size, in the same process
    many = cli(
        "run",
        model,
        "--input",
        tmp_path / "a.npy",
        "--output",
        tmp_path / "a_out.npy",
        "--input",
        tmp_path / "b.npy",
        "--output",
        tmp_path / "b_out.npz",
    )
    assert many.exit_code == 0, many.output
    for name, out in (("a", "a_one.npy"), ("b", "b_one.npz")):
        one = cli("run", model, "--input", tmp_path / f"{name}.npy", "--output", tmp_path / out)
        assert one.exit_code == 0, one.output
    assert np.array_equal(np.load(tmp_path / "a_out.npy"), np.load(tmp_path / "a_one.npy"))
    with np.load(tmp_path / "b_out.npz") as many_b, np.load(tmp_path / "b_one.npz") as one_b:
        assert many_b.files == one_b.files == ["output_0"]
        assert np.array_equal(many_b["output_0"], one_b["output_0"])
        assert many_b["output_0"].shape[0] == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--input", "b.npy"],
            "error: --input given 2 time(s), --output 1: expected one --output per --input, "
            "in the same order",
        ),
        (
            ["--input", "b.npy", "--output", "b.npy", "--dump", "d"],
            "error: --dump writes the tensors of one input, got 2 --input",
        ),
    ],
)
def test_run_inputs_and_outputs_that_do_not_pair_exit_2(goldens, tmp_path, extra, message):
    model = need(RESNET)
    result = cli("run", model, "--input", goldens / "resnet8_x.npy", "--output", tmp_path / "y.npy", *extra)
    assert result.exit_code == 2 and result.stderr == message + "\n"
    assert not (tmp_path / "y.npy").exists()


def test_run_reads_every_input_before_writing_any_output(goldens, tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"not an array")
    result = cli(
        "run",
        need(RESNET),
        "--input",
        goldens / "resnet8_x.npy",
        "--output",
        tmp_path / "y.npy",
        "--input",
        tmp_path / "bad.npy",
        "--output",
        tmp_path / "z.npy",
    )
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: --input {tmp_path / 'bad.npy'}: cannot read as .npy"), line
    assert not (tmp_path / "y.npy").exists()
