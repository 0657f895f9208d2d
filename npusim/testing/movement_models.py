"""The one-op model builders of the data movement, shape and quantization ops (RESHAPE ... GATHER,
QUANTIZE, DEQUANTIZE), as oracle.py's for the arithmetic ops; oracle re-exports them."""

from __future__ import annotations

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from .builder import ModelBuilder


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


def add_reshape(b: ModelBuilder, src: int, shape, name: str, scale: float, zp: int) -> int:
    """A RESHAPE of src into an int8 tensor of shape (its new_shape option and shape input both set)."""
    y = b.add_tensor(shape, np.int8, scale, zp, name=name)
    opt = schema.ReshapeOptionsT()
    opt.newShape = list(shape)
    b.add_op("RESHAPE", [src, b.add_const(np.asarray(shape, np.int32), name=name + "_shape")], [y], opt)
    return y


def batch_axis_head_model(seed: int = 3, heads: int = 2, batch: int = 1) -> bytes:
    """A model that moves data across axis 0, as YOLO11's C2PSA attention does (its TFLite export
    reshapes [1, 2, 64, 32] into [2, 64, 32]), then a head like YOLOv8n's DFL (a 1x1 CONV_2D after a
    reshape): input [batch, 4, 8, 6] -> RESHAPE [batch * heads, 32 / heads, 6] -> BATCH_MATMUL
    (r r^T) -> SOFTMAX -> BATCH_MATMUL (p r) -> RESHAPE [.., 1, 6] -> CONV_2D 1x1 to 3 channels
    (the new leading axis as its batch) -> RESHAPE back to [batch, 96] -> ADD of a constant."""
    rng = np.random.default_rng(seed)
    rows = 32 // heads
    b = ModelBuilder()
    x = b.add_tensor((batch, 4, 8, 6), np.int8, 0.05, -3, name="input")

    def reshape(src, shape, name, scale, zp):
        return add_reshape(b, src, shape, name, scale, zp)

    def matmul(lhs, rhs, shape, name, q, adj_y):
        y = b.add_tensor(shape, np.int8, *q, name=name)
        opt = schema.BatchMatMulOptionsT()
        opt.adjX, opt.adjY = False, adj_y
        b.add_op("BATCH_MATMUL", [lhs, rhs], [y], opt)
        return y

    n = batch * heads
    r = reshape(x, (n, rows, 6), "heads", 0.05, -3)  # across axis 0
    s = matmul(r, r, (n, rows, rows), "scores", (0.09, 5), True)
    p = b.add_tensor((n, rows, rows), np.int8, 1.0 / 256, -128, name="attention")
    sm = schema.SoftmaxOptionsT()
    sm.beta = 1.0
    b.add_op("SOFTMAX", [s], [p], sm)
    v = matmul(p, r, (n, rows, 6), "mixed", (0.004, 2), False)
    v4 = reshape(v, (n, rows, 1, 6), "mixed4", 0.004, 2)
    w = b.add_const(rng.integers(-127, 128, (3, 1, 1, 6)).astype(np.int8), scale=0.02, zero_point=0, name="w")
    bias = b.add_const(rng.integers(-50, 50, 3).astype(np.int32), scale=0.004 * 0.02, zero_point=0, name="b")
    c = b.add_tensor((n, rows, 1, 3), np.int8, 0.003, -1, name="dfl")
    opt = schema.Conv2DOptionsT()
    opt.padding = schema.Padding.VALID
    opt.strideH = opt.strideW = opt.dilationHFactor = opt.dilationWFactor = 1
    b.add_op("CONV_2D", [v4, w, bias], [c], opt)
    width = heads * rows * 3
    flat = reshape(c, (batch, width), "flat", 0.003, -1)  # back across axis 0
    k = b.add_const(rng.integers(-128, 128, (1, width)).astype(np.int8), scale=0.01, zero_point=4)
    y = b.add_tensor((batch, width), np.int8, 0.012, 0, name="output")
    b.add_op("ADD", [flat, k], [y], schema.AddOptionsT())
    return b.build([x], [y])


