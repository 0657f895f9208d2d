"""`npusim compare` through the CLI: two profiles on the real MobileNetV2 (they part), a --dump
directory of the same profile (no mismatch), plain <name>.npy references, and bad input (exit 2)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from npusim import Interpreter, load_model
from npusim.app.cli import main, tensor_file_name
from npusim.app.compare import compare_profiles, compare_reference, sanitize_name

from shared_paths import MOBILENET, RESNET, need


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def assert_one_line_error(result):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def mobilenet_input(tmp_path_factory):
    model = need(MOBILENET)
    d = tmp_path_factory.mktemp("cmp")
    x = np.random.default_rng(5).integers(0, 256, (2, 128, 128, 3)).astype(np.uint8)
    np.save(d / "x.npy", x)
    return model, d / "x.npy", x


@pytest.fixture(scope="module")
def resnet_dump(tmp_path_factory):
    """ResNet-8 on 3 images, dumped by `npusim run --dump` under tflm."""
    model = need(RESNET)
    d = tmp_path_factory.mktemp("dump")
    x = np.random.default_rng(6).integers(-128, 128, (3, 32, 32, 3)).astype(np.int8)
    np.save(d / "x.npy", x)
    result = cli("run", model, "--input", d / "x.npy", "--output", d / "y.npy", "--dump", d / "tflm")
    assert result.exit_code == 0, result.output
    return model, d / "x.npy", x, d / "tflm"


# -- two profiles ------------------------------------------------------------------------------


def test_tflm_against_xnnpack_on_mobilenet(mobilenet_input):
    model, x_path, x = mobilenet_input
    result = cli("compare", model, "--input", x_path, "--a", "tflm", "--b", "xnnpack")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "A = tflm, B = xnnpack" in out
    assert "first difference: op " in out and "LSB" in out
    # the table has one row per op output plus the graph input
    graph = load_model(model)
    assert out.count("\n") >= len(graph.ops) + 3

    comparison = compare_profiles(graph, x, "tflm", "xnnpack")
    assert len(comparison.rows) == len(graph.ops) + 1
    first = comparison.first
    assert first is not None and first.kind in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
    assert f"first difference: op {first.op_index} ({first.kind})" in out
    # rows agree with a direct run of the two profiles
    va, vb = Interpreter(graph, "tflm").run_all(x), Interpreter(graph, "xnnpack").run_all(x)
    for row in comparison.rows:
        assert row.mismatches == int(np.count_nonzero(va[row.tensor] != vb[row.tensor]))
    assert sum(1 for r in comparison.rows if r.differs) > len(graph.ops) // 2
    # real units are LSB times the tensor's scale; an op before the first difference has none
    for row in comparison.rows:
        t = graph.tensors[row.tensor]
        if row.max_lsb is not None and t.quant is not None:
            assert row.max_real == pytest.approx(row.max_lsb * t.scale)
        if row.op_index is not None and row.position < first.position:
            assert row.mismatches == 0
    # data movement never rounds: whatever PAD passes on it inherited
    for row in comparison.rows:
        if row.kind in ("PAD", "RESHAPE"):
            assert row.isolated == 0


def test_same_profile_agrees(resnet_dump):
    model, x_path, _, _ = resnet_dump
    result = cli("compare", model, "--input", x_path, "--a", "xnnpack", "--b", "xnnpack")
    assert result.exit_code == 0
    assert "no difference" in result.stdout


# -- against a reference directory ---------------------------------------------------------------


def test_reference_dump_of_the_same_profile_has_no_mismatch(resnet_dump):
    model, x_path, _, dump = resnet_dump
    result = cli("compare", model, "--input", x_path, "--reference", dump)
    assert result.exit_code == 0, result.output
    assert "no difference: A and B agree on all 17 compared tensors" in result.stdout
    assert "ignored" not in result.stdout


def test_reference_dump_of_another_profile_differs(resnet_dump, tmp_path):
    model, x_path, _, dump = resnet_dump
    assert (
        cli(
            "run",
            model,
            "--input",
            x_path,
            "--output",
            tmp_path / "y.npy",
            "--profile",
            "xnnpack",
            "--dump",
            tmp_path / "x",
        ).exit_code
        == 0
    )
    result = cli("compare", model, "--input", x_path, "--reference", tmp_path / "x")
    assert result.exit_code == 0
    assert "first difference: op 0 (CONV_2D)" in result.stdout
    # simulated under xnnpack (--profile is an alias of --a), the same dump agrees
    result = cli("compare", model, "--input", x_path, "--reference", tmp_path / "x", "--profile", "xnnpack")
    assert result.exit_code == 0 and "no difference" in result.stdout


def test_plain_name_files_and_a_tampered_tensor(resnet_dump, tmp_path):
    model, x_path, x, dump = resnet_dump
    graph = load_model(model)
    ref = tmp_path / "ref"
    ref.mkdir()
    for f in dump.glob("*.npy"):
        index = int(f.name.split("_", 1)[0])
        (ref / (sanitize_name(graph.tensors[index].name) + ".npy")).write_bytes(f.read_bytes())
    v = np.load(ref / (sanitize_name(graph.tensors[29].name) + ".npy"))  # output of op 7 (ADD)
    v.flat[:4] = np.where(v.flat[:4] > 0, v.flat[:4] - 2, v.flat[:4] + 2)
    np.save(ref / (sanitize_name(graph.tensors[29].name) + ".npy"), v)
    np.save(ref / "unrelated.npy", np.zeros(3))
    result = cli("compare", model, "--input", x_path, "--reference", ref)
    assert result.exit_code == 0, result.output
    assert "first difference: op 7 (ADD), tensor 29" in result.stdout
    assert "4 of 24,576 elements differ, up to 2 LSB" in result.stdout
    assert "ignored 1 reference file(s) that match no tensor (or several): unrelated.npy" in result.stdout
    c = compare_reference(graph, x, ref)
    assert [r.op_index for r in c.rows if r.differs] == [7]


def test_partial_reference_and_batch_one_shapes(resnet_dump, tmp_path):
    model, x_path, x, dump = resnet_dump
    graph = load_model(model)
    ref = tmp_path / "ref"
    ref.mkdir()
    x1 = x[:1]
    np.save(tmp_path / "x1.npy", x1)
    values = Interpreter(graph).run_all(x1)
    # a reference without the batch axis (one image, as TFLM's tensors are) and only two tensors
    for t in (25, 37):
        np.save(ref / tensor_file_name(t, graph.tensors[t].name), values[t][0])
    c = compare_reference(graph, x1, ref)
    assert c.compared == 2 and c.first is None
    result = cli("compare", model, "--input", tmp_path / "x1.npy", "--reference", ref)
    assert result.exit_code == 0 and "no reference file" in result.stdout and "no difference" in result.stdout


# -- bad input: exit 2 -------------------------------------------------------------------------


def test_bad_input_exits_2(resnet_dump, tmp_path):
    model, x_path, _, dump = resnet_dump
    assert_one_line_error(cli("compare", model, "--input", x_path))  # neither --b nor --reference
    assert_one_line_error(cli("compare", model, "--input", x_path, "--b", "xnnpack", "--reference", dump))
    assert_one_line_error(cli("compare", model, "--input", x_path, "--reference", tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "no .npy file" in assert_one_line_error(
        cli("compare", model, "--input", x_path, "--reference", tmp_path / "empty")
    )
    np.save(tmp_path / "u8.npy", np.zeros((2, 32, 32, 3), np.uint8))
    assert_one_line_error(cli("compare", model, "--input", tmp_path / "u8.npy", "--b", "xnnpack"))
    (tmp_path / "notmodel.tflite").write_bytes(b"hello")
    assert_one_line_error(cli("compare", tmp_path / "notmodel.tflite", "--input", x_path, "--b", "xnnpack"))
    broken = tmp_path / "broken"
    broken.mkdir()
    name = next(dump.glob("0000_*.npy")).name
    (broken / name).write_bytes(b"\x93NUMPY garbage")
    assert_one_line_error(cli("compare", model, "--input", x_path, "--reference", broken))
    result = CliRunner().invoke(main, ["compare", model, "--input", str(x_path), "--b", "fast"])
    assert result.exit_code == 2  # click's own usage error


# -- a model with two outputs, through the installed CLI (subprocess) --------------------------


def npusim_cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "npusim.app.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def two_head(tmp_path_factory):
    """O.two_head_model: output 0 'head_conv' (op 1 CONV_2D, tensor 4; tflm and xnnpack part there),
    output 1 'head_pool' (op 0 MAX_POOL_2D, tensor 3)."""
    from npusim.testing.oracle import two_head_model

    d = tmp_path_factory.mktemp("two")
    model = d / "two.tflite"
    model.write_bytes(two_head_model())
    x = np.random.default_rng(1).integers(-128, 128, (3, 8, 8, 4)).astype(np.int8)
    np.save(d / "x.npy", x)
    return model, d / "x.npy", x


def test_two_outputs_profiles_summary(two_head):
    model, x_path, x = two_head
    r = npusim_cli("compare", model, "--input", x_path, "--a", "tflm", "--b", "xnnpack")
    assert r.returncode == 0, r.stderr
    va = Interpreter(str(model), "tflm").run_all(x)[4]
    vb = Interpreter(str(model), "xnnpack").run_all(x)[4]
    n = int(np.count_nonzero(va != vb))
    assert n > 0
    lines = r.stdout.strip().splitlines()
    assert f"first difference: op 1 (CONV_2D), tensor 4 'head_conv': {n} of 1,536 elements differ" in r.stdout
    assert lines[-3:] == [
        "graph outputs: 1 of 2 differ (2 compared)",
        f"  output 0: tensor 4 'head_conv' from op 1 (CONV_2D): {n} of 1,536 elements differ, "
        f"up to {int(np.abs(va.astype(int) - vb).max())} LSB (0.037 real)",
        "  output 1: tensor 3 'head_pool' from op 0 (MAX_POOL_2D): no difference",
    ]
    c = compare_profiles(load_model(str(model)), x, "tflm", "xnnpack")
    assert c.outputs == [4, 3]
    assert [(k, r.differs) for k, r in c.output_rows] == [(0, True), (1, False)]


def test_two_outputs_same_profile_and_reference(two_head, tmp_path):
    model, x_path, _ = two_head
    r = npusim_cli("compare", model, "--input", x_path, "--a", "tflm", "--b", "tflm")
    assert r.returncode == 0, r.stderr
    assert "graph outputs: 0 of 2 differ (2 compared)" in r.stdout
    assert "  output 0: tensor 4 'head_conv' from op 1 (CONV_2D): no difference" in r.stdout
    # a dump with the second output tampered and the first one missing
    dump = tmp_path / "dump"
    r = npusim_cli("run", model, "--input", x_path, "--output", tmp_path / "y.npz", "--dump", dump)
    assert r.returncode == 0, r.stderr
    pool = next(dump.glob("0003_*.npy"))
    v = np.load(pool)
    v.flat[:2] = np.where(v.flat[:2] > 0, v.flat[:2] - 1, v.flat[:2] + 1)
    np.save(pool, v)
    next(dump.glob("0004_*.npy")).unlink()
    r = npusim_cli("compare", model, "--input", x_path, "--reference", dump)
    assert r.returncode == 0, r.stderr
    assert "graph outputs: 1 of 2 differ (1 compared)" in r.stdout
    assert "  output 0: tensor 4 'head_conv' from op 1 (CONV_2D): no reference file" in r.stdout
    assert (
        "  output 1: tensor 3 'head_pool' from op 0 (MAX_POOL_2D): 2 of 192 elements differ, up to 1 LSB"
        in r.stdout
    )
