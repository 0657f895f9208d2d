"""Element-wise ops onto TFLite's integer kernels, in whatever layout their input has.

Add, Sub, Mul: ADD, SUB, MUL (any scales, as TFLite's). Div by a constant: MUL by its reciprocal.
Neg: MUL by -1. Sigmoid: LOGISTIC, whose int8 output is fixed at scale 1/256 and zero point -128,
then a QUANTIZE int8 -> int8 to the QuantizeLinear's scale (what TFLite's converter emits for a
LOGISTIC whose consumers want another scale). Relu / Clip not fused into a producer: MAXIMUM /
MINIMUM with the bound's code at the input's scale (they do not rescale), then a QUANTIZE. HardSwish
and LeakyRelu: HARD_SWISH and LEAKY_RELU.
"""

from __future__ import annotations

import numpy as np

from ...graph import Quantization
from .context import Const, Lowering, Value
from .lower_conv import clip_range

LOGISTIC_OUT = Quantization(np.asarray([1 / 256], np.float32), np.asarray([-128], np.int64))


def operands(ctx: Lowering, node, a, b):
    """The two inputs of a binary op (Values or Consts) as tensors in one layout, and that layout
    and the output's physical shape."""
    if isinstance(a, Const) and isinstance(b, Const):
        raise ctx.error("both operands are constants")
    shapes = [x.value.shape if isinstance(x, Const) else ctx.logical_shape(x) for x in (a, b)]
    try:
        out_shape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise ctx.error(f"operand shapes {[list(s) for s in shapes]} do not broadcast") from None
    rank = len(out_shape)
    perm = (a if isinstance(a, Value) else b).perm
    tensors = []
    for k, x in enumerate((a, b)):
        if isinstance(x, Const):
            tensors.append(ctx.operand(x, rank, perm, f"{node.output[0]}_operand{k}"))
            continue
        if ctx.tensors[x.tensor].dtype != np.int8:
            raise ctx.error(f"input {k} is not quantized, expected a DequantizeLinear in front of it")
        if len(x.perm) != rank:
            raise ctx.error(f"an activation of rank {len(x.perm)} broadcast to rank {rank} is not supported")
        tensors.append(ctx.physical(x, perm))
    return tensors, perm, tuple(out_shape[p] for p in perm)


def binary(ctx: Lowering, node, kind: str, a, b, quant: Quantization):
    (ta, tb), perm, shape = operands(ctx, node, a, b)
    out = ctx.tensor(node.output[0], shape, np.int8, quant)
    ctx.emit(kind, [ta, tb], [out], fused_activation_function="NONE")
    ctx.env[node.output[0]] = Value(out, perm)


def lower_binary(kind: str):
    def lower(ctx: Lowering, node):
        binary(ctx, node, kind, ctx.get(node.input[0]), ctx.get(node.input[1]), ctx.out_quant(node))

    return lower


def lower_div(ctx: Lowering, node):
    b = ctx.get(node.input[1])
    if not isinstance(b, Const):
        raise ctx.error("division by an activation is not supported (TFLite has no int8 DIV)")
    if np.any(b.value == 0):
        raise ctx.error(f"division by zero in constant {b.name!r}")
    binary(
        ctx,
        node,
        "MUL",
        ctx.get(node.input[0]),
        Const(b.name + "_reciprocal", 1.0 / b.value.astype(np.float64)),
        ctx.out_quant(node),
    )


