"""ConvInteger and MatMulInteger: exact int32 sums that the graph rescales in float,
Cast(to float) -> Mul by a constant scale M [-> Add of a constant bias b] -> QuantizeLinear.

That chain is one integer layer: sum (x - x_zp)(w - w_zp), times M, plus b, rounded to the
QuantizeLinear's scale. It lowers to the CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED TFLite's
converter would build (weight scale M / x_scale per output channel, the bias rounded to int32 at M,
a fixed-point multiplier M / y_scale under `tflm`), and the op keeps the chain's float constants in
its options (`onnx_rescale`: M and b per output channel, float32) for `--profile onnxruntime`, which
runs what ORT runs: float32(sum) * M + b in float32, one operation and one rounding at a time, then
QuantizeLinear (profiles/ort_kernels.IntegerRescale).

An op whose int32 output is a graph output, with no rescale after it, is the MAC layer with an int32
output: the exact sums of (x - x_zp)(w - w_zp) themselves (kernels/wide.py), under both profiles.
Weights whose codes minus zero point leave int8 (uint8 of zero point 255) keep their zero points in
the layer, which sums them exactly (kernels/wide.py).

Refused in one line: a chain that is not this one (a runtime scale, a float graph output), and
DynamicQuantizeLinear, whose scale is each run's input range (docs/onnx.md says why).
"""

from __future__ import annotations

import numpy as np

from .context import NHWC, Const, Lowering, Quantization, Value
from .lower_conv import conv, dense, fit_bias_range, weight_codes

MAC_KINDS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
CHAIN = "Cast(to float) -> Mul by a constant scale [-> Add of a constant bias] -> QuantizeLinear"


def _only_user(ctx: Lowering, name: str, op_type: str):
    """The one node that reads `name`, if it is of op_type and `name` is no graph output."""
    users = ctx.consumers.get(name, [])
    if len(users) == 1 and users[0].op_type == op_type and name not in ctx.graph_outputs:
        return users[0]
    return None


def _const_operand(ctx: Lowering, node, name: str):
    """The other operand of a binary node one of whose inputs is `name`, if it is a constant."""
    if len(node.input) != 2 or list(node.input).count(name) != 1:
        return None
    other = node.input[1] if node.input[0] == name else node.input[0]
    v = ctx.env.get(other)
    return v.value if isinstance(v, Const) else None


def rescale_chain(ctx: Lowering, node):
    """(M, b or None, the name of the chain's float result, the nodes it takes over)."""
    found = node.output[0]
    cast = _only_user(ctx, node.output[0], "Cast")
    if cast is not None and int(ctx.attr(cast, "to", 0)) == 1:
        mul = _only_user(ctx, cast.output[0], "Mul")
        scale = None if mul is None else _const_operand(ctx, mul, cast.output[0])
        if scale is not None:
            taken, final, bias = [cast, mul], mul.output[0], None
            add = _only_user(ctx, mul.output[0], "Add")
            b = None if add is None else _const_operand(ctx, add, mul.output[0])
            if b is not None:
                taken, final, bias = taken + [add], add.output[0], b
            if ctx.q_consumer(final) is not None:
                return scale, bias, final, taken
            found = f"{final!r} read by no QuantizeLinear"
        else:
            found = f"{cast.output[0]!r} not scaled by one Mul with a constant"
    raise ctx.error(
        f"its int32 sums must be rescaled as {CHAIN} (a static layer); found {found} (a float graph "
        "output or a runtime scale is not an integer layer)"
    )


def per_channel(ctx: Lowering, value, rank: int, axis: int, channels: int, what: str) -> np.ndarray:
    """A constant of the rescale as one float32 per output channel (it may vary along no other axis)."""
    a = np.asarray(value, np.float32)
    if a.ndim > rank:
        raise ctx.error(f"{what} has rank {a.ndim}, above the output's {rank}")
    a = a.reshape((1,) * (rank - a.ndim) + a.shape)
    if any(d != 1 and (i != axis or d != channels) for i, d in enumerate(a.shape)):
        raise ctx.error(
            f"{what} of shape {list(a.shape)} varies along other axes than the {channels} output channels"
        )
    return np.ascontiguousarray(np.broadcast_to(a.reshape(-1), (channels,)), np.float32)


def _weights(ctx: Lowering, node, axis: int) -> Const:
    """Input 1 (the integer weights) with input 3 (their zero point) as a quantized Const of scale 1."""
    w = ctx.const(node, 1)
    if w.value.dtype.kind not in "iu":
        raise ctx.error(f"weight {node.input[1]!r} is {w.value.dtype.name}, expected integer codes")
    zp_c = ctx.const(node, 3, required=False)
    zp = np.zeros(1, np.int64) if zp_c is None else zp_c.value.astype(np.int64).ravel()
    storage = ctx.initializer_storage(w.name) or w.value.dtype.name
    return Const(w.name, w.value, w.value, np.ones(1, np.float32), zp, axis, storage, w.name)


