"""ONNX Runtime's float Conv (MLAS's SGEMM order, kernels/mlas_float.py) as a register-tiled kernel.

The sums are mlas_float's, element by element: within a K block one float32 accumulator starts
at 0 and takes each product by a fused multiply-add in K order (vfmadd231ps), a later block's sum
is added to the earlier ones (`C = acc + C`), the bias last (or first, for a Gemm's). Only the
work is arranged differently: each lane of a vector is one output element (a filter of one output
position), so a tile of up to MR positions by nr vectors of `lanes` filters keeps its
accumulators in registers while K runs, each input value broadcast once per position and each
weight vector loaded once per tile; no im2col copy is made. The input is the dequantized,
zero-padded NHWC copy, and the K order (input channel, kernel row, kernel column: ORT's im2col
order) is a table of offsets from each position's corner, so strides, dilations and padding cost
nothing in the loop. Which lanes of a vector land in one output changes nothing of any element's
order: every lane is its own chain of roundings.

The kernel serves the convolutions whose filters all share one K-block length per output
position and are not the M = 1 kernel (mlas_float.conv_blocks: every CONV_2D of group 1 but a
one-filter layer); the rest keep mlas_float's loops.
"""

from __future__ import annotations

import functools

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils

from . import aligned, host
from .jit import ParallelKernel, njit, parallel_kernel, renamed
from .microkernel import int64_intrinsic

MR = 12  # output positions per kernel call
ROUNDER = np.float32(12582912.0)  # 1.5 * 2^23
TILES_PER_TASK = 8  # kernel calls' worth of positions per parallel task
_I64, _F32 = ir.IntType(64), ir.FloatType()

_ARGS = """nr x_ptr bases_ptr koff_ptr k0 k1 w_ptr w_stride tile_ptr tile_stride rows first last bias_ptr
    params_ptr zp out_ptr out_stride width sums_ptr"""


def accumulators() -> int:
    """The vector accumulators a tile keeps: 24 of the 32 ZMM with AVX-512, 12 of the 16 YMM else."""
    return 24 if host.has_vnni() else 12


def tile_rows(nr: int, max_acc: int) -> int:
    """Positions per register tile at nr vectors: the largest divisor of MR whose tile fits."""
    return max(d for d in range(1, MR + 1) if MR % d == 0 and d * nr <= max_acc)


@functools.cache
def sgemm_tile(lanes: int, max_nr: int, max_acc: int):
    """t[r, lanes * j + l] = sum over k0 <= k < k1 of x[bases[r] + koff[k]] * w[k, lanes * j + l], one
    accumulator per element from 0, fused multiply-adds in k order, for r < rows (at most MR) and
    j < nr (1 to max_nr); unless `first`, plus the tile's value (float32 rows of tile_stride bytes;
    w: float32 rows of w_stride bytes). Unless `last`, t is stored to the tile; else the output
    stage: + bias (float32 vectors at bias_ptr, unless 0), MlasQuantizeLinear (params_ptr: float32
    y_scale, lo, hi; zp) to the int8 rows of out_stride bytes at out_ptr, the first `width` lanes
    of the block; and the float results to sums_ptr (rows of 4 * out_stride bytes) unless 0."""

    @int64_intrinsic(_ARGS)
    def kernel(builder, a):
        done = builder.append_basic_block("done")
        default = builder.append_basic_block("nr_out_of_range")
        switch = builder.switch(a.nr, default)
        for nr in range(1, max_nr + 1):
            body = builder.append_basic_block(f"nr{nr}")
            switch.add_case(ir.Constant(_I64, nr), body)
            builder.position_at_end(body)
            rows = tile_rows(nr, max_acc)
            for first in range(0, MR, rows):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, first), a.rows)):
                    _tile(builder, lanes, nr, a, range(first, first + rows))
            builder.branch(done)
        builder.position_at_end(default)  # callers pass 1 <= nr <= max_nr
        builder.branch(done)
        builder.position_at_end(done)

    return kernel


def _splat(builder, value, lanes: int):
    vec = ir.VectorType(_F32, lanes)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(
        one, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
    )


def _fma(builder, a, b, c):
    """a * b + c per lane, rounded once (llvm.fma on vectors: vfmadd231ps)."""
    ty = a.type
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ty, [ty] * 3), f"llvm.fma.v{ty.count}f32"
    )
    return builder.call(fn, [a, b, c])


