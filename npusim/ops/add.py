"""ADD: int8 elementwise addition with TFLite broadcasting (TFLM reference_integer_ops/add.h).

Both inputs are brought to a common scale with 20 bits of headroom (left_shift = 20), added in
int32, then requantized to the output scale: three MultiplyByQuantizedMultiplier calls per element.
Eval runs these steps as vector code, 16 elements at a time (add_run below; generic LLVM vector
operations, built for any x86). A test runs all 65,536 input pairs through TFLM and npusim.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..kernels import aligned
from ..kernels.jit import parallel_kernel
from ..kernels.output_stage import (
    CHECKED_ROWS,
    FLOAT_ROWS,
    PARAMETER_ROWS,
    each_profile,
    lane_mask,
    load_bytes,
    rounding_divide_by_pot,
    single_multiply,
    splat,
    store_bytes,
    vector_output_stage,
)
from ..kernels.requant import OutputStage, output_range
from ..profiles import DOUBLE_ROUNDING, SINGLE_ROUNDING, profile_of
from ..profiles import onnxruntime as ort
from ..profiles import xnnpack as xnn
from .float_form import Elementwise
from .int16 import add16
from .pairwise import LEFT_SHIFT, BinaryKernel

CHUNK = 1 << 14  # elements per parallel task


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
def add_run(typingctx, a_ptr, b_ptr, out_ptr, count, params_ptr, profile):
    """out[i] = the int8 sum of int8 a[i] and b[i] for i < count, the steps of TFLM's add on 16
    lanes: (x - z) << 20 rescaled by (m1, s1) or (m2, s2), summed in int32, then the output stage
    with (mo, so), zo and the clamp [lo, hi], on the checked form of output_stage.tflm_checked
    (its six rows after them). params_ptr: the int64 values of Add.vector_params. The xnnpack
    profile runs this where the XNNPACK delegate refuses the op (LiteRT's builtin ADD, taken as
    TFLM's), a table otherwise."""
    sig = types.void(*([types.int64] * 6))

    def codegen(context, builder, signature, args):
        a_ptr, b_ptr, out_ptr, count, params_ptr, profile = args
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
        for pid in each_profile(builder, profile):
            with cgutils.for_range(builder, whole) as loop:
                first = builder.mul(loop.index, ir.Constant(i64, 16))
                add_vector_at(first, builder.sub(count, first), pid, False)
            with builder.if_then(builder.icmp_signed("<", tail, count)):
                add_vector_at(tail, builder.sub(count, tail), pid, True)
        return context.get_dummy_value()

    return sig, codegen


@parallel_kernel
def add_vector(a, b, params, profile, out):
    """add_run over a, b, out (int8, same shape) in tasks of CHUNK elements; params: int64
    Add.vector_params."""
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    for task in nb.prange((fo.size + CHUNK - 1) // CHUNK):
        start = task * CHUNK
        add_run(
            fa.ctypes.data + start,
            fb.ctypes.data + start,
            fo.ctypes.data + start,
            min(CHUNK, fo.size - start),
            params.ctypes.data,
            profile,
        )
    return out


class Add(BinaryKernel):
    """The pairwise family's checks and multipliers (pairwise.py); eval in vector code, not a table
    (the onnxruntime profile: QLinearAdd's table, looked up as the family's other ops are)."""

    kind = "ADD"
    float_form = Elementwise

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        self.table = None
        if profile_of(profile).ort_qlinear:
            # QLinearAdd (onnxruntime.add_table) on the family's lookup, clamped to a fused
            # activation. ORT rescales in float32, so TFLM's output-multiplier limit (a CHECK in
            # QuantizeMultiplierSmallerThanOneExp, refused by rescale_multipliers) does not apply;
            # the family's operand checks do, and int8 operands only (ORT's 16-bit QDQ is not modelled).
            a, b, y = self.prepare_operands()
            lo, hi = output_range(op.options.get("fused_activation_function", "NONE"), y, profile)
            self.table = np.clip(ort.add_table(a, b, y), lo, hi).astype(np.int8)
            return
        self.params = self.prepare_rescaled(add16)  # None with int16 operands (int16.add16)
        if self.params is None:
            return
        a, b, y = self.inputs[0], self.inputs[1], self.outputs[0]
        if self.params[3] > 0 or self.params[5] > 0:  # add_run's shifted_high_mul takes no left shift
            raise self.error(f"input rescale shifts {self.params[3]}, {self.params[5]}: expected at most 0")
        # XNNPACK's qs8-vadd, as a table
        if profile_of(profile).xnnpack_delegate and xnn.delegates_add(a, b, y):
            self.table = xnn.add_table(a, b, y, False, self.activation)
        m_out, s_out, z_out, lo, hi = self.params[6:11]
        ones = np.ones(1, np.float32)
        # (add_run takes the tflm output stage for every profile but single, whose rows are unused)
        stage = OutputStage(
            np.array([m_out], np.int32),
            np.array([s_out]),
            ones,
            z_out,
            lo,
            hi,
            profile=profile_of(profile).integer_stage,
        )
        self.vector_params = np.array([*self.params, *stage.checked[:, 0]], np.int64)

    def eval_int8(self, a, b):
        if self.table is not None:  # onnxruntime, or XNNPACK's ADD: the pairwise table lookup
            return super().eval_int8(a, b)
        return add_vector(a, b, self.vector_params, np.int64(self.profile), aligned.empty(a.shape, np.int8))
