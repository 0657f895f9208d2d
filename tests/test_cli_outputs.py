"""`npusim run --output`: .npz holds every graph output (output_0, output_1, ... in the graph's
output order); .npy on a model with several outputs exits 2 with one line naming .npz."""

import subprocess
import sys

import numpy as np
import pytest

from npusim.testing import oracle as O


def npusim_run(*args):
    return subprocess.run(
        [sys.executable, "-m", "npusim.app.cli", "run", *map(str, args)],
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


def add_chain_model(length: int) -> bytes:
    """`length` ADDs in a row, each of the previous tensor with itself: [1, 32, 32, 64] int8."""
    b = O.ModelBuilder()
    shape = (1, 32, 32, 64)
    h = x = b.add_tensor(shape, np.int8, 0.1, 0, name="input")
    for k in range(length):
        y = b.add_tensor(shape, np.int8, 0.2, 0, name=f"sum{k}")
        b.add_op("ADD", [h, h], [y], O.schema.AddOptionsT())
        h = y
    return b.build([x], [h])


PEAK_CHILD = """
import resource, runpy, sys
sys.argv = ["npusim", *sys.argv[1:]]
try:
    runpy.run_module("npusim.app.cli", run_name="__main__")
except SystemExit as e:
    if e.code:
        raise
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_run_holds_only_the_live_activations(tmp_path):
    """Without --dump, `npusim run` drops each activation after its last reader: 12 ADDs of 32 MB
    activations (batch 512) peak well under the 400 MB that keeping every tensor takes."""
    model = tmp_path / "chain.tflite"
    model.write_bytes(add_chain_model(12))
    peaks = []
    for n in (1, 512):
        x = np.random.default_rng(0).integers(-128, 128, (n, 32, 32, 64), dtype=np.int8)
        np.save(tmp_path / f"x{n}.npy", x)
        args = ["run", model, "--input", tmp_path / f"x{n}.npy", "--output", tmp_path / f"y{n}.npy"]
        r = subprocess.run(
            [sys.executable, "-c", PEAK_CHILD, *map(str, args)], capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr
        peaks.append(int(r.stdout.split()[-1]) / 1024)  # MB (ru_maxrss is in KB on Linux)
    growth = peaks[1] - peaks[0]
    assert growth < 200, f"a run of 512 images grew the process by {growth:.0f} MB over one image"
