"""Test oracles: one-op .tflite builders and runners for TFLM, LiteRT and npusim, under one name.

This module holds the builders of the arithmetic ops; the model writer (builder.py), the builders
of the data movement ops (movement_models.py), the runners (runners.py) and the random test
parameters (randoms.py) are re-exported here, so that tests call everything as oracle.X. The writer
makes flatbuffers with the schema that ai-edge-litert ships (object API), so the test models are
made in the tests themselves and no model file lives in the repository.

    b = conv2d_model((1, 8, 8, 3), w, bias, in_scale=0.02, in_zp=-3, w_scale=ws,
                     out_scale=0.05, out_zp=4, stride=(2, 2), padding="SAME")
    y_ref = run_tflm(b, x)            # x: N inputs stacked on axis 0; TFLM runs them one by one
    y_lrt = run_litert(b, x, "REF")
    y_sim = run_npusim(b, x, "tflm")
    fast = BatchedLiteRT(b, batch=len(x), threads=2)(x)  # XNNPACK on the whole batch, for speed

All models have batch 1 in the file; the runners feed a batch of N by looping (the oracles) or by
stacking on axis 0 (npusim). Graph inputs beyond the first are passed as a list of arrays.
"""

from __future__ import annotations

import numpy as np
from ai_edge_litert import schema_py_generated as schema

# The oracle's other modules, under its name (tests call them as oracle.X): the model writer, the
# builders of the data movement ops, the runners and the random parameters.
from .builder import (  # noqa: F401
    _ACTIVATION,
    _OP_VERSIONS,
    _PADDING,
    _TENSOR_TYPES,
    _TYPE_DTYPES,
    ModelBuilder,
    bias_scale,
    conv_out_size,
    f32,
    float_model,
    model_inputs,
)
from .movement_models import (  # noqa: F401
    batch_axis_head_model,
    behind_reshape,
    concat_model,
    dequantize_model,
    dfl_across_batch_model,
    expand_dims_model,
    gather_model,
    pack_model,
    pad_model,
    quantize_model,
    reshape_model,
    resize_nearest_model,
    shape_model,
    slice_model,
    split_model,
    split_v_model,
    squeeze_model,
    strided_slice_model,
    tile_model,
    transpose_model,
    unpack_model,
)
from .randoms import (  # noqa: F401
    log_uniform,
    random_bias,
    random_int8,
    random_out_scale,
    random_weights,
)
from .runners import (  # noqa: F401
    BatchedLiteRT,
    assert_same,
    first_difference,
    litert_delegated,
    on_backend,
    run_litert,
    run_npusim,
    run_npusim_outputs,
    run_tflm,
    run_tflm_outputs,
    tflm_interpreter,
)


def _conv_like(
    kind,
    input_shape,
    weights,
    bias,
    in_scale,
    in_zp,
    w_scale,
    out_scale,
    out_zp,
    stride,
    padding,
    dilation,
    activation,
    w_axis,
    out_channels,
    options,
    bias_axis=0,
    dtype=np.int8,
    bias_dtype=None,
):
    b = ModelBuilder()
    dtype = np.dtype(dtype)
    bias_dtype = np.dtype(bias_dtype or (np.int64 if dtype == np.int16 else np.int32))
    n, h, w, _ = input_shape
    kh, kw = weights.shape[1], weights.shape[2]
    oh = conv_out_size(h, kh, stride[0], dilation[0], padding)
    ow = conv_out_size(w, kw, stride[1], dilation[1], padding)
    if oh <= 0 or ow <= 0:
        raise ValueError("empty output")
    ws = np.atleast_1d(f32(w_scale))
    x = b.add_tensor(input_shape, dtype, in_scale, in_zp, name="input")
    wt = b.add_const(
        np.asarray(weights, np.int8),
        scale=ws,
        zero_point=np.zeros(ws.size, np.int64),
        axis=w_axis if ws.size > 1 else 0,
        name="weights",
    )
    if bias is not None:
        bs = bias_scale(in_scale, ws)
        bt = b.add_const(
            np.asarray(bias, bias_dtype),
            scale=bs,
            zero_point=np.zeros(bs.size, np.int64),
            axis=bias_axis,
            name="bias",
        )
    else:
        bt = -1
    y = b.add_tensor((n, oh, ow, out_channels), dtype, out_scale, out_zp, name="output")
    options.padding = _PADDING[padding]
    options.strideH, options.strideW = int(stride[0]), int(stride[1])
    options.dilationHFactor, options.dilationWFactor = int(dilation[0]), int(dilation[1])
    options.fusedActivationFunction = _ACTIVATION[activation]
    b.add_op(kind, [x, wt, bt], [y], options)
    return b.build([x], [y])


