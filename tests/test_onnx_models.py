"""ST's ONNX QDQ models (../shared/models/onnx) end to end on real images, and the CLI on ONNX.

npusim --profile tflm runs TFLite's integer kernels on the lowered graph; ONNX Runtime's literal run
(ORT_DISABLE_ALL, the QDQ semantics as written) rounds each layer once in float. The two may differ
by one output step per layer, so the oracle is layer by layer: every lowered layer, fed ORT's own
codes of its inputs, is within one step of ORT's codes of its output. End to end those steps add
up over the depth (docs/onnx.md); the output must keep a cosine >= 0.999 against both of ORT's runs.
The share of output elements within one step of ORT is not a bar: ORT's own two runs agree on 0.41
of face landmarks' outputs on an AVX2 host (its u8s8 GEMM saturates pairs of products) and on 0.99
on an AVX-512 VNNI one, so a bar taken from them moves with the host's CPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import npusim  # noqa: E402
from npusim.app.cli import main  # noqa: E402
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


@pytest.mark.parametrize("path,n", [(FACE, 4), (YOLO, 2)], ids=["face_landmarks", "yolo26"])
def test_shared_model_against_onnxruntime(path, n):
    model = need(path)
    graph = npusim.load_model(model)
    x = eurosat(graph.input().shape[2], n)
    data = open(model, "rb").read()
    y_opt, y_lit = (
        oo.run_ort(data, x, optimize=True, threads=2),
        oo.run_ort(data, x, optimize=False, threads=2),
    )
    interp = npusim.Interpreter(graph, profile="tflm")
    y_sim = interp.run(x)
    assert oo.cosine(y_sim, y_lit) >= 0.999 and oo.cosine(y_sim, y_opt) >= 0.999
    layers = oo.literal_layer_codes(data, x)
    rows = oo.layer_by_layer(interp, x, oo.graph_layer_codes(graph, layers))
    # Most of ORT's quantized tensors are a lowered op's output (face landmarks 147 of 147, YOLO26
    # 364 of 377); an importer that stopped recording them would leave the check empty.
    assert len(rows) >= 0.9 * len(layers), f"{len(rows)} of ORT's {len(layers)} quantized tensors compared"
    worst = max(rows, key=lambda r: r[2])
    assert worst[2] <= 1, f"op {worst[0]} ({worst[1]}), fed ORT's inputs, is {worst[2]} steps off ORT"


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