def _tile(builder, lanes: int, nr: int, a, rows: range):
    vec = ir.VectorType(_F32, lanes)
    i8p = ir.IntType(8).as_pointer()
    x = builder.inttoptr(a.x_ptr, _F32.as_pointer())
    bases = builder.inttoptr(a.bases_ptr, _I64.as_pointer())
    koff = builder.inttoptr(a.koff_ptr, _I64.as_pointer())
    w = builder.inttoptr(a.w_ptr, i8p)
    base = {r: builder.load(builder.gep(bases, [ir.Constant(_I64, r)])) for r in rows}
    accs = {r: [cgutils.alloca_once_value(builder, ir.Constant(vec, None)) for _ in range(nr)] for r in rows}
    with cgutils.for_range_slice(builder, a.k0, a.k1, ir.Constant(_I64, 1)) as (k, _):
        off = builder.load(builder.gep(koff, [k]))
        row = builder.gep(w, [builder.mul(k, a.w_stride)])
        wv = [
            builder.load(
                builder.bitcast(builder.gep(row, [ir.Constant(_I64, 4 * lanes * j)]), vec.as_pointer()),
                align=4,
            )
            for j in range(nr)
        ]
        for r in rows:
            xv = _splat(builder, builder.load(builder.gep(x, [builder.add(base[r], off)])), lanes)
            for j in range(nr):
                builder.store(_fma(builder, xv, wv[j], builder.load(accs[r][j])), accs[r][j])
    tile = builder.inttoptr(a.tile_ptr, i8p)
    first = builder.icmp_signed("!=", a.first, ir.Constant(_I64, 0))
    last = builder.icmp_signed("!=", a.last, ir.Constant(_I64, 0))
    stage = _Stage(builder, lanes, a)
    for r in rows:
        with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), a.rows)):
            start = builder.mul(a.tile_stride, ir.Constant(_I64, r))
            for j in range(nr):
                p = builder.gep(tile, [builder.add(start, ir.Constant(_I64, 4 * lanes * j))])
                p = builder.bitcast(p, vec.as_pointer())
                acc = builder.load(accs[r][j])
                t = builder.select(first, acc, builder.fadd(acc, builder.load(p, align=4)))
                with builder.if_else(last) as (then, otherwise):
                    with then:
                        stage.store(t, r, j)
                    with otherwise:
                        builder.store(t, p, align=4)


class _Stage:
    """The output stage of _tile's vectors (sgemm_tile's docstring): y = t (+ bias), q =
    min(max(y / y_scale, lo), hi), rounded half to even as (q + 1.5 * 2^23) - 1.5 * 2^23 (exact for
    |q| < 2^22), + zp, to int8."""

    def __init__(self, builder, lanes, a):
        self.b, self.lanes, self.a = builder, lanes, a
        self.vec = ir.VectorType(_F32, lanes)
        params = builder.inttoptr(a.params_ptr, _F32.as_pointer())
        self.scale, self.lo, self.hi = (
            _splat(builder, builder.load(builder.gep(params, [ir.Constant(_I64, i)])), lanes)
            for i in range(3)
        )
        self.rounder = ir.Constant(self.vec, [float(ROUNDER)] * lanes)
        i32v = ir.VectorType(ir.IntType(32), lanes)
        zp = builder.trunc(a.zp, ir.IntType(32))
        one = builder.insert_element(ir.Constant(i32v, ir.Undefined), zp, ir.Constant(ir.IntType(32), 0))
        self.zp = builder.shuffle_vector(one, ir.Constant(i32v, ir.Undefined), ir.Constant(i32v, [0] * lanes))
        self.has_bias = builder.icmp_signed("!=", a.bias_ptr, ir.Constant(_I64, 0))
        self.has_sums = builder.icmp_signed("!=", a.sums_ptr, ir.Constant(_I64, 0))

    def store(self, t, r, j):
        b, lanes, a = self.b, self.lanes, self.a
        first = ir.Constant(_I64, lanes * j)
        bias_at = b.select(self.has_bias, b.add(a.bias_ptr, ir.Constant(_I64, 4 * lanes * j)), a.params_ptr)
        bias = b.load(b.inttoptr(bias_at, self.vec.as_pointer()), align=4)  # params_ptr: any valid address
        y = b.select(self.has_bias, b.fadd(t, bias), t)
        q = b.fdiv(y, self.scale)
        q = b.select(b.fcmp_ordered("<", q, self.lo), self.lo, q)
        q = b.select(b.fcmp_ordered(">", q, self.hi), self.hi, q)
        q = b.fsub(b.fadd(q, self.rounder), self.rounder)
        codes = b.add(b.fptosi(q, ir.VectorType(ir.IntType(32), lanes)), self.zp)
        codes = b.trunc(codes, ir.VectorType(ir.IntType(8), lanes))
        row = b.add(b.mul(a.out_stride, ir.Constant(_I64, r)), first)
        width = b.sub(a.width, first)
        _store(b, codes, b.add(a.out_ptr, row), width, lanes)
        with b.if_then(self.has_sums):
            _store(b, y, b.add(a.sums_ptr, b.mul(row, ir.Constant(_I64, 4))), width, lanes)