def conv2d_model(
    input_shape,
    weights,
    bias,
    in_scale,
    in_zp,
    w_scale,
    out_scale,
    out_zp,
    stride=(1, 1),
    padding="SAME",
    dilation=(1, 1),
    activation="NONE",
    dtype=np.int8,
    bias_dtype=None,
) -> bytes:
    """CONV_2D. weights int8 [O, kh, kw, I]; bias int32 [O] or None; w_scale scalar or [O] (axis 0).
    dtype int16: int16 input and output (16x8), the bias int64 unless bias_dtype says otherwise."""
    weights = np.asarray(weights, np.int8)
    return _conv_like(
        "CONV_2D",
        input_shape,
        weights,
        bias,
        in_scale,
        in_zp,
        w_scale,
        out_scale,
        out_zp,
        stride,
        padding,
        dilation,
        activation,
        0,
        weights.shape[0],
        schema.Conv2DOptionsT(),
        dtype=dtype,
        bias_dtype=bias_dtype,
    )


def depthwise_model(
    input_shape,
    weights,
    bias,
    in_scale,
    in_zp,
    w_scale,
    out_scale,
    out_zp,
    stride=(1, 1),
    padding="SAME",
    dilation=(1, 1),
    activation="NONE",
    depth_multiplier=1,
    bias_axis=0,
    dtype=np.int8,
    bias_dtype=None,
) -> bytes:
    """DEPTHWISE_CONV_2D. weights int8 [1, kh, kw, C*m]; w_scale scalar or [C*m] (axis 3).
    bias_axis=3 writes the 1-D bias with quantized_dimension 3, as some real files do (TFLM runs
    them, LiteRT refuses them). Note: TFLM segfaults on DEPTHWISE_CONV_2D without bias."""
    weights = np.asarray(weights, np.int8)
    opt = schema.DepthwiseConv2DOptionsT()
    opt.depthMultiplier = int(depth_multiplier)
    return _conv_like(
        "DEPTHWISE_CONV_2D",
        input_shape,
        weights,
        bias,
        in_scale,
        in_zp,
        w_scale,
        out_scale,
        out_zp,
        stride,
        padding,
        dilation,
        activation,
        3,
        weights.shape[3],
        opt,
        bias_axis=bias_axis,
        dtype=dtype,
        bias_dtype=bias_dtype,
    )


