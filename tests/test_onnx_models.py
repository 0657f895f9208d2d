"""ST's ONNX QDQ models (../shared/models/onnx) end to end on real images, and the CLI on ONNX.

The tolerance comes from ONNX Runtime itself: its optimized run (some layers fused into integer
QLinear kernels, the rest float between DequantizeLinear and QuantizeLinear) and its unoptimized run
(ORT_DISABLE_ALL, the literal QDQ semantics) agree on a share of the output elements within one
output step. npusim --profile tflm (TFLite's integer kernels on the lowered graph) must come within
0.10 of that share against one of the two runs, with cosine >= 0.999 against both.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import npusim  # noqa: E402
from npusim.cli import main  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402

from shared_paths import SHARED, need  # noqa: E402

MODELS = SHARED / "models" / "onnx"
YOLO = MODELS / "yolo26_256_qdq_int8_od_coco-person-st.onnx"
FACE = MODELS / "face_landmarks_v1_192_int8_pc.onnx"


def eurosat(size: int, n: int) -> np.ndarray:
    from zo.data import resize_images

    d = np.load(need(SHARED / "data" / "eurosat64_subset.npz"))
    x = resize_images(d["x_test"][:n], size).astype(np.float32) / 255.0  # the models read pixels on [0, 1]
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def output_codes(graph, y):
    t = graph.tensors[graph.ops[-1].inputs[0]]  # the int8 tensor the final DEQUANTIZE reads
    return np.rint(np.asarray(y, np.float64) / t.scale).astype(np.int64) + t.zero_point


@pytest.mark.parametrize(
    "path,n",
    [
        (FACE, 4),
        pytest.param(
            YOLO,
            2,
            marks=pytest.mark.xfail(
                strict=True,
                reason="measured 0.71 within one step against 0.83 between ORT's runs (8 images): the "
                "one-step differences TFLM's integer arithmetic adds at each layer (double-rounding "
                "fixed-point multipliers, LOGISTIC's 1/256) accumulate over ~100 layers, and the box "
                "decoding turns one distance code into up to 3.4 output steps (docs/onnx.md)",
            ),
        ),
    ],
    ids=["face_landmarks", "yolo26"],
)
def test_shared_model_against_onnxruntime(path, n):
    model = need(path)
    graph = npusim.load_model(model)
    x = eurosat(graph.input().shape[2], n)
    data = open(model, "rb").read()
    y_opt, y_lit = (
        oo.run_ort(data, x, optimize=True, threads=2),
        oo.run_ort(data, x, optimize=False, threads=2),
    )
    y_sim = npusim.Interpreter(graph, profile="tflm").run(x)
    assert oo.cosine(y_sim, y_lit) >= 0.999 and oo.cosine(y_sim, y_opt) >= 0.999
    c_opt, c_lit, c_sim = (output_codes(graph, y) for y in (y_opt, y_lit, y_sim))
    tolerance = oo.within_one_step(c_opt, c_lit)
    best = max(oo.within_one_step(c_sim, c_lit), oo.within_one_step(c_sim, c_opt))
    assert best >= tolerance - 0.10, (
        f"npusim within one step of ORT: {best:.3f}, ORT's two runs: {tolerance:.3f}"
    )


def test_cli_run_inspect_golden_compare_on_onnx(tmp_path):
    model = need(FACE)
    x = eurosat(192, 2)
    np.save(tmp_path / "x.npy", x)
    r = CliRunner()

    def ok(*args):
        res = r.invoke(main, [str(a) for a in args])
        assert res.exit_code == 0, res.output
        return res.output

    ok(
        "run",
        model,
        "--input",
        tmp_path / "x.npy",
        "--output",
        tmp_path / "y.npz",
        "--dump",
        tmp_path / "dump",
    )
    y = np.load(tmp_path / "y.npz")["output_0"]
    assert y.shape == (2, 1, 1, 936) and y.dtype == np.float32
    assert np.array_equal(y, npusim.Interpreter(model).run(x))
    assert len(list((tmp_path / "dump").glob("*.npy"))) > 100
    report = json.loads(ok("inspect", model, "--format", "json", "--target", "stm32n6"))
    assert report["model"] == FACE.name
    assert "DEPTHWISE_CONV_2D" in ok("inspect", model)  # the text report of the lowered graph
    ok("golden", "record", model, "--input", tmp_path / "x.npy", "-o", tmp_path / "g.npz")
    assert "OK" in ok("golden", "check", model, tmp_path / "g.npz")
    assert "first difference" in ok(
        "compare", model, "--input", tmp_path / "x.npy", "--a", "tflm", "--b", "single"
    )


def test_stm32n6_view_does_not_charge_layout_transposes():
    """The TRANSPOSEs between the declared NCHW and the kernels' NHWC are views in the cost model."""
    from npusim.npu.cost import device_structure

    interp = npusim.Interpreter(need(FACE))
    dev = device_structure(interp)
    transposes = [op for op in dev.ops if op["kind"] == "TRANSPOSE"]
    assert transposes and all(op["role"] == "view" for op in transposes)


@pytest.mark.parametrize(
    "data,message",
    [
        (b"\x08\x07" + b"\xff" * 40, "not a valid ONNX protobuf"),
        (
            b"hello, this is not a model at all",
            "not a TFLite flatbuffer (no 'TFL3' identifier) and not an ONNX model",
        ),
        (b"", "not a TFLite flatbuffer (no 'TFL3' identifier) and not an ONNX model"),
    ],
)
def test_bad_files_exit_2_naming_both_formats(tmp_path, data, message):
    f = tmp_path / "m.onnx"
    f.write_bytes(data)
    res = CliRunner().invoke(main, ["inspect", str(f)])
    assert res.exit_code == 2 and message in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
