"""Small models and data sets for the zo tests: fast enough to train in seconds, real .tflite files."""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

from npusim.testing.oracle import ModelBuilder, bias_scale


def tiny_classifier(
    classes: int = 4,
    side: int = 4,
    hidden: int = 8,
    seed: int = 0,
    input_scale: float = 1.0,
    input_zero_point: int = -128,
    input_dtype=np.int8,
    head: bool = True,
    logits_scale: float = 0.05,
    channels: int = 3,
    width: int | None = None,
    nchw: bool = False,
    reshape_logits: bool = False,
    convs: int = 1,
) -> bytes:
    """[1, side, width, channels] input (default int8, scale 1, zp -128: raw pixels, like the shared
    ResNet-8) -> CONV_2D 1x1 + RELU -> AVERAGE_POOL_2D (global) -> RESHAPE -> FULLY_CONNECTED ->
    SOFTMAX; convs > 1 stacks more 1x1 CONV_2D + RELU (hidden -> hidden) after the first, so that
    the layers below the last conv are separated from the head by a weighted layer.
    head=False stops at the pooled features (an embedding model). nchw declares the input
    1 x channels x side x width and reads it through a TRANSPOSE. The conv's weight scale follows the
    input scale, so the integer arithmetic after the input is the same for every input quantization."""
    rng = np.random.default_rng(seed)
    width = width or side
    b = ModelBuilder("zo test classifier")
    if nchw:
        x = b.add_tensor((1, channels, side, width), input_dtype, input_scale, input_zero_point, name="input")
        perm = b.add_const(np.array([0, 2, 3, 1], np.int32), name="nhwc/perm")
        nhwc = b.add_tensor(
            (1, side, width, channels), input_dtype, input_scale, input_zero_point, name="nhwc"
        )
        b.add_op("TRANSPOSE", [x, perm], [nhwc], schema.TransposeOptionsT())
    else:
        x = nhwc = b.add_tensor(
            (1, side, width, channels), input_dtype, input_scale, input_zero_point, name="input"
        )
    conv_in = nhwc
    if np.dtype(input_dtype) == np.uint8:  # as real uint8 models do: QUANTIZE to int8 first
        conv_in = b.add_tensor(
            (1, side, width, channels), np.int8, input_scale, input_zero_point - 128, name="input/int8"
        )
        b.add_op("QUANTIZE", [nhwc], [conv_in], None)
        input_zero_point -= 128
    w1_scale = np.full(hidden, 0.001 / input_scale, np.float32)
    w1 = b.add_const(
        rng.integers(-127, 128, (hidden, 1, 1, channels)).astype(np.int8),
        scale=w1_scale,
        zero_point=np.zeros(hidden, np.int64),
        name="conv/weights",
    )
    b1 = b.add_const(
        np.zeros(hidden, np.int32),
        scale=bias_scale(input_scale, w1_scale),
        zero_point=np.zeros(hidden, np.int64),
        name="conv/bias",
    )
    h = b.add_tensor((1, side, width, hidden), np.int8, 0.2, -128, name="conv/out")
    opt = schema.Conv2DOptionsT()
    opt.padding, opt.strideH, opt.strideW = schema.Padding.VALID, 1, 1
    opt.fusedActivationFunction = schema.ActivationFunctionType.RELU
    b.add_op("CONV_2D", [conv_in, w1, b1], [h], opt)
    for k in range(1, convs):
        wk_scale = np.full(hidden, 0.003, np.float32)
        wk = b.add_const(
            rng.integers(-127, 128, (hidden, 1, 1, hidden)).astype(np.int8),
            scale=wk_scale,
            zero_point=np.zeros(hidden, np.int64),
            name=f"conv{k}/weights",
        )
        bk = b.add_const(
            rng.integers(-200, 200, hidden).astype(np.int32),
            scale=bias_scale(0.2, wk_scale),
            zero_point=np.zeros(hidden, np.int64),
            name=f"conv{k}/bias",
        )
        hk = b.add_tensor((1, side, width, hidden), np.int8, 0.2, -128, name=f"conv{k}/out")
        b.add_op("CONV_2D", [h, wk, bk], [hk], opt)
        h = hk
    pooled = b.add_tensor((1, 1, 1, hidden), np.int8, 0.2, -128, name="pool/out")
    popt = schema.Pool2DOptionsT()
    popt.padding, popt.strideH, popt.strideW, popt.filterHeight, popt.filterWidth = (
        schema.Padding.VALID,
        1,
        1,
        side,
        width,
    )
    b.add_op("AVERAGE_POOL_2D", [h], [pooled], popt)
    if not head:
        return b.build([x], [pooled])
    shape = b.add_const(np.array([1, hidden], np.int32), name="flatten/shape")
    flat = b.add_tensor((1, hidden), np.int8, 0.2, -128, name="flatten/out")
    ropt = schema.ReshapeOptionsT()
    ropt.newShape = [1, hidden]
    b.add_op("RESHAPE", [pooled, shape], [flat], ropt)
    w2_scale = np.full(classes, 0.001, np.float32)
    w2 = b.add_const(
        rng.integers(-20, 21, (classes, hidden)).astype(np.int8),
        scale=w2_scale,
        zero_point=np.zeros(classes, np.int64),
        name="head/weights",
    )
    b2 = b.add_const(
        np.zeros(classes, np.int32),
        scale=bias_scale(0.2, w2_scale),
        zero_point=np.zeros(classes, np.int64),
        name="head/bias",
    )
    logits = b.add_tensor((1, classes), np.int8, logits_scale, 0, name="head/logits")
    b.add_op("FULLY_CONNECTED", [flat, w2, b2], [logits], schema.FullyConnectedOptionsT())
    if reshape_logits:  # as converters write it: FC -> RESHAPE (same quantization) -> SOFTMAX
        shape3 = b.add_const(np.array([1, 1, classes], np.int32), name="logits/shape")
        reshaped = b.add_tensor((1, 1, classes), np.int8, logits_scale, 0, name="logits/reshaped")
        ropt3 = schema.ReshapeOptionsT()
        ropt3.newShape = [1, 1, classes]
        b.add_op("RESHAPE", [logits, shape3], [reshaped], ropt3)
        probs = b.add_tensor((1, 1, classes), np.int8, 1 / 256, -128, name="probs")
        sopt = schema.SoftmaxOptionsT()
        sopt.beta = 1.0
        b.add_op("SOFTMAX", [reshaped], [probs], sopt)
        return b.build([x], [probs])
    probs = b.add_tensor((1, classes), np.int8, 1 / 256, -128, name="probs")
    sopt = schema.SoftmaxOptionsT()
    sopt.beta = 1.0
    b.add_op("SOFTMAX", [logits], [probs], sopt)
    return b.build([x], [probs])


def color_dataset(
    classes: int = 4, side: int = 4, n_train: int = 400, n_test: int = 200, seed: int = 0
) -> dict:
    """Images whose class is their dominant colour mix: learnable by the tiny classifier's head."""
    rng = np.random.default_rng(seed)
    centers = rng.integers(30, 226, (classes, 3))

    def make(n):
        y = np.arange(n) % classes
        x = centers[y][:, None, None, :] + rng.normal(0, 25, (n, side, side, 3))
        return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)

    x_train, y_train = make(n_train)
    x_test, y_test = make(n_test)
    return dict(
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        class_names=np.array([f"c{i}" for i in range(classes)]),
    )


def deep_classifier(folder):
    """(model path, data path): the tiny classifier with two 1x1 convs (the upper one the exact tail,
    the lower one below it) and the colour data, written into folder."""
    model = folder / "deep.tflite"
    model.write_bytes(tiny_classifier(convs=2))
    data = folder / "colors.npz"
    np.savez(data, **color_dataset())
    return model, data
