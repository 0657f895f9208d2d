"""Test oracles: a one-op .tflite builder and runners for TFLM, LiteRT and npusim.

The builder writes flatbuffers with the schema that ai-edge-litert ships (object API), so the test
models are made in the tests themselves and no model file lives in the repository.

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

import contextlib
import contextvars
import math
from typing import Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

# ----------------------------------------------------------------------------------------------
# Builder
# ----------------------------------------------------------------------------------------------

_TENSOR_TYPES = {
    np.dtype(np.float32): schema.TensorType.FLOAT32,
    np.dtype(np.int32): schema.TensorType.INT32,
    np.dtype(np.uint8): schema.TensorType.UINT8,
    np.dtype(np.int64): schema.TensorType.INT64,
    np.dtype(np.int8): schema.TensorType.INT8,
    np.dtype(np.int16): schema.TensorType.INT16,
}
_TYPE_DTYPES = {v: k for k, v in _TENSOR_TYPES.items()}

_PADDING = {"SAME": schema.Padding.SAME, "VALID": schema.Padding.VALID}
_ACTIVATION = {
    "NONE": schema.ActivationFunctionType.NONE,
    "RELU": schema.ActivationFunctionType.RELU,
    "RELU6": schema.ActivationFunctionType.RELU6,
    "RELU_N1_TO_1": schema.ActivationFunctionType.RELU_N1_TO_1,
}

# Operator versions a converter would write for int8 (TFLM ignores them, LiteRT accepts any
# registered version).
_OP_VERSIONS = {
    "CONV_2D": 3,
    "DEPTHWISE_CONV_2D": 3,
    "FULLY_CONNECTED": 4,
    "ADD": 2,
    "AVERAGE_POOL_2D": 2,
    "MAX_POOL_2D": 2,
    "MEAN": 2,
    "SOFTMAX": 2,
    "RESHAPE": 1,
    "PAD": 2,
    "PADV2": 2,
    "TRANSPOSE": 2,
    "CONCATENATION": 2,
    "QUANTIZE": 2,
    "DEQUANTIZE": 2,
    "LOGISTIC": 2,
    "MUL": 2,
    "SUB": 2,
    "STRIDED_SLICE": 2,
    "SPLIT": 2,
    "SPLIT_V": 2,
    "PACK": 2,
    "RESIZE_NEAREST_NEIGHBOR": 2,
    "TRANSPOSE_CONV": 3,
    "TANH": 2,
    "HARD_SWISH": 1,
    "LEAKY_RELU": 2,
    "MAXIMUM": 2,
    "MINIMUM": 2,
    "PRELU": 1,
    "SLICE": 2,
    "UNPACK": 2,
    "SQUEEZE": 1,
    "EXPAND_DIMS": 1,
    "SHAPE": 1,
    "TILE": 1,
    "GATHER": 2,
    "REDUCE_MAX": 2,
    "SUM": 2,
    "RESIZE_BILINEAR": 3,
    "BATCH_MATMUL": 4,
}


def _as_list(v):
    return [int(a) for a in np.atleast_1d(v)]


class ModelBuilder:
    """Builds a single-subgraph .tflite model. Tensor and op indices follow insertion order."""

    def __init__(self, description: str = "npusim test model"):
        self.description = description
        self.buffers = [schema.BufferT()]  # buffer 0: the empty buffer every model starts with
        self.tensors: list = []
        self.opcodes: list = []
        self._opcode_index: dict = {}
        self.operators: list = []

    # -- tensors --------------------------------------------------------------------------------
    def add_tensor(
        self, shape, dtype=np.int8, scale=None, zero_point=None, data=None, axis=0, name=None
    ) -> int:
        """Add a tensor; `data` makes it a constant. scale/zero_point: scalar (per-tensor) or
        sequence (per-channel along `axis`). Returns the tensor index."""
        dtype = np.dtype(dtype)
        t = schema.TensorT()
        t.shape = [int(d) for d in shape]
        t.type = _TENSOR_TYPES[dtype]
        t.name = name or f"t{len(self.tensors)}"
        if scale is not None:
            q = schema.QuantizationParametersT()
            q.scale = [float(np.float32(s)) for s in np.atleast_1d(scale)]
            zp = np.zeros(len(q.scale), np.int64) if zero_point is None else np.atleast_1d(zero_point)
            if zp.size == 1 and len(q.scale) > 1:
                zp = np.repeat(zp, len(q.scale))
            q.zeroPoint = [int(z) for z in zp]
            q.quantizedDimension = int(axis)
            t.quantization = q
        if data is not None:
            arr = np.ascontiguousarray(np.asarray(data, dtype=dtype))
            if tuple(arr.shape) != tuple(t.shape) and arr.size != int(np.prod(t.shape, dtype=np.int64)):
                raise ValueError(f"constant data shape {arr.shape} does not match {t.shape}")
            buf = schema.BufferT()
            buf.data = np.frombuffer(arr.tobytes(), dtype=np.uint8)
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        else:
            t.buffer = 0
        self.tensors.append(t)
        return len(self.tensors) - 1

    def add_const(self, data, dtype=None, scale=None, zero_point=None, axis=0, name=None) -> int:
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
        return self.add_tensor(arr.shape, arr.dtype, scale, zero_point, data=arr, axis=axis, name=name)

    def shape(self, t: int) -> tuple:
        return tuple(self.tensors[t].shape)

    # -- operators ------------------------------------------------------------------------------
    def add_op(
        self,
        kind: str,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options=None,
        version: int | None = None,
    ) -> int:
        """kind: builtin operator name ("CONV_2D"); options: a schema *OptionsT object or None."""
        code = getattr(schema.BuiltinOperator, kind)
        version = version if version is not None else _OP_VERSIONS.get(kind, 1)
        key = (code, version)
        if key not in self._opcode_index:
            oc = schema.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
            oc.version = version
            self.opcodes.append(oc)
            self._opcode_index[key] = len(self.opcodes) - 1
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode_index[key]
        op.inputs = [int(i) for i in inputs]
        op.outputs = [int(o) for o in outputs]
        if options is not None:
            op.builtinOptionsType = getattr(schema.BuiltinOptions, type(options).__name__[:-1])
            op.builtinOptions = options
        self.operators.append(op)
        return len(self.operators) - 1

    # -- output ---------------------------------------------------------------------------------
    def build(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        sg = schema.SubGraphT()
        sg.tensors = self.tensors
        sg.inputs = [int(i) for i in inputs]
        sg.outputs = [int(o) for o in outputs]
        sg.operators = self.operators
        sg.name = "main"
        model = schema.ModelT()
        model.version = 3
        model.operatorCodes = self.opcodes
        model.subgraphs = [sg]
        model.buffers = self.buffers
        model.description = self.description
        builder = flatbuffers.Builder(0)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def model_inputs(model_bytes: bytes) -> list[tuple[tuple, np.dtype]]:
    """(shape, dtype) of each graph input, read back from the flatbuffer."""
    m = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    sg = m.subgraphs[0]
    return [(tuple(int(d) for d in sg.tensors[i].shape), _TYPE_DTYPES[sg.tensors[i].type]) for i in sg.inputs]


# ----------------------------------------------------------------------------------------------
# Quantization helpers (mirroring the converter, not the kernels)
# ----------------------------------------------------------------------------------------------


def f32(x):
    return np.asarray(x, dtype=np.float32)


def bias_scale(in_scale, w_scale) -> np.ndarray:
    """float32(double(in_scale) * double(w_scale[c])), as the converter stores it (LiteRT checks it)."""
    return (np.float64(np.float32(in_scale)) * f32(w_scale).astype(np.float64)).astype(np.float32)


def conv_out_size(n: int, k: int, stride: int, dilation: int, padding: str) -> int:
    if padding == "SAME":
        return -(-n // stride)
    return (n - (k - 1) * dilation - 1) // stride + 1


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


def reshape_model(input_shape, new_shape, scale, zp, shape_tensor=True) -> bytes:
    """RESHAPE; new_shape may hold one -1. shape_tensor: pass the shape as a constant int32 input
    (what converters write) rather than only in ReshapeOptions."""
    new_shape = [int(d) for d in new_shape]
    resolved = list(np.empty(input_shape, np.int8).reshape(new_shape).shape)
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    inputs = [x]
    if shape_tensor:
        inputs.append(b.add_const(np.asarray(new_shape, np.int32), name="shape"))
    y = b.add_tensor(resolved, np.int8, scale, zp, name="output")
    opt = schema.ReshapeOptionsT()
    opt.newShape = new_shape
    b.add_op("RESHAPE", inputs, [y], opt)
    return b.build([x], [y])


def pad_model(input_shape, paddings, scale, zp, v2=False) -> bytes:
    """PAD (pads with the zero point), or PADV2 with an explicit constant pad value = zp."""
    paddings = np.asarray(paddings, np.int32).reshape(len(input_shape), 2)
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    p = b.add_const(paddings, name="paddings")
    inputs = [x, p]
    if v2:
        inputs.append(
            b.add_const(np.asarray([zp], np.int8).reshape(()), scale=scale, zero_point=zp, name="pad_value")
        )
    out_shape = tuple(int(d + p0 + p1) for d, (p0, p1) in zip(input_shape, paddings))
    y = b.add_tensor(out_shape, np.int8, scale, zp, name="output")
    if v2:
        b.add_op("PADV2", inputs, [y], schema.PadV2OptionsT())
    else:
        b.add_op("PAD", inputs, [y], schema.PadOptionsT())
    return b.build([x], [y])


def transpose_model(input_shape, perm, scale, zp) -> bytes:
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    p = b.add_const(np.asarray(perm, np.int32), name="perm")
    y = b.add_tensor(tuple(input_shape[i] for i in perm), np.int8, scale, zp, name="output")
    b.add_op("TRANSPOSE", [x, p], [y], schema.TransposeOptionsT())
    return b.build([x], [y])


def concat_model(shapes, axis, scale, zp, consts=None) -> bytes:
    """CONCATENATION of int8 tensors that share scale and zero point. consts: optional list, one
    entry per operand, of int8 data (that operand becomes a constant) or None (a graph input).
    The first operand must be a graph input."""
    consts = consts or [None] * len(shapes)
    b = ModelBuilder()
    ins, graph_inputs = [], []
    for i, (shape, c) in enumerate(zip(shapes, consts)):
        if c is None:
            t = b.add_tensor(shape, np.int8, scale, zp, name=f"input{i}")
            graph_inputs.append(t)
        else:
            t = b.add_tensor(
                shape, np.int8, scale, zp, data=np.asarray(c, np.int8).reshape(shape), name=f"const{i}"
            )
        ins.append(t)
    rank = len(shapes[0])
    ax = axis % rank
    out_shape = list(shapes[0])
    out_shape[ax] = sum(s[ax] for s in shapes)
    y = b.add_tensor(out_shape, np.int8, scale, zp, name="output")
    opt = schema.ConcatenationOptionsT()
    opt.axis = int(axis)
    b.add_op("CONCATENATION", ins, [y], opt)
    return b.build(graph_inputs, [y])


def strided_slice_model(
    input_shape,
    begin,
    end,
    strides,
    scale,
    zp,
    begin_mask=0,
    end_mask=0,
    shrink_axis_mask=0,
    ellipsis_mask=0,
    new_axis_mask=0,
    output_shape=None,
) -> bytes:
    """STRIDED_SLICE with constant int32 begin/end/strides. output_shape: by default the shape of
    the slice as TFLite defines it (masks per input axis, ellipsis and new axis ignored as TFLM does)."""
    if output_shape is None:  # TFLM checks the declared shape against its own (CheckOutputSize)
        from npusim.ops.strided_slice import axis_indices

        output_shape = []
        for k, d in enumerate(input_shape):
            flags = (begin_mask >> k & 1, end_mask >> k & 1, shrink_axis_mask >> k & 1)
            n = len(axis_indices(d, int(begin[k]), int(end[k]), int(strides[k]), *map(bool, flags)))
            if not flags[2]:
                output_shape.append(n)
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    ts = [
        b.add_const(np.asarray(v, np.int32), name=n)
        for v, n in ((begin, "begin"), (end, "end"), (strides, "strides"))
    ]
    y = b.add_tensor(output_shape, np.int8, scale, zp, name="output")
    opt = schema.StridedSliceOptionsT()
    opt.beginMask, opt.endMask, opt.shrinkAxisMask = int(begin_mask), int(end_mask), int(shrink_axis_mask)
    opt.ellipsisMask, opt.newAxisMask = int(ellipsis_mask), int(new_axis_mask)
    b.add_op("STRIDED_SLICE", [x, *ts], [y], opt)
    return b.build([x], [y])


def split_model(input_shape, axis, num_splits, scale, zp) -> bytes:
    """SPLIT into num_splits equal parts: inputs (axis, input), num_splits outputs."""
    b = ModelBuilder()
    a = b.add_const(np.asarray(axis, np.int32).reshape(()), name="axis")
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    part = list(input_shape)
    part[axis] //= num_splits
    ys = [b.add_tensor(part, np.int8, scale, zp, name=f"output{i}") for i in range(num_splits)]
    opt = schema.SplitOptionsT()
    opt.numSplits = int(num_splits)
    b.add_op("SPLIT", [a, x], ys, opt)
    return b.build([x], ys)


def split_v_model(input_shape, size_splits, axis, scale, zp) -> bytes:
    """SPLIT_V: inputs (input, size_splits, axis); size_splits may hold one -1."""
    sizes = list(size_splits)
    if -1 in sizes:
        sizes[sizes.index(-1)] = input_shape[axis] - (sum(sizes) + 1)
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    s = b.add_const(np.asarray(size_splits, np.int32), name="size_splits")
    a = b.add_const(np.asarray(axis, np.int32).reshape(()), name="axis")
    ys = []
    for i, n in enumerate(sizes):
        shape = list(input_shape)
        shape[axis] = n
        ys.append(b.add_tensor(shape, np.int8, scale, zp, name=f"output{i}"))
    opt = schema.SplitVOptionsT()
    opt.numSplits = len(sizes)
    b.add_op("SPLIT_V", [x, s, a], ys, opt)
    return b.build([x], ys)


def pack_model(shape, count, axis, scale, zp) -> bytes:
    """PACK of `count` graph inputs of one shape along a new axis."""
    b = ModelBuilder()
    xs = [b.add_tensor(shape, np.int8, scale, zp, name=f"input{i}") for i in range(count)]
    out = list(shape)
    out.insert(axis % (len(shape) + 1), count)
    y = b.add_tensor(out, np.int8, scale, zp, name="output")
    opt = schema.PackOptionsT()
    opt.valuesCount, opt.axis = int(count), int(axis)
    b.add_op("PACK", xs, [y], opt)
    return b.build(xs, [y])


def resize_nearest_model(
    input_shape, size, scale, zp, align_corners=False, half_pixel_centers=False, bilinear=False
) -> bytes:
    """RESIZE_NEAREST_NEIGHBOR, or RESIZE_BILINEAR with bilinear=True (same inputs and options)."""
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    s = b.add_const(np.asarray(size, np.int32), name="size")
    y = b.add_tensor((input_shape[0], *size, input_shape[3]), np.int8, scale, zp, name="output")
    opt = schema.ResizeBilinearOptionsT() if bilinear else schema.ResizeNearestNeighborOptionsT()
    opt.alignCorners, opt.halfPixelCenters = bool(align_corners), bool(half_pixel_centers)
    b.add_op("RESIZE_BILINEAR" if bilinear else "RESIZE_NEAREST_NEIGHBOR", [x, s], [y], opt)
    return b.build([x], [y])


def slice_model(input_shape, begin, size, scale, zp, index_dtype=np.int32) -> bytes:
    """SLICE with constant begin and size (size may hold -1: to the end of the axis)."""
    out = [d - b if s == -1 else s for d, b, s in zip(input_shape, begin, size)]
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    bt = b.add_const(np.asarray(begin, index_dtype), name="begin")
    st = b.add_const(np.asarray(size, index_dtype), name="size")
    y = b.add_tensor(out, np.int8, scale, zp, name="output")
    b.add_op("SLICE", [x, bt, st], [y], schema.SliceOptionsT())
    return b.build([x], [y])


def unpack_model(input_shape, axis, scale, zp) -> bytes:
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    ax = axis % len(input_shape)
    part = list(input_shape[:ax]) + list(input_shape[ax + 1 :])
    ys = [b.add_tensor(part, np.int8, scale, zp, name=f"output{i}") for i in range(input_shape[ax])]
    opt = schema.UnpackOptionsT()
    opt.num, opt.axis = int(input_shape[ax]), int(axis)
    b.add_op("UNPACK", [x], ys, opt)
    return b.build([x], ys)


def squeeze_model(input_shape, squeeze_dims, scale, zp) -> bytes:
    rank = len(input_shape)
    dims = (
        {d % rank for d in squeeze_dims} if squeeze_dims else {i for i, s in enumerate(input_shape) if s == 1}
    )
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    y = b.add_tensor(
        [s for i, s in enumerate(input_shape) if i not in dims], np.int8, scale, zp, name="output"
    )
    opt = schema.SqueezeOptionsT()
    opt.squeezeDims = [int(d) for d in squeeze_dims]
    b.add_op("SQUEEZE", [x], [y], opt)
    return b.build([x], [y])


def expand_dims_model(input_shape, axis, scale, zp) -> bytes:
    out = list(input_shape)
    out.insert(axis % (len(input_shape) + 1), 1)
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    a = b.add_const(np.asarray([axis], np.int32), name="axis")
    y = b.add_tensor(out, np.int8, scale, zp, name="output")
    b.add_op("EXPAND_DIMS", [x, a], [y], schema.ExpandDimsOptionsT())
    return b.build([x], [y])


def shape_model(input_shape, scale, zp, reshape=False) -> bytes:
    """SHAPE (int32 output); reshape=True feeds it to a RESHAPE of the input as its shape tensor and
    returns both outputs (the reshape first)."""
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    s = b.add_tensor([len(input_shape)], np.int32, name="shape")
    opt = schema.ShapeOptionsT()
    opt.outType = schema.TensorType.INT32
    b.add_op("SHAPE", [x], [s], opt)
    if not reshape:
        return b.build([x], [s])
    y = b.add_tensor(input_shape, np.int8, scale, zp, name="output")
    b.add_op("RESHAPE", [x, s], [y], schema.ReshapeOptionsT())
    return b.build([x], [y, s])


def tile_model(input_shape, multiples, scale, zp) -> bytes:
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    m = b.add_const(np.asarray(multiples, np.int32), name="multiples")
    y = b.add_tensor([d * r for d, r in zip(input_shape, multiples)], np.int8, scale, zp, name="output")
    b.add_op("TILE", [x, m], [y], schema.TileOptionsT())
    return b.build([x], [y])


def gather_model(input_shape, indices, axis, scale, zp) -> bytes:
    """GATHER of an int8 graph input with constant int32 indices (any shape) along axis."""
    indices = np.asarray(indices, np.int32)
    ax = axis % len(input_shape)
    out = list(input_shape[:ax]) + list(indices.shape) + list(input_shape[ax + 1 :])
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    i = b.add_const(indices, name="indices")
    y = b.add_tensor(out, np.int8, scale, zp, name="output")
    opt = schema.GatherOptionsT()
    opt.axis = int(axis)
    b.add_op("GATHER", [x, i], [y], opt)
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


def quantize_model(input_shape, in_dtype, out_scale, out_zp, in_scale=None, in_zp=None) -> bytes:
    """QUANTIZE float32 -> int8 (no input quantization), or uint8 / int8 -> int8 (in_scale, in_zp)."""
    in_dtype = np.dtype(in_dtype)
    b = ModelBuilder()
    if in_dtype == np.float32:
        x = b.add_tensor(input_shape, np.float32, name="input")
    else:
        x = b.add_tensor(input_shape, in_dtype, in_scale, in_zp, name="input")
    y = b.add_tensor(input_shape, np.int8, out_scale, out_zp, name="output")
    b.add_op("QUANTIZE", [x], [y], schema.QuantizeOptionsT())
    return b.build([x], [y])


def dequantize_model(input_shape, scale, zp) -> bytes:
    b = ModelBuilder()
    x = b.add_tensor(input_shape, np.int8, scale, zp, name="input")
    y = b.add_tensor(input_shape, np.float32, name="output")
    b.add_op("DEQUANTIZE", [x], [y], schema.DequantizeOptionsT())
    return b.build([x], [y])


# ----------------------------------------------------------------------------------------------
# Runners
# ----------------------------------------------------------------------------------------------


def _as_inputs(x_batch) -> list[np.ndarray]:
    xs = list(x_batch) if isinstance(x_batch, (list, tuple)) else [x_batch]
    n = xs[0].shape[0]
    if any(x.shape[0] != n for x in xs):
        raise ValueError("all inputs need the same batch size")
    return xs


def tflm_interpreter(model_bytes: bytes, x_batch, arena_size: int | None = None):
    """A TFLM interpreter for the model, its arena sized for inputs like x_batch's (4 MB plus room
    for the model and a few copies of one image's inputs)."""
    from tflite_micro.python.tflite_micro import runtime

    if arena_size is None:
        arena_size = (4 << 20) + 4 * len(model_bytes)
        arena_size += 8 * sum(int(x[:1].nbytes) for x in _as_inputs(x_batch))
    return runtime.Interpreter.from_bytes(bytes(model_bytes), arena_size=arena_size)


