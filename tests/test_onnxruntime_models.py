"""--profile onnxruntime on whole ONNX models, against ONNX Runtime (CPU).

- A small CNN (Conv + Relu, depthwise Conv, strided Conv, 1x1 Conv, residual Add, MaxPool,
  GlobalAveragePool, Flatten, Gemm) quantized by ORT's quantize_static in QOperator format: ORT
  runs every layer as an integer kernel, and npusim must give its outputs bit for bit.
- ST's two shared QDQ models on real EuroSAT images (resized to the model's input, pixels on
  [0, 1]): npusim must equal ORT's unoptimized run (the literal QDQ semantics, ORT_DISABLE_ALL) on
  every output element, at one intra-op thread and at ORT's default thread count.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

import npusim  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402
from npusim.testing import oracle as O  # noqa: E402

from shared_paths import SHARED, need  # noqa: E402

# Float ops that would mean ORT did not run a layer as an integer kernel.
FLOAT_LAYERS = {"Conv", "Gemm", "MatMul", "Add", "Mul", "GlobalAveragePool", "AveragePool"}


@pytest.mark.parametrize(
    "seed,activation,per_channel", [(0, "int8", True), (1, "int8", False), (2, "uint8", True)]
)
def test_all_integer_qoperator_model_bit_exact(seed, activation, per_channel):
    model = oo.small_cnn_model(seed)
    # uint8 with reduce_range: 7-bit weights keep ORT's u8s8 GEMM on AVX2 free of int16 saturation.
    q = oo.quantize(
        model, "QOperator", per_channel, activation, seed=seed, reduce_range=activation == "uint8"
    )
    # quantize_static writes no shape for QLinearAdd's and QLinearGlobalAveragePool's outputs
    # (com.microsoft ops); the importer needs one, so the test supplies what ORT computes.
    q = oo.with_value_info(q)
    fused = oo.optimized_op_types(q)
    assert not FLOAT_LAYERS & set(fused), f"ORT left float layers: {fused}"
    x = np.concatenate([f["x"] for f in oo.random_inputs(model, 6, seed=seed + 10)])
    expected = oo.run_ort(q, x)
    got = npusim.Interpreter(npusim.load_model(q), profile="onnxruntime").run(x)
    O.assert_same(expected, got, f"small CNN {activation} per_channel={per_channel}: npusim vs ORT")


MODELS = {
    "face_landmarks": ("face_landmarks_v1_192_int8_pc.onnx", 192),
    "yolo26": ("yolo26_256_qdq_int8_od_coco-person-st.onnx", 256),
}


def eurosat_inputs(size: int, n: int) -> np.ndarray:
    from zo.data import load_dataset, resize_images

    images = load_dataset(need(SHARED / "data" / "eurosat64_subset.npz")).x_test[:n]
    x = np.transpose(resize_images(images, size), (0, 3, 1, 2)).astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray(x)


@pytest.mark.parametrize("threads", [1, 0], ids=["1 thread", "ORT's default threads"])
@pytest.mark.parametrize("name", list(MODELS))
def test_shared_qdq_model_equals_ort_literal(name, threads, monkeypatch):
    """ORT with its optimizations off (the literal QDQ semantics) at intra_op_num_threads 1 and at
    ORT's default (0: the physical cores), npusim at the same NPUSIM_ORT_THREADS: every output
    element equal. ORT's optimized run is another arithmetic (fused integer kernels): cosine only."""
    from npusim.profiles import ort_literal

    if threads:
        monkeypatch.setenv(ort_literal.THREADS_ENV, str(threads))
    else:
        monkeypatch.delenv(ort_literal.THREADS_ENV, raising=False)
    filename, size = MODELS[name]
    model = open(need(SHARED / "models" / "onnx" / filename), "rb").read()
    x = eurosat_inputs(size, 3)
    scale, zp = oo.output_quantization(model)
    literal = oo.run_ort(model, x, optimize=False, threads=threads)
    got = npusim.Interpreter(npusim.load_model(model), profile="onnxruntime").run(x)
    lit_c, sim_c = (oo.output_steps(y, scale, zp) for y in (literal, got))
    differ = int(np.sum(lit_c != sim_c))
    assert differ == 0, f"{name}: {differ} of {lit_c.size} output codes differ from ORT-literal"
    assert oo.cosine(got, oo.run_ort(model, x)) >= 0.999


@pytest.mark.parametrize(
    "seed,activation,per_channel", [(0, "int8", True), (1, "int8", False), (2, "uint8", True)]
)
def test_qdq_cnn_equals_ort_literal(seed, activation, per_channel, monkeypatch):
    """An ORT-quantized classifier in QDQ format (Conv + Relu, depthwise, strided and 1x1 Convs,
    residual Add, MaxPool, GlobalAveragePool, Flatten, Gemm): every output element of ORT's
    unoptimized run."""
    monkeypatch.setenv("NPUSIM_ORT_THREADS", "1")
    model = oo.small_cnn_model(seed, size=32)
    q = oo.quantize(model, "QDQ", per_channel, activation, seed=seed)
    x = np.concatenate([f["x"] for f in oo.random_inputs(model, 16, seed=seed + 10)])
    scale, zp = oo.output_quantization(q)
    literal = oo.output_steps(oo.run_ort(q, x, optimize=False), scale, zp)
    got = oo.output_steps(npusim.Interpreter(npusim.load_model(q), profile="onnxruntime").run(x), scale, zp)
    O.assert_same(literal, got, f"QDQ CNN {activation} per_channel={per_channel}: npusim vs ORT-literal")