def fully_connected_model(
    input_shape,
    weights,
    bias,
    in_scale,
    in_zp,
    w_scale,
    out_scale,
    out_zp,
    activation="NONE",
    keep_num_dims=False,
    dtype=np.int8,
    bias_dtype=None,
) -> bytes:
    """FULLY_CONNECTED. weights int8 [U, K] with K = prod(input_shape[1:]); w_scale scalar or [U].
    dtype int16: int16 input and output (16x8), the bias int64 unless bias_dtype says otherwise."""
    weights = np.asarray(weights, np.int8)
    units, k = weights.shape
    b = ModelBuilder()
    dtype = np.dtype(dtype)
    bias_dtype = np.dtype(bias_dtype or (np.int64 if dtype == np.int16 else np.int32))
    ws = np.atleast_1d(f32(w_scale))
    x = b.add_tensor(input_shape, dtype, in_scale, in_zp, name="input")
    wt = b.add_const(weights, scale=ws, zero_point=np.zeros(ws.size, np.int64), axis=0, name="weights")
    if bias is not None:
        bs = bias_scale(in_scale, ws)
        bt = b.add_const(
            np.asarray(bias, bias_dtype), scale=bs, zero_point=np.zeros(bs.size, np.int64), name="bias"
        )
    else:
        bt = -1
    out_shape = (
        tuple(input_shape[:-1]) + (units,) if keep_num_dims else (int(np.prod(input_shape)) // k, units)
    )
    y = b.add_tensor(out_shape, dtype, out_scale, out_zp, name="output")
    opt = schema.FullyConnectedOptionsT()
    opt.fusedActivationFunction = _ACTIVATION[activation]
    opt.keepNumDims = bool(keep_num_dims)
    b.add_op("FULLY_CONNECTED", [x, wt, bt], [y], opt)
    return b.build([x], [y])


def transpose_conv_model(
    input_shape,
    out_hw,
    weights,
    bias,
    in_scale,
    in_zp,
    w_scale,
    out_scale,
    out_zp,
    stride=(2, 2),
    padding="SAME",
    activation=None,
) -> bytes:
    """TRANSPOSE_CONV. weights int8 [O, kh, kw, I]; bias int32 [O] or None; w_scale scalar or [O]
    (axis 0); out_hw the output's (H, W). activation None leaves the option at its default."""
    weights = np.asarray(weights, np.int8)
    n = input_shape[0]
    o = weights.shape[0]
    b = ModelBuilder()
    ws = np.atleast_1d(f32(w_scale))
    shape = b.add_const(np.asarray([n, *out_hw, o], np.int32), name="output_shape")
    wt = b.add_const(weights, scale=ws, zero_point=np.zeros(ws.size, np.int64), axis=0, name="weights")
    x = b.add_tensor(input_shape, np.int8, in_scale, in_zp, name="input")
    inputs = [shape, wt, x]
    if bias is not None:
        bs = bias_scale(in_scale, ws)
        inputs.append(
            b.add_const(
                np.asarray(bias, np.int32), scale=bs, zero_point=np.zeros(bs.size, np.int64), name="bias"
            )
        )
    y = b.add_tensor((n, *out_hw, o), np.int8, out_scale, out_zp, name="output")
    opt = schema.TransposeConvOptionsT()
    opt.padding = _PADDING[padding]
    opt.strideH, opt.strideW = int(stride[0]), int(stride[1])
    if activation is not None:
        opt.fusedActivationFunction = _ACTIVATION[activation]
    b.add_op("TRANSPOSE_CONV", inputs, [y], opt)
    return b.build([x], [y])


def add_model(
    shape1, shape2, s1, z1, s2, z2, out_scale, out_zp, activation="NONE", const2=None, dtype=np.int8
) -> bytes:
    """ADD with numpy-style broadcasting: binary_model("ADD", ...)."""
    return binary_model(
        "ADD", shape1, shape2, s1, z1, s2, z2, out_scale, out_zp, activation, const2=const2, dtype=dtype
    )


def binary_model(
    kind, shape1, shape2, s1, z1, s2, z2, out_scale, out_zp, activation="NONE", const2=None, dtype=np.int8
) -> bytes:
    """ADD, MUL or SUB with numpy-style broadcasting: the second operand a graph input or, with
    const2 (data of shape2), a constant. dtype: of both inputs and the output (int8 or int16)."""
    b = ModelBuilder()
    x1 = b.add_tensor(shape1, dtype, s1, z1, name="input1")
    if const2 is None:
        x2 = b.add_tensor(shape2, dtype, s2, z2, name="input2")
    else:
        x2 = b.add_tensor(
            shape2, dtype, s2, z2, data=np.asarray(const2, dtype).reshape(shape2), name="const2"
        )
    out_shape = np.broadcast_shapes(tuple(shape1), tuple(shape2))
    y = b.add_tensor(out_shape, dtype, out_scale, out_zp, name="output")
    opt = {"MUL": schema.MulOptionsT, "SUB": schema.SubOptionsT, "ADD": schema.AddOptionsT}[kind]()
    opt.fusedActivationFunction = _ACTIVATION[activation]
    b.add_op(kind, [x1, x2], [y], opt)
    return b.build([x1] if const2 is not None else [x1, x2], [y])


def logistic_model(input_shape, in_scale, in_zp, out_scale=None, out_zp=None, dtype=np.int8) -> bytes:
    """LOGISTIC; the output quantization defaults to TFLM's: (1/256, -128) for int8, (2^-15, 0) for
    int16 (dtype of the input and the output)."""
    int16 = np.dtype(dtype) == np.int16
    out_scale = (2.0**-15 if int16 else 1.0 / 256.0) if out_scale is None else out_scale
    out_zp = (0 if int16 else -128) if out_zp is None else out_zp
    b = ModelBuilder()
    x = b.add_tensor(input_shape, dtype, in_scale, in_zp, name="input")
    y = b.add_tensor(input_shape, dtype, out_scale, out_zp, name="output")
    b.add_op("LOGISTIC", [x], [y])
    return b.build([x], [y])


def unary_model(kind, input_shape, in_scale, in_zp, out_scale, out_zp, options=None) -> bytes:
    """A one-input elementwise op (TANH, HARD_SWISH, LEAKY_RELU with options=LeakyReluOptionsT)."""
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, in_scale, in_zp, name="input")
    y = b.add_tensor(input_shape, np.int8, out_scale, out_zp, name="output")
    b.add_op(kind, [x], [y], options)
    return b.build([x], [y])


