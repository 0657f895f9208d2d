"""QOperator ops (ORT's quantize_static in QOperator format, com.microsoft contrib ops among them):
each names its operands' and its output's scales and zero points itself, and lowers through the
same functions as its QDQ twin. The input tensors already carry the scales their producers gave
them; an op that reads them at other scales is refused (it would reinterpret the codes).
"""

from __future__ import annotations

import numpy as np

from .context import NHWC, Const, Lowering, Quantization, Value, identity, same_quant
from .lower_conv import batch_matmul, conv, dense, gemm_weights
from .lower_elementwise import binary, lower_leakyrelu, lower_sigmoid
from .lower_movement import lower_concat
from .lower_pool import lower_averagepool, lower_globalaveragepool, softmax


def qinput(ctx: Lowering, node, k: int, s_k: int, zp_k: int):
    """Input k as a Value whose scale is the one the op names, or as a quantized Const."""
    v = ctx.get(node.input[k])
    if isinstance(v, Const):
        return qconst(ctx, node, k, s_k, zp_k, axis=0)
    v = ctx.activation(node, k)
    q, _ = ctx.qparams(node, s_k, zp_k)
    if not same_quant(ctx.quant(v.tensor), q):
        raise ctx.error(
            f"input {node.input[k]!r} is read at scale {float(q.scale[0]):g} / zero point "
            f"{int(q.zero_point[0])}, its producer wrote it at {ctx.tensors[v.tensor].scale:g} / "
            f"{ctx.tensors[v.tensor].zero_point}"
        )
    return v


def qconst(ctx: Lowering, node, k: int, s_k: int, zp_k: int, axis: int) -> Const:
    """A constant operand stored as integer codes with the op's scale and zero point for it."""
    c = ctx.const(node, k)
    if c.value.dtype.kind not in "iu":
        raise ctx.error(f"input {node.input[k]!r} is {c.value.dtype.name}, expected integer codes")
    scale = ctx.const(node, s_k).value.astype(np.float32).ravel()
    zp_c = ctx.const(node, zp_k, required=False)
    zp = zp_c.value.astype(np.int64).ravel() if zp_c is not None else np.zeros(1, np.int64)
    zp = np.repeat(zp, scale.size) if zp.size == 1 and scale.size > 1 else zp
    if scale.size > 1 and (c.value.ndim <= axis or c.value.shape[axis] != scale.size):
        raise ctx.error(f"{scale.size} scales do not fit axis {axis} of {list(c.value.shape)}")
    shape = [-1 if i == axis and scale.size > 1 else 1 for i in range(c.value.ndim)]
    real = (c.value.astype(np.int64) - zp.reshape(shape)) * scale.reshape(shape).astype(np.float64)
    return Const(
        c.name,
        real,
        codes=c.value,
        scale=scale,
        zero_point=zp,
        axis=axis,
        storage=ctx.initializer_storage(c.name) or c.value.dtype.name,
        source=c.name,
    )


def qbias(ctx: Lowering, node, k: int, scale: np.ndarray) -> Const | None:
    b = ctx.const(node, k, required=False)
    if b is None:
        return None
    return Const(
        b.name,
        b.value.astype(np.float64) * scale,
        codes=b.value,
        scale=scale.astype(np.float32),
        zero_point=np.zeros(1, np.int64),
        storage="int32",
        source=b.name,
    )


def lower_qlinearconv(ctx: Lowering, node):
    x = qinput(ctx, node, 0, 1, 2)
    w = qconst(ctx, node, 3, 4, 5, axis=0)
    yq, _ = ctx.qparams(node, 6, 7)
    xs = np.float64(ctx.quant(x.tensor).scale[0])
    b = qbias(ctx, node, 8, xs * np.asarray(w.scale, np.float64))
    ctx.env[node.output[0]] = Value(conv(ctx, node, x, w, b, yq, node.output[0]), NHWC)


