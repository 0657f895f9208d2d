"""The real shared models end to end against TFLM on real images, and the CLI contract of npusim."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import npusim
from npusim.testing.oracle import run_tflm
from zo.data import load_dataset, resize_images

from shared_paths import MOBILENET, RESNET, SHARED

NPUSIM = [sys.executable, "-m", "npusim.app.cli"]

pytestmark = pytest.mark.skipif(
    not RESNET.exists(), reason=f"SHARED DATA MISSING: {SHARED} not found (set NPU_SHARED)"
)


@pytest.fixture(scope="module")
def cifar():
    return load_dataset(SHARED / "data" / "cifar10_subset.npz")


def test_resnet8_bit_exact_and_same_accuracy_as_tflm_on_2000_cifar10_images(cifar):
    x = (cifar.x_test.astype(np.int16) - 128).astype(np.int8)  # input scale 1, zero point -128
    ours = npusim.Interpreter(RESNET).run(x)
    theirs = run_tflm(RESNET.read_bytes(), x)
    assert len(x) == 2000
    assert np.array_equal(ours, theirs)
    accuracy = np.mean(np.argmax(ours, 1) == cifar.y_test)
    assert accuracy == np.mean(np.argmax(theirs, 1) == cifar.y_test)
    assert accuracy > 0.7  # 75.8% measured (JPEG re-encodes): far from chance, so images and labels line up


@pytest.mark.parametrize("profile", ["tflm"])
def test_mobilenet_v2_bit_exact_on_64_eurosat_images(profile):
    data = load_dataset(SHARED / "data" / "eurosat64_subset.npz")
    x = resize_images(data.x_test[::7][:64], 128)  # uint8 input, QUANTIZE inside the model
    assert x.shape == (64, 128, 128, 3)
    interp = npusim.Interpreter(MOBILENET, profile=profile)
    # run() folds the model's 4 PADs into the depthwise layers that read them (run_all does not).
    assert len(interp._pad_sources) == 4
    ours = interp.run(x)
    assert ours.dtype == np.float32 and ours.shape == (64, 5)
    assert np.array_equal(ours, run_tflm(MOBILENET.read_bytes(), x))


def test_every_intermediate_of_mobilenet_v2_matches_tflm():
    from tflite_micro.python.tflite_micro import runtime

    data = MOBILENET.read_bytes()
    x = resize_images(load_dataset(SHARED / "data" / "eurosat64_subset.npz").x_test[:2], 128)
    interp = npusim.Interpreter(data)
    values = interp.run_all(x)
    tflm = runtime.Interpreter.from_bytes(
        data, arena_size=8_000_000, intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors
    )
    for n in range(2):
        tflm.set_input(x[n : n + 1], 0)
        tflm.invoke()
        for k in interp.kernels:
            t = k.op.outputs[0]
            ref = np.asarray(tflm.GetTensor(t, 0)["tensor_data"]).reshape(values[t][n].shape)
            assert np.array_equal(ref, values[t][n]), f"op {k.op.index} ({k.kind}) differs"


def test_round_trip_of_real_models_runs_identically_in_tflm():
    x = np.random.default_rng(0).integers(-128, 128, (4, 32, 32, 3)).astype(np.int8)
    written = npusim.write_model(npusim.load_model(RESNET))
    assert np.array_equal(run_tflm(written, x), run_tflm(RESNET.read_bytes(), x))


# -- the command line ---------------------------------------------------------------------------------
def npusim_cli(*args, cwd=None):
    return subprocess.run(
        NPUSIM + [str(a) for a in args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_run_writes_outputs_and_dump(tmp_path):
    x = np.random.default_rng(0).integers(-128, 128, (3, 32, 32, 3)).astype(np.int8)
    np.save(tmp_path / "x.npy", x)
    r = npusim_cli(
        "run",
        RESNET,
        "--input",
        tmp_path / "x.npy",
        "--output",
        tmp_path / "y.npy",
        "--dump",
        tmp_path / "dump",
    )
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npy")
    assert y.dtype == np.int8 and y.shape == (3, 10)
    assert np.array_equal(y, run_tflm(RESNET.read_bytes(), x))
    dumped = sorted((tmp_path / "dump").glob("*.npy"))
    assert len(dumped) == 1 + 16  # the input and one tensor per op
    r = npusim_cli(
        "run", RESNET, "--input", tmp_path / "x.npy", "--output", tmp_path / "y2.npy", "--profile", "xnnpack"
    )
    assert r.returncode == 0


def test_run_float_output_after_dequantize(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 128, 128, 3), np.uint8))
    r = npusim_cli("run", MOBILENET, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "y.npy").dtype == np.float32


def test_inspect_lists_ops_and_totals():
    r = npusim_cli("inspect", RESNET)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "inputs:" and lines[2] == "outputs:"  # one input, one output, then the table
    lines = lines[4:]
    assert len(lines) == 1 + 16 + 1
    assert "CONV_2D" in r.stdout and "total" in lines[-1]
    assert "12,534,410" in lines[-1]  # MACs: every conv, FC, pool, add of the network


def uint8_asymmetric_model() -> bytes:
    """An old TF1-style 'quant' model: uint8 activations and weights, asymmetric."""
    from ai_edge_litert import schema_py_generated as schema

    from npusim.testing.oracle import ModelBuilder

    b = ModelBuilder()
    x = b.add_tensor((1, 4, 4, 3), np.uint8, 0.02, 128, name="input")
    w = b.add_const(np.full((2, 1, 1, 3), 130, np.uint8), scale=0.01, zero_point=128, name="weights")
    y = b.add_tensor((1, 4, 4, 2), np.uint8, 0.05, 128, name="output")
    opt = schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = schema.Padding.VALID, 1, 1
    b.add_op("CONV_2D", [x, w, -1], [y], opt)
    return b.build([x], [y])


@pytest.mark.parametrize(
    "case, message",
    [
        ("truncated", "malformed"),
        ("not-tflite", "not a TFLite flatbuffer"),
        ("missing", "cannot read model file"),
        ("uint8-model", "a uint8 model (TFLite's legacy quantization: op 0 (CONV_2D)"),
        ("wrong-shape", "shape"),
        ("wrong-dtype", "dtype"),
        ("empty-batch", "empty batch"),
        ("bad-npy", "cannot read"),
        ("bad-profile", "--profile"),
    ],
)
def test_bad_input_exit_2_with_one_line(tmp_path, case, message):
    model = RESNET
    x = np.zeros((2, 32, 32, 3), np.int8)
    if case == "truncated":
        model = tmp_path / "m.tflite"
        model.write_bytes(RESNET.read_bytes()[:5000])
    elif case == "not-tflite":
        model = tmp_path / "m.tflite"
        model.write_bytes(b"hello world, not a model")
    elif case == "missing":
        model = tmp_path / "absent.tflite"
    elif case == "uint8-model":
        model = tmp_path / "m.tflite"
        model.write_bytes(uint8_asymmetric_model())
        x = np.zeros((1, 4, 4, 3), np.uint8)
    elif case == "wrong-shape":
        x = np.zeros((2, 31, 32, 3), np.int8)
    elif case == "wrong-dtype":
        x = np.zeros((2, 32, 32, 3), np.float32)
    elif case == "empty-batch":
        x = np.zeros((0, 32, 32, 3), np.int8)
    np.save(tmp_path / "x.npy", x)
    if case == "bad-npy":
        (tmp_path / "x.npy").write_bytes(b"garbage")
    extra = ["--profile", "fast"] if case == "bad-profile" else []
    r = npusim_cli("run", model, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if case != "bad-profile":  # click's own usage errors print a usage line too
        assert len(r.stderr.strip().splitlines()) == 1