def lower_neg(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    minus = ctx.constant(
        node.output[0] + "_minus_one",
        np.full((1,) * len(x.perm), -1),
        np.int8,
        Quantization(np.asarray([1.0], np.float32), np.asarray([0], np.int64)),
    )
    out = ctx.new_output(node, 0, ctx.shape(x.tensor))
    ctx.emit("MUL", [x.tensor, minus], [out], fused_activation_function="NONE")
    ctx.env[node.output[0]] = Value(out, x.perm)


def unary(ctx: Lowering, node, kind: str, quant: Quantization | None = None, **options):
    x = ctx.activation(node, 0)
    out = ctx.tensor(
        node.output[0] + ("" if quant is None else "_" + kind.lower()),
        ctx.shape(x.tensor),
        np.int8,
        quant if quant is not None else ctx.out_quant(node),
    )
    ctx.emit(kind, [x.tensor], [out], **options)
    ctx.bind(node, 0, out, x.perm)


def lower_sigmoid(ctx: Lowering, node, out_quant: Quantization | None = None):
    x = ctx.activation(node, 0)
    out = ctx.tensor(node.output[0] + "_logistic", ctx.shape(x.tensor), np.int8, LOGISTIC_OUT)
    ctx.emit("LOGISTIC", [x.tensor], [out])
    ctx.bind(node, 0, out, x.perm, out_quant, fixed=True)


def clamp(ctx: Lowering, node, lo, hi):
    """max(x, lo) then min(., hi) in x's own quantization (MAXIMUM/MINIMUM do not rescale)."""
    x = ctx.activation(node, 0)
    t = x.tensor
    q = ctx.quant(t)
    for kind, bound in (("MAXIMUM", lo), ("MINIMUM", hi)):
        if bound is None:
            continue
        code = int(np.clip(np.rint(bound / np.float64(q.scale[0])) + q.zero_point[0], -128, 127))
        c = ctx.constant(
            f"{node.output[0]}_{kind.lower()}_bound", np.full((1,) * len(x.perm), code), np.int8, q
        )
        out = ctx.tensor(f"{node.output[0]}_{kind.lower()}", ctx.shape(t), np.int8, q)
        ctx.emit(kind, [t, c], [out])
        t = out
    ctx.bind(node, 0, t, x.perm)


def lower_relu(ctx: Lowering, node):
    clamp(ctx, node, 0.0, None)


def lower_clip(ctx: Lowering, node):
    clamp(ctx, node, *clip_range(ctx, node))


def lower_hardswish(ctx: Lowering, node):
    unary(ctx, node, "HARD_SWISH")


def lower_leakyrelu(ctx: Lowering, node, out_quant: Quantization | None = None):
    x = ctx.activation(node, 0)
    out = ctx.tensor(
        node.output[0],
        ctx.shape(x.tensor),
        np.int8,
        out_quant if out_quant is not None else ctx.out_quant(node),
    )
    ctx.emit("LEAKY_RELU", [x.tensor], [out], alpha=float(np.float32(ctx.attr(node, "alpha", 0.01))))
    ctx.env[node.output[0]] = Value(out, x.perm)


def lower_hardsigmoid(ctx: Lowering, node):
    """max(0, min(1, alpha x + beta)) = MUL by alpha into the output's scale with its zero point moved
    by beta (so the int8 range saturates where the clamp would), ADD beta, then the clamp."""
    x = ctx.activation(node, 0)
    alpha = float(np.float32(ctx.attr(node, "alpha", 0.2)))
    beta = float(np.float32(ctx.attr(node, "beta", 0.5)))
    yq = ctx.out_quant(node)
    s, zp = float(yq.scale[0]), int(yq.zero_point[0])
    rank, shape = len(x.perm), ctx.shape(x.tensor)
    mq = Quantization(yq.scale.copy(), np.asarray([int(np.clip(zp + round(beta / s), -128, 127))], np.int64))
    m = ctx.tensor(node.output[0] + "_scaled", shape, np.int8, mq)
    ctx.emit(
        "MUL",
        [x.tensor, ctx.operand(Const("alpha", np.float32(alpha)), rank, x.perm, m_name(ctx, m, "alpha"))],
        [m],
        fused_activation_function="NONE",
    )
    t = ctx.tensor(node.output[0] + "_shifted", shape, np.int8, yq)
    ctx.emit(
        "ADD",
        [m, ctx.operand(Const("beta", np.float32(beta)), rank, x.perm, m_name(ctx, m, "beta"))],
        [t],
        fused_activation_function="NONE",
    )
    for kind, bound in (("MAXIMUM", 0.0), ("MINIMUM", 1.0)):
        code = int(np.clip(np.rint(bound / s) + zp, -128, 127))
        c = ctx.constant(f"{node.output[0]}_{kind.lower()}_bound", np.full((1,) * rank, code), np.int8, yq)
        out = ctx.tensor(f"{node.output[0]}_{kind.lower()}", shape, np.int8, yq)
        ctx.emit(kind, [t, c], [out])
        t = out
    ctx.env[node.output[0]] = Value(t, x.perm)


def m_name(ctx: Lowering, t: int, what: str) -> str:
    return f"{ctx.tensors[t].name}_{what}"