def lower_qlinearmatmul(ctx: Lowering, node):
    a = qinput(ctx, node, 0, 1, 2)
    yq, _ = ctx.qparams(node, 6, 7)
    if isinstance(ctx.get(node.input[3]), Const):
        w = qconst(ctx, node, 3, 4, 5, axis=1)
        if w.codes.ndim == 2 and (w.scale.size > 1 or _symmetric(w)):
            ctx.env[node.output[0]] = dense(ctx, node, a, w, None, yq, node.output[0])
            return
        # a constant right operand FULLY_CONNECTED cannot take (batched, or an asymmetric zero point,
        # which TFLite's weights never have): BATCH_MATMUL, whose right operand has its own zero point
        ctx.env[node.output[0]] = batch_matmul(ctx, a, _operand(ctx, w, node.input[3]), yq, node.output[0])
    else:
        b = qinput(ctx, node, 3, 4, 5)
        ctx.env[node.output[0]] = batch_matmul(ctx, a, b, yq, node.output[0])


def _symmetric(w: Const) -> bool:
    return (
        w.storage in ("int8", "")
        and int(w.zero_point[0]) == 0
        or w.storage == "uint8"
        and int(w.zero_point[0]) == 128
    )


def _operand(ctx: Lowering, w: Const, name: str) -> Value:
    """A per-tensor quantized constant as an int8 tensor of its codes (uint8 shifted by -128)."""
    if w.scale.size > 1 or w.codes.ndim < 2:
        raise ctx.error(f"constant {name!r}: expected one scale and at least 2 axes")
    shift = 128 if w.codes.dtype == np.uint8 else 0
    quant = Quantization(np.asarray(w.scale[:1], np.float32), np.asarray([int(w.zero_point[0]) - shift]))
    t = ctx.constant(name + "_codes", w.codes.astype(np.int64) - shift, np.int8, quant)
    return Value(t, identity(w.codes.ndim))


def lower_qgemm(ctx: Lowering, node):
    if int(ctx.attr(node, "transA", 0)):
        raise ctx.error("transA=1 is not supported")
    if len(node.input) < 8 or not node.input[7]:
        raise ctx.error("QGemm with a float output (no y_scale) is not supported")
    a = qinput(ctx, node, 0, 1, 2)
    trans_b = int(ctx.attr(node, "transB", 0))
    w = gemm_weights(ctx, node, qconst(ctx, node, 3, 4, 5, axis=0 if trans_b else 1), trans_b)
    yq, _ = ctx.qparams(node, 7, 8)
    alpha = float(ctx.attr(node, "alpha", 1.0))
    xs = np.float64(ctx.quant(a.tensor).scale[0])
    b = qbias(ctx, node, 6, xs * alpha * np.asarray(w.scale, np.float64))
    ctx.env[node.output[0]] = dense(
        ctx, node, a, w, b, yq, node.output[0], alpha=alpha, file_nk=bool(trans_b)
    )


def lower_qbinary(kind: str):
    def lower(ctx: Lowering, node):
        a = qinput(ctx, node, 0, 1, 2)
        b = qinput(ctx, node, 3, 4, 5)
        binary(ctx, node, kind, a, b, ctx.qparams(node, 6, 7)[0])

    return lower


def lower_qlinearconcat(ctx: Lowering, node):
    yq, _ = ctx.qparams(node, 0, 1)
    items = []
    for k in range(2, len(node.input), 3):
        items.append((qinput(ctx, node, k, k + 1, k + 2), None))
    lower_concat(ctx, node, yq, items)


def lower_qunary(fn):
    def lower(ctx: Lowering, node):
        qinput(ctx, node, 0, 1, 2)
        if fn is lower_globalaveragepool and int(ctx.attr(node, "channels_last", 0)):
            raise ctx.error("channels_last=1 is not supported")
        fn(ctx, node, out_quant=ctx.qparams(node, 3, 4)[0])

    return lower


def lower_qlinearsoftmax(ctx: Lowering, node):
    qinput(ctx, node, 0, 1, 2)
    softmax(ctx, node, ctx.qparams(node, 3, 4)[0])


QUNARY = {
    "QLinearAveragePool": lower_averagepool,
    "QLinearGlobalAveragePool": lower_globalaveragepool,
    "QLinearSigmoid": lower_sigmoid,
    "QLinearLeakyRelu": lower_leakyrelu,
}
