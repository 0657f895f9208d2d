"""Pooling, reductions and Softmax: MaxPool / AveragePool onto MAX_POOL_2D / AVERAGE_POOL_2D (NHWC,
input scale kept, then a QUANTIZE if the QuantizeLinear wants another), GlobalAveragePool and
ReduceMean onto MEAN (which rescales), Softmax onto SOFTMAX (int8 output fixed at 1/256, -128) along
the last physical axis, then a QUANTIZE.
"""

from __future__ import annotations

import numpy as np

from ...graph import Quantization
from .context import NHWC, Lowering, Value
from .lower_conv import pad_nhwc, tflite_padding
from .lower_elementwise import LOGISTIC_OUT


def pooled(ctx: Lowering, node, axis: int, n: int, k: int, s: int) -> int:
    """ONNX's pooled size along spatial axis 0 or 1 (auto_pad, pads and ceil_mode as the spec has them;
    with ceil_mode the last window must start inside the input or its leading pad)."""
    auto = ctx.attr(node, "auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return -(-n // s)
    if auto == "VALID":
        return -(-(n - k + 1) // s)
    pads = list(ctx.attr(node, "pads", None) or [0, 0, 0, 0])
    span = n + pads[axis] + pads[axis + 2] - k
    if span < 0:
        raise ctx.error(f"kernel {k} does not fit the padded input {n + pads[axis] + pads[axis + 2]}")
    if not int(ctx.attr(node, "ceil_mode", 0)):
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= n + pads[axis] else out


def pool(ctx: Lowering, node, kind: str, out_quant: Quantization | None = None):
    x = ctx.activation(node, 0)
    if len(x.perm) != 4:
        raise ctx.error("only 2-D pooling (4-D NCHW input) is supported")
    k = list(ctx.attr(node, "kernel_shape", []))
    strides = list(ctx.attr(node, "strides", [1, 1]))
    if len(k) != 2 or len(strides) != 2:
        raise ctx.error(f"kernel {k} / strides {strides}, expected 2-D")
    if any(d != 1 for d in ctx.attr(node, "dilations", [1, 1])):
        raise ctx.error("dilated pooling is not supported")
    if int(ctx.attr(node, "storage_order", 0)) or len(node.output) > 1:
        raise ctx.error("MaxPool indices output is not supported")
    t = ctx.physical(x, NHWC)
    n, h, w, c = ctx.shape(t)
    oh, ow = (pooled(ctx, node, i, d, kk, ss) for i, (d, kk, ss) in enumerate(zip((h, w), k, strides)))
    padding, pads = tflite_padding(
        ctx, (h, w), k, strides, (1, 1), ctx.attr(node, "pads", None), ctx.attr(node, "auto_pad", "NOTSET")
    )

    def out_size(n_in, kk, s):
        return -(-n_in // s) if padding == "SAME" else (n_in - kk) // s + 1

    include_pad = int(ctx.attr(node, "count_include_pad", 0))
    if pads is None and (out_size(h, k[0], strides[0]), out_size(w, k[1], strides[1])) != (oh, ow):
        pads = [0, 0, 0, 0] if padding == "VALID" else None  # ceil_mode: pad the far edges
        if pads is None:
            raise ctx.error("ceil_mode with TFLite's SAME padding is not supported")
    if pads is not None:
        if kind == "AVERAGE_POOL_2D" and not include_pad and any(pads):
            raise ctx.error(
                "AveragePool with explicit pads that exclude the padding (count_include_pad=0) "
                "is not one of TFLite's paddings"
            )
        extra_h = max((oh - 1) * strides[0] + k[0] - (h + pads[0] + pads[2]), 0)
        extra_w = max((ow - 1) * strides[1] + k[1] - (w + pads[1] + pads[3]), 0)
        if kind == "AVERAGE_POOL_2D" and (extra_h or extra_w):
            raise ctx.error("AveragePool with ceil_mode windows past the edge is not supported")
        pads = [pads[0], pads[1], pads[2] + extra_h, pads[3] + extra_w]
        value = -128 if kind == "MAX_POOL_2D" else None  # a max pool never picks its padding
        t = pad_nhwc(ctx, t, pads, node.output[0] + "_pad", value)
        padding = "VALID"
    elif kind == "AVERAGE_POOL_2D" and include_pad and padding == "SAME":
        raise ctx.error(
            "AveragePool counting the padding (count_include_pad=1) with TFLite's SAME is not exact"
        )
    out = ctx.tensor(node.output[0], (n, oh, ow, c), np.int8, ctx.quant(t))
    ctx.emit(
        kind,
        [t],
        [out],
        padding=padding,
        stride_h=int(strides[0]),
        stride_w=int(strides[1]),
        filter_height=int(k[0]),
        filter_width=int(k[1]),
        fused_activation_function="NONE",
    )
    ctx.bind(node, 0, out, NHWC, out_quant, fixed=kind == "AVERAGE_POOL_2D")


def lower_maxpool(ctx, node):
    pool(ctx, node, "MAX_POOL_2D")


def lower_averagepool(ctx, node, out_quant=None):
    pool(ctx, node, "AVERAGE_POOL_2D", out_quant)


def mean(ctx: Lowering, node, x: Value, axes: list, keepdims: bool, out_quant: Quantization):
    rank = len(x.perm)
    axes = sorted({int(a) % rank for a in axes})  # axis 0 too: MEAN then runs the model image by image
    phys = [x.perm.index(a) for a in axes]
    shape = ctx.shape(x.tensor)
    if keepdims:
        out_shape, perm = tuple(1 if i in phys else d for i, d in enumerate(shape)), x.perm
    else:
        kept = [a for a in range(rank) if a not in axes]
        out_shape = tuple(d for i, d in enumerate(shape) if i not in phys)
        perm = tuple(kept.index(p) for p in x.perm if p not in axes)
    out = ctx.tensor(node.output[0], out_shape, np.int8, out_quant)
    ctx.emit(
        "MEAN",
        [x.tensor, ctx.constant(node.output[0] + "_axes", phys, np.int32)],
        [out],
        keep_dims=bool(keepdims),
    )
    ctx.env[node.output[0]] = Value(out, perm)


def lower_globalaveragepool(ctx, node, out_quant=None):
    x = ctx.activation(node, 0)
    if len(x.perm) != 4:
        raise ctx.error("only 2-D GlobalAveragePool (4-D NCHW input) is supported")
    x = Value(ctx.physical(x, NHWC), NHWC)
    mean(ctx, node, x, [2, 3], True, out_quant if out_quant is not None else ctx.out_quant(node))


def lower_reducemean(ctx, node):
    x = ctx.activation(node, 0)
    if ctx.opset >= 18 and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.const(node, 1).value.ravel()]
    else:
        axes = ctx.attr(node, "axes", None)
    if not axes:
        if int(ctx.attr(node, "noop_with_empty_axes", 0)):
            raise ctx.error("noop_with_empty_axes=1 is not supported")
        axes = list(range(1, len(x.perm)))
    mean(ctx, node, x, list(axes), bool(int(ctx.attr(node, "keepdims", 1))), ctx.out_quant(node))


def softmax(ctx: Lowering, node, out_quant: Quantization | None = None):
    x = ctx.activation(node, 0)
    rank = len(x.perm)
    axis = int(ctx.attr(node, "axis", -1 if ctx.opset >= 13 else 1)) % rank
    if ctx.opset < 13 and axis != rank - 1:
        raise ctx.error(
            f"Softmax (opset {ctx.opset}) over axes {axis}.. is not supported, expected the last axis"
        )
    perm = tuple(p for p in x.perm if p != axis) + (axis,)  # the reduced axis innermost
    t = ctx.physical(x, perm)
    out = ctx.tensor(node.output[0] + "_softmax", ctx.shape(t), np.int8, LOGISTIC_OUT)
    ctx.emit("SOFTMAX", [t], [out], beta=1.0)
    ctx.bind(node, 0, out, perm, out_quant, fixed=True)


def lower_softmax(ctx, node):
    softmax(ctx, node)
