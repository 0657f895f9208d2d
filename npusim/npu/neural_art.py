"""The Neural-ART datapath as ST's compiler configures it: for each op the N6 maps to its NPU, the
chain of hardware units with ll_aton's own field names (LL_Convacc_InitTypeDef,
LL_Arithacc_InitTypeDef, LL_Poolacc_InitTypeDef in ST's ll_aton.h) and the values derived from the
model's scales and zero points the way ST Edge AI 3.0 derives them.

The rules were read off ST's own compiled program for a real model (the yolox_nano_480 trace in
../shared/models/stm32n6/st_compiler; tests/test_neural_art_trace.py measures the agreement, and
docs/neural-art.md quotes it):

* CONV_2D / DEPTHWISE_CONV_2D (FULLY_CONNECTED alike, as a 1x1 convolution: not in the trace):
  an ARITH "suboff" (A=1.0 as 16384 >> 14, BC = 128 << 14: int8 to
  the unsigned feature the CONVACC reads), a CONVACC that accumulates and rounds the accumulator
  right by S into 16 bits, then an ARITH "off_bias" with a per-channel int16 A and int32 BC:
  A[c] = round(M[c] * 2^T), T the largest shift that keeps every A within int16 (M = s_x s_w / s_y),
  the ARITH's shift_o = T - S, and BC[c] = (round(b[c] * 2^F) + z_y << F) >> (F - shift_o) with b
  the bias in output steps (float32 bias value over the output scale) and F the fraction bits the
  layer's largest |b + z_y| leaves in int32 (bc_vector). A bias-free layer
  takes a scalar BC in B_scalar / C_scalar (combinebc: BC = {B[15:0], C[15:0]}).
* ADD: one scalar ARITH, A*x >> Ax_shift + B*y >> By_shift + C << C_shift, all >> shift_o: A and B
  the input scales over the output scale normalised to [2^14, 2^15), the zero points folded in C.
* QUANTIZE (to int8): one scalar ARITH, A*x + BC, like the suboff (a uint8 input read as 16 bits).

S, the CONVACC's output shift, is the smallest s with max |sum of a channel's weights| * 256 below
2^(15 + s) (conv_shift). What the trace does not decide (docs/neural-art.md): an input zero point
other than -128 (the trace has none): the suboff subtracts it, as its name and its output buffer's
("<conv>_zero_off_out" in c_info.json) say, the feature then 8 or 16 bits wide (options.input_offset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..profiles import N6_CHOICES
from .n6_compiler import compiler

INT16_MAX = 32767
INT32_MAX = 2**31 - 1
SUBOFF_SHIFT = 14  # the suboff's A = 1.0 as 2^14


@dataclass(frozen=True)
class N6Options:
    """The unknowns of the Neural-ART datapath, each a named choice (docs/neural-art.md).

    rounding: what round_mode_o=1 with rounding_o=1 does to a right shift (half-up: add 2^(s-1) then
      floor; half-even; truncate: floor). ST does not publish it.
    add_products: "exact" (the two ARITH products summed at full precision, then one rounding) or
      "rounded" (A*x >> Ax_shift and B*y >> By_shift each rounded before the sum).
    shift_a: "ignore" (the CONVACC's shift_a, set only on a CONVACC without an accumulator input in
      the trace, changes nothing) or "products" (products shifted left by shift_a, the output by
      shift_o + shift_a).
    conv_shift: "weights" (S by the compiler's rule, conv_shift()) or an int forcing S.
    input_offset: "subtract" (the suboff subtracts the input zero point: a real zero is feature 0, so
      the CONVACC's zero padding is right; x - z_x takes 9 bits unless z_x is -128 or 0) or "fold"
      (the suboff adds 128, unsigned 8-bit feature, and (z_x + 128) * sum(w) goes into BC).
    compiler: the ST Edge AI version whose requantization chain is derived (npu/n6_compiler.py):
      "3.0" one off_bias ARITH, "2.2" / "2.1" a 16-bit per-channel scale then a scalar one.
    compiled: a network_ecblobs.h path: the convs it maps run its coefficients, shifts and widths
      (npu/compiled.py) instead of derived ones.
    """

    rounding: str = "half-up"
    add_products: str = "exact"
    shift_a: str = "ignore"
    conv_shift: object = "weights"
    input_offset: str = "subtract"
    compiler: str = "3.0"
    compiled: object = None


ROUNDINGS, ADD_PRODUCTS, SHIFT_A, INPUT_OFFSETS = (
    N6_CHOICES[k] for k in ("rounding", "add_products", "shift_a", "input_offset")
)

MAC_KINDS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")  # a CONVACC chain each


def round_half_away(v: float) -> int:
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


def split_bc(bc: int) -> tuple[int, int]:
    """combinebc: BC = {B[15:0], C[15:0]}; (B_scalar, C_scalar) as signed shorts."""
    bc &= 0xFFFFFFFF
    b, c = bc >> 16, bc & 0xFFFF
    return (b - 0x10000 if b >= 0x8000 else b), (c - 0x10000 if c >= 0x8000 else c)


def normalised_shift(ratio: float, limit: int = INT16_MAX) -> int:
    """The largest s with round(ratio * 2^s) <= limit: the shift that normalises a coefficient."""
    if ratio <= 0:
        return 0
    s = math.floor(math.log2(limit / ratio))
    while round_half_away(ratio * 2.0**s) > limit:
        s -= 1
    return s


def fixed_point(value: float, shift: int, bits: int = 16) -> tuple[int, int]:
    """(C, C_shift): value * 2^shift as C << C_shift with C a signed `bits`-bit integer. The compiler
    rounds at the precision that fills C, then shifts right (floor) where C_shift cannot go below
    0: Add_330 of the trace, value -0.29, gives C = -1."""
    v = value * 2.0**shift
    if v == 0:
        return 0, 0
    raw = math.ceil(math.log2(abs(v) / (2 ** (bits - 1) - 1)))  # C_shift that fills the bits
    c = round_half_away(v / 2.0**raw)
    if abs(c) > 2 ** (bits - 1) - 1:
        raw += 1
        c = round_half_away(v / 2.0**raw)
    if raw >= 0:
        return c, raw
    return c >> -raw, 0


# ----------------------------------------------------------------------------------------------
# The stages


def _arith(**fields) -> dict:
    base = {
        "unit": "ARITH",
        "operation": "ARITH_AFFINE",
        "rounding_o": 1,
        "saturation_o": 1,
        "round_mode_o": 1,
        "relu_mode_o": 0,
        "outbytes_o": 1,
        "clipout": 0,
        "Ax_shift": 0,
        "By_shift": 0,
        "C_shift": 0,
        "A_scalar": 0,
        "B_scalar": 0,
        "C_scalar": 0,
        "A_vector": None,
        "B_vector": None,
        "C_vector": None,
    }
    base.update(fields)
    return base


def affine_stage(role: str, a_ratio: float, c_value: float, inbytes: int = 1) -> dict:
    """A scalar single-input ARITH out = (A*x + BC) >> shift_o: a suboff or a requantize. A is the
    ratio normalised to 16 bits, BC the constant at the same shift."""
    shift = normalised_shift(a_ratio)
    a = round_half_away(a_ratio * 2.0**shift)
    b, c = split_bc(round_half_away(c_value * 2.0**shift))
    return _arith(
        role=role,
        scalar=1,
        dualinput=0,
        combinebc=1,
        bcast="ARITH_BCAST_SCALAR",
        inbytes_x=inbytes,
        shift_o=shift,
        A_scalar=a,
        B_scalar=b,
        C_scalar=c,
        vec_precision=[8, 8, 8],
    )


def feature_format(input_zero_point: int, options: N6Options) -> tuple[int, int, int]:
    """(offset the suboff adds, feature bytes, unsigned) of the CONVACC's input feature."""
    offset = -input_zero_point if options.input_offset == "subtract" else 128
    lo, hi = -128 + offset, 127 + offset
    if lo >= 0 and hi <= 255:
        return offset, 1, 1
    if lo >= -128 and hi <= 127:
        return offset, 1, 0
    return offset, 2, 0  # 9 bits: a 16-bit feature (the CONVACC's 16x8 mode)


def suboff_stage(input_zero_point: int, options: N6Options) -> dict:
    """The ARITH before a CONVACC: the int8 input as the feature it reads, x + offset."""
    offset, width, _ = feature_format(input_zero_point, options)
    st = affine_stage("suboff", 1.0, float(offset))
    st.update(rounding_o=0, saturation_o=0, outbytes_o=width)
    return st


def add_stage(sx: float, zx: int, sy: float, zy: int, so: float, zo: int, qmin=-128, qmax=127) -> dict:
    """ADD as one ARITH: out = (A*x >> Ax_shift + B*y >> By_shift + C << C_shift) >> shift_o."""
    ra, rb = np.float64(sx) / np.float64(so), np.float64(sy) / np.float64(so)
    shift = normalised_shift(max(ra, rb))
    ax = normalised_shift(ra * 2.0**shift)
    by = normalised_shift(rb * 2.0**shift)
    c_value = float(zo - ra * zx - rb * zy)
    c, c_shift = fixed_point(c_value, shift)
    st = _arith(
        role="add",
        scalar=1,
        dualinput=1,
        combinebc=0,
        bcast="ARITH_BCAST_NONE",
        inbytes_x=1,
        inbytes_y=1,
        shift_o=shift,
        A_scalar=round_half_away(ra * 2.0 ** (shift + ax)),
        B_scalar=round_half_away(rb * 2.0 ** (shift + by)),
        C_scalar=c,
        Ax_shift=ax,
        By_shift=by,
        C_shift=c_shift,
        vec_precision=[8, 8, 8],
    )
    _clip(st, qmin, qmax)
    return st


def _clip(st: dict, qmin: int, qmax: int):
    """A fused activation narrower than int8: the ARITH's output clip."""
    if qmin > -128 or qmax < 127:
        st.update(clipout=1, clipmin=int(qmin), clipmax=int(qmax))


def conv_stages(
    x_scale: float,
    x_zero_point: int,
    w_scales,
    weights_per_channel: np.ndarray,
    bias,
    bias_scales,
    y_scale: float,
    y_zero_point: int,
    options: N6Options = N6Options(),
    qmin: int = -128,
    qmax: int = 127,
) -> list[dict]:
    """suboff ARITH, CONVACC, off_bias ARITH of a convolution. weights_per_channel: the int8
    weights as [output channel, taps]; bias int32 per channel (None: no bias)."""
    w = np.asarray(weights_per_channel, np.int64)
    channels = w.shape[0]
    w_scales = np.broadcast_to(np.asarray(w_scales, np.float32), (channels,))
    a = np.float64(x_scale) * w_scales.astype(np.float64)  # M[c] = a[c] / s_y
    s = conv_shift(w, options)
    bq = np.zeros(channels, np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
    offset = 128 if options.input_offset == "fold" else -x_zero_point
    folded = bq - (x_zero_point + offset) * w.sum(axis=1)  # the input offset the suboff left
    if bias_scales is None:
        bias_scales = np.float32(x_scale) * w_scales
    sb = np.broadcast_to(np.asarray(bias_scales, np.float32), (channels,))
    # The bias as the compiler reads it: float32 value (int32 code times float32 scale), over the
    # output scale in double (then held in int32 fixed point and floor-shifted: bc_vector).
    b_steps = (folded.astype(np.float32) * sb).astype(np.float64) / np.float64(np.float32(y_scale))
    _, width, unsigned = feature_format(x_zero_point, options)
    convacc = {
        "unit": "CONVACC",
        "simd": width,  # 8x8 (1) or 16x8 (2) SIMD: the feature's width
        "f_unsigned": unsigned,
        "k_unsigned": 0,
        "inbytes_f": width,
        "shift_a": s,
        "shift_o": s,
        "rounding_o": 1,
        "saturation_o": 1,
        "round_mode_o": 1,
        "relu_mode_o": 0,
        "outbytes_o": 2,
        "accumulate": 0,
    }
    requant = compiler(options.compiler).requantize(
        _RULES, a, y_scale, s, b_steps, y_zero_point, not np.any(folded)
    )
    _clip(requant[-1], qmin, qmax)
    return [suboff_stage(x_zero_point, options), convacc, *requant]


class _RULES:
    """The rounding rules the compilers' requantizations share (npu/n6_compiler.py)."""

    normalised_shift = staticmethod(normalised_shift)
    split_bc = staticmethod(split_bc)
    round = staticmethod(round_half_away)
    bc = staticmethod(lambda b_steps, shift_o, zero_point: bc_vector(b_steps, shift_o, zero_point))
    arith = staticmethod(lambda **fields: _arith(**fields))


def bc_vector(b_steps, shift_o: int, zero_point: int) -> list[int]:
    """A layer's per-channel BC at shift_o: (b[c] + z_y) 2^shift_o, b[c] the bias in output steps.
    The compiler holds the layer's b + z_y as one int32 fixed-point vector with as many fraction
    bits F as its largest magnitude leaves (F = the normalising shift of max |b + z_y| into int32),
    each value rounded half away at 2^-F, then shifts it right (floor) to shift_o. F is 22, 23 or 24
    on the shared compiles; this gives ST's BC on every channel of the 3.0 trace (12,082) and of the
    2.1 blobs (12,082), where one fixed F = 23 missed 47 and 161 (docs/neural-art.md)."""
    b = np.asarray(b_steps, np.float64).reshape(-1)
    f = normalised_shift(float(np.abs(b + zero_point).max()), INT32_MAX)
    out = []
    for v in b:
        n = round_half_away(float(v) * 2.0**f) + (zero_point << f)
        out.append(n >> (f - shift_o) if f >= shift_o else n << (shift_o - f))
    return out


def conv_shift(w: np.ndarray, options: N6Options) -> int:
    """S, the CONVACC's right shift into 16 bits: the smallest s >= 0 with
    max over channels |sum of the channel's weights| * 256 < 32768 * 2^s. The compiler sizes the
    16-bit output for the accumulator of a feature of 256 at every tap (not the worst case of a
    sign-mixed kernel: docs/neural-art.md); this rule gives ST's S on 186 of 186 layers of the trace."""
    if isinstance(options.conv_shift, int):
        return options.conv_shift
    level = int(np.abs(w.sum(axis=1)).max()) * 256
    s = 0
    while level >= (INT16_MAX + 1) << s:
        s += 1
    return s


def pool_stages(kind: str, options: dict, shape=None) -> list[dict]:
    """The units of a pooling, with ll_aton's fields (LL_Convacc_InitTypeDef, LL_Poolacc_InitTypeDef).
    A stride-1 SAME max pool of an odd square window k > 3 is ST's decomposition: one CONVACC that
    pads the input by p = (k - 1) / 2 on every side with -128 (a 1x1 kernel, 8 bits in and out, shift
    0: a padded value never wins a max), then (k - 1) / 2 chained 3x3 stride-1 POOL units without
    padding, each taking 2 off the padded frame (the shared compiles' 5x5, 9x9 and 13x13 SPP pools:
    2, 4 and 6 units, every field equal in both). shape: the input (N, H, W, C); without it the
    geometry fields are left out. Other pools are one POOL unit with TFLite's padding (not in
    either compile: unverified)."""
    wx, wy = int(options.get("filter_width", 1)), int(options.get("filter_height", 1))
    sx, sy = int(options.get("stride_w", 1)), int(options.get("stride_h", 1))
    op = "POOL_MAX" if kind == "MAX_POOL_2D" else "POOL_AVG"
    h, w = (None, None) if shape is None else (int(shape[1]), int(shape[2]))
    if op == "POOL_MAX" and wx == wy and wx > 3 and wx % 2 == 1 and sx == sy == 1:
        pad = (wx - 1) // 2
        stages = [] if h is None else [_pad_convacc(h, w, pad)]
        for i in range(pad):
            size = None if h is None else (h + 2 * pad - 2 * i, w + 2 * pad - 2 * i)
            stages.append(_pool_unit(op, 3, 3, 1, 1, size, (0, 0, 0, 0)))
        return stages
    size, pads = None, (0, 0, 0, 0)
    if h is not None:
        size = (h, w)
        if options.get("padding") == "SAME":
            py = max((-(-h // sy) - 1) * sy + wy - h, 0)
            px = max((-(-w // sx) - 1) * sx + wx - w, 0)
            pads = (py // 2, py - py // 2, px // 2, px - px // 2)
    return [_pool_unit(op, wx, wy, sx, sy, size, pads)]


def _pool_unit(op: str, wx: int, wy: int, sx: int, sy: int, size, pads) -> dict:
    """One POOL unit: the constants every unit of the shared compiles has (8-bit in and out, rounded
    and saturated, no shift, dualLine, batch 1, a max's mulval 0), the window, and with size (H, W) of its
    input the frame: crops spanning it, output size by its own padding (top, bottom, left, right)."""
    st = {"unit": "POOL", "operation": op, "avgnopad": 0, "poolWinX": wx, "poolWinY": wy}
    st.update(strideX=sx, strideY=sy, batchSize=1, shift_f=0, shift_o=0, dualLine=1)
    if op == "POOL_MAX":
        st["mulval"] = 0  # (an average's 1 / window as mulval: not in the compiles, not derived)
    st.update(rounding_f=0, saturation_f=0, round_mode_f=0, inbytes_f=1, outbytes_f=1)
    st.update(rounding_o=1, saturation_o=1, round_mode_o=1, relu_mode_o=0, outbytes_o=1)
    st.update(pad_val_en=0, pad_val=0)
    if size is not None:
        (h, w), (top, bottom, left, right) = size, pads
        st.update(inputX=w, inputY=h, topPad=top, bottomPad=bottom, leftPad=left, rightPad=right)
        st.update(outputX=(w + left + right - wx) // sx + 1, outputY=(h + top + bottom - wy) // sy + 1)
        st.update(leftCrop=0, rightCrop=w - 1, topCrop=0, bottomCrop=h - 1)
    return st


def _pad_convacc(h: int, w: int, pad: int) -> dict:
    """The CONVACC of a decomposed max pool: the int8 input through a 1x1 identity, framed by `pad`
    values of -128 (zfbias) on every side, 8-bit out, no shift."""
    st = {"unit": "CONVACC", "role": "pad", "simd": 1, "fsub": 0, "vshift": 0, "accumulate": 0}
    st.update(rounding_f=0, saturation_f=0, round_mode_f=0, f_unsigned=0, k_unsigned=0, deepmode=0)
    st.update(dss2mode=0, kseten=0, zfbias=-128, inbytes_f=1, shift_f=0, shift_a=0)
    st.update(rounding_o=1, saturation_o=1, round_mode_o=1, relu_mode_o=0, outbytes_o=1, shift_o=0, raw_o=0)
    st.update(fWidth=w, fHeight=h, kernelWidth=1, kernelHeight=1, nKernels=1, batchDepth=1)
    st.update(hstride=1, vstride=1, left_padding=pad, right_padding=pad, top_padding=pad, bot_padding=pad)
    st.update(left_crop=0, right_crop=w - 1, top_crop=0, bot_crop=h - 1)
    return st


# ----------------------------------------------------------------------------------------------
# A whole graph


def _activation(op, out) -> tuple[int, int]:
    from ..quant import activation_range  # the kernels' module: imported when a chain is asked for

    act = op.options.get("fused_activation_function", "NONE")
    if act in (None, "NONE"):
        return -128, 127
    return activation_range(act, out.scale, out.zero_point)


def conv_geometry(op, x, w, options: N6Options) -> dict:
    """A convolution's CONVACC frame: kernel, strides, TFLite's SAME padding split with the odd one
    at the bottom and right, the input frame with crops spanning it, and `zfbias`, the padding's
    feature value (a real zero: 0 after the suboff subtracts the zero point; z_x + 128 when it adds
    128). Equal on the first and every pipe unit of all 186 layers of both shared compiles; not given
    for a dilated or fully-connected op (in neither compile)."""
    if op.kind == "FULLY_CONNECTED" or len(x.shape) != 4:
        return {}
    if int(op.options.get("dilation_w_factor", 1)) != 1 or int(op.options.get("dilation_h_factor", 1)) != 1:
        return {}
    h, wd = int(x.shape[1]), int(x.shape[2])
    kh, kw = int(w.shape[1]), int(w.shape[2])
    sh, sw = int(op.options.get("stride_h", 1)), int(op.options.get("stride_w", 1))
    ph = pw = 0
    if op.options.get("padding") == "SAME":
        ph = max((-(-h // sh) - 1) * sh + kh - h, 0)
        pw = max((-(-wd // sw) - 1) * sw + kw - wd, 0)
    zfbias = 0 if options.input_offset == "subtract" else int(x.zero_point) + 128
    return {
        "kernelWidth": kw,
        "kernelHeight": kh,
        "hstride": sw,
        "vstride": sh,
        "left_padding": pw // 2,
        "right_padding": pw - pw // 2,
        "top_padding": ph // 2,
        "bot_padding": ph - ph // 2,
        "fWidth": wd,
        "fHeight": h,
        "left_crop": 0,
        "right_crop": wd - 1,
        "top_crop": 0,
        "bot_crop": h - 1,
        "zfbias": zfbias,
    }


def _per_channel_weights(op, w) -> np.ndarray:
    data = np.asarray(w.data, np.int64)
    if op.kind == "DEPTHWISE_CONV_2D":
        return data.reshape(-1, data.shape[-1]).T
    return data.reshape(data.shape[0], -1)


def op_stages(graph, op, options: N6Options = N6Options()) -> list[dict] | None:
    """The unit chain of one op as the compiler configures it, or None where npusim does not derive
    one (an op on the M55, or an NPU op whose configuration the trace does not show)."""
    t = graph.tensors
    outs = [t[i] for i in op.outputs]
    if any(o.quant is None or np.dtype(o.dtype) != np.int8 for o in outs):
        return None
    out = outs[0]
    if op.kind in MAC_KINDS:
        x, w = t[op.inputs[0]], t[op.inputs[1]]
        b = t[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
        if w.data is None or x.quant is None or np.dtype(x.dtype) != np.int8:
            return None
        qmin, qmax = _activation(op, out)
        stages = conv_stages(
            x.scale,
            x.zero_point,
            w.quant.scale,
            _per_channel_weights(op, w),
            None if b is None else b.data,
            None if b is None or b.quant is None else b.quant.scale,
            out.scale,
            out.zero_point,
            options,
            qmin,
            qmax,
        )
        stages[1].update(conv_geometry(op, x, w, options))
        return stages
    if op.kind == "ADD":
        x, y = t[op.inputs[0]], t[op.inputs[1]]
        if x.quant is None or y.quant is None or x.is_constant or y.is_constant:
            return None
        qmin, qmax = _activation(op, out)
        zx, zy, zo = x.zero_point, y.zero_point, out.zero_point
        return [add_stage(x.scale, zx, y.scale, zy, out.scale, zo, qmin, qmax)]
    if op.kind == "QUANTIZE":
        x = t[op.inputs[0]]
        if x.quant is None or np.dtype(x.dtype).kind not in "iu":
            return None
        ratio = float(np.float64(x.scale) / np.float64(out.scale))
        # a uint8 input reaches the (signed) ARITH as a 16-bit stream: inbytes_x 2 on the 2.1 compile
        inbytes = 2 if np.dtype(x.dtype) == np.uint8 else 1
        return [affine_stage("requantize", ratio, out.zero_point - ratio * x.zero_point, inbytes)]
    if op.kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        return pool_stages(op.kind, op.options, t[op.inputs[0]].shape)
    return None


def graph_stages(graph, options: N6Options = N6Options()) -> dict[int, list[dict]]:
    """op index -> its unit chain, for the ops op_stages derives one for."""
    chains = {}
    for op in graph.ops:
        st = op_stages(graph, op, options)
        if st is not None:
            chains[op.index] = st
    return chains