def leaky_relu_model(input_shape, in_scale, in_zp, out_scale, out_zp, alpha) -> bytes:
    opt = schema.LeakyReluOptionsT()
    opt.alpha = float(np.float32(alpha))
    return unary_model("LEAKY_RELU", input_shape, in_scale, in_zp, out_scale, out_zp, opt)


def plain_binary_model(kind, shape1, shape2, q1, q2, q_out, const2=None) -> bytes:
    """MAXIMUM, MINIMUM or PRELU (no options): numpy-style broadcasting; q* = (scale, zero point);
    the second operand a graph input or, with const2, a constant."""
    b = ModelBuilder()
    x1 = b.add_tensor(shape1, np.int8, *q1, name="input1")
    if const2 is None:
        x2 = b.add_tensor(shape2, np.int8, *q2, name="input2")
    else:
        x2 = b.add_tensor(
            shape2, np.int8, *q2, data=np.asarray(const2, np.int8).reshape(shape2), name="const2"
        )
    out_shape = np.broadcast_shapes(tuple(shape1), tuple(shape2))
    y = b.add_tensor(out_shape, np.int8, *q_out, name="output")
    b.add_op(kind, [x1, x2], [y])
    return b.build([x1] if const2 is not None else [x1, x2], [y])


def _pool_model(kind, input_shape, scale, zp, filter_size, stride, padding, activation):
    b = ModelBuilder()
    n, h, w, c = input_shape
    oh = conv_out_size(h, filter_size[0], stride[0], 1, padding)
    ow = conv_out_size(w, filter_size[1], stride[1], 1, padding)
    if oh <= 0 or ow <= 0:
        raise ValueError("empty output")
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    y = b.add_tensor((n, oh, ow, c), np.int8, scale, zp, name="output")
    opt = schema.Pool2DOptionsT()
    opt.padding = _PADDING[padding]
    opt.strideH, opt.strideW = int(stride[0]), int(stride[1])
    opt.filterHeight, opt.filterWidth = int(filter_size[0]), int(filter_size[1])
    opt.fusedActivationFunction = _ACTIVATION[activation]
    b.add_op(kind, [x], [y], opt)
    return b.build([x], [y])