def dfl_across_batch_model(seed: int = 1, anchors: int = 21) -> bytes:
    """YOLOv8n's DFL head (the shared yolov8n_256 model's ops 238-245: RESHAPE [1, 64, A] ->
    [1, 4, 16, A], TRANSPOSEs to [1, 4, A, 16], SOFTMAX, a 1x1 CONV_2D 16 -> 1, RESHAPE to [1, 4, A])
    written across axis 0, as a converter that drops the leading 1 does: RESHAPE [1, 64, A] ->
    [4, 16, A], TRANSPOSE [4, A, 16], SOFTMAX, RESHAPE [4, A, 1, 16], CONV_2D, RESHAPE [1, 4, A]."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.add_tensor((1, 64, anchors), np.int8, 0.08, 10, name="input")

    def reshape(src, shape, name, scale, zp):
        return add_reshape(b, src, shape, name, scale, zp)

    r = reshape(x, (4, 16, anchors), "sides", 0.08, 10)  # across axis 0
    t = b.add_tensor((4, anchors, 16), np.int8, 0.08, 10, name="bins")
    b.add_op("TRANSPOSE", [r, b.add_const(np.asarray([0, 2, 1], np.int32))], [t], schema.TransposeOptionsT())
    p = b.add_tensor((4, anchors, 16), np.int8, 1.0 / 256, -128, name="softmax")
    sm = schema.SoftmaxOptionsT()
    sm.beta = 1.0
    b.add_op("SOFTMAX", [t], [p], sm)
    p4 = reshape(p, (4, anchors, 1, 16), "softmax4", 1.0 / 256, -128)
    w = b.add_const(np.arange(16, dtype=np.int8).reshape(1, 1, 1, 16) * 8, scale=0.1, zero_point=0, name="w")
    bias = b.add_const(rng.integers(-20, 20, 1).astype(np.int32), scale=0.1 / 256, zero_point=0, name="b")
    c = b.add_tensor((4, anchors, 1, 1), np.int8, 0.06, -128, name="distance")
    opt = schema.Conv2DOptionsT()
    opt.padding = schema.Padding.VALID
    opt.strideH = opt.strideW = opt.dilationHFactor = opt.dilationWFactor = 1
    b.add_op("CONV_2D", [p4, w, bias], [c], opt)
    y = reshape(c, (1, 4, anchors), "output", 0.06, -128)  # back across axis 0
    return b.build([x], [y])


def behind_reshape(model: bytes) -> bytes:
    """A one-op model fed as YOLO11's attention feeds its ops: each graph input becomes a batch-1
    input [1, K] RESHAPEd into the op's declared input shape (whose axis 0 may be 2 or more), so the
    op works across the axis 0 of a model exported at batch 1."""
    m = schema.ModelT.InitFromPackedBuf(bytes(model), 0)
    sg = m.subgraphs[0]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.RESHAPE
    code.version = 1
    m.operatorCodes.append(code)
    front = []
    sg.inputs = [int(t) for t in sg.inputs]
    for k, t in enumerate(list(sg.inputs)):
        old = sg.tensors[t]
        flat = schema.TensorT()
        flat.shape, flat.type, flat.buffer = [1, int(np.prod(old.shape))], old.type, 0
        flat.name, flat.quantization = f"flat{k}", old.quantization
        shape = schema.TensorT()
        shape.shape, shape.type, shape.name = [len(old.shape)], schema.TensorType.INT32, f"flat{k}_shape"
        buf = schema.BufferT()
        buf.data = np.frombuffer(np.asarray(old.shape, np.int32).tobytes(), np.uint8)
        m.buffers.append(buf)
        shape.buffer = len(m.buffers) - 1
        sg.tensors += [flat, shape]
        op = schema.OperatorT()
        op.opcodeIndex = len(m.operatorCodes) - 1
        op.inputs, op.outputs = [len(sg.tensors) - 2, len(sg.tensors) - 1], [t]
        front.append(op)
        sg.inputs[k] = len(sg.tensors) - 2
    sg.operators = front + list(sg.operators)
    builder = flatbuffers.Builder(0)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