def run_tflm(model_bytes: bytes, x_batch, arena_size: int | None = None) -> np.ndarray:
    """TFLM output 0 for a batch (inputs stacked on axis 0; a list for several graph inputs).
    TFLM runs batch 1 per invoke; one interpreter serves the whole batch."""
    xs = _as_inputs(x_batch)
    interp = tflm_interpreter(model_bytes, xs, arena_size)
    outs = []
    for i in range(xs[0].shape[0]):
        for k, x in enumerate(xs):
            interp.set_input(np.ascontiguousarray(x[i : i + 1]), k)
        interp.invoke()
        outs.append(np.array(interp.get_output(0), copy=True))
    return np.concatenate(outs, axis=0)


def run_tflm_outputs(model_bytes: bytes, x_batch, arena_size: int | None = None) -> list[np.ndarray]:
    """Every TFLM graph output for a batch, in the graph's output order."""
    xs = _as_inputs(x_batch)
    interp = tflm_interpreter(model_bytes, xs, arena_size)
    count = len(schema.ModelT.InitFromPackedBuf(bytes(model_bytes), 0).subgraphs[0].outputs)
    outs: list[list[np.ndarray]] = [[] for _ in range(count)]
    for i in range(xs[0].shape[0]):
        for k, x in enumerate(xs):
            interp.set_input(np.ascontiguousarray(x[i : i + 1]), k)
        interp.invoke()
        for k in range(count):
            outs[k].append(np.array(interp.get_output(k), copy=True))
    return [np.concatenate(o, axis=0) for o in outs]