def avg_pool_model(
    input_shape, scale, zp, filter_size=(2, 2), stride=(2, 2), padding="VALID", activation="NONE"
) -> bytes:
    return _pool_model("AVERAGE_POOL_2D", input_shape, scale, zp, filter_size, stride, padding, activation)


def max_pool_model(
    input_shape, scale, zp, filter_size=(2, 2), stride=(2, 2), padding="VALID", activation="NONE"
) -> bytes:
    return _pool_model("MAX_POOL_2D", input_shape, scale, zp, filter_size, stride, padding, activation)


def mean_model(
    input_shape, in_scale, in_zp, out_scale, out_zp, axes=(1, 2), keep_dims=True, kind="MEAN"
) -> bytes:
    """MEAN, or with kind SUM / REDUCE_MAX the other int8 reducers (same inputs and options)."""
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, in_scale, in_zp, name="input")
    ax = b.add_const(np.asarray(axes, np.int32), name="axes")
    axes_n = {a % len(input_shape) for a in axes}
    if keep_dims:
        out_shape = tuple(1 if i in axes_n else d for i, d in enumerate(input_shape))
    else:
        out_shape = tuple(d for i, d in enumerate(input_shape) if i not in axes_n)
    y = b.add_tensor(out_shape, np.int8, out_scale, out_zp, name="output")
    opt = schema.ReducerOptionsT()
    opt.keepDims = bool(keep_dims)
    b.add_op(kind, [x, ax], [y], opt)
    return b.build([x], [y])


def softmax_model(input_shape, in_scale, in_zp, beta=1.0, dtype=np.int8, out_scale=None) -> bytes:
    """SOFTMAX int8 -> int8 with the fixed output quantization (1/256, -128), or with dtype int16
    int16 -> int16 with (2^-15, 0) unless out_scale says otherwise."""
    int16 = np.dtype(dtype) == np.int16
    if out_scale is None:
        out_scale = 2.0**-15 if int16 else 1.0 / 256.0
    b = ModelBuilder()
    x = b.add_tensor(input_shape, dtype, in_scale, in_zp, name="input")
    y = b.add_tensor(input_shape, dtype, out_scale, 0 if int16 else -128, name="output")
    opt = schema.SoftmaxOptionsT()
    opt.beta = float(beta)
    b.add_op("SOFTMAX", [x], [y], opt)
    return b.build([x], [y])


def batch_matmul_model(lhs_shape, rhs_shape, ql, qr, qo, adj_x=False, adj_y=False, rhs_const=None) -> bytes:
    """BATCH_MATMUL int8; q* = (scale, zero point); rhs a graph input or, with rhs_const, a constant."""
    ls, rs = list(lhs_shape), list(rhs_shape)
    if adj_x:
        ls[-2], ls[-1] = ls[-1], ls[-2]
    if adj_y:
        rs[-2], rs[-1] = rs[-1], rs[-2]
    out = [*np.broadcast_shapes(tuple(ls[:-2]), tuple(rs[:-2])), ls[-2], rs[-1]]
    b = ModelBuilder()
    x = b.add_tensor(lhs_shape, np.int8, *ql, name="lhs")
    if rhs_const is None:
        r = b.add_tensor(rhs_shape, np.int8, *qr, name="rhs")
    else:
        r = b.add_tensor(rhs_shape, np.int8, *qr, data=np.asarray(rhs_const, np.int8), name="rhs")
    y = b.add_tensor(out, np.int8, *qo, name="output")
    opt = schema.BatchMatMulOptionsT()
    opt.adjX, opt.adjY = bool(adj_x), bool(adj_y)
    b.add_op("BATCH_MATMUL", [x, r], [y], opt)
    return b.build([x] if rhs_const is not None else [x, r], [y])