def _store(b, v, address, width, lanes):
    """The first min(width, lanes) lanes of v at address: one vector store when all fit."""
    whole = b.icmp_signed(">=", width, ir.Constant(_I64, lanes))
    elem = v.type.element
    with b.if_else(whole) as (then, otherwise):
        with then:
            b.store(v, b.inttoptr(address, v.type.as_pointer()), align=1)
        with otherwise:
            base = b.inttoptr(address, elem.as_pointer())
            for lane in range(lanes):
                with b.if_then(b.icmp_signed(">", width, ir.Constant(_I64, lane))):
                    b.store(
                        b.extract_element(v, ir.Constant(ir.IntType(32), lane)),
                        b.gep(base, [ir.Constant(_I64, lane)]),
                    )


@njit(inline="always")
def _epilogue(t, bias, bias_first, y_scale, lo, hi, y_zp, out):
    """out[f] = MlasQuantizeLinear of t[f] (+ bias[f] unless bias_first): divide, clamp, round half
    to even, add the zero point."""
    for f in range(out.size):
        y = t[f] if bias_first else t[f] + bias[f]
        q = min(max(y / y_scale, lo), hi)
        # half to even: |q| < 2^22, so q + 1.5 * 2^23 rounds q to an integer (ulp 1) and the
        # subtraction is exact (np.rint's call does not vectorize)
        out[f] = np.int8(np.int32((q + ROUNDER) - ROUNDER) + y_zp)


@njit(inline="always")
def _sums(t, bias, bias_first, out):
    for f in range(out.size):
        out[f] = t[f] if bias_first else t[f] + bias[f]


LANES = MAX_NR = 0  # globals of the template, bound per form (tiled_conv)
sgemm = None  # the template's kernel: sgemm_tile(LANES, MAX_NR, accumulators()), bound by tiled_conv


