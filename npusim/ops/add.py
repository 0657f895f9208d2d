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

from ..engines import aligned
from ..engines.int16 import ADD_LEFT_SHIFT, add16, is_int16, range16, require_int16, require_tflm
from ..engines.output_stage import (
    each_profile,
    lane_mask,
    load_bytes,
    single_multiply,
    splat,
    store_bytes,
    tflm_multiply,
    vector_output_stage,
)
from ..engines.requant import output_range, requantization_multiplier
from ..jit import parallel_kernel
from ..quant import ONNXRUNTIME, SINGLE, TFLM
from . import onnxruntime as ort
from .base import Kernel
from .float_form import Elementwise
from .pairwise import pair_lookup

LEFT_SHIFT = 20
CHUNK = 1 << 14  # elements per parallel task


@intrinsic
def add_run(typingctx, a_ptr, b_ptr, out_ptr, count, z1, z2, m1, s1, m2, s2, mo, so, zo, lo, hi, profile):
    """out[i] = the int8 sum of int8 a[i] and b[i] for i < count, the steps of TFLM's add on 16
    lanes: (x - z) << 20 rescaled by (m1, s1) or (m2, s2), summed in int32, then the output stage
    with (mo, so), zo and the clamp [lo, hi]. The xnnpack profile adds as TFLM does."""
    sig = types.void(*([types.int64] * 16))

    def codegen(context, builder, signature, args):
        a_ptr, b_ptr, out_ptr, count, z1, z2, m1, s1, m2, s2, mo, so, zo, lo, hi, profile = args
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
        # (offset, M, left, right, xnnpack scale): the scale is never read, the xnnpack profile adding as TFLM
        out_params = [
            ir.Constant(v16, 0),
            vec(mo),
            *shifts(so),
            ir.Constant(ir.VectorType(ir.FloatType(), 16), 0.0),
        ]

        def add_vector_at(first, remaining, pid, masked: bool):
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
                x = builder.shl(builder.sub(builder.sext(xb, v16), z), ir.Constant(v16, LEFT_SHIFT))
                # |x| < 2^28 and the rescale multipliers are at most 1/2: the results fit int32.
                y = (
                    builder.trunc(single_multiply(builder, x, m, left, right), v16)
                    if pid == SINGLE
                    else tflm_multiply(builder, x, m, left, right)
                )
                total = builder.add(total, y)
            y = vector_output_stage(builder, total, out_params, SINGLE if pid == SINGLE else TFLM, zo, lo, hi)
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
    """add_run over a, b, out (int8, same shape) in tasks of CHUNK elements; params as Add.params."""
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    z1, z2, m1, s1, m2, s2, mo, so, zo, lo, hi = params
    for task in nb.prange((fo.size + CHUNK - 1) // CHUNK):
        start = task * CHUNK
        add_run(
            fa.ctypes.data + start,
            fb.ctypes.data + start,
            fo.ctypes.data + start,
            min(CHUNK, fo.size - start),
            z1,
            z2,
            m1,
            s1,
            m2,
            s2,
            mo,
            so,
            zo,
            lo,
            hi,
            profile,
        )
    return out


class Add(Kernel):
    kind = "ADD"
    float_form = Elementwise
    required_inputs, max_inputs = 2, 2

    def __init__(self, op, graph, profile):
        super().__init__(op, graph, profile)
        a, b, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.params16 = None
        if is_int16(a):  # int16 operands and output (int16.add16)
            require_tflm(self)
            require_int16(self, a, b, y)
        else:
            self.require_int8(a, b, y)
        for t in (a, b, y):
            if t.quant.per_channel:
                raise self.error(f"tensor {t.name!r} is quantized per channel, expected per-tensor")
        self.require_broadcast(a, b, y)
        for t in (a, b):  # an activation's axis 0 is the batch: it must line up with the output's
            if t.data is None and len(t.shape) != len(y.shape):
                raise self.error(
                    f"input {t.name!r} has rank {len(t.shape)}, expected the output's rank {len(y.shape)}"
                )
        s1, s2, so = (np.float64(t.quant.scale[0]) for t in (a, b, y))
        twice_max = 2.0 * max(s1, s2)
        self.out_shape = tuple(y.shape[1:])
        if is_int16(a):
            self.params16 = (
                *requantization_multiplier(s1 / twice_max),
                *requantization_multiplier(s2 / twice_max),
                *requantization_multiplier(twice_max / ((1 << ADD_LEFT_SHIFT) * so)),
                *range16(self, op.options.get("fused_activation_function", "NONE"), y),
            )
            return
        self.table = None
        if profile == ONNXRUNTIME:  # QLinearAdd (onnxruntime.add_table), clamped to a fused activation
            lo, hi = output_range(op.options.get("fused_activation_function", "NONE"), y, profile)
            table = ort.add_table(a, b, y)
            self.table = np.clip(table, lo, hi).astype(np.int8)
            return
        self.params = (
            a.zero_point,
            b.zero_point,
            *requantization_multiplier(s1 / twice_max),
            *requantization_multiplier(s2 / twice_max),
            *requantization_multiplier(twice_max / ((1 << LEFT_SHIFT) * so)),
            y.zero_point,
            *output_range(op.options.get("fused_activation_function", "NONE"), y),
        )
        self.vector_params = tuple(np.int64(p) for p in self.params)

    def macs(self) -> int:
        return int(np.prod(self.out_shape))

    def workspace_bytes(self, n: int) -> int:
        return n * int(np.prod(self.out_shape))  # each operand broadcast to the output shape

    def __call__(self, a, b):
        shape = self.broadcast_batch(a, b, self.out_shape)
        a, b = (np.ascontiguousarray(np.broadcast_to(t, shape)) for t in (a, b))
        if self.params16 is not None:
            return add16(a, b, self.params16)
        if self.table is not None:
            return pair_lookup(self.table, a.view(np.uint8), b.view(np.uint8), aligned.empty(shape, np.int8))
        return add_vector(a, b, self.vector_params, np.int64(self.profile), aligned.empty(shape, np.int8))