def two_head_model(seed: int = 7) -> bytes:
    """Two heads on one [1, 8, 8, 4] input: op 0 MAX_POOL_2D 2x2 (tensor 'head_pool', exact under every
    profile) and op 1 CONV_2D 3x3 SAME to 8 channels (tensor 'head_conv', where tflm and xnnpack part).
    Graph outputs (head_conv, head_pool): output 0 comes from the later op."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.add_tensor((1, 8, 8, 4), np.int8, 0.05, 3, name="input")
    w = b.add_const(rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8), scale=0.01, zero_point=0, name="w")
    bias = b.add_const(
        rng.integers(-500, 500, 8).astype(np.int32), scale=bias_scale(0.05, 0.01), zero_point=0, name="bias"
    )
    pool = b.add_tensor((1, 4, 4, 4), np.int8, 0.05, 3, name="head_pool")
    p = schema.Pool2DOptionsT()
    p.padding = _PADDING["VALID"]
    p.strideH = p.strideW = p.filterHeight = p.filterWidth = 2
    b.add_op("MAX_POOL_2D", [x], [pool], p)
    conv = b.add_tensor((1, 8, 8, 8), np.int8, 0.037, -5, name="head_conv")
    opt = schema.Conv2DOptionsT()
    opt.padding = _PADDING["SAME"]
    opt.strideH = opt.strideW = opt.dilationHFactor = opt.dilationWFactor = 1
    b.add_op("CONV_2D", [x, w, bias], [conv], opt)
    return b.build([x], [conv, pool])


def silu_chain_model(shape, variant: str = "silu", seed: int = 0) -> bytes:
    """Elementwise chains over one activation, as YOLO's SiLU is (npusim/runtime/chains.py): a 1x1 CONV_2D
    gives x, then by variant
    - "silu": LOGISTIC(x) -> s, MUL(x, s); "swapped": MUL(s, x);
    - "long": SiLU, then ADD of a scalar constant, then TANH (a chain of four);
    - "exposed": SiLU with s a graph output too (no chain may drop it);
    - "uint8": no conv, a uint8 input -> QUANTIZE to int8 -> SiLU (the chain's root is uint8).
    shape: [N, H, W, C] of x."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    outputs = []
    if variant == "uint8":
        inp = b.add_tensor(shape, np.uint8, 0.05, 131, name="input")
        x = b.add_tensor(shape, np.int8, 0.05, 3, name="x")
        b.add_op("QUANTIZE", [inp], [x])
    else:
        inp = b.add_tensor(shape, np.int8, 0.04, -5, name="input")
        c = shape[-1]
        w = b.add_const(rng.integers(-127, 128, (c, 1, 1, c)).astype(np.int8), scale=0.03, zero_point=0)
        bias = b.add_const(rng.integers(-300, 300, c).astype(np.int32), scale=0.04 * 0.03, zero_point=0)
        x = b.add_tensor(shape, np.int8, 0.07, 9, name="x")
        opt = schema.Conv2DOptionsT()
        opt.padding = schema.Padding.VALID
        opt.strideH = opt.strideW = opt.dilationHFactor = opt.dilationWFactor = 1
        b.add_op("CONV_2D", [inp, w, bias], [x], opt)
    s = b.add_tensor(shape, np.int8, 1.0 / 256, -128, name="sigmoid")
    b.add_op("LOGISTIC", [x], [s])
    y = b.add_tensor(shape, np.int8, 0.04, -110, name="silu")
    b.add_op("MUL", [s, x] if variant == "swapped" else [x, s], [y], schema.MulOptionsT())
    if variant == "long":
        k = b.add_const(np.array([37], np.int8), scale=0.02, zero_point=-4)
        z = b.add_tensor(shape, np.int8, 0.05, -20, name="shifted")
        b.add_op("ADD", [y, k], [z], schema.AddOptionsT())
        y = b.add_tensor(shape, np.int8, 1.0 / 128, 0, name="tanh")
        b.add_op("TANH", [z], [y])
    if variant == "exposed":
        outputs.append(s)
    return b.build([inp], [y, *outputs])
