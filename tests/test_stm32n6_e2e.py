"""End to end on ST's BlazeFace and ReID deployment models for the STM32N6 (shared data): npusim
equals TFLM bit for bit on every output, on a seeded random input and on a real image (EuroSAT
x_test[0], resized with PIL bilinear). TFLM runs batch 1, one image at a time; the tests skip loudly
without the shared folder.

BlazeFace front 128 (float32 input in [0, 1], four float32 outputs): QUANTIZE, CONV_2D,
DEPTHWISE_CONV_2D, ADD, PAD, MAX_POOL_2D, RESHAPE, DEQUANTIZE.
ReID MobileNetV2 1.0 256 x 128 (uint8 input, int8 embedding): QUANTIZE, CONV_2D, DEPTHWISE_CONV_2D,
ADD, MEAN.
"""

import numpy as np
import pytest

from npusim.testing import oracle as O

from shared_paths import SHARED, need

MODELS = SHARED / "models" / "stm32n6"
BLAZEFACE = MODELS / "blazeface_front_128_quant_pc_ff_od_widerface.tflite"
REID = MODELS / "mobilenetv2_a100_256_128_fft_int8.tflite"
EUROSAT = SHARED / "data" / "eurosat64_subset.npz"


def real_image(height: int, width: int) -> np.ndarray:
    """EuroSAT x_test[0] (64 x 64 RGB uint8) resized to height x width, PIL bilinear: [1, h, w, 3]."""
    from PIL import Image

    with np.load(need(EUROSAT)) as z:
        img = z["x_test"][0]
    return np.asarray(Image.fromarray(img).resize((width, height), Image.BILINEAR), dtype=np.uint8)[None]


def inputs(shape, dtype) -> dict:
    """A seeded random input and the real image: uint8 pixels, or float32 pixels / 255 (BlazeFace's
    input quantization is scale 1/255, zero point -128: the range [0, 1])."""
    rng = np.random.default_rng(20261130)
    h, w = shape[1], shape[2]
    images = {"random": rng.integers(0, 256, (1, h, w, 3), dtype=np.uint8), "eurosat": real_image(h, w)}
    if dtype == np.float32:
        images = {k: (v.astype(np.float32) / np.float32(255.0)) for k, v in images.items()}
        images["random_float"] = rng.random((1, h, w, 3), dtype=np.float32)  # not on the pixel grid
    return images


@pytest.mark.parametrize("path", [BLAZEFACE, REID], ids=["blazeface", "reid"])
def test_stm32n6_model_equals_tflm(path):
    import npusim

    model = open(need(path), "rb").read()
    graph = npusim.load_model(model)
    interp = npusim.Interpreter(graph)
    for name, x in inputs(graph.input().shape, graph.input().dtype).items():
        assert x.dtype == graph.input().dtype
        values = interp.run_all(x)
        got = [values[t] for t in graph.outputs]
        expected = O.run_tflm_outputs(model, x, arena_size=64 << 20)
        assert len(expected) == len(got) == len(graph.outputs)
        for k, (e, g) in enumerate(zip(expected, got)):
            O.assert_same(e, g, f"{path.name}, {name} input, output {k}")
            assert np.unique(g).size > 1, f"{path.name} output {k} is constant on the {name} input"
