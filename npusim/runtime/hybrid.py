"""LiteRT's hybrid ("dynamic-range") MAC kernels, for a float model whose FULLY_CONNECTED, CONV_2D
or DEPTHWISE_CONV_2D weights are int8: LiteRT does not compute such a layer in float. It quantizes
the float input on the fly to int8 (per batch row of a FULLY_CONNECTED, per image of a convolution),
asymmetrically (tensor_utils' AsymmetricQuantizeFloats, which XNNPACK's qd8 path follows too), takes
the exact int32 dot with the int8 weights and scales it back in float32. The reference does the
same (hybrid_call), so that validate's reference equals LiteRT's builtin kernels on such a model
(tests/test_hybrid.py); LiteRT's default XNNPACK delegate takes some of those layers with its own
rounding, 1e-4 to 1e-2 apart on 2 of 8 CIFAR images of ResNet-8's dynamic-range twin."""

from __future__ import annotations

import numpy as np

HYBRID_KINDS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D")


def is_hybrid(op, graph) -> bool:
    """A MAC op with a float32 activation input and constant int8 weights."""
    if op.kind not in HYBRID_KINDS or len(op.inputs) < 2 or min(op.inputs[:2]) < 0:
        return False
    x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    return np.dtype(x.dtype) == np.float32 and w.is_constant and np.dtype(w.dtype) == np.int8


def rows(op, graph, x: np.ndarray) -> int:
    """How many quantization groups LiteRT's hybrid kernel cuts x into: a FULLY_CONNECTED's rows
    (the input flattened to [rows, K], K the weights' inner size), a convolution's images."""
    if op.kind == "FULLY_CONNECTED":
        k = int(graph.tensors[op.inputs[1]].shape[-1])
        return max(1, x.size // k)
    return x.shape[0]


def asymmetric_quantize(values: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """tensor_utils::PortableAsymmetricQuantizeFloats of one group: (int8 codes, scaling factor,
    offset). The range always holds 0; the zero point is the one of smaller error, nudged into
    [-128, 127]; codes are offset + TfLiteRound(x * (1 / scale)), 1 / scale in float32."""
    v = np.asarray(values, np.float32).ravel()
    rmin, rmax = min(0.0, float(v.min())), max(0.0, float(v.max()))
    if rmin == rmax:
        return np.zeros(v.size, np.int8), np.float32(1.0), 0
    scale = (rmax - rmin) / 255.0
    from_min, from_max = -128.0 - rmin / scale, 127.0 - rmax / scale
    zero = from_min if 128.0 + abs(rmin / scale) < 127.0 + abs(rmax / scale) else from_max
    offset = -128 if zero <= -128.0 else 127 if zero >= 127.0 else int(np.round(zero))
    sf = np.float32(scale)
    # offset + TfLiteRound(x * (1 / scale)), the product in float32: the offset added after the
    # rounding, as LiteRT does (79 / (158 / 255) gives 127.5 in float32: code 0 with offset -128,
    # where rounding offset + product, -0.5, would give -1)
    p = v * (np.float32(1.0) / sf)
    q = np.clip(offset + np.rint(p), -128, 127)
    return q.astype(np.int8), sf, offset


def hybrid_call(form, graph, x: np.ndarray, bias) -> np.ndarray:
    """The output of the MAC op of `form` (a float form, ops/float_form.py) as LiteRT's hybrid
    kernel computes it: each group of x quantized (asymmetric_quantize), the int32 dot of
    (code - offset) with the weights' int8 codes (the float form's sum of integers, exact while
    the partial sums stay below 2^24), scaled back in float32 as fully_connected.cc (bias + acc *
    (scale * weight scale)) and the convolutions' HybridConvPerChannel (acc * weight scale *
    scale + bias) do, then the fused activation."""
    op, w = form.op, graph.tensors[form.op.inputs[1]]
    x = np.asarray(x, np.float32)
    groups = x.reshape(rows(op, graph, x), -1)
    codes = np.empty(groups.shape, np.float32)
    scales = np.empty(len(groups), np.float32)
    for g, v in enumerate(groups):
        q, scales[g], offset = asymmetric_quantize(v)
        codes[g] = q.astype(np.float32) - np.float32(offset)
    lo, hi = form.lo, form.hi
    form.lo = form.hi = None  # the activation after the scaling, not on the integer sums
    try:
        acc = np.asarray(form(codes.reshape(x.shape), w.data.astype(np.float32), None), np.float32)
    finally:
        form.lo, form.hi = lo, hi
    w_scale = np.asarray(w.quant.scale, np.float32)  # per output channel (the last axis) or one
    per_group = acc.reshape(len(groups), -1, acc.shape[-1])
    sf = scales[:, None, None]
    if op.kind == "FULLY_CONNECTED":
        y = per_group * (sf * w_scale)
        y = y + bias if bias is not None else y
    else:
        y = per_group * w_scale * sf
        y = y + bias if bias is not None else y
    return form.activate(y.reshape(acc.shape).astype(np.float32))
