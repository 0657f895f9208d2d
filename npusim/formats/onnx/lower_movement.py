"""Ops that move int8 codes without arithmetic: Concat, Split, Slice, Pad, Resize keep their input's
layout (axes remapped through its perm); Reshape, Flatten, Squeeze, Unsqueeze read the declared
layout; Transpose only changes the layout bookkeeping. TFLite's movement kernels keep the input's
scale, so an output whose QuantizeLinear says otherwise gets a QUANTIZE (TFLite's requantize) after.
"""

from __future__ import annotations

import numpy as np

from .context import Const, Lowering, Value, identity, inverse

INT_MAX = 2**62


def phys_axis(v: Value, axis: int) -> int:
    return v.perm.index(axis % len(v.perm))


def reshaped(ctx: Lowering, node, shape: tuple) -> tuple:
    """The output shape of Reshape, Flatten, Squeeze or Unsqueeze on an input of `shape`, computed
    as ONNX defines it (shape inference does not reach past the com.microsoft ops of QOperator models)."""
    op, size = node.op_type, int(np.prod(shape))
    if op == "Reshape":
        target = [int(d) for d in ctx.const(node, 1).value.ravel()]
        allowzero = int(ctx.attr(node, "allowzero", 0))
        out = [shape[i] if d == 0 and not allowzero and i < len(shape) else d for i, d in enumerate(target)]
        if out.count(-1) > 1 or any(d < -1 for d in out):
            raise ctx.error(f"shape {target} has more than one -1 or a negative size")
        if -1 in out:
            known = int(np.prod([d for d in out if d != -1]))
            if known == 0 or size % known:
                raise ctx.error(f"cannot reshape {list(shape)} into {target}")
            out[out.index(-1)] = size // known
        return tuple(out)
    if op == "Flatten":
        axis = int(ctx.attr(node, "axis", 1)) % (len(shape) + 1)
        return (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    if ctx.opset >= 13 and len(node.input) > 1 and node.input[1]:
        axes = [int(a) for a in ctx.const(node, 1).value.ravel()]
    else:
        axes = list(ctx.attr(node, "axes", []) or [])
    if op == "Squeeze":
        axes = [a % len(shape) for a in axes] or [i for i, d in enumerate(shape) if d == 1]
        return tuple(d for i, d in enumerate(shape) if i not in axes)
    rank = len(shape) + len(axes)  # Unsqueeze
    axes = sorted(a % rank for a in axes)
    out, it = [], iter(shape)
    for i in range(rank):
        out.append(1 if i in axes else next(it))
    return tuple(out)


def lower_concat(ctx: Lowering, node, quant=None, inputs=None):
    """inputs: [(value or Const, its quantization or None)] for QLinearConcat; else the node's."""
    quant = quant if quant is not None else ctx.out_quant(node)
    items = inputs if inputs is not None else [(ctx.get(i), None) for i in node.input if i]
    first = next((v for v, _ in items if isinstance(v, Value)), None)
    if first is None:
        raise ctx.error("all inputs are constants")
    perm = first.perm
    axis = int(ctx.attr(node, "axis", 0))
    parts = []
    for k, (v, _) in enumerate(items):
        if isinstance(v, Const):
            t = ctx.operand(v, len(perm), perm, f"{node.output[0]}_input{k}")
        else:
            if len(v.perm) != len(perm):
                raise ctx.error("inputs of different ranks")
            t = ctx.physical(v, perm)
        if ctx.tensors[t].dtype != np.int8:
            raise ctx.error(f"input {k} is not quantized, expected a DequantizeLinear in front of it")
        parts.append(ctx.requantize(t, quant))  # TFLite's CONCATENATION shares one scale
    pa = phys_axis(first, axis)
    shapes = [ctx.shape(t) for t in parts]
    if any(
        len(s) != len(shapes[0]) or s[:pa] + s[pa + 1 :] != shapes[0][:pa] + shapes[0][pa + 1 :]
        for s in shapes
    ):
        raise ctx.error(f"input shapes {[list(s) for s in shapes]} differ outside the concatenation axis")
    shape = shapes[0][:pa] + (sum(s[pa] for s in shapes),) + shapes[0][pa + 1 :]
    out = ctx.tensor(node.output[0], shape, np.int8, quant)
    ctx.emit("CONCATENATION", parts, [out], axis=pa, fused_activation_function="NONE")
    ctx.env[node.output[0]] = Value(out, perm)


def lower_split(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    axis = int(ctx.attr(node, "axis", 0))
    dim = ctx.logical_shape(x)[axis % len(x.perm)]
    sizes = None
    if len(node.input) > 1 and node.input[1]:
        sizes = [int(s) for s in ctx.const(node, 1).value.ravel()]
    elif ctx.attr(node, "split") is not None:
        sizes = [int(s) for s in ctx.attr(node, "split")]
    else:
        n = len(node.output)
        sizes = [-(-dim // n)] * (n - 1) + [dim - (n - 1) * -(-dim // n)]
    if len(sizes) != len(node.output) or sum(sizes) != dim or any(s <= 0 for s in sizes):
        raise ctx.error(f"split sizes {sizes} do not divide the axis of {dim} into {len(node.output)} parts")
    pa = phys_axis(x, axis)
    shape = ctx.shape(x.tensor)
    outs = [
        ctx.tensor(o, shape[:pa] + (s,) + shape[pa + 1 :], np.int8, ctx.quant(x.tensor))
        for o, s in zip(node.output, sizes)
    ]
    ctx.emit(
        "SPLIT_V",
        [
            x.tensor,
            ctx.constant(node.output[0] + "_sizes", sizes, np.int32),
            ctx.constant(node.output[0] + "_axis", np.asarray(pa), np.int32),
        ],
        outs,
        num_splits=len(outs),
    )
    for k, t in enumerate(outs):
        ctx.bind(node, k, t, x.perm)


def slice_spec(ctx: Lowering, node, shape) -> list:
    """Per logical axis (begin, end or None for 'past the start', step), clamped as ONNX's Slice does."""
    rank = len(shape)
    if ctx.opset >= 10:
        starts = [int(v) for v in ctx.const(node, 1).value.ravel()]
        ends = [int(v) for v in ctx.const(node, 2).value.ravel()]
        axes_c = ctx.const(node, 3, required=False)
        steps_c = ctx.const(node, 4, required=False)
        axes = [int(v) for v in axes_c.value.ravel()] if axes_c is not None else list(range(len(starts)))
        steps = [int(v) for v in steps_c.value.ravel()] if steps_c is not None else [1] * len(starts)
    else:
        starts, ends = list(ctx.attr(node, "starts", [])), list(ctx.attr(node, "ends", []))
        axes = list(ctx.attr(node, "axes", range(len(starts))))
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.error("starts, ends, axes and steps differ in length")
    spec = [(0, d, 1) for d in shape]
    for b, e, a, s in zip(starts, ends, axes, steps):
        if not -rank <= a < rank or s == 0:
            raise ctx.error(f"axis {a} or step {s} is out of range")
        a %= rank
        d = shape[a]
        b = b + d if b < 0 else b
        e = e + d if e < 0 else e
        if s > 0:
            b, e = min(max(b, 0), d), min(max(e, 0), d)
        else:
            b, e = min(max(b, 0), d - 1), min(max(e, -1), d - 1)
        spec[a] = (b, None if e == -1 else e, s)
    return spec


def lower_slice(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    spec = slice_spec(ctx, node, ctx.logical_shape(x))
    phys = [spec[p] for p in x.perm]  # a cut of axis 0: STRIDED_SLICE marks it (image by image)
    begin = [b for b, _, _ in phys]
    end = [0 if e is None else e for _, e, _ in phys]
    mask = sum(1 << i for i, (_, e, _) in enumerate(phys) if e is None)
    out_shape = tuple(len(range(b, -1 if e is None else e, s)) for b, e, s in phys)
    if any(d <= 0 for d in out_shape):
        raise ctx.error("the slice is empty")
    out = ctx.tensor(node.output[0], out_shape, np.int8, ctx.quant(x.tensor))
    ins = [x.tensor] + [
        ctx.constant(f"{node.output[0]}_{w}", np.asarray(a), np.int32)
        for w, a in (("begin", begin), ("end", end), ("strides", [s for _, _, s in phys]))
    ]
    ctx.emit(
        "STRIDED_SLICE",
        ins,
        [out],
        begin_mask=0,
        end_mask=mask,
        ellipsis_mask=0,
        new_axis_mask=0,
        shrink_axis_mask=0,
        offset=False,
    )
    ctx.bind(node, 0, out, x.perm)


def lower_reshape(ctx: Lowering, node):
    """Reshape, Flatten, Squeeze, Unsqueeze: RESHAPE of the declared layout to the declared shape."""
    x = ctx.activation(node, 0)
    t = ctx.logical(x)
    shape = reshaped(ctx, node, ctx.shape(t))
    # A reshape across the batch axis is lowered as it is: the RESHAPE kernel marks it, and the
    # Interpreter runs such a model image by image (ops/movement.py).
    if int(np.prod(shape)) != int(np.prod(ctx.shape(t))) or not shape:
        raise ctx.error(
            f"cannot reshape {list(ctx.shape(t))} ({int(np.prod(ctx.shape(t)))} elements) into {list(shape)}"
        )
    out = ctx.tensor(node.output[0], shape, np.int8, ctx.quant(t))
    ctx.emit(
        "RESHAPE",
        [t, ctx.constant(node.output[0] + "_shape", np.asarray(shape), np.int32)],
        [out],
        new_shape=list(shape),
    )
    ctx.bind(node, 0, out, identity(len(shape)))


def lower_transpose(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    rank = len(x.perm)
    t = list(ctx.attr(node, "perm", list(reversed(range(rank)))))
    if sorted(t) != list(range(rank)):
        raise ctx.error(f"perm {t} is not a permutation of {rank} axes")
    tinv = inverse(t)
    # No data moves; a perm moving axis 0 becomes a TRANSPOSE across it when a consumer needs the
    # layout (Lowering.physical), which runs the model image by image.
    ctx.bind(node, 0, x.tensor, tuple(tinv[p] for p in x.perm))


def lower_pad(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    if ctx.attr(node, "mode", "constant") != "constant":
        raise ctx.error(f"mode {ctx.attr(node, 'mode')!r} is not supported, expected constant")
    rank = len(x.perm)
    if ctx.opset >= 11:
        pads = [int(v) for v in ctx.const(node, 1).value.ravel()]
        value_c = ctx.const(node, 2, required=False)
        value = value_c.value.ravel()[0] if value_c is not None and value_c.value.size else 0.0
        axes_c = ctx.const(node, 3, required=False)
        axes = [int(a) % rank for a in axes_c.value.ravel()] if axes_c is not None else list(range(rank))
    else:
        pads, value, axes = (
            list(ctx.attr(node, "pads", [])),
            float(ctx.attr(node, "value", 0.0)),
            list(range(rank)),
        )
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} do not fit {len(axes)} axes")
    logical = [[0, 0] for _ in range(rank)]
    for k, a in enumerate(axes):
        logical[a] = [pads[k], pads[k + len(axes)]]
    if any(p < 0 for pair in logical for p in pair):
        raise ctx.error(f"negative pads {pads} (cropping) are not supported")
    paddings = [logical[p] for p in x.perm]
    q = ctx.quant(x.tensor)
    shape = tuple(d + a + b for d, (a, b) in zip(ctx.shape(x.tensor), paddings))
    out = ctx.tensor(node.output[0], shape, np.int8, q)
    p = ctx.constant(node.output[0] + "_paddings", paddings, np.int32)
    if isinstance(value, (np.int8, np.uint8)):
        # A QOperator Pad pads its quantized tensor with a code of the tensor's own type (ORT's
        # quantizer writes the zero point there), not a real value; uint8 codes shift as the tensor's.
        code = int(value) - 128 * isinstance(value, np.uint8)
    else:
        code = np.rint(float(value) / np.float64(q.scale[0])) + q.zero_point[0]
    if code == q.zero_point[0]:  # TFLite's PAD pads int8 with the zero point
        ctx.emit("PAD", [x.tensor, p], [out])
    else:
        v = ctx.constant(node.output[0] + "_value", [int(np.clip(code, -128, 127))], np.int8, q)
        ctx.emit("PADV2", [x.tensor, p, v], [out])
    ctx.bind(node, 0, out, x.perm)


def resized(ctx: Lowering, node, shape) -> tuple:
    k_scales, k_sizes = (1, None) if ctx.opset < 11 else (2, 3)
    sizes = ctx.const(node, k_sizes, required=False) if k_sizes is not None else None
    if sizes is not None and sizes.value.size:
        out = tuple(int(d) for d in sizes.value.ravel())
    else:
        scales = ctx.const(node, k_scales).value.astype(np.float64).ravel()
        if scales.size != len(shape):
            raise ctx.error(f"{scales.size} scales for {len(shape)} axes")
        out = tuple(int(np.floor(d * np.float32(s))) for d, s in zip(shape, scales))
    if len(out) != len(shape) or any(d < 1 for d in out):
        raise ctx.error(f"output size {list(out)} does not fit an input of {list(shape)}")
    return out


NEAREST = {
    ("asymmetric", "floor"): (False, False),
    ("align_corners", "round_prefer_ceil"): (True, False),
    ("half_pixel", "round_prefer_ceil"): (False, True),
    ("tf_half_pixel_for_nn", "floor"): (False, True),
}
LINEAR = {
    "asymmetric": (False, False),
    "align_corners": (True, False),
    "half_pixel": (False, True),
    "pytorch_half_pixel": (False, True),
}


def lower_resize(ctx: Lowering, node):
    x = ctx.activation(node, 0)
    if len(x.perm) != 4:
        raise ctx.error("only 4-D (NCHW) Resize is supported")
    mode = ctx.attr(node, "mode", "nearest")
    ct = ctx.attr(node, "coordinate_transformation_mode", "half_pixel")
    if ctx.opset < 11:
        ct = "asymmetric"
    n, c, h, w = ctx.logical_shape(x)
    shape = resized(ctx, node, (n, c, h, w))
    if shape[0] != n or shape[1] != c:
        raise ctx.error(f"resizing {[n, c, h, w]} to {list(shape)} changes more than the spatial axes")
    if int(ctx.attr(node, "antialias", 0)):
        raise ctx.error("antialias is not supported")
    if mode == "nearest":
        key = (ct, ctx.attr(node, "nearest_mode", "round_prefer_floor") if ctx.opset >= 11 else "floor")
        if key not in NEAREST:
            raise ctx.error(
                f"nearest Resize with {key[0]} / {key[1]} is not one of TFLite's, expected "
                "asymmetric/floor, align_corners or half_pixel with round_prefer_ceil"
            )
        kind, (align, half) = "RESIZE_NEAREST_NEIGHBOR", NEAREST[key]
    elif mode in ("linear", "bilinear"):
        if ct not in LINEAR:
            raise ctx.error(f"linear Resize with {ct} is not one of TFLite's")
        kind, (align, half) = "RESIZE_BILINEAR", LINEAR[ct]
    else:
        raise ctx.error(f"mode {mode!r} is not supported, expected nearest or linear")
    t = ctx.physical(x, (0, 2, 3, 1))
    out = ctx.tensor(node.output[0], (n, shape[2], shape[3], c), np.int8, ctx.quant(t))
    size = ctx.constant(node.output[0] + "_size", [shape[2], shape[3]], np.int32)
    ctx.emit(kind, [t, size], [out], align_corners=align, half_pixel_centers=half)
    ctx.bind(node, 0, out, (0, 2, 3, 1), fixed=kind == "RESIZE_BILINEAR")
