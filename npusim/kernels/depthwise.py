"""The engine of DEPTHWISE_CONV_2D (ops/depthwise.py): per-channel int8 depthwise convolution with
depth multiplier (TFLM reference_integer_ops/depthwise_conv.h). Output channel c_out = c_in * multiplier + m,
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

from ..errors import NpusimError
from . import aligned, host
from .jit import ParallelKernel, njit, parallel_kernel, renamed
from .microkernel import int64_intrinsic, packs_to_bytes, pmaddwd_add, prefetch_range, vpdpbusd
from .output_stage import (
    each_stage,
    lane_mask,
    load_bytes,
    load_parameters,
    output_parameters,
    output_stage_row,
    store_bytes,
    vector_output_stage,
)

LANES = 64  # channels (bytes) per vector block
GROUP = 4  # taps per VPDPBUSD, in the vnni and generic layouts (int8 weights)
PAIR = 2  # taps per VPMADDWD
CHUNK = 16  # channels of one tap per 16-byte load in the AVX2 form
# The channel (within a chunk of 16) at each position 8 h + j of the AVX2 form's two accumulators
# h: in-lane word interleaves put channels 0-3, 8-11 in the first and 4-7, 12-15 in the second.
PAIR_ORDER = np.array([0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])
ROWS_PER_TASK = 8  # output rows per parallel task
PREFETCH_ROWS = 2  # output rows ahead whose input rows are prefetched
# The arguments of tap_quads_run (all int64), in both forms.
RUN_ARGS = """x_ptr x_step taps_ptr n_quads w_ptr n_pixels out_ptr out_step count params_ptr params_stride
    stage zero_point lo hi"""


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

        for kind in each_stage(builder, a.stage):
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
                    vector_output_stage(builder, builder.load(slot), p, kind, a.zero_point, a.lo, a.hi)
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

        def pixels(chunk, kind, left):
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
                        builder, builder.load(slot), p, kind, a.zero_point, a.lo, a.hi, narrow=False
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

        for kind in each_stage(builder, a.stage):
            for chunk in range(LANES // CHUNK):
                left = builder.sub(a.count, ir.Constant(i64, CHUNK * chunk))
                with builder.if_then(builder.icmp_signed(">", left, ir.Constant(i64, 0))):
                    full = builder.icmp_signed(">=", left, ir.Constant(i64, CHUNK))
                    with builder.if_else(full) as (whole, part):
                        with whole:
                            pixels(chunk, kind, None)
                        with part:
                            pixels(chunk, kind, left)

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


@njit(inline="always")
def prefetch_ahead(x, row, rows, out_h, stride_h, pad_top, kh, dil_h):
    """The input rows of output row row + PREFETCH_ROWS that the row before it does not read,
    fetched while this one computes: a large batch's input comes from memory, at a stride (2 rows
    per output row at stride 2) that left the kernel waiting on it."""
    _, in_h, in_w, in_c = x.shape
    ahead = row + PREFETCH_ROWS
    if ahead < rows:
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


def vector_run(x, n, oy, ox0, pixels, border, window, taps, edge_taps, n_quads, pad_row, weights, out, stage):
    """Multiplier 1: `pixels` output pixels of row (n, oy) from column ox0, as vector code on 64
    channels at a time (replicas > 1: `replicas` adjacent pixels per vector). Two stages use it:
    the interior run, the columns whose taps all fall inside the image width (border False), and
    each border pixel alone (border True), whose padding taps read the row of zero points. The
    first tap is at input pixel (iy0, ix0), which may lie outside the image (it is only a base for
    the offsets); in a row at the top or bottom, taps in rows outside the image read the row of
    zero points too. window: (kh, kw, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, ox_lo,
    ox_hi); weights: (address of the group's vector weights, bytes per block of 64 channels, address
    of its vector parameters, channels of the vector layout, replicas); stage: (profile, output zero
    point, lo, hi). Compiled per variant with its tap_quads_run (depthwise_kernel)."""
    _, in_h, in_w, in_c = x.shape
    _, out_h, out_w, out_c = out.shape
    kh, kw, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, _, _ = window
    w_group, block_bytes, v_group, v_channels, replicas = weights
    profile, out_zp, lo, hi = stage
    iy0 = oy * stride_h - pad_top
    ix0 = ox0 * stride_w - pad_left
    x_first = np.int64(x.ctypes.data) + ((n * in_h + iy0) * in_w + ix0) * in_c
    run_taps = taps
    if border or iy0 < 0 or iy0 + (kh - 1) * dil_h >= in_h:
        pad_address = np.int64(pad_row.ctypes.data)
        tap_offsets(taps, kh, kw, dil_h, dil_w, in_h, in_w, in_c, iy0, ix0, x_first, pad_address, edge_taps)
        run_taps = edge_taps
    out_first = out.ctypes.data + ((n * out_h + oy) * out_w + ox0) * out_c
    if replicas > 1 and not border:  # adjacent pixels in_c bytes apart: `replicas` pixels per vector
        tap_quads_run(
            x_first,
            replicas * in_c,
            run_taps.ctypes.data,
            n_quads,
            w_group,
            pixels // replicas,
            out_first,
            replicas * out_c,
            replicas * out_c,
            v_group,
            v_channels * 4,
            profile,
            out_zp,
            lo,
            hi,
        )
        left = pixels % replicas
        if left:  # the last pixels: the lanes past them are neither read nor stored
            tap_quads_run(
                x_first + (pixels - left) * in_c,
                0,
                run_taps.ctypes.data,
                n_quads,
                w_group,
                1,
                out_first + (pixels - left) * out_c,
                0,
                left * out_c,
                v_group,
                v_channels * 4,
                profile,
                out_zp,
                lo,
                hi,
            )
        return
    for c0 in range(0, out_c, LANES):  # (replicas > 1, a border pixel: the first out_c lanes)
        tap_quads_run(
            x_first + c0,
            stride_w * in_c,
            run_taps.ctypes.data,
            n_quads,
            w_group + c0 // LANES * block_bytes,
            pixels,
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


@njit(inline="always")
def multiplier_pixel(x, w, n, oy, ox, g, multiplier, in_zp, window, acc, params, out, stage):
    """Stage 3, multiplier > 1: output pixel (n, oy, ox) in a scalar loop over the taps inside the
    image (TFLM skips the others), the input channels and the multiplier, into the int32
    accumulators acc, then the output stage (output_stage_row, params in channel order). Arguments
    as vector_run's."""
    _, in_h, in_w, in_c = x.shape
    _, out_h, out_w, out_c = out.shape
    kh, kw, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, _, _ = window
    profile, out_zp, lo, hi = stage
    iy0 = oy * stride_h - pad_top
    zp = np.int32(in_zp)
    acc[:] = 0  # the bias is the stage's offset
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
                    acc[oc] += xv * np.int32(ws[oc])
    o_padded = params.shape[2]
    output_stage_row(
        acc.ctypes.data,
        params.ctypes.data + g * params.shape[1] * o_padded * 4,
        o_padded * 4,
        out.ctypes.data + ((n * out_h + oy) * out_w + ox) * out_c,
        out_c,
        profile,
        out_zp,
        lo,
        hi,
    )


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
    taps_per_group,
    weight_bytes,
    out,
):
    """The rows of the batch in parallel tasks, each row in its stages: the interior vector runs,
    the border pixels, or (multiplier > 1) the scalar loop. params: the output parameters of the
    scalar loop (channel order); wv and vparams: the weights and parameters of the vector runs (see
    vector_layout). replicas > 1 (16 or 32 channels, multiplier 1, stride 1 along the width): wv and
    vparams hold the channels that many times, and one 64-lane vector computes as many adjacent
    output pixels. taps_per_group and weight_bytes: the ISA's taps per multiply-accumulate (4 on
    VPDPBUSD, 2 on VPMADDWD) and bytes per weight of its layout. The template of the kernels that
    depthwise_kernel compiles, not called itself."""
    n_batch, in_h, in_w, in_c = x.shape
    _, out_h, out_w, out_c = out.shape
    kh, kw = w.shape[2], w.shape[3]
    per_group = n_batch // groups
    o_padded = params.shape[2]  # channels, padded to a multiple of LANES
    v_channels = vparams.shape[2]  # of the vector layout: a multiple of LANES (64 when replicated)
    # Output columns whose taps all fall inside the image, [ox_lo, ox_hi), and the tap offsets, in
    # groups of taps_per_group (the taps past the last repeat it; their weights are zero).
    ox_lo = min(out_w, (pad_left + stride_w - 1) // stride_w)
    ox_hi = max(ox_lo, min(out_w, (in_w - 1 + pad_left - (kw - 1) * dil_w) // stride_w + 1))
    window = (kh, kw, stride_h, stride_w, dil_h, dil_w, pad_top, pad_left, ox_lo, ox_hi)
    stage = (profile, out_zp, lo, hi)
    n_quads = (kh * kw + taps_per_group - 1) // taps_per_group
    taps = np.empty(taps_per_group * n_quads, dtype=np.int64)
    for ky in range(kh):
        for kx in range(kw):
            taps[ky * kw + kx] = ((ky * dil_h) * in_w + kx * dil_w) * in_c
    taps[kh * kw :] = taps[kh * kw - 1]
    block_bytes = n_quads * taps_per_group * LANES * weight_bytes  # vector weights of 64 channels
    # A row of zero points: the padding taps read it (and so contribute (zp + 128) * w, which the
    # folded bias takes back, as TFLM skips them).
    pad_row = np.empty(in_w * in_c, dtype=np.int8)
    pad_row[:] = in_zp
    vector = multiplier == 1
    runs = vector and ox_hi > ox_lo  # the columns [ox_lo, ox_hi) of each row, as vector runs
    rows = n_batch * out_h
    n_tasks = (rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in nb.prange(n_tasks):
        # Per task, not per row: an allocation per row cost as much as a small layer's arithmetic.
        edge_taps = np.empty(taps_per_group * n_quads, dtype=np.int64)  # taps of a run or pixel at an edge
        scratch = np.empty(o_padded + 16, dtype=np.int32)
        start = (-scratch.ctypes.data // 4) % 16  # vector loads of the output stage on cache lines
        acc = scratch[start : start + o_padded]  # int32 accumulators, as TFLM's
        for row in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            n = row // out_h
            oy = row - n * out_h
            g = n // per_group
            prefetch_ahead(x, row, rows, out_h, stride_h, pad_top, kh, dil_h)
            weights = (
                wv.ctypes.data + g * (v_channels // LANES) * block_bytes,
                block_bytes,
                vparams.ctypes.data + g * vparams.shape[1] * v_channels * 4,
                v_channels,
                replicas,
            )
            if runs:  # stage 1: the interior run
                vector_run(
                    x,
                    n,
                    oy,
                    ox_lo,
                    ox_hi - ox_lo,
                    False,
                    window,
                    taps,
                    edge_taps,
                    n_quads,
                    pad_row,
                    weights,
                    out,
                    stage,
                )
            for ox in range(out_w):
                if runs and ox_lo <= ox < ox_hi:
                    continue
                if vector:  # stage 2: a border pixel
                    vector_run(
                        x, n, oy, ox, 1, True, window, taps, edge_taps, n_quads, pad_row, weights, out, stage
                    )
                else:  # stage 3: multiplier > 1
                    multiplier_pixel(x, w, n, oy, ox, g, multiplier, in_zp, window, acc, params, out, stage)
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
        raise NpusimError("the VNNI depthwise kernel does not run on this host (see npusim/kernels/host.py)")
    if variant == "avx2" and not host.has_avx2():
        raise NpusimError("the AVX2 depthwise kernel does not run on this host (see npusim/kernels/host.py)")
    run = _tap_pairs_run() if variant == "avx2" else _tap_quads_run(variant == "vnni")
    # The vector run (interior and border stages) compiled with the variant's instructions; the
    # template with it. Numba takes no intrinsic as an argument: this one name is bound per variant,
    # the ISA's numbers are arguments (isa_parameters).
    stage = njit(inline="always")(renamed(vector_run, variant, tap_quads_run=run))
    return parallel_kernel(renamed(depthwise_conv, variant, vector_run=stage))


def isa_parameters(variant: str) -> tuple[int, int]:
    """(taps per multiply-accumulate, bytes per weight) of a variant's vector layout: the last two
    scalar arguments of its kernel."""
    return (PAIR, 2) if variant == "avx2" else (GROUP, 1)  # int16 weight pairs, or int8 quads


def replicas_for(multiplier: int, channels: int, stride_w: int, variant: str) -> int:
    """How many adjacent output pixels one 64-lane vector computes, with multiplier 1 and stride 1
    along the width (else 1): 4 or 2 for 16 or 32 channels; the AVX2 form, which works in chunks of
    16 channels and loads or stores a partial chunk lane by lane, also takes as many pixels as fill
    whole chunks (8 for 8 channels, 4 for 12, 2 for 24: BlazeFace's 64x64x24 layers had run one
    pixel per vector, 16 lanes plus 8 lane by lane)."""
    if multiplier != 1 or stride_w != 1:
        return 1
    if variant != "avx2":
        return LANES // channels if channels in (16, 32) else 1
    return max((r for r in range(1, LANES // channels + 1) if r * channels % CHUNK == 0), default=1)


def prepared_weights(variant, wg, b, in_zp: int, stage, replicas: int):
    """(params, wv, vparams) of weights wg [G, 1, kh, kw, O] and bias b ([O], [G, O] or None): the
    output parameters of the scalar loop (channel order) and the vector runs' weights and parameters
    in the variant's layout, the activations' offset folded into the bias (zp + 128: VNNI and generic
    make activations unsigned; zp: AVX2 keeps their sign)."""
    groups, o = wg.shape[0], wg.shape[-1]
    bias = (
        np.zeros((groups, o), dtype=np.int64)
        if b is None
        else np.ascontiguousarray(np.broadcast_to(b.reshape(-1, o), (groups, o)), dtype=np.int64)
    )
    weight_sums = wg.reshape(groups, -1, o).sum(axis=1, dtype=np.int64)
    if variant == "avx2":
        layout = pair_layout(wg, output_parameters(bias - in_zp * weight_sums, stage, LANES), replicas)
    else:
        offset = bias - (in_zp + 128) * weight_sums
        layout = vector_layout(wg, output_parameters(offset, stage, LANES), replicas)
    return (output_parameters(bias, stage, LANES), *layout)


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
