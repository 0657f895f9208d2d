"""`npusim run --output`: .npz holds every graph output (output_0, output_1, ... in the graph's
output order); .npy on a model with several outputs exits 2 with one line naming .npz."""

import subprocess
import sys

import numpy as np
import pytest

from npusim.testing import oracle as O


def npusim_run(*args):
    return subprocess.run(
        [sys.executable, "-m", "npusim.cli", "run", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def two_output_model() -> bytes:
    """SPLIT of [1, 4, 6] into two along axis 2, then a LOGISTIC on the second half: outputs
    (logistic, first half), listed in that order so that the graph order differs from op order."""
    b = O.ModelBuilder()
    axis = b.add_const(np.asarray(2, np.int32).reshape(()), name="axis")
    x = b.add_tensor((1, 4, 6), np.int8, 0.1, -3, name="input")
    h0 = b.add_tensor((1, 4, 3), np.int8, 0.1, -3, name="half0")
    h1 = b.add_tensor((1, 4, 3), np.int8, 0.1, -3, name="half1")
    opt = O.schema.SplitOptionsT()
    opt.numSplits = 2
    b.add_op("SPLIT", [axis, x], [h0, h1], opt)
    y = b.add_tensor((1, 4, 3), np.int8, 1.0 / 256, -128, name="sigmoid")
    b.add_op("LOGISTIC", [h1], [y])
    return b.build([x], [y, h0])


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "two.tflite"
    model.write_bytes(two_output_model())
    x = np.random.default_rng(0).integers(-128, 128, (3, 4, 6), dtype=np.int8)
    np.save(tmp_path / "x.npy", x)
    return model, tmp_path / "x.npy", x


def test_npz_holds_every_output_in_graph_order(files, tmp_path):
    model, x_path, x = files
    r = npusim_run(model, "--input", x_path, "--output", tmp_path / "y.npz")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "y.npz") as z:
        assert sorted(z.files) == ["output_0", "output_1"]
        got = [z["output_0"], z["output_1"]]
    expected = O.run_tflm_outputs(model.read_bytes(), x)
    assert [e.shape for e in expected] == [(3, 4, 3), (3, 4, 3)]
    for k in range(2):
        O.assert_same(expected[k], got[k], f"output_{k}")
    O.assert_same(x[:, :, :3], got[1], "output_1 is the first half of the split")


def test_npy_on_a_multi_output_model_exits_2_naming_npz(files, tmp_path):
    model, x_path, _ = files
    r = npusim_run(model, "--input", x_path, "--output", tmp_path / "y.npy")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and ".npz" in lines[0] and "2 outputs" in lines[0], r.stderr
    assert not (tmp_path / "y.npy").exists()


def test_npz_on_a_single_output_model(tmp_path):
    model = tmp_path / "one.tflite"
    model.write_bytes(O.logistic_model((1, 5), 0.05, 7))
    x = np.arange(-128, 127, 17, dtype=np.int8)[:15].reshape(3, 5)
    np.save(tmp_path / "x.npy", x)
    r = npusim_run(model, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "y.npz") as z:
        assert z.files == ["output_0"]
        O.assert_same(O.run_tflm(model.read_bytes(), x), z["output_0"], "single output in .npz")
    r = npusim_run(model, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert r.returncode == 0, r.stderr
    O.assert_same(O.run_tflm(model.read_bytes(), x), np.load(tmp_path / "y.npy"), "single output .npy")