def _check_input_zero_point(ctx: Lowering, node, x: Value):
    """ConvInteger / MatMulInteger subtract their own a zero point; npusim's MAC subtracts the
    input tensor's (that of the QuantizeLinear that wrote it), so the two must be one."""
    t = ctx.tensors[x.tensor]
    zp_c = ctx.const(node, 2, required=False)
    z = 0 if zp_c is None else zp_c.value.astype(np.int64).ravel()
    if np.size(z) != 1 or int(np.ravel(z)[0]) != t.zero_point + t.quant.offset:
        raise ctx.error(
            f"input zero point {np.ravel(z).tolist()} is not {t.zero_point + t.quant.offset}, the zero "
            f"point of {node.input[0]!r}: expected the QuantizeLinear's own"
        )


def _integer_sums(ctx: Lowering, node, x: Value):
    """The op's own int32 output (a graph output): the MAC layer writing its sums, at scale x_scale
    (the weights' scale is 1), zero point 0."""
    is_conv = node.op_type == "ConvInteger"
    w = _weights(ctx, node, 0 if is_conv else 1)
    xs = np.float32(ctx.tensors[x.tensor].quant.scale[0])
    quant = Quantization(np.asarray([xs], np.float32), np.zeros(1, np.int64))
    name = node.output[0]
    if is_conv:
        ctx.env[name] = Value(conv(ctx, node, x, w, None, quant, name, out_dtype=np.int32), NHWC)
    else:
        ctx.env[name] = dense(ctx, node, x, w, None, quant, name, out_dtype=np.int32)


def lower_integer(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    if not isinstance(ctx.get(node.input[1]), Const):
        raise ctx.error("the second operand is an activation, expected constant integer weights")
    _check_input_zero_point(ctx, node, x)
    if node.output[0] in ctx.graph_outputs:
        _integer_sums(ctx, node, x)
        return
    scale, bias, final, taken = rescale_chain(ctx, node)
    out_quant = ctx.out_quant(node, name=final)
    xs = np.float64(ctx.tensors[x.tensor].quant.scale[0])
    is_conv = node.op_type == "ConvInteger"
    axis = 0 if is_conv else 1  # the output channels' axis of the weights (OIHW, [K, N])
    w = _weights(ctx, node, axis)
    codes, wzp = weight_codes(ctx, w, "weight")
    channels = w.value.shape[0 if is_conv else -1]
    rank = 4 if is_conv else len(ctx.logical_shape(x))
    out_axis = 1 if is_conv else rank - 1  # and of the output (NCHW, [..., N])
    m = per_channel(ctx, scale, rank, out_axis, channels, "scale")
    b = None if bias is None else per_channel(ctx, bias, rank, out_axis, channels, "bias")
    if not np.all(np.isfinite(m) & (m > 0)):
        raise ctx.error(f"rescale factor {m[:4].tolist()} is not positive and finite")
    ws = (m.astype(np.float64) / xs).astype(np.float32)  # so that x_scale * w_scale = M
    if wzp is None and fit_bias_range(codes, ws, b, xs, axis)[2]:
        raise ctx.error("bias is beyond the int32 accumulator at the rescale factor (|b / M| >= 2^30)")
    # the file's codes and zero point (conv() and dense() subtract it, and zo writes codes back there)
    shape = [-1 if i == axis else 1 for i in range(codes.ndim)]
    zq = 0 if wzp is None else (wzp.reshape(shape) if wzp.size > 1 else wzp[0])
    real = (codes.astype(np.int64) - zq) * ws.reshape(shape)
    wq = Const(w.name, real, w.codes, ws, w.zero_point, axis, w.storage, w.source)
    b_const = None if b is None else Const(node.output[0] + "_bias", b.astype(np.float64))
    x_type = "uint8" if ctx.tensors[x.tensor].quant.offset else "int8"
    types = (x_type, "uint8" if w.value.dtype == np.uint8 else "int8")
    start = len(ctx.ops)
    if is_conv:
        value = Value(conv(ctx, node, x, wq, b_const, out_quant, final), NHWC)
    else:
        value = dense(ctx, node, x, wq, b_const, out_quant, final)
    first = 0
    for op in ctx.ops[start:]:
        if op.kind in MAC_KINDS:
            n = ctx.shape(op.outputs[0])[-1]
            part = slice(first, first + n)
            op.options["onnx_rescale"] = dict(
                scale=m[part].copy(), bias=None if b is None else b[part].copy(), op=node.op_type, types=types
            )
            first += n
    ctx.skip.update(id(n) for n in taken)
    ctx.env[final] = value


def lower_dynamic_quantize(ctx: Lowering, node):
    raise ctx.error(
        "its scale and zero point are computed from each run's input range (over the whole batch): a "
        "per-run scale is not a deployed integer graph; quantize the model statically (quantize_static)"
    )
