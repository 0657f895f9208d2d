"""The output stage of the MAC ops as LLVM vector code: int32 accumulators to int8 outputs, 16 lanes
(one ZMM register) or 8 (one YMM register, for the AVX2 kernels) per vector.

The same integer steps as rounding.requantize_to_output, for each output stage, written on
vectors so that they run in registers (Numba does not vectorize the scalar form inside the
kernels' loops). The oracle tests hold it to TFLM and LiteRT, and to the scalar form. Only
generic LLVM vector operations: it compiles for any x86 (AVX-512 gives the best code).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import aligned
from .rounding import INT32_MAX, INT32_MIN
from .rounding import multiply_by_quantized_multiplier_array as requantize
from .stages import DOUBLE_ROUNDING, FP32, SINGLE_ROUNDING

_I32, _I64 = ir.IntType(32), ir.IntType(64)
_V16 = ir.VectorType(_I32, 16)
# offset, multiplier, left shift, right shift, xnnpack scale; then the checked form's (tflm_checked):
# accumulator bounds, scale, addends above and below zero, bias of the result's bits.
CHECKED_ROWS = 6
PARAMETER_ROWS = 5 + CHECKED_ROWS
FLOAT_ROWS = (4, 7, 8, 9)
MAGIC = np.float32(3072.0)  # 1.5 * 2^11: W + MAGIC for every |W| < 1024 lies in [2^11, 2^12), 2^-12 apart
GRID_BITS = 12
WINDOW = 4  # grid steps either side of a rounding boundary that send a vector to the exact form


def splat(builder, value, vector_type):
    undef = ir.Constant(vector_type, ir.Undefined)
    lane0 = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(lane0, undef, ir.Constant(ir.VectorType(_I32, vector_type.count), None))


def tflm_multiply(builder, x, m, left, right):
    """TFLM's MultiplyByQuantizedMultiplier on int32 lanes (an even count): SaturatingRoundingDoublingHighMul
    ((x << left) as int32, M), then RoundingDivideByPOT(right); int32 result."""
    # 0 <= M < 2^31, so the saturating case (both operands INT32_MIN) cannot occur.
    # TFLM adds a nudge of 2^30 (ab >= 0) or 1 - 2^30 (ab < 0) and divides by 2^31 truncating
    # toward zero; for every integer ab that equals floor((ab + 2^30) / 2^31), one add and one
    # shift (|ab| < 2^62: no overflow). The 64-bit products are taken in place, of the even and
    # the odd lanes (VPMULDQ reads the low half of each 64-bit lane), and the results meet in one
    # blend, instead of widening to two vectors of 64-bit lanes and narrowing back.
    lanes = x.type.count
    i64x8 = ir.VectorType(_I64, lanes // 2)
    c32, nudge = ir.Constant(i64x8, 32), ir.Constant(i64x8, 1 << 30)
    shifted = builder.shl(x, left)
    xq, mq = builder.bitcast(shifted, i64x8), builder.bitcast(m, i64x8)

    def low_half(q):  # the low int32 of each 64-bit lane, sign-extended
        return builder.ashr(builder.shl(q, c32), c32)

    def odd_lanes(v):  # lanes 2k + 1 moved down to 2k (one in-lane shuffle)
        odd = ir.Constant(x.type, [k | 1 for k in range(lanes)])
        return builder.bitcast(builder.shuffle_vector(v, ir.Constant(x.type, ir.Undefined), odd), i64x8)

    # Both products as sign-extended low halves, which LLVM lowers to one VPMULDQ each; the high
    # halves as ashr(q, 32) were lowered without AVX-512 to a full 64-bit multiply (three VPMULUDQ).
    even = builder.add(builder.mul(low_half(xq), low_half(mq)), nudge)
    odd = builder.add(builder.mul(low_half(odd_lanes(shifted)), low_half(odd_lanes(m))), nudge)
    # bits 31..62 of each sum: in the low half of the even lanes, in the high half of the odd.
    high = builder.shuffle_vector(
        builder.bitcast(builder.lshr(even, ir.Constant(i64x8, 31)), x.type),
        builder.bitcast(builder.shl(odd, ir.Constant(i64x8, 1)), x.type),
        ir.Constant(x.type, [k + lanes * (k % 2) for k in range(lanes)]),
    )
    return rounding_divide_by_pot(builder, high, right)


def rounding_divide_by_pot(builder, x, right):
    """gemmlowp's RoundingDivideByPOT on int32 lanes: x / 2^right rounded half away from zero,
    sign(x) * floor((|x| + half) / 2^right), half = 2^right / 2 (0 for right = 0). As unsigned,
    |x| + half < 2^32 (|INT32_MIN| included), so a logical shift is exact."""
    one, zero = ir.Constant(x.type, 1), ir.Constant(x.type, 0)
    negative = builder.icmp_signed("<", x, zero)
    magnitude = builder.select(negative, builder.sub(zero, x), x)
    half = builder.lshr(builder.shl(one, right), one)
    rounded = builder.lshr(builder.add(magnitude, half), right)
    return builder.select(negative, builder.sub(zero, rounded), rounded)


def tflm_checked(builder, x, params, exact):
    """TFLM's output stage (tflm_multiply, the clamp, the zero point) on int32 lanes x = acc + offset,
    in float32 where that is provably exact, else by exact() (the integer form), per vector.

    With no left shift, TFLM's two roundings of x M / 2^31 / 2^r (half up, then half away from zero)
    are one: y = floor(W + 1/2), W = x S + nu, S = M / 2^(31 + r), nu = 2^-(1 + r) for x >= 0 and
    -2^-(1 + r) below (0 when r = 0), by floor((floor(a / b) + c) / d) = floor((a + c b) / (b d)).
    y is monotone in x, so clamping x to the middle of the cells of the two clamp bounds (rows 5, 6,
    checked_parameters) clamps y, and leaves |W| <= 256. Then u = x S + (MAGIC + nu) in float32 is
    rounded to a grid of 2^-12 (its binade), and its bits minus MAGIC's count grid steps n, within
    1.2 steps of W * 2^12: 3 x 2^-24 of 256 from x, S and the product, 2^-13 each from the addend and
    the sum. y = floor((n + 2048) / 4096) is exact unless n + 2048 lies within WINDOW steps of a
    multiple of 4096; such lanes (0.2% of random ones) send the vector to exact(). Channels the form
    does not cover (a left shift, an empty clamp cell) have S = 0 and bits that always land there.
    About 12 instructions per 8 lanes on AVX2, against 19 for the integer form."""
    lanes = x.type.count
    f32v = ir.VectorType(ir.FloatType(), lanes)
    x_lo, x_hi, scale, above, below, bias = params[PARAMETER_ROWS - CHECKED_ROWS :]
    xc = builder.select(builder.icmp_signed("<", x, x_lo), x_lo, x)
    xc = builder.select(builder.icmp_signed(">", xc, x_hi), x_hi, xc)
    addend = builder.select(builder.icmp_signed("<", xc, ir.Constant(x.type, 0)), below, above)
    fmuladd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(f32v, [f32v] * 3), f"llvm.fmuladd.v{lanes}f32"
    )
    u = builder.call(fmuladd, [builder.sitofp(xc, f32v), scale, addend])
    v = builder.add(builder.bitcast(u, x.type), bias)  # n + 2048 + WINDOW + zero point * 4096
    cell = ir.Constant(x.type, (1 << GRID_BITS) - 1)
    near = builder.icmp_unsigned("<", builder.and_(v, cell), ir.Constant(x.type, 2 * WINDOW))
    slot = cgutils.alloca_once_value(builder, builder.ashr(v, ir.Constant(x.type, GRID_BITS)))
    mask = builder.bitcast(near, ir.IntType(lanes))
    with builder.if_then(builder.icmp_unsigned("!=", mask, ir.Constant(mask.type, 0)), likely=False):
        builder.store(exact(), slot)
    return builder.load(slot)


def single_multiply(builder, x, m, left, right):
    """The single-rounding MultiplyByQuantizedMultiplier (rounding.multiply_by_quantized_multiplier_single)
    on int32 lanes: (x * M + 2^(total - 1)) >> total, total = 31 - left + right, as int64 lanes."""
    i64v = ir.VectorType(_I64, x.type.count)
    total = builder.sext(builder.add(builder.sub(ir.Constant(x.type, 31), left), right), i64v)
    half = builder.shl(ir.Constant(i64v, 1), builder.sub(total, ir.Constant(i64v, 1)))
    return builder.ashr(builder.add(builder.mul(builder.sext(x, i64v), builder.sext(m, i64v)), half), total)


def vector_output_stage(builder, acc, params, stage, zero_point, lo, hi, narrow=True):
    """int32 accumulators -> int8 outputs (16 or 8 lanes): the vector form of
    rounding.requantize_to_output for one output stage (the same integer steps; for tflm in the
    checked form of tflm_checked, which falls back to them; tests hold both to TFLM and to each
    other). narrow=False
    leaves the outputs in int32 lanes (all within int8), for kernels that narrow them with packs.

    params: offset, multiplier, left shift, right shift (int32) and the xnnpack scale (float32),
    then the CHECKED_ROWS rows of tflm_checked, one vector of as many lanes as acc each (PARAMETER_ROWS).
    """
    offset, m, left, right, scale = params[:5]
    lanes = acc.type.count
    i64v, f32v = ir.VectorType(_I64, lanes), ir.VectorType(ir.FloatType(), lanes)
    x = builder.add(acc, offset)  # the int32 accumulator of the runtimes (wraps as theirs)
    # The clamp range of the requantized value before the zero point is added.
    y_lo = splat(builder, builder.trunc(builder.sub(lo, zero_point), _I32), acc.type)
    y_hi = splat(builder, builder.trunc(builder.sub(hi, zero_point), _I32), acc.type)
    if stage == DOUBLE_ROUNDING:

        def exact():
            y = tflm_multiply(builder, x, m, left, right)
            y = builder.select(builder.icmp_signed("<", y, y_lo), y_lo, y)
            y = builder.select(builder.icmp_signed(">", y, y_hi), y_hi, y)
            return builder.add(y, splat(builder, builder.trunc(zero_point, _I32), acc.type))

        y = tflm_checked(builder, x, params, exact)
        return builder.trunc(y, ir.VectorType(ir.IntType(8), lanes)) if narrow else y
    if stage == SINGLE_ROUNDING:
        y = single_multiply(builder, x, m, left, right)  # clamped in 64 bits: it may exceed int32
        y = builder.select(builder.icmp_signed("<", y, builder.sext(y_lo, i64v)), builder.sext(y_lo, i64v), y)
        y = builder.trunc(
            builder.select(
                builder.icmp_signed(">", y, builder.sext(y_hi, i64v)), builder.sext(y_hi, i64v), y
            ),
            acc.type,
        )
    else:
        # XNNPACK: round half to even of float32(x) * scale (float32), in the default rounding mode.
        rint = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f32v, [f32v]), f"llvm.rint.v{lanes}f32"
        )
        product = builder.call(rint, [builder.fmul(builder.sitofp(x, f32v), scale)])
        f_lo, f_hi = builder.sitofp(y_lo, f32v), builder.sitofp(y_hi, f32v)
        product = builder.select(builder.fcmp_ordered("<", product, f_lo), f_lo, product)
        product = builder.select(builder.fcmp_ordered(">", product, f_hi), f_hi, product)
        y = builder.fptosi(product, acc.type)  # integer valued and in range: exact
    # Clamp before adding the zero point (the sum cannot overflow int32 then); bounds are small.
    y = builder.select(builder.icmp_signed("<", y, y_lo), y_lo, y)
    y = builder.select(builder.icmp_signed(">", y, y_hi), y_hi, y)
    y = builder.add(y, splat(builder, builder.trunc(zero_point, _I32), acc.type))
    return builder.trunc(y, ir.VectorType(ir.IntType(8), lanes)) if narrow else y


def lane_mask(builder, count, lanes: int):
    """<lanes x i1>: lane l is set when l < count (an i64, which may exceed lanes). Built as an
    integer bit mask (one mask-register move) rather than a vector compare, which LLVM would
    otherwise repeat inside loops."""
    bits = ir.IntType(lanes)
    full = builder.icmp_signed(">=", count, ir.Constant(_I64, lanes))
    # count clamped to [0, lanes - 1] for the shift below (a full mask is the select's other arm)
    count = builder.select(builder.icmp_signed("<", count, ir.Constant(_I64, 0)), ir.Constant(_I64, 0), count)
    count = builder.select(full, ir.Constant(_I64, lanes - 1), count)
    partial = builder.sub(builder.shl(ir.Constant(_I64, 1), count), ir.Constant(_I64, 1))
    if lanes < 64:
        partial = builder.trunc(partial, bits)
    mask = builder.select(full, ir.Constant(bits, (1 << lanes) - 1), partial)
    return builder.bitcast(mask, ir.VectorType(ir.IntType(1), lanes))


def each_stage(builder, stage):
    """Yields each output-stage kind (stages.py: DOUBLE_ROUNDING, SINGLE_ROUNDING, FP32) inside the
    branch taken when `stage` (an i64, the kind a kernel was called with) equals it: the code of
    every kind is emitted, and a call runs one, decided once outside its loops."""
    for kind in (DOUBLE_ROUNDING, SINGLE_ROUNDING, FP32):
        with builder.if_then(builder.icmp_signed("==", stage, ir.Constant(_I64, kind))):
            yield kind


def load_parameters(builder, params, stride, j, lanes: int = 16):
    """The PARAMETER_ROWS parameter vectors of channels lanes * j .. lanes * (j + 1) - 1 (params: i8*
    to channel 0 of row 0, stride: bytes between rows)."""

    def row(k, ty):
        p = builder.gep(
            params, [builder.add(builder.mul(stride, ir.Constant(_I64, k)), ir.Constant(_I64, 4 * lanes * j))]
        )
        return builder.load(builder.bitcast(p, ty.as_pointer()), align=1)

    int_row, float_row = ir.VectorType(_I32, lanes), ir.VectorType(ir.FloatType(), lanes)
    return [row(k, float_row if k in FLOAT_ROWS else int_row) for k in range(PARAMETER_ROWS)]


def load_bytes(builder, src, mask):
    """The bytes at src (i8*) in the lanes that mask (<n x i1>) sets, zero in the others, which are
    not read (a masked load does not fault past the end of an array)."""
    lanes = mask.type.count
    vector_type = ir.VectorType(ir.IntType(8), lanes)
    masked_load = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(vector_type, [vector_type.as_pointer(), _I32, mask.type, vector_type]),
        f"llvm.masked.load.v{lanes}i8.p0",
    )
    return builder.call(
        masked_load,
        [
            builder.bitcast(src, vector_type.as_pointer()),
            ir.Constant(_I32, 1),
            mask,
            ir.Constant(vector_type, None),
        ],
    )


def store_bytes(builder, y, dst, count):
    """Store the first `count` (i64, may exceed the lanes) lanes of the <n x i8> y at dst (i8*)."""
    lanes = y.type.count
    masked_store = cgutils.get_or_insert_function(
        builder.module,
        ir.FunctionType(
            ir.VoidType(), [y.type, y.type.as_pointer(), _I32, ir.VectorType(ir.IntType(1), lanes)]
        ),
        f"llvm.masked.store.v{lanes}i8.p0",
    )
    builder.call(
        masked_store,
        [
            y,
            builder.bitcast(dst, y.type.as_pointer()),
            ir.Constant(_I32, 1),
            lane_mask(builder, count, lanes),
        ],
    )


def store_first(builder, y, dst, count):
    """store_bytes, with a plain store when all lanes are stored. For AVX2 code: without AVX-512 BW
    there is no byte-masked store, and LLVM writes a masked one as a branch per lane."""
    full = builder.icmp_signed(">=", count, ir.Constant(_I64, y.type.count))
    with builder.if_else(full) as (whole, part):
        with whole:
            builder.store(y, builder.bitcast(dst, y.type.as_pointer()), align=1)
        with part:
            store_bytes(builder, y, dst, count)


@intrinsic
def output_stage_row(
    typingctx, acc_ptr, params_ptr, params_stride, out_ptr, count, stage, zero_point, lo, hi
):
    """out[c] = output stage of acc[c] for c < count: int32 acc, int8 out, parameters as
    output_parameters lays them out (params_ptr at channel 0, params_stride bytes per row)."""
    sig = types.void(*([types.int64] * 9))

    def codegen(context, builder, signature, args):
        acc_ptr, params_ptr, params_stride, out_ptr, count, stage, zero_point, lo, hi = args
        i8p = ir.IntType(8).as_pointer()
        acc, params, out = (builder.inttoptr(v, i8p) for v in (acc_ptr, params_ptr, out_ptr))
        vectors = builder.sdiv(builder.add(count, ir.Constant(_I64, 15)), ir.Constant(_I64, 16))
        for kind in each_stage(builder, stage):
            with cgutils.for_range(builder, vectors) as loop:
                v = loop.index
                a = builder.load(
                    builder.bitcast(
                        builder.gep(acc, [builder.mul(v, ir.Constant(_I64, 64))]), _V16.as_pointer()
                    ),
                    align=1,
                )
                p = builder.gep(params, [builder.mul(v, ir.Constant(_I64, 64))])
                y = vector_output_stage(
                    builder, a, load_parameters(builder, p, params_stride, 0), kind, zero_point, lo, hi
                )
                first = builder.mul(v, ir.Constant(_I64, 16))
                store_bytes(builder, y, builder.gep(out, [first]), builder.sub(count, first))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def output_stage_tile(
    typingctx,
    acc_ptr,
    params_ptr,
    params_stride,
    out_ptr,
    out_stride,
    rows,
    count,
    stage,
    zero_point,
    lo,
    hi,
):
    """out[r * out_stride + c] = output stage of acc[16 r + c] for r < rows and c < count (at most
    16 channels, one set of parameters for all rows: an AMX result tile of 16 rows of 64 bytes).
    With 8 channels or fewer, two rows share one vector (half the output stages)."""
    sig = types.void(*([types.int64] * 11))

    def codegen(context, builder, signature, args):
        acc_ptr, params_ptr, params_stride, out_ptr, out_stride, rows, count, stage, zero_point, lo, hi = (
            args
        )
        i8p = ir.IntType(8).as_pointer()
        acc, params, out = (builder.inttoptr(v, i8p) for v in (acc_ptr, params_ptr, out_ptr))
        channel_params = load_parameters(builder, params, params_stride, 0)
        v8 = ir.VectorType(_I32, 8)

        def row(r, vector_type):
            p = builder.gep(acc, [builder.mul(r, ir.Constant(_I64, 64))])
            return builder.load(builder.bitcast(p, vector_type.as_pointer()), align=1)

        def lanes(v, indices):
            return builder.shuffle_vector(
                v, ir.Constant(v.type, ir.Undefined), ir.Constant(ir.VectorType(_I32, len(indices)), indices)
            )

        narrow = builder.icmp_signed("<=", count, ir.Constant(_I64, 8))
        with builder.if_else(narrow) as (two_rows, one_row):
            with two_rows:  # lanes 0-7: row r, 8-15: row r + 1 (a row past `rows` is computed, not stored)
                pair_params = [lanes(p, list(range(8)) * 2) for p in channel_params]
                pairs = builder.sdiv(builder.add(rows, ir.Constant(_I64, 1)), ir.Constant(_I64, 2))
                for kind in each_stage(builder, stage):
                    with cgutils.for_range(builder, pairs) as loop:
                        r = builder.mul(loop.index, ir.Constant(_I64, 2))
                        r1 = builder.add(r, ir.Constant(_I64, 1))
                        a = builder.shuffle_vector(
                            row(r, v8), row(r1, v8), ir.Constant(_V16, list(range(16)))
                        )
                        y = vector_output_stage(builder, a, pair_params, kind, zero_point, lo, hi)
                        store_bytes(
                            builder,
                            lanes(y, list(range(8))),
                            builder.gep(out, [builder.mul(r, out_stride)]),
                            count,
                        )
                        with builder.if_then(builder.icmp_signed("<", r1, rows)):
                            store_bytes(
                                builder,
                                lanes(y, list(range(8, 16))),
                                builder.gep(out, [builder.mul(r1, out_stride)]),
                                count,
                            )
            with one_row:
                for kind in each_stage(builder, stage):
                    with cgutils.for_range(builder, rows) as loop:
                        r = loop.index
                        y = vector_output_stage(
                            builder, row(r, _V16), channel_params, kind, zero_point, lo, hi
                        )
                        store_bytes(builder, y, builder.gep(out, [builder.mul(r, out_stride)]), count)
        return context.get_dummy_value()

    return sig, codegen


def output_parameters(offset, stage, multiple: int = 16) -> np.ndarray:
    """[G, PARAMETER_ROWS, O'] int32 per group and channel: the accumulator offset [G, O] (the part
    of the accumulator that the kernel does not sum, wrapped to int32 as the runtimes'
    accumulators), M, left and right shift, the bits of the float32 xnnpack scale, then the rows of
    tflm_checked (checked_parameters). O' is O rounded up to `multiple` (the widest vector the
    kernel loads them in); channels past O are zero."""
    groups, o = offset.shape
    params = aligned.zeros((groups, PARAMETER_ROWS, (o + multiple - 1) // multiple * multiple), np.int32)
    params[:, 0, :o] = offset.astype(np.int32)  # two's complement wrap
    params[:, 1, :o] = stage.multiplier
    params[:, 2, :o] = np.maximum(stage.shift, 0)
    params[:, 3, :o] = np.maximum(-stage.shift, 0)
    params[:, 4, :o] = stage.real_scale.astype(np.float32).view(np.int32)
    params[:, PARAMETER_ROWS - CHECKED_ROWS :, :o] = stage.checked  # checked_parameters, kept by the stage
    return params


def _first_at_least(y, target, guess):
    """Per channel, the least x of int32 with y(x) >= target (INT32_MAX + 1 where there is none),
    y nondecreasing: among the 8 integers around the float estimate `guess` (good to about 1), in
    one evaluation of y, or by bisection over all of int32 where they do not bracket it."""
    beyond = INT32_MAX + 1

    def f(x):  # y, and +inf past int32
        return np.where(x > INT32_MAX, np.iinfo(np.int64).max, y(np.minimum(x, INT32_MAX)))

    g = np.clip(np.nan_to_num(guess, nan=0.0, posinf=beyond, neginf=INT32_MIN), INT32_MIN, beyond)
    first = np.clip(g.astype(np.int64)[None] + np.arange(-4, 4)[:, None], INT32_MIN, beyond)
    below = (f(first) < target).sum(axis=0)  # f is monotone: the candidates below the target
    lo = first[np.minimum(below, 7), np.arange(target.size)]
    found = ((below > 0) | (first[0] == INT32_MIN)) & (below < 8)
    if found.all():
        return lo
    lo, hi = np.where(found, lo, INT32_MIN), np.where(found, lo, beyond)
    for _ in range(34):
        mid = (lo + hi) >> 1
        ok = f(mid) >= target
        lo, hi = np.where(ok, lo, mid + 1), np.where(ok, mid, hi)
    return lo


def checked_parameters(stage) -> np.ndarray:
    """[CHECKED_ROWS, O] int32, the last rows of output_parameters, for tflm_checked: the
    accumulator bounds (the middle of the cells where y, before the zero point, equals each clamp
    bound, or the end of int32 where y never leaves the bound's side), S, MAGIC + nu and MAGIC - nu
    as float32 bits, and the bias 2048 + WINDOW + zero point * 4096 - bits(MAGIC). A channel with a
    left shift (TFLM wraps x << left in int32: y is not monotone) or a clamp bound that y steps over
    gets S = 0 and the bias -bits(MAGIC): its lanes always take the exact form."""
    m, shift = stage.multiplier.astype(np.int64), stage.shift.astype(np.int64)
    o = m.size
    right = np.maximum(-shift, 0)
    scale = m.astype(np.float64) * np.ldexp(1.0, -(31 + right - np.maximum(shift, 0)).astype(np.int32))
    y_lo, y_hi = stage.lo - stage.zero_point, stage.hi - stage.zero_point
    # The four searches as one, over 4 O channels: the first x of y_lo, y_lo + 1, y_hi, y_hi + 1.
    targets = np.repeat(np.array([y_lo, y_lo + 1, y_hi, y_hi + 1], np.int64), o)
    m4, shift4 = np.tile(m, 4), np.tile(shift, 4)
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = (targets - 0.5) / np.tile(scale, 4)
    first = _first_at_least(lambda x: requantize(x, m4, shift4), targets, guess).reshape(4, o)
    first_lo, last_lo, first_hi, last_hi = first[0], first[1] - 1, first[2], first[3] - 1

    def y(x):
        return requantize(x, m, shift)

    # Clamp bounds: the middle of the cell of y_lo (y_hi), or the end of int32 where all of it is
    # on the bound's side; covered where the cell is not empty (y can step over a bound).
    x_lo = np.where(first_lo == INT32_MIN, INT32_MIN, (first_lo + last_lo) >> 1)
    x_hi = np.where(last_hi == INT32_MAX, INT32_MAX, (first_hi + last_hi) >> 1)
    covered = (shift <= 0) & (x_lo <= x_hi) & (first_lo <= INT32_MAX) & (last_hi >= INT32_MIN)
    covered &= (x_lo == INT32_MIN) | (y(np.clip(x_lo, INT32_MIN, INT32_MAX)) == y_lo)
    covered &= (x_hi == INT32_MAX) | (y(np.clip(x_hi, INT32_MIN, INT32_MAX)) == y_hi)
    nu = np.where(right > 0, np.ldexp(1.0, -(1 + right).astype(np.int32)), 0.0)
    magic_bits = int(MAGIC.view(np.int32))
    bias = 2048 + WINDOW + np.int64(stage.zero_point) * (1 << GRID_BITS) - magic_bits
    rows = np.stack(
        [
            np.where(covered, x_lo, INT32_MIN),
            np.where(covered, x_hi, INT32_MAX),
            np.where(covered, scale, 0).astype(np.float32).view(np.int32),
            np.where(covered, float(MAGIC) + nu, float(MAGIC)).astype(np.float32).view(np.int32),
            np.where(covered, float(MAGIC) - nu, float(MAGIC)).astype(np.float32).view(np.int32),
            np.where(covered, bias, -magic_bits),
        ]
    )
    return rows.astype(np.int32)
