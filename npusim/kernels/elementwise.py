"""The compiled loops of the elementwise int8 ops: ADD's vector code (TFLM's add on 16 lanes, LLVM),
the pairwise family's table lookup, QUANTIZE's rounding and byte shift, the requantization of exact
sums (FULLY_CONNECTED's activation weights, BATCH_MATMUL) and LEAKY_RELU's table. The operators
(npusim/ops/add.py, pairwise.py, quantize.py, fully_connected.py, batch_matmul.py, activations.py)
prepare their parameters and call these.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit import njit, parallel_kernel
from .output_stage import (
    CHECKED_ROWS,
    FLOAT_ROWS,
    PARAMETER_ROWS,
    each_stage,
    lane_mask,
    load_bytes,
    rounding_divide_by_pot,
    single_multiply,
    splat,
    store_bytes,
    vector_output_stage,
)
from .pair_tables import LEFT_SHIFT
from .rounding import clamp, requantize_one, requantize_to_output
from .stages import DOUBLE_ROUNDING, SINGLE_ROUNDING

ADD_CHUNK = 1 << 14  # elements per parallel task of add_vector

LEFT_SHIFT_ROUNDING = 31 - LEFT_SHIFT  # the bits below the high half that the input's shift leaves


def shifted_high_mul(builder, d, m):
    """SaturatingRoundingDoublingHighMul(d << 20, m) on int32 lanes with |d| < 2^8 and 0 <= m < 2^31,
    without 64-bit products. TFLM's nudge and truncation equal floor((p + 2^30) / 2^31) for every
    product p (output_stage.tflm_multiply); with p = d * m * 2^20 that is floor((d * m + 2^10) / 2^11)
    exactly, and with m = mh * 2^11 + ml (0 <= ml < 2^11) it is d * mh + floor((d * ml + 2^10) / 2^11),
    as d * mh * 2^11 is a multiple of 2^11: two 32-bit products (|d * mh| < 2^28, |d * ml| < 2^19)
    instead of the four 64-bit multiplies and the shuffles of the general form (no saturation: d << 20
    is never INT32_MIN)."""
    low_bits = LEFT_SHIFT_ROUNDING
    mh = builder.lshr(m, ir.Constant(m.type, low_bits))
    ml = builder.and_(m, ir.Constant(m.type, (1 << low_bits) - 1))
    rounded = builder.add(builder.mul(d, ml), ir.Constant(m.type, 1 << (low_bits - 1)))
    return builder.add(builder.mul(d, mh), builder.ashr(rounded, ir.Constant(m.type, low_bits)))


@intrinsic
def add_run(typingctx, a_ptr, b_ptr, out_ptr, count, params_ptr, stage):
    """out[i] = the int8 sum of int8 a[i] and b[i] for i < count, the steps of TFLM's add on 16
    lanes: (x - z) << 20 rescaled by (m1, s1) or (m2, s2), summed in int32, then the output stage
    with (mo, so), zo and the clamp [lo, hi], on the checked form of output_stage.tflm_checked
    (its six rows after them). params_ptr: the int64 values of ops/add.Add.vector_params; stage:
    the profile's integer_stage (SINGLE_ROUNDING or DOUBLE_ROUNDING). The xnnpack profile runs this
    where the XNNPACK delegate refuses the op (LiteRT's builtin ADD, taken as TFLM's), a table
    otherwise."""
    sig = types.void(*([types.int64] * 6))

    def codegen(context, builder, signature, args):
        a_ptr, b_ptr, out_ptr, count, params_ptr, stage = args
        values = builder.inttoptr(params_ptr, ir.IntType(64).as_pointer())
        z1, z2, m1, s1, m2, s2, mo, so, zo, lo, hi, *checked = (
            builder.load(builder.gep(values, [ir.Constant(ir.IntType(64), k)]))
            for k in range(11 + CHECKED_ROWS)
        )
        i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
        v16 = ir.VectorType(i32, 16)
        a, b, out = (builder.inttoptr(v, i8.as_pointer()) for v in (a_ptr, b_ptr, out_ptr))

        def vec(v):
            return splat(builder, builder.trunc(v, i32), v16)

        def shifts(shift):  # (left, right) of a shift: max(shift, 0), max(-shift, 0)
            zero = ir.Constant(i64, 0)
            positive = builder.icmp_signed(">", shift, zero)
            return vec(builder.select(positive, shift, zero)), vec(
                builder.select(positive, zero, builder.neg(shift))
            )

        rescale = [(vec(z), vec(m), *shifts(sh)) for z, m, sh in ((z1, m1, s1), (z2, m2, s2))]
        # (offset, M, left, right, xnnpack scale): the scale is never read (XNNPACK's ADD is a table);
        # then the checked form's rows (float ones as their bits)
        f16 = ir.VectorType(ir.FloatType(), 16)
        out_params = [
            ir.Constant(v16, 0),
            vec(mo),
            *shifts(so),
            ir.Constant(f16, 0.0),
            *(
                builder.bitcast(vec(v), f16) if row in FLOAT_ROWS else vec(v)
                for row, v in enumerate(checked, PARAMETER_ROWS - CHECKED_ROWS)
            ),
        ]

        def add_vector_at(first, remaining, stage, masked: bool):
            """16 elements from `first`; masked: only the `remaining` ones (< 16) are read and written.
            Whole vectors take plain loads and stores: without AVX-512 BW there are no byte-masked
            ones, and LLVM writes them as a branch per lane."""
            valid = lane_mask(builder, remaining, 16) if masked else None
            total = ir.Constant(v16, 0)
            for src, (z, m, left, right) in zip((a, b), rescale):
                ptr = builder.gep(src, [first])
                if masked:
                    xb = load_bytes(builder, ptr, valid)
                else:
                    xb = builder.load(builder.bitcast(ptr, ir.VectorType(i8, 16).as_pointer()), align=1)
                d = builder.sub(builder.sext(xb, v16), z)
                # |d| < 2^8, so |d << 20| < 2^28, and the rescale multipliers are at most 1/2: the
                # results fit int32.
                if stage == SINGLE_ROUNDING:
                    x = builder.shl(d, ir.Constant(v16, LEFT_SHIFT))
                    y = builder.trunc(single_multiply(builder, x, m, left, right), v16)
                else:  # left is 0: a multiplier at most 1/2 has a shift of at most 0
                    y = rounding_divide_by_pot(builder, shifted_high_mul(builder, d, m), right)
                total = builder.add(total, y)
            # (the rescales' rounding is the output stage's: the fp32 stage's rows are unused)
            out_stage = SINGLE_ROUNDING if stage == SINGLE_ROUNDING else DOUBLE_ROUNDING
            y = vector_output_stage(builder, total, out_params, out_stage, zo, lo, hi)
            dst = builder.gep(out, [first])
            if masked:
                store_bytes(builder, y, dst, remaining)
            else:
                builder.store(y, builder.bitcast(dst, y.type.as_pointer()), align=1)

        whole = builder.sdiv(count, ir.Constant(i64, 16))
        tail = builder.mul(whole, ir.Constant(i64, 16))
        for kind in each_stage(builder, stage):
            with cgutils.for_range(builder, whole) as loop:
                first = builder.mul(loop.index, ir.Constant(i64, 16))
                add_vector_at(first, builder.sub(count, first), kind, False)
            with builder.if_then(builder.icmp_signed("<", tail, count)):
                add_vector_at(tail, builder.sub(count, tail), kind, True)
        return context.get_dummy_value()

    return sig, codegen


@parallel_kernel
def add_vector(a, b, params, stage, out):
    """add_run over a, b, out (int8, same shape) in tasks of ADD_CHUNK elements; params: int64
    ops/add.Add.vector_params."""
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    for task in nb.prange((fo.size + ADD_CHUNK - 1) // ADD_CHUNK):
        start = task * ADD_CHUNK
        add_run(
            fa.ctypes.data + start,
            fb.ctypes.data + start,
            fo.ctypes.data + start,
            min(ADD_CHUNK, fo.size - start),
            params.ctypes.data,
            stage,
        )
    return out


@parallel_kernel
def pair_lookup(table, a, b, out):
    """out[i] = table[a[i] * 256 + b[i]] for bytes a, b (uint8 views of the int8 operands)."""
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    for i in nb.prange(fo.size):
        fo[i] = table[(np.int64(fa[i]) << 8) | np.int64(fb[i])]
    return out


@parallel_kernel
def affine_quantize(x, scale, zero_point, out):
    """AffineQuantize: TfLiteRound(val / scale) + zero_point, saturated to int8, with a float32
    division (in double, 3.85f / 0.1f lands just below 38.5 and would round the other way).
    Returns the number of values that are not finite or whose |val / scale| reaches 2^31 (TFLM's
    static_cast<int32_t> is undefined there: x86 and Arm disagree), which the caller refuses."""
    xf = x.reshape(-1)
    of = out.reshape(-1)
    bad = 0
    for i in nb.prange(xf.size):
        r = np.float64(xf[i] / scale)
        a = abs(r)
        if not a < 2.0**31:  # also true for NaN
            bad += 1
            a = 0.0
        q = math.floor(a + 0.5)  # round half away from zero
        v = np.int64(q if r >= 0 else -q) + zero_point
        of[i] = clamp(v, -128, 127)
    return bad


@parallel_kernel
def add_bytes(x, d, out):
    """out = x + d (mod 256) for bytes x: the lookup when the table is a shift of the codes."""
    xf = x.reshape(-1)
    of = out.reshape(-1)
    for i in nb.prange(xf.size):
        of[i] = xf[i] + d
    return out


@parallel_kernel
def requantize_rows(acc, m, shift, real_scale, stage, zero_point, lo, hi, out):
    """out = the output stage (requantize_to_output) of the exact sums acc, elementwise."""
    af, of = acc.reshape(-1), out.reshape(-1)
    for i in nb.prange(af.size):
        of[i] = requantize_to_output(np.int64(af[i]), m, shift, real_scale, stage, zero_point, lo, hi)
    return out


@parallel_kernel
def requantize_array(acc, m, shift, real_scale, stage, zero_point, out):
    """requantize_rows clamped to the whole int8 range (BATCH_MATMUL has no fused activation)."""
    af, of = acc.reshape(-1), out.reshape(-1)
    for i in nb.prange(af.size):
        of[i] = requantize_to_output(np.int64(af[i]), m, shift, real_scale, stage, zero_point, -128, 127)
    return out


@njit()
def leaky_relu_table(x_zp, y_zp, m_id, s_id, r_id, m_alpha, s_alpha, r_alpha, stage):
    """TFLM's LEAKY_RELU on every input byte (index: the byte as uint8): the identity multiplier
    above the zero point, alpha's below, each by the output stage `stage`."""
    table = np.empty(256, dtype=np.int8)
    for code in range(256):
        q = code - 256 if code >= 128 else code
        v = np.int64(q) - x_zp
        if v >= 0:
            out = requantize_one(v, m_id, s_id, r_id, stage)
        elif m_alpha < 0:  # a negative alpha: as the PyPI TFLM rounds it (ops/activations.py)
            out = -requantize_one(v, -m_alpha, s_alpha, -r_alpha, stage)
        else:
            out = requantize_one(v, m_alpha, s_alpha, r_alpha, stage)
        out += y_zp
        table[code] = max(-128, min(127, out))
    return table
