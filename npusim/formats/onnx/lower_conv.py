"""Conv (plain, depthwise, grouped), MatMul and Gemm onto CONV_2D, DEPTHWISE_CONV_2D,
FULLY_CONNECTED and BATCH_MATMUL, as TFLite's converter lays them out: filters OHWI (depthwise
1HWO), dense weights [out, in], int32 bias at input scale x filter scale, explicit pads that are not
TFLite's SAME as a PAD in front of a VALID convolution, a following Relu/Clip fused into the output
range, a following BatchNormalization folded into the filter scales and the bias.
"""

from __future__ import annotations

import numpy as np

from ...graph import Quantization
from .context import NHWC, Const, Lowering, Value, identity

# Clip ranges that are one of TFLite's fused activations.
FUSED = {(0.0, None): "RELU", (0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1"}


def weight_codes(ctx: Lowering, w: Const, what: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(int8 codes, zero points): the codes minus their zero point when all of them fit int8 (zero
    points None: symmetric weights, which TFLite's kernels take; uint8 with zero point 128 and uint4
    with 8 land on the same int8 values), else the file's codes moved into int8 (uint8 by -128) with
    their zero points moved likewise (one, or one per channel of w.axis): asymmetric weights, such as
    uint8 of zero point 255, which CONV_2D and FULLY_CONNECTED then sum exactly (kernels/wide.py)."""
    if w.codes is None:
        raise ctx.error(
            f"{what} {w.name!r} is float, expected quantized weights (a DequantizeLinear of integers)"
        )
    if w.storage not in ("int8", "uint8", "int4", "uint4"):
        raise ctx.error(
            f"{what} {w.name!r} is stored as {w.storage or w.codes.dtype.name}, expected int8, "
            "uint8, int4 or uint4"
        )
    zp = w.zero_point.reshape(
        [-1 if i == w.axis and w.zero_point.size > 1 else 1 for i in range(w.codes.ndim)]
    )
    q = w.codes.astype(np.int64) - zp
    if not q.size or (q.min() >= -128 and q.max() <= 127):
        return q.astype(np.int8), None
    shift = 128 if w.storage == "uint8" else 0  # (int4 and uint4 codes minus zero point always fit)
    return (w.codes.astype(np.int64) - shift).astype(np.int8), w.zero_point.astype(np.int64).ravel() - shift


def bias_tensor(
    ctx: Lowering, b: Const | None, in_scale: float, w_scale: np.ndarray, channels: int, name: str
):
    """The int32 bias at input scale x filter scale: the file's own codes when they are already at that
    scale (ORT and ST's quantizers write them so), else its real values rounded to it."""
    if b is None:
        return -1
    target = (np.float64(np.float32(in_scale)) * np.asarray(w_scale, np.float64)).reshape(-1)
    target = np.broadcast_to(target, (channels,))
    real = np.asarray(b.value, np.float64).reshape(-1)
    if real.size == 1:
        real = np.repeat(real, channels)
    if real.size != channels:
        raise ctx.error(f"bias {b.name!r} has {real.size} values, expected {channels}")
    if b.codes is not None and b.storage == "int32" and not np.any(b.zero_point):
        s = np.broadcast_to(np.asarray(b.scale, np.float64).reshape(-1), (channels,))
        if np.allclose(s, target, rtol=1e-6, atol=0):
            t = ctx.constant(name, b.codes.reshape(-1), np.int32)
            ctx.weights[t] = dict(
                init=b.source, kind="bias", storage="int32", zero_point=0, shape=b.codes.shape
            )
            return t
    codes = np.rint(real / target)
    if np.any(np.abs(codes) > 2**31 - 1):
        raise ctx.error(f"bias {b.name!r} does not fit int32 at input scale x filter scale")
    return ctx.constant(name, codes, np.int32)


def fit_bias_range(codes: np.ndarray, ws: np.ndarray, bias_real, in_scale: float, axis: int = 0):
    """Widen the filter scale of every output channel whose bias would leave the middle half of int32
    at input scale x filter scale, as TFLite's converter does before it quantizes the weights
    (AdjustWeightsForBiasScale in tensorflow/lite/tools/optimize/quantization_utils.cc): the new scale
    is 2 |bias| / (int32 max x input scale) and the channel's codes are requantized to it (rounding
    half away from zero, [-127, 127]). Without it the accumulator wraps when it adds a bias near
    -2^31 (ORT's quantizer saturates such biases; ORT adds them in float). Returns (codes, scales,
    whether any channel changed)."""
    if bias_real is None:
        return codes, ws, False
    k = np.float64(np.iinfo(np.int32).max)
    s_in = np.float64(np.float32(in_scale))
    b = np.abs(np.asarray(bias_real, np.float64).ravel())
    o = codes.shape[axis]
    with np.errstate(all="ignore"):  # a hostile file's inf / NaN is left to bias_tensor to refuse
        if np.size(ws) == 1:  # per tensor: the bias's half range decides, as in the converter
            half = float(b.max()) if b.size else 0.0
            if not half / k >= 0.5 * s_in * float(np.ravel(ws)[0]):
                return codes, ws, False
            new = np.full(np.shape(ws), 2.0 * half / (k * s_in))
            ratio = np.full(o, float(np.ravel(ws)[0]) / new.ravel()[0])
        else:
            ws = np.broadcast_to(np.asarray(ws, np.float64).reshape(-1), (o,))
            b = np.broadcast_to(b, (o,))
            wide = b >= 0.5 * s_in * ws * k
            if not np.any(wide):
                return codes, ws, False
            new = np.where(wide, 2.0 * b / (k * s_in), ws)
            ratio = ws / new
    if not np.all(np.isfinite(new) & (np.asarray(new) > 0) & np.isfinite(ratio)):
        return codes, ws, False
    shape = [1] * codes.ndim
    shape[axis] = o
    scaled = codes.astype(np.float64) * ratio.reshape(shape)
    q = np.clip(np.sign(scaled) * np.floor(np.abs(scaled) + 0.5), -127, 127).astype(np.int8)
    return q, new, True


def tflite_padding(ctx, in_hw, k, s, d, pads, auto_pad):
    """('SAME' | 'VALID', explicit [top, left, bottom, right] to PAD first or None)."""
    same = []
    for n, kk, ss, dd in zip(in_hw, k, s, d):
        out = -(-n // ss)
        total = max((out - 1) * ss + (kk - 1) * dd + 1 - n, 0)
        same.append((total // 2, total - total // 2))
    if auto_pad == "VALID":
        return "VALID", None
    if auto_pad == "SAME_UPPER":
        return "SAME", None
    if auto_pad == "SAME_LOWER":
        pads = [same[0][1], same[1][1], same[0][0], same[1][0]]
    elif auto_pad not in ("NOTSET", "", None):
        raise ctx.error(f"auto_pad {auto_pad!r} is not supported")
    pads = list(pads or [0, 0, 0, 0])
    if len(pads) != 4 or any(p < 0 for p in pads):
        raise ctx.error(f"pads {pads}, expected 4 non-negative values (2-D)")
    if not any(pads):
        return "VALID", None
    if [pads[0], pads[2]] == list(same[0]) and [pads[1], pads[3]] == list(same[1]):
        return "SAME", None
    return "VALID", pads


def pad_nhwc(ctx: Lowering, t: int, pads, name: str, value=None) -> int:
    top, left, bottom, right = pads
    n, h, w, c = ctx.shape(t)
    out = ctx.tensor(name, (n, h + top + bottom, w + left + right, c), np.int8, ctx.quant(t))
    p = ctx.constant(name + "_paddings", [[0, 0], [top, bottom], [left, right], [0, 0]], np.int32)
    if value is None:
        ctx.emit("PAD", [t, p], [out])
    else:
        v = ctx.constant(name + "_value", np.asarray([value]), np.int8)
        ctx.emit("PADV2", [t, p, v], [out])
    return out


def fused_activation(ctx: Lowering, node, name: str):
    """A Relu or Clip that reads only `name` (directly, or through one QuantizeLinear/DequantizeLinear
    pair) and is one of TFLite's fused ranges: (activation, the name whose QuantizeLinear gives the
    output scale, the nodes it takes over). Else ("NONE", name, [])."""
    chain = []  # the QuantizeLinear / DequantizeLinear pair between them, if any
    cur = name
    while True:
        users = ctx.consumers.get(cur, [])
        if len(users) != 1 or cur in ctx.graph_outputs:
            return "NONE", name, []
        user = users[0]
        step = ["QuantizeLinear", "DequantizeLinear"][len(chain)] if len(chain) < 2 else None
        if user.op_type == step:
            chain.append(user)
            cur = user.output[0]
            continue
        if len(chain) == 1 or user.op_type not in ("Relu", "Clip"):
            return "NONE", name, []
        act = "RELU" if user.op_type == "Relu" else FUSED.get(clip_range(ctx, user))
        if act is None or ctx.q_consumer(user.output[0]) is None:
            return "NONE", name, []
        return act, user.output[0], chain + [user]


def clip_range(ctx: Lowering, node):
    if ctx.opset >= 11:
        lo_c = ctx.const(node, 1, required=False)
        hi_c = ctx.const(node, 2, required=False)
        lo = float(lo_c.value.reshape(-1)[0]) if lo_c is not None else None
        hi = float(hi_c.value.reshape(-1)[0]) if hi_c is not None else None
    else:
        lo, hi = ctx.attr(node, "min", None), ctx.attr(node, "max", None)
    if lo is not None and lo <= -3.0e38:
        lo = None
    if hi is not None and hi >= 3.0e38:
        hi = None
    return lo, hi


def batchnorm_fold(ctx: Lowering, name: str):
    """A BatchNormalization that alone reads the float conv output `name`: (per-channel factor,
    shift, its output name, the node), so that conv' = conv * factor + shift."""
    users = ctx.consumers.get(name, [])
    if len(users) != 1 or users[0].op_type != "BatchNormalization" or name in ctx.graph_outputs:
        return None
    bn = users[0]
    gamma, beta, mean, var = (ctx.const(bn, k).value.astype(np.float64).ravel() for k in range(1, 5))
    eps = float(ctx.attr(bn, "epsilon", 1e-5))
    factor = gamma / np.sqrt(var + eps)
    return factor, beta - mean * factor, bn


def fold_batchnorm(ctx: Lowering, codes, ws, b: Const | None, bn):
    """conv * factor + shift folded into the filter scales (|factor|; a negative factor flips the
    codes' sign, exact but for a -128 code) and the bias: (codes, scales, real bias)."""
    factor, shift, _ = bn
    o = codes.shape[0]
    if factor.size != o or np.any(factor == 0):
        raise ctx.error("BatchNormalization has a zero factor or not one per output channel: cannot fold it")
    flip = (factor < 0)[:, None, None, None]
    if np.any(flip & (codes == -128)):
        raise ctx.error("BatchNormalization with a negative factor on a -128 weight cannot be folded exactly")
    codes = np.where(flip, -codes.astype(np.int16), codes).astype(np.int8)
    base = b.value.astype(np.float64).ravel() if b is not None else np.zeros(o)
    return codes, np.broadcast_to(ws, (o,)) * np.abs(factor), base * factor + shift


def keep_file_layout(ctx: Lowering, tensor: int, w, kind: str):
    """Record how the filter tensor's codes stand in the file (initializer, storage type, layout
    kind), so that writer.py can put trained codes back where they came from."""
    ctx.weights[tensor] = dict(
        init=w.source, kind=kind, storage=w.storage, zero_point=w.zero_point, axis=w.axis, shape=w.codes.shape
    )


def conv(
    ctx: Lowering,
    node,
    x: Value,
    w: Const,
    b: Const | None,
    out_quant: Quantization | None,
    out_name: str,
    activation: str = "NONE",
    bn=None,
    out_dtype=np.int8,
) -> int:
    """The integer convolution of x (any layout; read as NHWC): returns its NHWC output tensor
    (out_dtype int32: the accumulators plus the bias, no rescale; see wide_conv)."""
    if w.value.ndim != 4:
        raise ctx.error(
            f"weight {w.name!r} has shape {list(w.value.shape)}, expected a 2-D convolution [O, I, kh, kw]"
        )
    t = ctx.physical(x, NHWC)
    n, h, wd, c = ctx.shape(t)
    o, cg, kh, kw = w.value.shape
    group = int(ctx.attr(node, "group", 1))
    if group < 1 or c % group or o % group or cg * group != c:
        raise ctx.error(f"group {group} does not fit {c} input channels and weight {list(w.value.shape)}")
    codes, wzp = weight_codes(ctx, w, "weight")
    wide = wzp is not None or out_dtype != np.int8
    ws = (
        np.broadcast_to(np.asarray(w.scale, np.float64).reshape(-1), (o,)).copy()
        if w.scale.size > 1
        else np.asarray(w.scale, np.float64)
    )
    if w.scale.size > 1 and w.axis != 0:
        raise ctx.error(
            f"weight {w.name!r} is quantized along axis {w.axis}, expected the output channels (0)"
        )
    bias_real = None
    if bn is not None:
        if wide:
            raise ctx.error("a BatchNormalization cannot be folded into asymmetric weights or int32 sums")
        codes, ws, bias_real = fold_batchnorm(ctx, codes, ws, b, bn)
    b_real = bias_real if bn is not None else (None if b is None else b.value)
    refit = False  # wide layers sum in int64 (kernels/wide.py): no accumulator to keep from wrapping
    if not wide:
        codes, ws, refit = fit_bias_range(codes, ws, b_real, ctx.quant(t).scale[0])
    keep_file_codes = bn is None and not refit  # the Graph's codes are the file's (writer.py)
    strides = list(ctx.attr(node, "strides", [1, 1]))
    dil = list(ctx.attr(node, "dilations", [1, 1]))
    padding, pads = tflite_padding(
        ctx,
        (h, wd),
        (kh, kw),
        strides,
        dil,
        ctx.attr(node, "pads", None),
        ctx.attr(node, "auto_pad", "NOTSET"),
    )
    if pads is not None:
        t = pad_nhwc(ctx, t, pads, out_name + "_pad")
        n, h, wd, c = ctx.shape(t)
    oh = (h - ((kh - 1) * dil[0] + 1)) // strides[0] + 1 if padding == "VALID" else -(-h // strides[0])
    ow = (wd - ((kw - 1) * dil[1] + 1)) // strides[1] + 1 if padding == "VALID" else -(-wd // strides[1])
    if oh < 1 or ow < 1:
        raise ctx.error(f"kernel {kh}x{kw} does not fit the input {h}x{wd}")
    xq = ctx.quant(t)
    if refit and bias_real is None:
        bias_real = b.value
    options = dict(
        padding=padding,
        stride_h=int(strides[0]),
        stride_w=int(strides[1]),
        dilation_h_factor=int(dil[0]),
        dilation_w_factor=int(dil[1]),
        fused_activation_function=activation,
    )
    bias_const = b if bias_real is None else Const(b.name if b else out_name + "_bias", bias_real)
    out = ctx.tensor(out_name, (n, oh, ow, o), out_dtype, out_quant)
    if wide:
        wide_conv(ctx, t, codes, wzp, ws, bias_const, w, group, out, options)
        return out
    depthwise = group == c and group > 1 and cg == 1
    if depthwise:
        wq = Quantization(np.asarray(ws, np.float32).reshape(-1), np.zeros(np.size(ws), np.int64), axis=3)
        wt = ctx.constant(w.name, codes.reshape(o, kh, kw).transpose(1, 2, 0)[None], np.int8, wq)
        ctx.storage[wt] = w.storage
        if keep_file_codes:
            keep_file_layout(ctx, wt, w, "depthwise")
        bt = bias_tensor(ctx, bias_const, xq.scale[0], ws, o, out_name + "_bias")
        ctx.emit("DEPTHWISE_CONV_2D", [t, wt, bt], [out], depth_multiplier=o // c, **options)
        return out
    ohwi = codes.transpose(0, 2, 3, 1)
    if group == 1:
        wq = Quantization(np.asarray(ws, np.float32).reshape(-1), np.zeros(np.size(ws), np.int64), axis=0)
        wt = ctx.constant(w.name, ohwi, np.int8, wq)
        ctx.storage[wt] = w.storage
        if keep_file_codes:
            keep_file_layout(ctx, wt, w, "conv")
        bt = bias_tensor(ctx, bias_const, xq.scale[0], ws, o, out_name + "_bias")
        ctx.emit("CONV_2D", [t, wt, bt], [out], **options)
        return out
    # Grouped: SPLIT the channels, one CONV_2D per group, CONCATENATION (TFLite's converter does the same).
    grouped_conv(ctx, t, ohwi, ws, bias_const, w.name, out, group, options, w.storage)
    return out


def wide_conv(ctx: Lowering, t: int, codes, wzp, ws, bias_const, w: Const, group: int, out: int, options):
    """One CONV_2D whose filter keeps its zero points (kernels/wide.py sums it exactly, and writes
    int32 sums). Groups (depthwise too) become one block-diagonal filter whose taps outside a
    channel's group hold that channel's zero point, so contribute 0: DEPTHWISE_CONV_2D and the
    SPLIT / CONCATENATION of grouped_conv take neither filter zero points nor int32."""
    o, cg, kh, kw = codes.shape
    og = o // group
    zp = np.zeros(o, np.int64) if wzp is None else np.broadcast_to(np.asarray(wzp, np.int64), (o,))
    full = np.repeat(zp.reshape(o, 1, 1, 1), cg * group, axis=1).repeat(kh, axis=2).repeat(kw, axis=3)
    for g in range(group):
        full[g * og : (g + 1) * og, g * cg : (g + 1) * cg] = codes[g * og : (g + 1) * og]
    wsb = np.broadcast_to(np.asarray(ws, np.float64).reshape(-1), (o,))
    per_channel = np.size(ws) > 1 or np.any(zp != zp[0])
    quant = Quantization(
        np.asarray(wsb if per_channel else wsb[:1], np.float32),
        np.asarray(zp if per_channel else zp[:1], np.int64),
        axis=0,
    )
    wt = ctx.constant(w.name, full.transpose(0, 2, 3, 1), np.int8, quant)
    ctx.storage[wt] = w.storage
    if group == 1 and wzp is None:
        keep_file_layout(ctx, wt, w, "conv")
    bt = bias_tensor(ctx, bias_const, ctx.quant(t).scale[0], wsb, o, ctx.tensors[out].name + "_bias")
    ctx.emit("CONV_2D", [t, wt, bt], [out], **options)


def grouped_conv(
    ctx: Lowering, t: int, ohwi, ws, bias_const, w_name: str, out: int, group: int, options, storage: str
):
    """A convolution of `group` groups as SPLIT, one CONV_2D per group and CONCATENATION into out."""
    n, h, wd, c = ctx.shape(t)
    _, oh, ow, o = ctx.shape(out)
    out_name, out_quant, xq = ctx.tensors[out].name, ctx.quant(out), ctx.quant(t)
    cg = c // group
    og = o // group
    parts = [ctx.tensor(f"{out_name}_group{g}_in", (n, h, wd, cg), np.int8, xq) for g in range(group)]
    axis = ctx.constant(out_name + "_split_axis", np.asarray(3), np.int32)
    ctx.emit("SPLIT", [axis, t], parts, num_splits=group)
    outs = []
    wsb = np.broadcast_to(ws, (o,))
    for g, part in enumerate(parts):
        sl = slice(g * og, (g + 1) * og)
        wq = Quantization(
            np.asarray(wsb[sl] if np.size(ws) > 1 else ws, np.float32).reshape(-1),
            np.zeros(og if np.size(ws) > 1 else 1, np.int64),
            axis=0,
        )
        wt = ctx.constant(f"{w_name}_group{g}", ohwi[sl], np.int8, wq)
        ctx.storage[wt] = storage
        real = (
            None
            if bias_const is None
            else Const(
                bias_const.name, np.broadcast_to(np.asarray(bias_const.value, np.float64).ravel(), (o,))[sl]
            )
        )
        bt = bias_tensor(ctx, real, xq.scale[0], wsb[sl], og, f"{out_name}_group{g}_bias")
        y = ctx.tensor(f"{out_name}_group{g}", (n, oh, ow, og), np.int8, out_quant)
        ctx.emit("CONV_2D", [part, wt, bt], [y], **options)
        outs.append(y)
    ctx.emit("CONCATENATION", outs, [out], axis=3, fused_activation_function="NONE")


def lower_conv(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    w = ctx.const(node, 1)
    b = ctx.const(node, 2, required=False)
    name = node.output[0]
    bn = batchnorm_fold(ctx, name)
    if bn is not None:
        ctx.skip.add(id(bn[2]))
        name = bn[2].output[0]
    act, final, taken = fused_activation(ctx, node, name)
    ctx.skip.update(id(n) for n in taken)
    t = conv(ctx, node, x, w, b, ctx.out_quant(node, name=final), final, act, bn)
    ctx.env[final] = Value(t, NHWC)


def dense(
    ctx: Lowering,
    node,
    x: Value,
    w_kn: Const,
    b: Const | None,
    out_quant,
    out_name: str,
    activation: str = "NONE",
    alpha: float = 1.0,
    beta: float = 1.0,
    file_nk: bool = False,
    out_dtype=np.int8,
) -> Value:
    """x [..., K] (declared layout) times a constant [K, N]: FULLY_CONNECTED with weights [N, K]
    (asymmetric weights keep their zero points, and out_dtype int32 gives the sums: kernels/wide.py)."""
    t = ctx.logical(x)
    shape = ctx.shape(t)
    if w_kn.value.ndim != 2 or shape[-1] != w_kn.value.shape[0]:
        raise ctx.error(f"weight {list(w_kn.value.shape)} does not fit an input {list(shape)} as [K, N]")
    k, nout = w_kn.value.shape
    codes, wzp = weight_codes(ctx, w_kn, "weight")
    wide = wzp is not None or out_dtype != np.int8
    ws = np.asarray(w_kn.scale, np.float64).reshape(-1)
    if alpha <= 0:
        raise ctx.error(f"alpha {alpha:g} is not positive")
    ws = ws * alpha
    bias = b
    if b is not None and beta != 1.0:
        bias = Const(b.name, np.asarray(b.value, np.float64) * beta)
    bias_real = None if bias is None else bias.value
    refit = False  # wide layers sum in int64 (kernels/wide.py): no accumulator to keep from wrapping
    if not wide:
        codes, ws, refit = fit_bias_range(codes, ws, bias_real, ctx.quant(t).scale[0], axis=1)
    if refit:  # the bias's codes are no longer at the file's scale: requantize its real values
        bias = Const(bias.name, np.asarray(bias.value, np.float64))
    ws = np.asarray(ws, np.float64).reshape(-1)
    zp = np.zeros(ws.size, np.int64) if wzp is None else np.asarray(wzp, np.int64)
    if zp.size != ws.size:  # one scale and a zero point per column, or the reverse
        ws, zp = np.broadcast_to(ws, (nout,)).copy(), np.broadcast_to(zp, (nout,)).copy()
    wq = Quantization(ws.astype(np.float32), zp, axis=0)
    wt = ctx.constant(w_kn.name, codes.T, np.int8, wq)
    ctx.storage[wt] = w_kn.storage
    if alpha == 1.0 and w_kn.source and not refit and wzp is None:
        ctx.weights[wt] = dict(
            init=w_kn.source,
            kind="dense_nk" if file_nk else "dense_kn",
            storage=w_kn.storage,
            zero_point=w_kn.zero_point,
            axis=1 - w_kn.axis if file_nk else w_kn.axis,
            shape=w_kn.codes.shape[::-1] if file_nk else w_kn.codes.shape,
        )
    bt = bias_tensor(ctx, bias, ctx.quant(t).scale[0], ws, nout, out_name + "_bias")
    out_shape = tuple(shape[:-1]) + (nout,)
    out = ctx.tensor(out_name, out_shape, out_dtype, out_quant)
    ctx.emit(
        "FULLY_CONNECTED",
        [t, wt, bt],
        [out],
        fused_activation_function=activation,
        keep_num_dims=len(shape) > 2,
        weights_format=0,
    )
    return Value(out, identity(len(out_shape)))


def batch_matmul(ctx: Lowering, a: Value, b: Value, out_quant, out_name: str) -> Value:
    ta, tb = ctx.logical(a), ctx.logical(b)
    sa, sb = ctx.shape(ta), ctx.shape(tb)
    if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
        raise ctx.error(f"MatMul of {list(sa)} x {list(sb)}: expected [..., M, K] x [..., K, N]")
    try:
        batch = np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2]))
    except ValueError:
        raise ctx.error(f"MatMul of {list(sa)} x {list(sb)}: batch axes do not broadcast") from None
    out_shape = tuple(batch) + (sa[-2], sb[-1])
    out = ctx.tensor(out_name, out_shape, np.int8, out_quant)
    ctx.emit("BATCH_MATMUL", [ta, tb], [out], adj_x=False, adj_y=False, asymmetric_quantize_inputs=False)
    return Value(out, identity(len(out_shape)))


def lower_matmul(ctx: Lowering, node):
    a = ctx.activation(node, 0)
    rhs = ctx.get(node.input[1])
    if isinstance(rhs, Const):
        act, final, taken = fused_activation(ctx, node, node.output[0])
        ctx.skip.update(id(n) for n in taken)
        ctx.env[final] = dense(ctx, node, a, rhs, None, ctx.out_quant(node, name=final), final, act)
        return
    b = ctx.activation(node, 1)
    ctx.env[node.output[0]] = batch_matmul(ctx, a, b, ctx.out_quant(node), node.output[0])


def gemm_weights(ctx: Lowering, node, w: Const, trans_b: int) -> Const:
    if not trans_b:
        return w
    # [N, K] in the file: the [K, N] view, per-channel axis 0 -> 1
    return Const(
        w.name,
        w.value.T,
        None if w.codes is None else w.codes.T,
        w.scale,
        w.zero_point,
        1 - w.axis if w.value.ndim == 2 else w.axis,
        w.storage,
        w.source,
    )


def lower_gemm(ctx: Lowering, node):
    if int(ctx.attr(node, "transA", 0)):
        raise ctx.error("transA=1 is not supported")
    a = ctx.activation(node, 0)
    trans_b = int(ctx.attr(node, "transB", 0))
    w = gemm_weights(ctx, node, ctx.const(node, 1), trans_b)
    c = ctx.const(node, 2, required=False)
    act, final, taken = fused_activation(ctx, node, node.output[0])
    ctx.skip.update(id(n) for n in taken)
    ctx.env[final] = dense(
        ctx,
        node,
        a,
        w,
        c,
        ctx.out_quant(node, name=final),
        final,
        act,
        float(ctx.attr(node, "alpha", 1.0)),
        float(ctx.attr(node, "beta", 1.0)),
        bool(trans_b),
    )


def lower_batchnorm(ctx: Lowering, node):
    raise ctx.error(
        "only a BatchNormalization that alone reads a Conv's float output is supported (folded into it)"
    )
