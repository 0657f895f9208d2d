"""End to end on ST's YOLOv8n deployment models for the STM32N6 (shared data): npusim equals TFLM
bit for bit on every output, on a seeded random input and on a real image (EuroSAT x_test[0],
resized to 256 x 256 with PIL bilinear). TFLM runs batch 1, one image at a time.

Detection (uint8 input, float output): QUANTIZE, CONV_2D, LOGISTIC, MUL, STRIDED_SLICE, ADD, SUB,
CONCATENATION, MAX_POOL_2D, RESIZE_NEAREST_NEIGHBOR, TRANSPOSE, RESHAPE, SOFTMAX, DEQUANTIZE.
Segmentation (int8 input, two int8 outputs): the same plus TRANSPOSE_CONV.
"""

import numpy as np
import pytest

from npusim.testing import oracle as O

from shared_paths import SHARED, need

MODELS = SHARED / "models" / "stm32n6"
DETECT = MODELS / "yolov8n_256_quant_pc_uf_od_coco-person.tflite"
SEGMENT = MODELS / "yolov8n_256_quant_pc_ii_seg_coco-st.tflite"
EUROSAT = SHARED / "data" / "eurosat64_subset.npz"


def real_image() -> np.ndarray:
    """EuroSAT x_test[0] (64 x 64 RGB uint8) resized to 256 x 256, PIL bilinear: [1, 256, 256, 3]."""
    from PIL import Image

    with np.load(need(EUROSAT)) as z:
        img = z["x_test"][0]
    return np.asarray(Image.fromarray(img).resize((256, 256), Image.BILINEAR), dtype=np.uint8)[None]


def inputs(dtype) -> dict:
    """A seeded random input and the real image, in the model's input type (int8 = uint8 - 128, the
    same pixel values under scale 1/255 with zero point -128 instead of 0)."""
    rng = np.random.default_rng(20261130)
    images = {"random": rng.integers(0, 256, (1, 256, 256, 3), dtype=np.uint8), "eurosat": real_image()}
    if dtype == np.int8:
        images = {k: (v.astype(np.int16) - 128).astype(np.int8) for k, v in images.items()}
    return images


@pytest.mark.parametrize("path", [DETECT, SEGMENT], ids=["detect", "segment"])
def test_yolov8n_equals_tflm(path):
    import npusim

    model = open(need(path), "rb").read()
    graph = npusim.load_model(model)
    interp = npusim.Interpreter(graph)
    for name, x in inputs(graph.input().dtype).items():
        assert x.dtype == graph.input().dtype
        values = interp.run_all(x)
        got = [values[t] for t in graph.outputs]
        expected = O.run_tflm_outputs(model, x, arena_size=64 << 20)
        assert len(expected) == len(got)
        for k, (e, g) in enumerate(zip(expected, got)):
            O.assert_same(e, g, f"{path.name}, {name} input, output {k}")
            assert np.unique(g).size > 1, f"{path.name} output {k} is constant on the {name} input"
