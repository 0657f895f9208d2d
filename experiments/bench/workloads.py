"""The bench's workloads (experiments/bench/main.py): the shared models it times, their inputs, and the
one-op CONV_2D of the main table."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npusim.testing import oracle

MODELS = {
    "resnet8": "resnet8_cifar10_int8.tflite",
    "mobilenet_v2": "mobilenet_v2_0.35_128_flowers_int8.tflite",
}


YOLO_MODELS = {"yolov8n_256": "stm32n6/yolov8n_256_quant_pc_uf_od_coco-person.tflite"}


ALL_MODELS = {**MODELS, **YOLO_MODELS}  # name -> path under <shared>/models


# TFLM arena per model where the default (oracle.tflm_interpreter) is too small
TFLM_ARENA = {"yolov8n_256": 64 << 20}


def conv_model(seed: int = 0) -> bytes:
    """CONV_2D 1x56x56x64 -> 64, 3x3, SAME, stride 1, per-channel int8 weights, int32 bias, RELU."""
    rng = np.random.default_rng(seed)
    h, w, c, o, k = 56, 56, 64, 64, 3
    in_scale, in_zp = np.float32(0.05), -10
    w_scale = np.exp(rng.uniform(np.log(0.002), np.log(0.01), o)).astype(np.float32)
    weights = rng.integers(-127, 128, (o, k, k, c), dtype=np.int8)
    taps = k * k * c
    # Output scale: put a typical accumulator (~127*73*sqrt(taps)) at ~40 LSB of the output.
    typical = float(in_scale) * float(np.median(w_scale)) * 127 * 73 * np.sqrt(taps)
    out_scale, out_zp = np.float32(typical / 40.0), -20
    span = int(127 * 64 * np.sqrt(taps))
    bias = rng.integers(-span, span + 1, o).astype(np.int32)
    return oracle.conv2d_model(
        (1, h, w, c),
        weights,
        bias,
        in_scale,
        in_zp,
        w_scale,
        out_scale,
        out_zp,
        padding="SAME",
        activation="RELU",
    )


def depthwise_model(rng: np.random.Generator, c: int, k: int = 3) -> bytes:
    """A MobileNet-style DEPTHWISE_CONV_2D 1x28x28xc, kxk, stride 1, SAME, per-channel int8 weights,
    int32 bias, RELU6, its weights, bias and scales drawn from rng in that order."""
    return oracle.depthwise_model(
        (1, 28, 28, c),
        rng.integers(-127, 128, (1, k, k, c), dtype=np.int8),
        rng.integers(-5000, 5000, c).astype(np.int32),
        0.05,
        -10,
        np.exp(rng.uniform(np.log(0.002), np.log(0.01), c)).astype(np.float32),
        0.1,
        -20,
        activation="RELU6",
    )


# name -> (file under <shared>/data, how x_test reaches the model's input size)
INPUT_DATA = {
    "resnet8": ("cifar10_subset.npz", "as is"),
    "mobilenet_v2": ("eurosat64_subset.npz", "nearest 2x"),
    "yolov8n_256": ("eurosat64_subset.npz", "bilinear"),
}


def bench_inputs(shared: Path, name: str, n: int, shape, dtype) -> tuple[np.ndarray, str]:
    """Real images when the shared data is there (CIFAR-10 for ResNet-8, EuroSAT-64 upsampled 2x for
    MobileNetV2, EuroSAT-64 resized to 256x256 with PIL bilinear for YOLOv8n, cycled to n), random
    pixels otherwise."""
    h, w = shape[1], shape[2]
    fname, how = INPUT_DATA[name]
    path = shared / "data" / fname
    if path.exists():
        with np.load(path) as d:
            imgs = d["x_test"]
        desc = f"{fname} x_test"
        if how == "nearest 2x":
            imgs = imgs.repeat(2, axis=1).repeat(2, axis=2)
            desc += " upsampled 2x (nearest)"
        elif how == "bilinear" and imgs.shape[1:3] != (h, w):
            from PIL import Image

            imgs = imgs[:n]  # only the images the batch uses
            imgs = np.stack(
                [np.asarray(Image.fromarray(i).resize((w, h), Image.BILINEAR), dtype=np.uint8) for i in imgs]
            )
            desc += f" resized to {h}x{w} (PIL bilinear)"
        if imgs.shape[1:3] == (h, w):
            imgs = np.resize(imgs, (n,) + imgs.shape[1:])
            if dtype == np.int8:
                return (imgs.astype(np.int16) - 128).astype(np.int8), desc + ", pixel - 128"
            return imgs.astype(dtype), desc
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, (n,) + tuple(shape[1:]), dtype=dtype), "random pixels"
