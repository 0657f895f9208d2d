"""DEPTHWISE_CONV_2D: per-channel int8 depthwise convolution with depth multiplier
(TFLM reference_integer_ops/depthwise_conv.h). Output channel c_out = c_in * multiplier + m,
weights [1, kh, kw, C * multiplier] (or [G, 1, kh, kw, C * multiplier] for grouped weights, see conv.py).
A direct integer loop: there is no reduction long enough for a GEMM to pay. With multiplier 1,
every pixel runs 64 channels at a time as vector code with the accumulators in registers
(tap_quads_run below): each row's columns whose taps fall inside the image width as one run (taps
in rows above or below the image read a row of zero points instead), and the left and right border
pixels one by one, their padding taps reading that row too. Layers of 16 or 32 channels with
stride 1 along the width put 4 or 2 adjacent pixels in one vector. Other multipliers take a scalar
loop.

The vector code takes the taps four at a time, as VNNI convolutions take channels: the bytes of
taps t..t+3 are interleaved channel by channel, so that one VPDPBUSD (AVX-512 VNNI; elsewhere
generic vector code, see depthwise_kernel) adds the four products of each of 16 channels to its
int32 accumulator. Activations are made unsigned as they load (u = x + 128), so
sum (x - zp) * w = sum u * w - (zp + 128) * sum w, the second term folded into the bias. This holds
on the border too, where a padding tap reads x = zp: its terms cancel, as TFLM skips the tap.

The interleave follows x86's in-lane unpacks (bytes, then words): accumulator q gets channels
16 L + 4 q + j of each 128-bit lane L. Weights and output parameters are stored in that order
(quad_order), and the output bytes are put back in channel order before they are stored.
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils

from .. import host
from ..engines import aligned, backend
from ..engines.geometry import ConvGeometry, SlidingWindow
from ..engines.int16 import Stage16, depthwise16, is_int16
from ..engines.microkernel import (
    int64_intrinsic,
    packs_to_bytes,
    pmaddwd_add,
    prefetch_range,
    vpdpbusd,
)
from ..engines.output_stage import (
    each_profile,
    lane_mask,
    load_bytes,
    load_parameters,
    output_parameters,
    output_stage_row,
    store_bytes,
    vector_output_stage,
)
from ..engines.requant import OutputStage
from ..errors import NpusimError
from ..jit import ParallelKernel, njit, parallel_kernel, renamed
from ..quant import mac_profile
from .base import Kernel, WeightMemo

LANES = 64  # channels (bytes) per vector block
GROUP = 4  # taps per VPDPBUSD (the "avx2" variant binds 2: taps per VPMADDWD)
WEIGHT_BYTES = 1  # bytes per weight of the vector layout (the "avx2" variant binds 2: int16)
PAIR = 2  # taps per VPMADDWD
CHUNK = 16  # channels of one tap per 16-byte load in the AVX2 form
# The channel (within a chunk of 16) at each position 8 h + j of the AVX2 form's two accumulators
# h: in-lane word interleaves put channels 0-3, 8-11 in the first and 4-7, 12-15 in the second.
PAIR_ORDER = np.array([0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])
ROWS_PER_TASK = 8  # output rows per parallel task
PREFETCH_ROWS = 2  # output rows ahead whose input rows are prefetched
# The arguments of tap_quads_run (all int64), in both forms.
RUN_ARGS = """x_ptr x_step taps_ptr n_quads w_ptr n_pixels out_ptr out_step count params_ptr params_stride
    profile zero_point lo hi"""


def quad_order() -> np.ndarray:
    """The channel (within a block of 64) at each accumulator position p = 16 q + i: lane
    i = 4 L + j of accumulator q holds channel 16 L + 4 q + j (L: the 128-bit lane)."""
    p = np.arange(LANES)
    q, i = p // 16, p % 16
    return 16 * (i // 4) + 4 * q + i % 4


def _tap_quads_run(vnni: bool):
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    bytes_t, acc_t = ir.VectorType(i8, LANES), ir.VectorType(i32, 16)
    # x86's in-lane unpacks: the bytes of two taps, then the byte pairs of two pairs of taps.
    bytes_of = [
        [
            v
            for lane in range(4)
            for j in range(8 * h, 8 * h + 8)
            for v in (16 * lane + j, LANES + 16 * lane + j)
        ]
        for h in range(2)
    ]
    words_of = [
        [v for lane in range(4) for j in range(4 * h, 4 * h + 4) for v in (8 * lane + j, 32 + 8 * lane + j)]
        for h in range(2)
    ]
    to_channels = [int(p) for p in np.argsort(quad_order())]  # output bytes back in channel order

    @int64_intrinsic(RUN_ARGS)
    def run(builder, a):
        x, w, out, params = (
            builder.inttoptr(v, i8.as_pointer()) for v in (a.x_ptr, a.w_ptr, a.out_ptr, a.params_ptr)
        )
        taps = builder.inttoptr(a.taps_ptr, i64.as_pointer())
        if vnni:

            def multiply_add(acc, xs, ws):
                return vpdpbusd(builder, acc, builder.bitcast(xs, acc_t), builder.bitcast(ws, acc_t))
        else:

            def multiply_add(acc, xs, ws):  # the same sums in generic vector code
                wide = ir.VectorType(i32, LANES)
                products = builder.mul(
                    builder.zext(builder.bitcast(xs, bytes_t), wide),
                    builder.sext(builder.bitcast(ws, bytes_t), wide),
                )
                for k in range(GROUP):
                    acc = builder.add(
                        acc,
                        builder.shuffle_vector(
                            products,
                            ir.Constant(wide, ir.Undefined),
                            ir.Constant(acc_t, list(range(k, LANES, GROUP))),
                        ),
                    )
                return acc

        valid = lane_mask(builder, a.count, LANES)
        sign = ir.Constant(bytes_t, [0x80] * LANES)
        channel_params = [load_parameters(builder, params, a.params_stride, q) for q in range(4)]
        acc_slots = [cgutils.alloca_once_value(builder, ir.Constant(acc_t, None)) for _ in range(4)]

        def load_tap(base, t):  # 64 int8 activations as uint8 x + 128
            offset = builder.add(base, builder.load(builder.gep(taps, [t])))
            return builder.xor(load_bytes(builder, builder.gep(x, [offset]), valid), sign)

        def shuffle(u, v, indices):
            return builder.shuffle_vector(u, v, ir.Constant(ir.VectorType(i32, len(indices)), indices))

        for pid in each_profile(builder, a.profile):
            with cgutils.for_range(builder, a.n_pixels) as pixel:
                base = builder.mul(pixel.index, a.x_step)
                for slot in acc_slots:
                    builder.store(ir.Constant(acc_t, None), slot)
                with cgutils.for_range(builder, a.n_quads) as quad:
                    t = builder.mul(quad.index, ir.Constant(i64, GROUP))
                    xa, xb, xc, xd = (
                        load_tap(base, builder.add(t, ir.Constant(i64, k))) for k in range(GROUP)
                    )
                    words_t = ir.VectorType(ir.IntType(16), LANES // 2)
                    ab = [builder.bitcast(shuffle(xa, xb, bytes_of[h]), words_t) for h in range(2)]
                    cd = [builder.bitcast(shuffle(xc, xd, bytes_of[h]), words_t) for h in range(2)]
                    for q, slot in enumerate(acc_slots):
                        xs = shuffle(ab[q // 2], cd[q // 2], words_of[q % 2])  # 4 taps of 16 channels
                        w_off = builder.add(
                            builder.mul(quad.index, ir.Constant(i64, 4 * LANES)),
                            ir.Constant(i64, LANES * q),
                        )
                        ws = builder.load(
                            builder.bitcast(builder.gep(w, [w_off]), acc_t.as_pointer()), align=1
                        )
                        builder.store(multiply_add(builder.load(slot), xs, ws), slot)
                ys = [
                    vector_output_stage(builder, builder.load(slot), p, pid, a.zero_point, a.lo, a.hi)
                    for slot, p in zip(acc_slots, channel_params)
                ]
                y = shuffle(
                    shuffle(ys[0], ys[1], list(range(32))),
                    shuffle(ys[2], ys[3], list(range(32))),
                    to_channels,
                )
                store_bytes(builder, y, builder.gep(out, [builder.mul(pixel.index, a.out_step)]), a.count)

    return run


def _tap_pairs_run():
    """The AVX2 form of tap_quads_run, with the same arguments, on taps in pairs (n_quads counts
    pairs): per 16 channels, each tap's bytes are loaded widened to int16 (VPMOVSXBW from memory)
    and the words of two taps interleaved within 128-bit lanes (VPUNPCKLWD, VPUNPCKHWD), so that one
    VPMADDWD against the int16 weight pairs adds both taps' products to 8 int32 accumulators,
    exactly. The in-lane interleave puts channels 0-3 and 8-11 in the first accumulator and 4-7,
    12-15 in the second (PAIR_ORDER): weights and parameters are stored in that order (pair_layout),
    and the packs of the output stage (packs_to_bytes) bring the bytes back to channel order.
    Activations keep their sign, so the folded offset is -zp * sum w (a padding tap reads x = zp:
    its terms cancel, as TFLM skips the tap). Loads and stores are plain where all 16 bytes of a
    chunk are valid: AVX2 has no byte-masked load or store, and LLVM writes them as a branch per
    lane (left to the last chunk of a channel tail)."""
    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    bytes_t, words_t, acc_t = ir.VectorType(i8, CHUNK), ir.VectorType(i16, CHUNK), ir.VectorType(i32, 8)
    # In-lane word interleaves of taps a (0-15) and b (16-31): VPUNPCKLWD, VPUNPCKHWD.
    low = ir.Constant(
        ir.VectorType(i32, CHUNK), [v for lane in (0, 8) for j in range(4) for v in (lane + j, 16 + lane + j)]
    )
    high = ir.Constant(
        ir.VectorType(i32, CHUNK),
        [v for lane in (4, 12) for j in range(4) for v in (lane + j, 16 + lane + j)],
    )

    @int64_intrinsic(RUN_ARGS)
    def run(builder, a):
        x, w, out, params = (
            builder.inttoptr(v, i8.as_pointer()) for v in (a.x_ptr, a.w_ptr, a.out_ptr, a.params_ptr)
        )
        taps = builder.inttoptr(a.taps_ptr, i64.as_pointer())
        acc_slots = [cgutils.alloca_once_value(builder, ir.Constant(acc_t, None)) for _ in range(2)]

        def pixels(chunk, pid, left):
            """The pixel loop over one chunk of 16 channels; left: None when all 16 are valid, else
            the count of valid ones (masked loads and stores)."""
            mask = None if left is None else lane_mask(builder, left, CHUNK)
            chunk_params = [
                load_parameters(builder, params, a.params_stride, 2 * chunk + h, lanes=8) for h in range(2)
            ]

            def load_tap(base, t):  # 16 int8 activations as int16
                offset = builder.add(base, builder.load(builder.gep(taps, [t])))
                src = builder.gep(x, [builder.add(offset, ir.Constant(i64, CHUNK * chunk))])
                if mask is None:
                    xs = builder.load(builder.bitcast(src, bytes_t.as_pointer()), align=1)
                else:
                    xs = load_bytes(builder, src, mask)
                return builder.sext(xs, words_t)

            with cgutils.for_range(builder, a.n_pixels) as pixel:
                base = builder.mul(pixel.index, a.x_step)
                for slot in acc_slots:
                    builder.store(ir.Constant(acc_t, None), slot)
                with cgutils.for_range(builder, a.n_quads) as pair:
                    t = builder.mul(pair.index, ir.Constant(i64, PAIR))
                    xa = load_tap(base, t)
                    xb = load_tap(base, builder.add(t, ir.Constant(i64, 1)))
                    w_pair = builder.add(
                        builder.mul(pair.index, ir.Constant(i64, PAIR * LANES * 2)),
                        ir.Constant(i64, CHUNK * PAIR * 2 * chunk),
                    )
                    for h, (slot, order) in enumerate(zip(acc_slots, (low, high))):
                        xs = builder.shuffle_vector(xa, xb, order)
                        src = builder.gep(w, [builder.add(w_pair, ir.Constant(i64, 32 * h))])
                        ws = builder.load(builder.bitcast(src, words_t.as_pointer()), align=1)
                        builder.store(pmaddwd_add(builder, builder.load(slot), xs, ws), slot)
                ys = [
                    vector_output_stage(
                        builder, builder.load(slot), p, pid, a.zero_point, a.lo, a.hi, narrow=False
                    )
                    for slot, p in zip(acc_slots, chunk_params)
                ]
                y = packs_to_bytes(builder, *ys, in_lanes=True)
                dst = builder.gep(
                    out,
                    [builder.add(builder.mul(pixel.index, a.out_step), ir.Constant(i64, CHUNK * chunk))],
                )
                if mask is None:
                    builder.store(y, builder.bitcast(dst, bytes_t.as_pointer()), align=1)
                else:
                    store_bytes(builder, y, dst, left)

        for pid in each_profile(builder, a.profile):
            for chunk in range(LANES // CHUNK):
                left = builder.sub(a.count, ir.Constant(i64, CHUNK * chunk))
                with builder.if_then(builder.icmp_signed(">", left, ir.Constant(i64, 0))):
                    full = builder.icmp_signed(">=", left, ir.Constant(i64, CHUNK))
                    with builder.if_else(full) as (whole, part):
                        with whole:
                            pixels(chunk, pid, None)
                        with part:
                            pixels(chunk, pid, left)

    return run


def tap_quads_run(
    x_ptr,
    x_step,
    taps_ptr,
    n_quads,
    w_ptr,
    n_pixels,
    out_ptr,
    out_step,
    count,
    params_ptr,
    params_stride,
    profile,
    zero_point,
    lo,
    hi,
):
    """A run of n_pixels output pixels of a depthwise convolution (multiplier 1), for 64 channels
    (count of them valid): out[p * out_step + c] = the output stage of the sum over taps t of
    (x[p * x_step + taps[t] + c] + 128) * w(t, c), w in the layout of vector_layout and the parameters
    (offset - (zp + 128) * sum w) in quad_order. x is read with masked loads (never past the valid
    channels). A placeholder: each variant of depthwise_conv (depthwise_kernel) binds this name to
    the intrinsic _tap_quads_run(vnni) of its own."""
    raise NotImplementedError("tap_quads_run runs only inside a variant compiled by depthwise_kernel")


@njit(inline="always")
def tap_offsets(taps, kh, kw, dil_h, dil_w, in_h, in_w, in_c, iy0, ix0, x_first, pad_row_address, out):
    """out: the offsets from x_first, the address of input pixel (iy0, ix0) (which may lie outside
    the image), of the taps of the output pixel whose first tap that is; taps: the offsets when all
    fall inside. A tap outside the image reads the row of zero points instead, at its own column
    when that is inside the width, so that a run stepping along the row stays within that row."""
    for ky in range(kh):
        iy = iy0 + ky * dil_h
        for kx in range(kw):
            ix = ix0 + kx * dil_w
            t = ky * kw + kx
            if 0 <= iy < in_h and 0 <= ix < in_w:
                out[t] = taps[t]
            else:
                out[t] = pad_row_address + (ix if 0 <= ix < in_w else 0) * in_c - x_first
    out[kh * kw :] = out[kh * kw - 1]


def depthwise_conv(
    x,
    w,
    wv,
    replicas,
    groups,
    multiplier,
    stride_h,
    stride_w,
    dil_h,
    dil_w,
    pad_top,
    pad_left,
    in_zp,
    params,
    vparams,
    profile,
    out_zp,
    lo,
    hi,
    out,
):
    """params: the output parameters of the scalar loop (channel order); wv and vparams: the
    weights and parameters of the vector runs (see vector_layout). replicas > 1 (16 or 32
    channels, multiplier 1, stride 1 along the width): wv and vparams hold the channels that many
    times, and one 64-lane vector computes as many adjacent output pixels. The template of the
    kernels that depthwise_kernel compiles, not called itself."""
    n_batch, in_h, in_w, in_c = x.shape
    _, out_h, out_w, out_c = out.shape
    kh, kw = w.shape[2], w.shape[3]
    per_group = n_batch // groups
    zp = np.int32(in_zp)
    o_padded = params.shape[2]  # channels, padded to a multiple of LANES
    v_channels = vparams.shape[2]  # of the vector layout: a multiple of LANES (64 when replicated)
    # Output columns whose taps all fall inside the image, [ox_lo, ox_hi), and the tap offsets, in
    # groups of 4 (the taps past the last repeat it; their weights are zero).
    ox_lo = min(out_w, (pad_left + stride_w - 1) // stride_w)
    ox_hi = max(ox_lo, min(out_w, (in_w - 1 + pad_left - (kw - 1) * dil_w) // stride_w + 1))
    n_quads = (kh * kw + GROUP - 1) // GROUP
    taps = np.empty(GROUP * n_quads, dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            taps[ky * kw + kx] = ((ky * dil_h) * in_w + kx * dil_w) * in_c
    taps[kh * kw :] = taps[kh * kw - 1]
    block_bytes = n_quads * GROUP * LANES * WEIGHT_BYTES  # vector weights of one block of 64 channels
    # A row of zero points: the padding taps read it (and so contribute (zp + 128) * w, which the
    # folded bias takes back, as TFLM skips them).
    pad_row = np.empty(in_w * in_c, dtype=np.int8)
    pad_row[:] = in_zp
    vector = multiplier == 1
    rows = n_batch * out_h
    n_tasks = (rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in nb.prange(n_tasks):
        # Per task, not per row: an allocation per row cost as much as a small layer's arithmetic.
        edge_taps = np.empty(GROUP * n_quads, dtype=np.int64)  # the tap offsets of a run or pixel at an edge
        scratch = np.empty(o_padded + 16, dtype=np.int32)
        start = (-scratch.ctypes.data // 4) % 16  # vector loads of the output stage on cache lines
        a = scratch[start : start + o_padded]  # int32 accumulators, as TFLM's
        for row in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            n = row // out_h
            oy = row - n * out_h
            g = n // per_group
            iy0 = oy * stride_h - pad_top
            ahead = row + PREFETCH_ROWS
            if ahead < rows:
                # The input rows of output row `ahead` that the row before it does not read,
                # fetched while this one computes: a large batch's input comes from memory, at a
                # stride (2 rows per output row at stride 2) that left the kernel waiting on it.
                n_next = ahead // out_h
                first = (ahead - n_next * out_h) * stride_h - pad_top
                last = min(in_h - 1, first + (kh - 1) * dil_h)
                if (ahead - 1) // out_h == n_next:
                    first = max(first, first - stride_h + (kh - 1) * dil_h + 1)
                first = max(first, 0)
                if last >= first:
                    prefetch_range(
                        np.int64(x.ctypes.data) + ((n_next * in_h + first) * in_w) * in_c,
                        (last - first + 1) * in_w * in_c,
                    )
            w_group = wv.ctypes.data + g * (v_channels // LANES) * block_bytes
            v_group = vparams.ctypes.data + g * vparams.shape[1] * v_channels * 4
            # Taken in the loop, where pad_row is still used (Numba frees an array after its last use).
            pad_address = np.int64(pad_row.ctypes.data)
            runs = vector and ox_hi > ox_lo  # the columns [ox_lo, ox_hi) of the row, as vector runs
            if runs:
                # The address of the run's first tap (row iy0 may lie above the image: it is only a
                # base for the offsets); in a row at the top or bottom, taps in rows outside the
                # image read the row of zero points.
                ix0 = ox_lo * stride_w - pad_left
                x_first = np.int64(x.ctypes.data) + ((n * in_h + iy0) * in_w + ix0) * in_c
                run_taps = taps
                if iy0 < 0 or iy0 + (kh - 1) * dil_h >= in_h:
                    tap_offsets(
                        taps,
                        kh,
                        kw,
                        dil_h,
                        dil_w,
                        in_h,
                        in_w,
                        in_c,
                        iy0,
                        ix0,
                        x_first,
                        pad_address,
                        edge_taps,
                    )
                    run_taps = edge_taps
                out_first = out.ctypes.data + ((n * out_h + oy) * out_w + ox_lo) * out_c
                run = ox_hi - ox_lo
                if replicas > 1:  # adjacent pixels in_c bytes apart: `replicas` pixels per vector
                    tap_quads_run(
                        x_first,
                        replicas * in_c,
                        run_taps.ctypes.data,
                        n_quads,
                        w_group,
                        run // replicas,
                        out_first,
                        replicas * out_c,
                        LANES,
                        v_group,
                        v_channels * 4,
                        profile,
                        out_zp,
                        lo,
                        hi,
                    )
                    left = run % replicas
                    if left:  # the last pixels: the lanes past them are neither read nor stored
                        tap_quads_run(
                            x_first + (run - left) * in_c,
                            0,
                            run_taps.ctypes.data,
                            n_quads,
                            w_group,
                            1,
                            out_first + (run - left) * out_c,
                            0,
                            left * out_c,
                            v_group,
                            v_channels * 4,
                            profile,
                            out_zp,
                            lo,
                            hi,
                        )
                else:
                    for c0 in range(0, out_c, LANES):
                        tap_quads_run(
                            x_first + c0,
                            stride_w * in_c,
                            run_taps.ctypes.data,
                            n_quads,
                            w_group + c0 // LANES * block_bytes,
                            run,
                            out_first + c0,
                            out_c,
                            out_c - c0,
                            v_group + c0 * 4,
                            v_channels * 4,
                            profile,
                            out_zp,
                            lo,
                            hi,
                        )
            # The other pixels one by one: with multiplier 1 as a vector run of one pixel (padding
            # taps: the row of zero points); other multipliers in a scalar loop.
            for ox in range(out_w):
                if runs and ox_lo <= ox < ox_hi:
                    continue
                out_pixel = out.ctypes.data + ((n * out_h + oy) * out_w + ox) * out_c
                if vector:
                    ix0 = ox * stride_w - pad_left
                    x_first = np.int64(x.ctypes.data) + ((n * in_h + iy0) * in_w + ix0) * in_c
                    tap_offsets(
                        taps,
                        kh,
                        kw,
                        dil_h,
                        dil_w,
                        in_h,
                        in_w,
                        in_c,
                        iy0,
                        ix0,
                        x_first,
                        pad_address,
                        edge_taps,
                    )
                    for c0 in range(0, out_c, LANES):  # (replicas > 1: the first out_c lanes)
                        tap_quads_run(
                            x_first + c0,
                            0,
                            edge_taps.ctypes.data,
                            n_quads,
                            w_group + c0 // LANES * block_bytes,
                            1,
                            out_pixel + c0,
                            out_c,
                            out_c - c0,
                            v_group + c0 * 4,
                            v_channels * 4,
                            profile,
                            out_zp,
                            lo,
                            hi,
                        )
                    continue
                a[:] = 0  # the bias is the stage's offset
                for ky in range(kh):
                    iy = iy0 + ky * dil_h
                    if iy < 0 or iy >= in_h:
                        continue
                    for kx in range(kw):
                        ix = ox * stride_w - pad_left + kx * dil_w
                        if ix < 0 or ix >= in_w:
                            continue
                        xs = x[n, iy, ix]
                        ws = w[g, 0, ky, kx]
                        for ic in range(in_c):
                            xv = np.int32(xs[ic]) - zp
                            for mi in range(multiplier):
                                oc = ic * multiplier + mi
                                a[oc] += xv * np.int32(ws[oc])
                output_stage_row(
                    a.ctypes.data,
                    params.ctypes.data + g * params.shape[1] * o_padded * 4,
                    o_padded * 4,
                    out_pixel,
                    out_c,
                    profile,
                    out_zp,
                    lo,
                    hi,
                )
    return out


VARIANTS = ("vnni", "avx2", "generic")


@functools.cache
def depthwise_kernel(variant: str) -> ParallelKernel:
    """depthwise_conv compiled with tap_quads_run on VPDPBUSD ("vnni"), on VPMADDWD with taps in
    pairs ("avx2", _tap_pairs_run) or in generic LLVM vector code ("generic"), made on first use only
    (Numba compiles it at its first call): a host without AVX-512 VNNI never compiles the VNNI form.
    Each variant carries its own qualified name, so that Numba's cache, keyed by name, never serves
    one for the other."""
    if variant not in VARIANTS:
        raise ValueError(f"depthwise variant {variant!r}, expected one of {VARIANTS}")
    if variant == "vnni" and not host.has_vnni():
        raise NpusimError("the VNNI depthwise kernel does not run on this host (see npusim/host.py)")
    if variant == "avx2" and not host.has_avx2():
        raise NpusimError("the AVX2 depthwise kernel does not run on this host (see npusim/host.py)")
    if variant == "avx2":
        fn = renamed(depthwise_conv, variant, tap_quads_run=_tap_pairs_run(), GROUP=PAIR, WEIGHT_BYTES=2)
    else:
        fn = renamed(depthwise_conv, variant, tap_quads_run=_tap_quads_run(variant == "vnni"))
    return parallel_kernel(fn)


def _replicated(wg: np.ndarray, params: np.ndarray, replicas: int):
    """(taps [G, kh * kw, O'], parameters [G, 5, O'], O', O' rounded up to LANES): the O channels of
    wg [G, 1, kh, kw, O] and params repeated replicas times (O' = O * replicas), as both layouts take them."""
    groups, _, kh, kw, o = wg.shape
    taps = wg.reshape(groups, kh * kw, o)
    if replicas > 1:
        taps, params, o = (
            np.concatenate([taps] * replicas, axis=2),
            np.concatenate([params[:, :, :o]] * replicas, axis=2),
            o * replicas,
        )
    return taps, params, o, (o + LANES - 1) // LANES * LANES


def pair_layout(wg: np.ndarray, params: np.ndarray, replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """The weights [G, 1, kh, kw, O] int8 and output parameters [G, 5, O64] (the offset with
    -zp * sum w folded in) of the AVX2 vector runs: weights [G, O64 / 64, pairs, 4 (chunk), 16, 2 (tap)]
    int16 (tap 2 * pair + k of channel 64 * block + 16 * chunk + PAIR_ORDER[i]), parameters [G, 5, O64]
    with each chunk of 16 channels in PAIR_ORDER. replicas: the O channels that many times, as the
    channels of one block."""
    groups, _, kh, kw, _ = wg.shape
    taps, params, o, o64 = _replicated(wg, params, replicas)
    pairs = (kh * kw + PAIR - 1) // PAIR
    padded = np.zeros((groups, PAIR * pairs, o64), dtype=np.int16)
    padded[:, : kh * kw, :o] = taps
    wv = aligned.zeros((groups, o64 // LANES, pairs, LANES // CHUNK, CHUNK, PAIR), np.int16)
    blocks = padded.reshape(groups, pairs, PAIR, o64 // LANES, LANES // CHUNK, CHUNK)[..., PAIR_ORDER]
    wv[:] = blocks.transpose(0, 3, 1, 4, 5, 2)
    in_order = np.zeros((groups, params.shape[1], o64), np.int32)
    in_order[:, :, :o] = params[:, :, :o]
    vparams = aligned.zeros((groups, params.shape[1], o64), np.int32)
    vparams[:] = in_order.reshape(groups, -1, o64 // CHUNK, CHUNK)[..., PAIR_ORDER].reshape(in_order.shape)
    return wv, vparams


def vector_layout(wg: np.ndarray, params: np.ndarray, replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """The weights [G, 1, kh, kw, O] int8 and output parameters [G, 5, O64] (the offset with
    -(zp + 128) * sum w folded in) of the vector runs: weights [G, O64 / 64, quads, 4 (q), 64] int8,
    where byte 4i + k of accumulator q holds tap 4 * quad + k of the channel at position 16q + i of
    quad_order; parameters [G, 5, O64] permuted to the same positions. replicas: the O channels that
    many times, as the channels of one block."""
    groups, _, kh, kw, _ = wg.shape
    taps, params, o, o64 = _replicated(wg, params, replicas)
    quads = (kh * kw + GROUP - 1) // GROUP
    padded = np.zeros((groups, GROUP * quads, o64), dtype=np.int8)
    padded[:, : kh * kw, :o] = taps
    wv = aligned.zeros((groups, o64 // LANES, quads, 4, LANES), np.int8)
    vparams = aligned.zeros((groups, params.shape[1], o64), np.int32)
    for block, c0 in enumerate(range(0, o64, LANES)):
        channels = c0 + quad_order()
        chosen = padded[:, :, channels].reshape(groups, quads, GROUP, 4, 16)  # [G, quad, k, q, i]
        wv[:, block] = chosen.transpose(0, 1, 3, 4, 2).reshape(groups, quads, 4, LANES)
        vparams[:, :, c0 : c0 + LANES] = params[:, :, channels]
    return wv, vparams


class DepthwiseConv2D(SlidingWindow, Kernel):
    """variant: the form of the vector code, "vnni" where the interpreter's backend selection has
    an engine that runs AVX-512 VNNI (amx, vnni), "avx2" where its widest engine runs AVX2, else
    "generic" (backend="blas" runs it too): backend.Selection.depthwise_variant."""

    kind = "DEPTHWISE_CONV_2D"
    required_inputs, max_inputs = 2, 3
    takes_backends = True

    def __init__(self, op, graph, profile, backends: backend.Selection | None = None):
        super().__init__(op, graph, profile)
        self.variant = (backends or backend.select()).depthwise_variant()
        x, w, y = self.inputs[0], self.inputs[1], self.outputs[0]
        self.int16: Stage16 | None = None
        if not is_int16(x):
            self.require_int8(x, w, y)
        self.require_constant(w, "filter")
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4 or w.shape[0] != 1:
            raise self.error(
                f"expected 4-D input and output and a [1, kh, kw, C] filter, got {list(x.shape)}, "
                f"{list(w.shape)}, {list(y.shape)}"
            )
        o = self.options = op.options
        _, kh, kw, self.out_channels = w.shape
        in_c = x.shape[3]
        if self.out_channels % in_c:
            raise self.error(
                f"filter channels {self.out_channels} are not a multiple of input channels {in_c}"
            )
        self.multiplier = self.out_channels // in_c
        bias = self.inputs[2] if len(self.inputs) > 2 else None
        if not is_int16(x):
            self.require_bias(bias, self.out_channels)
        elif bias is not None and bias.dtype != np.int64:
            # TFLM's int16 depthwise reads the bias as int64 whatever its type.
            raise self.error(f"bias {bias.name!r} is {np.dtype(bias.dtype).name}, expected int64 (16x8)")
        self.in_image_shape = tuple(x.shape[1:])
        self.geometry = ConvGeometry.from_options(o, x.shape, kh, kw)
        if (self.out_h, self.out_w, self.out_channels) != tuple(y.shape[1:]):
            raise self.error(
                f"output shape {list(y.shape)} does not match the computed "
                f"[N, {self.out_h}, {self.out_w}, {self.out_channels}]"
            )
        self.unpadded_shape = None  # see fuse_pad
        if is_int16(x):  # 16x8: int16 activations, int8 weights (engines/int16.py)
            activation = o.get("fused_activation_function", "NONE")
            self.int16 = Stage16.prepare(self, x, w, bias, y, self.out_channels, activation)
            return
        self.stage = OutputStage.prepare(
            x, w, y, self.out_channels, o.get("fused_activation_function", "NONE"), self.profile
        )
        self.memo = WeightMemo()

    def fuse_pad(self, pad) -> bool:
        """Take over the spatial padding of the PAD kernel that feeds this op (as converters write
        SAME stride-2 depthwise layers: PAD, then VALID), if it pads with the input zero point: a
        padded tap then contributes (zp - zp) * w = 0, exactly as a skipped one. Interpreter.run then
        passes the unpadded input and the PAD's copy of a large activation is saved."""
        p = pad.paddings
        if (
            len(p) != 4
            or p[0].any()
            or p[3].any()
            or not p[1:3].any()
            or pad.value != self.inputs[0].zero_point
            or pad.inputs[0].dtype != np.int8
        ):
            return False
        self.unpadded_shape = tuple(pad.inputs[0].shape[1:])
        self.fused_pad = (int(p[1, 0]), int(p[2, 0]))
        return True

    def macs(self) -> int:
        return self.out_h * self.out_w * self.out_channels * self.kh * self.kw

    def workspace_bytes(self, n: int) -> int:
        return 0  # one int32 accumulator row per thread

    def __call__(self, x, w, b=None, shared=False):
        g = self.geometry
        if self.int16 is not None:
            if w.ndim != 4:
                raise self.error("grouped weights are not supported with int16 activations")
            if x.shape[1:] != self.in_image_shape:
                raise self.error(
                    f"input array has shape {list(x.shape)}, expected [N, {self.in_image_shape}]"
                )
            return self.int16(depthwise16(x, w, g, self.multiplier), b)
        pad_top, pad_left = g.pad
        if self.unpadded_shape is not None and x.shape[1:] == self.unpadded_shape:  # the fused PAD's input
            pad_top, pad_left = pad_top + self.fused_pad[0], pad_left + self.fused_pad[1]
        elif x.shape[1:] != self.in_image_shape:  # the Numba loop indexes by the planned shape, unchecked
            raise self.error(
                f"input array has shape {list(x.shape)}, expected [N, "
                f"{', '.join(map(str, self.in_image_shape))}]"
            )
        wg = w if w.ndim == 5 else w[None]
        groups = wg.shape[0]
        if shared:  # no reduction to share: give each group its own copy of the batch
            x = np.concatenate([x] * groups)
        replicas = (
            LANES // self.out_channels
            if self.multiplier == 1 and self.out_channels in (16, 32) and g.stride[1] == 1
            else 1
        )

        in_zp = self.inputs[0].zero_point

        def prepare():
            bias = (
                np.zeros((groups, self.out_channels), dtype=np.int64)
                if b is None
                else np.ascontiguousarray(
                    np.broadcast_to(b.reshape(-1, self.out_channels), (groups, self.out_channels)),
                    dtype=np.int64,
                )
            )
            weight_sums = wg.reshape(groups, -1, self.out_channels).sum(axis=1, dtype=np.int64)
            if self.variant == "avx2":  # signed activations: the offset takes zp, not zp + 128
                offset = bias - in_zp * weight_sums
                layout = pair_layout(wg, output_parameters(offset, self.stage, LANES), replicas)
            else:
                layout = vector_layout(
                    wg, output_parameters(bias - (in_zp + 128) * weight_sums, self.stage, LANES), replicas
                )
            return (output_parameters(bias, self.stage, LANES), *layout)

        params, wv, vparams = self.memo.get("depthwise", wg, b, prepare) if groups == 1 else prepare()
        out = aligned.empty((x.shape[0], self.out_h, self.out_w, self.out_channels), np.int8)
        s = self.stage
        depthwise_kernel(self.variant)(
            np.ascontiguousarray(x),
            np.ascontiguousarray(wg),
            wv,
            replicas,
            groups,
            self.multiplier,
            *g.stride,
            *g.dilation,
            pad_top,
            pad_left,
            np.int64(in_zp),
            params,
            vparams,
            np.int64(mac_profile(self.profile)),
            np.int64(s.zero_point),
            np.int64(s.lo),
            np.int64(s.hi),
            out,
        )
        return out