def _tiled(xp, koff, wp, bias, bias_first, geometry, blocks, y_scale, y_zp, out, sums):
    """out[b, oy, ox, f] = QuantizeLinear of the sum over k of xp[b, oy * sh + ky * dh, ox * sw + kx
    * dw, c] * wp[k, f] in MLAS's order (blocks[oy * OW + ox]: the K block length), + bias[f] (first
    if bias_first, else last). xp: NHWC float32, zero-padded; koff[k]: the offset of k's tap and
    channel from a position's corner in xp; wp [K, Fp] float32, Fp a multiple of LANES (zeros
    past F); bias [Fp]. sums: float32 like out for the results before QuantizeLinear, or empty. The
    template of the kernels that tiled_conv compiles, where sgemm stands for sgemm_tile(LANES,
    MAX_NR, .)."""
    batch, hp, wp_, channels = xp.shape
    oh, ow, filters = out.shape[1], out.shape[2], out.shape[3]
    depth, fp = wp.shape
    sh, sw = geometry[2], geometry[3]
    keep = sums.size > 0
    pixels = oh * ow
    total = batch * pixels
    params = np.zeros(16, np.float32)  # 64 bytes: also the address of a bias load that is not used
    params[0], params[1], params[2] = y_scale, np.float32(-128 - y_zp), np.float32(127 - y_zp)
    per_task = MR * TILES_PER_TASK
    tasks = (total + per_task - 1) // per_task
    block_w = LANES * MAX_NR
    bias_ptr = 0 if bias_first else bias.ctypes.data
    for task in nb.prange(tasks):
        bases = np.empty(MR, np.int64)
        tile = np.empty((MR, fp), np.float32)
        p = task * per_task
        end = min(total, p + per_task)
        b = p // pixels  # the position p, then stepped one at a time
        oy = (p - b * pixels) // ow
        ox = p - b * pixels - oy * ow
        while p < end:
            block = blocks[p % pixels]
            rows = 1
            while rows < MR and p + rows < end and blocks[(p + rows) % pixels] == block:
                rows += 1
            for r in range(MR):  # past rows the last position repeats; then (b, oy, ox) is p + rows
                bases[r] = ((b * hp + oy * sh) * wp_ + ox * sw) * channels
                if r < rows - 1 or r == MR - 1:
                    ox += 1
                    if ox == ow:
                        ox = 0
                        oy += 1
                        if oy == oh:
                            oy = 0
                            b += 1
            if bias_first:
                for r in range(rows):
                    for f in range(filters):
                        tile[r, f] = bias[f]
            for cb in range(0, fp, block_w):
                nr = min(MAX_NR, (fp - cb) // LANES)
                k0 = 0
                while k0 < depth:
                    k1 = min(k0 + block, depth)
                    sgemm(
                        nr, xp.ctypes.data, bases.ctypes.data, koff.ctypes.data, k0, k1,
                        wp.ctypes.data + cb * 4, fp * 4, tile.ctypes.data + cb * 4, fp * 4, rows,
                        1 if (k0 == 0 and not bias_first) else 0, 1 if k1 == depth else 0,
                        0 if bias_ptr == 0 else bias_ptr + cb * 4, params.ctypes.data, y_zp,
                        out.ctypes.data + p * filters + cb, filters, filters - cb,
                        sums.ctypes.data + (p * filters + cb) * 4 if keep else 0,
                    )  # fmt: skip
                    k0 = k1
            p += rows
    return out


def _work(args) -> int:
    """A call's multiply-adds / 8 (ParallelKernel's measure of work)."""
    wp, out = args[2], args[9]
    return out.size * wp.shape[0] // 8


@functools.cache
def tiled_conv(lanes: int) -> ParallelKernel:
    """_tiled with vectors of `lanes` float32 (16: ZMM, 8: YMM), under its own name."""
    max_acc = accumulators()
    max_nr = 4
    name = f"l{lanes}_a{max_acc}"
    fn = renamed(_tiled, name, sgemm=sgemm_tile(lanes, max_nr, max_acc), LANES=lanes, MAX_NR=max_nr)
    return ParallelKernel(fn, work=_work)


def lanes_for(filters: int) -> int:
    """16 lanes (one ZMM) with AVX-512 unless the filters fill half a vector or less, else 8."""
    return 16 if host.has_vnni() and filters > 8 else 8


def pack_weights(wt: np.ndarray, lanes: int) -> np.ndarray:
    """wt [K, F] float32 -> [K, Fp] (Fp: F rounded up to lanes, zeros past F), 64-byte aligned."""
    depth, filters = wt.shape
    fp = -(-filters // lanes) * lanes
    out = aligned.zeros((depth, fp), np.float32)
    out[:, :filters] = wt
    return out


def tap_offsets(channels: int, kh: int, kw: int, dh: int, dw: int, padded_w: int) -> np.ndarray:
    """koff[k] for k = (c * kh + ky) * kw + kx: the offset of (ky, kx, c) from a position's corner in
    the padded NHWC input of width padded_w."""
    c, ky, kx = np.meshgrid(np.arange(channels), np.arange(kh), np.arange(kw), indexing="ij")
    return np.ascontiguousarray(((ky * dh * padded_w + kx * dw) * channels + c).reshape(-1), np.int64)


@njit
def dequantize_nhwc(x, x_scale, x_zp, pt, pl, out):
    """out[b, pt + y, pl + x, c] = (x[b, y, x, c] - x_zp) * x_scale in float32; out is zero elsewhere."""
    batch, height, width, channels = x.shape
    hp, wp = out.shape[1], out.shape[2]
    src = x.reshape(x.size)
    dst = out.reshape(out.size)
    row = width * channels
    for b in range(batch):
        for y in range(height):
            s = (b * height + y) * row
            d = ((b * hp + pt + y) * wp + pl) * channels
            v, o = src[s : s + row], dst[d : d + row]  # views from 0: LLVM vectorizes their loop
            for i in range(row):
                o[i] = np.float32(np.int32(v[i]) - x_zp) * x_scale
    return out


M1_FLAG = 1 << 30  # mlas_float.M1_FLAG (a block length above it: MlasSgemmKernelM1Avx's order)


@parallel_kernel
def depthwise_m1(xp, wd, bias, geometry, blocks, y_scale, y_zp, out, sums):
    """A depthwise Conv (one input channel and one filter per group) in MlasConv's order for it, the
    M = 1 kernel per group: within each K block of blocks[p] - M1_FLAG, groups of 4 taps (then 2,
    then 1) multiplied and added left to right without fused multiply-adds, each group's sum added
    to the earlier ones, then + bias[c] and QuantizeLinear; the channels of NHWC side by side, one
    per lane. xp: NHWC float32, zero-padded; wd [K, C], K = kh * kw (kernel row, column); sums as
    in _tiled."""
    batch, hp, wp, channels = xp.shape
    oh, ow = out.shape[1], out.shape[2]
    kh, kw, sh, sw, dh, dw = geometry[0], geometry[1], geometry[2], geometry[3], geometry[4], geometry[5]
    depth = kh * kw
    keep = sums.size > 0
    lo, hi = np.float32(-128 - y_zp), np.float32(127 - y_zp)
    src = xp.reshape(xp.size)
    flat_out = out.reshape(out.size)
    flat_sums = sums.reshape(sums.size)
    for bp in nb.prange(batch * oh):
        b = bp // oh
        oy = bp - b * oh
        offs = np.empty(depth, np.int64)
        t = np.empty(channels, np.float32)
        tot = np.empty(channels, np.float32)
        for ox in range(ow):
            corner = ((b * hp + oy * sh) * wp + ox * sw) * channels
            for ky in range(kh):
                for kx in range(kw):
                    offs[ky * kw + kx] = corner + (ky * dh * wp + kx * dw) * channels
            size = blocks[oy * ow + ox] - M1_FLAG
            first = True
            k0 = 0
            while k0 < depth:
                k1 = min(k0 + size, depth)
                kk = k0
                while kk < k1:
                    kn = kk + (4 if k1 - kk >= 4 else (2 if k1 - kk >= 2 else 1))
                    xs, ws = src[offs[kk] : offs[kk] + channels], wd[kk]
                    for c in range(channels):
                        t[c] = xs[c] * ws[c]
                    for i in range(kk + 1, kn):
                        xs, ws = src[offs[i] : offs[i] + channels], wd[i]
                        for c in range(channels):
                            t[c] = t[c] + xs[c] * ws[c]
                    if first:
                        for c in range(channels):
                            tot[c] = t[c]
                    else:
                        for c in range(channels):
                            tot[c] = t[c] + tot[c]
                    first = False
                    kk = kn
                k0 = k1
            dst = (bp * ow + ox) * channels
            _epilogue(tot, bias, False, y_scale, lo, hi, y_zp, flat_out[dst : dst + channels])
            if keep:
                _sums(tot, bias, False, flat_sums[dst : dst + channels])
    return out


@parallel_kernel
def one_filter_m1(xp, koff, w, bias, bias_first, geometry, blocks, y_scale, y_zp, out, sums):
    """A Conv of one filter (group 1) in MlasSgemmKernelM1Avx's order: per output position, within
    each K block of blocks[p] - M1_FLAG, groups of 4 products (then 2, then 1) multiplied and added
    left to right, each group's sum added to the earlier ones (from the bias if bias_first), then
    the bias (unless first) and QuantizeLinear. xp, koff as in _tiled; w [K]; sums as in _tiled."""
    batch, hp, wp, channels = xp.shape
    oh, ow = out.shape[1], out.shape[2]
    sh, sw = geometry[2], geometry[3]
    depth = w.size
    keep = sums.size > 0
    lo, hi = np.float32(-128 - y_zp), np.float32(127 - y_zp)
    src = xp.reshape(xp.size)
    flat_out = out.reshape(out.size)
    flat_sums = sums.reshape(sums.size)
    for bp in nb.prange(batch * oh):
        b = bp // oh
        oy = bp - b * oh
        for ox in range(ow):
            x = src[((b * hp + oy * sh) * wp + ox * sw) * channels :]
            size = blocks[oy * ow + ox] - M1_FLAG
            first = not bias_first
            tot = bias[0] if bias_first else np.float32(0.0)
            k0 = 0
            while k0 < depth:
                k1 = min(k0 + size, depth)
                kk = k0
                while kk < k1:
                    kn = kk + (4 if k1 - kk >= 4 else (2 if k1 - kk >= 2 else 1))
                    t = x[koff[kk]] * w[kk]
                    for i in range(kk + 1, kn):
                        t = t + x[koff[i]] * w[i]
                    tot = t if first else t + tot
                    first = False
                    kk = kn
                k0 = k1
            y = tot if bias_first else tot + bias[0]
            q = min(max(y / y_scale, lo), hi)
            flat_out[bp * ow + ox] = np.int8(np.int32((q + ROUNDER) - ROUNDER) + y_zp)
            if keep:
                flat_sums[bp * ow + ox] = y
    return out