_RESOLVERS = {
    "AUTO": "AUTO",
    "REF": "BUILTIN_REF",
    "BUILTIN_REF": "BUILTIN_REF",
    "BUILTIN": "BUILTIN",
    "BUILTIN_WITHOUT_DEFAULT_DELEGATES": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
    "NODELEGATE": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
}


def run_litert(model_bytes: bytes, x_batch, resolver: str = "AUTO", threads: int = 1) -> np.ndarray:
    """LiteRT output 0, one invoke per batch element. resolver: AUTO (XNNPACK), REF (BUILTIN_REF),
    BUILTIN, NODELEGATE (BUILTIN_WITHOUT_DEFAULT_DELEGATES)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    xs = _as_inputs(x_batch)
    interp = Interpreter(
        model_content=bytes(model_bytes),
        experimental_op_resolver_type=getattr(OpResolverType, _RESOLVERS[resolver.upper()]),
        num_threads=threads,
    )
    interp.allocate_tensors()
    ins = interp.get_input_details()
    out = interp.get_output_details()[0]["index"]
    outs = []
    for i in range(xs[0].shape[0]):
        for k, x in enumerate(xs):
            interp.set_tensor(ins[k]["index"], np.ascontiguousarray(x[i : i + 1]))
        interp.invoke()
        outs.append(np.array(interp.get_tensor(out), copy=True))
    return np.concatenate(outs, axis=0)


class BatchedLiteRT:
    """LiteRT's default interpreter (AUTO resolver = XNNPACK delegate) with the input resized to the
    batch, as a user would run it for speed; a graph with a hard-coded batch (e.g. RESHAPE to
    [1, K]) is fed image by image instead (`batched` False)."""

    def __init__(self, model: bytes, batch: int, threads: int = 1):
        from ai_edge_litert.interpreter import Interpreter

        self.batched = True
        self.it = Interpreter(model_content=model, num_threads=threads)
        inp = self.it.get_input_details()[0]
        self.in_index = inp["index"]
        self.out_index = self.it.get_output_details()[0]["index"]
        self.batch = batch
        if batch != 1:
            try:
                self.it.resize_tensor_input(self.in_index, [batch] + list(inp["shape"][1:]), strict=False)
                self.it.allocate_tensors()
                if self.it.get_output_details()[0]["shape"][0] != batch:
                    raise ValueError("output batch does not follow the input batch")
            except (ValueError, RuntimeError):
                self.batched = False
                self.it = Interpreter(model_content=model, num_threads=threads)
                self.it.allocate_tensors()
        else:
            self.it.allocate_tensors()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.batched:
            self.it.set_tensor(self.in_index, x)
            self.it.invoke()
            return self.it.get_tensor(self.out_index)
        outs = []
        for i in range(x.shape[0]):
            self.it.set_tensor(self.in_index, x[i : i + 1])
            self.it.invoke()
            outs.append(self.it.get_tensor(self.out_index))
        return np.concatenate(outs)


_BACKEND = contextvars.ContextVar("npusim_backend", default="auto")


@contextlib.contextmanager
def on_backend(name: str):
    """run_npusim within the block uses the MAC backend `name` (npusim/engines/backend.py) unless told
    otherwise. A context rather than an argument so that a test's body, from which Hypothesis
    derives its derandomized examples, stays the same whichever backend it runs on."""
    token = _BACKEND.set(name)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def run_npusim(model_bytes, x_batch, profile: str = "tflm", backend: str | None = None) -> np.ndarray:
    """npusim output 0 for the whole batch at once, on `backend` (default: the one on_backend set,
    else "auto"). A single-input model goes through the public `Interpreter.run`; several graph
    inputs are fed through `Interpreter.evaluate`."""
    import npusim

    graph = npusim.load_model(model_bytes)
    interp = npusim.Interpreter(graph, profile=profile, backend=backend or _BACKEND.get())
    xs = _as_inputs(x_batch)
    if len(xs) == 1:
        return interp.run(xs[0])
    values = {graph.inputs[k]: np.ascontiguousarray(x) for k, x in enumerate(xs)}
    return interp.evaluate(values)[graph.outputs[0]]


def run_npusim_outputs(model_bytes, x_batch, profile: str = "tflm") -> list[np.ndarray]:
    """Every npusim graph output for the whole batch, in the graph's output order."""
    import npusim

    graph = npusim.load_model(model_bytes)
    interp = npusim.Interpreter(graph, profile=profile, backend=_BACKEND.get())
    values = {graph.inputs[k]: np.ascontiguousarray(x) for k, x in enumerate(_as_inputs(x_batch))}
    values = interp.evaluate(values)
    return [values[t] for t in graph.outputs]


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    """A readable description of where two outputs first differ (for assertion messages)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    diff = np.argwhere(~((a == b) | (np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)))))
    if len(diff) == 0:
        return "equal"
    idx = tuple(int(i) for i in diff[0])
    d = a.astype(np.float64) - b.astype(np.float64)
    return (
        f"{len(diff)}/{a.size} elements differ; first at {idx}: {a[idx]} vs {b[idx]}; "
        f"max |diff| {np.nanmax(np.abs(d))}"
    )


def assert_same(expected: np.ndarray, actual: np.ndarray, context: str = ""):
    if not (
        expected.shape == actual.shape and expected.dtype == actual.dtype and np.array_equal(expected, actual)
    ):
        raise AssertionError(f"{context}\n  {first_difference(expected, actual)}")


# ----------------------------------------------------------------------------------------------
# Random parameters (shared by the test files)
# ----------------------------------------------------------------------------------------------


def log_uniform(rng: np.random.Generator, lo: float, hi: float, size=None):
    return np.exp(rng.uniform(math.log(lo), math.log(hi), size))


def random_int8(rng: np.random.Generator, shape, mode: str = "uniform") -> np.ndarray:
    """Activations. mode: uniform over [-128, 127], 'extreme' (only -128 and 127), 'mixed'
    (uniform with about a quarter of the values at the extremes), 'narrow' (near 0)."""
    if mode == "extreme":
        return rng.choice(np.array([-128, 127], np.int8), size=shape)
    if mode == "narrow":
        return rng.integers(-8, 8, size=shape, dtype=np.int8)
    x = rng.integers(-128, 128, size=shape, dtype=np.int8)
    if mode == "mixed":
        m = rng.random(shape) < 0.25
        x[m] = rng.choice(np.array([-128, 127], np.int8), size=int(m.sum()))
    return x


def random_weights(rng: np.random.Generator, shape, mode: str = "uniform") -> np.ndarray:
    """int8 weights in [-127, 127]; mode 'extreme' gives only +-127, 'narrow' [-3, 3]."""
    if mode == "narrow":
        return rng.integers(-3, 4, size=shape, dtype=np.int8)
    if mode == "extreme":
        return rng.choice(np.array([-127, 127], np.int8), size=shape)
    w = rng.integers(-127, 128, size=shape, dtype=np.int8)
    if mode == "mixed":
        m = rng.random(shape) < 0.25
        w[m] = rng.choice(np.array([-127, 127], np.int8), size=int(m.sum()))
    return w


def random_out_scale(rng: np.random.Generator, in_scale, w_scale, taps: int, max_mult: float = 0.999):
    """An output scale that keeps every per-channel multiplier in_scale*w_scale[c]/out_scale below
    max_mult (checked on the float32 values, in double) and puts the typical accumulator in the int8
    range give or take a factor of ~10 (so outputs are neither all saturated nor all zero)."""
    ws = np.atleast_1d(f32(w_scale)).astype(np.float64)
    s_in = float(np.float32(in_scale))
    # |acc| ~ 127*75*sqrt(taps) for uniform data; aim for ~64 LSB at the output.
    typical = 64.0 / (127.0 * 75.0 * math.sqrt(max(taps, 1)))
    m = float(log_uniform(rng, typical / 8, min(typical * 8, max_mult)))
    out = np.float32(s_in * float(np.median(ws)) / m)
    for _ in range(100):
        if np.all(s_in * ws / np.float64(out) < max_mult):
            break
        out = np.float32(out * 1.25)
    return float(out)


def random_bias(rng: np.random.Generator, n: int, taps: int, mode: str = "uniform") -> np.ndarray:
    """int32 bias of the size of a few hundred accumulator LSBs per tap; 'large' adds +-2^20-ish
    values; 'small' within +-64; 'zero' gives zeros."""
    if mode == "zero":
        return np.zeros(n, np.int32)
    if mode == "small":
        return rng.integers(-64, 65, size=n).astype(np.int32)
    span = int(127 * 64 * math.sqrt(max(taps, 1)))
    if mode == "large":
        span = 1 << 22
    return rng.integers(-span, span + 1, size=n, dtype=np.int64).astype(np.int32)


def litert_delegated(model_bytes: bytes) -> bool:
    """Whether LiteRT's default resolver (AUTO) hands the model to XNNPACK (a DELEGATE node appears
    in the execution plan). One-op models only: any delegated node counts."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(
        model_content=bytes(model_bytes), experimental_op_resolver_type=OpResolverType.AUTO, num_threads=1
    )
    interp.allocate_tensors()
    return any(d["op_name"] == "DELEGATE" for d in interp._get_ops_details())


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
