"""ONNX Runtime's float32 convolution and matrix product (MLAS on x86-64 with FMA3 or AVX-512F), in
the order it adds the products: what ORT runs for a Conv, Gemm or MatMul between DequantizeLinear
and QuantizeLinear with its optimizations off (docs/numerics.md, the onnxruntime profile).

MLAS computes a float Conv as im2col + SGEMM (mlas/lib/convolve.cpp), Gemm and MatMul as SGEMM
(mlas/lib/sgemm.cpp). Every output element is a sum over K taken in blocks:

- within a block, one float32 accumulator starts at 0 and takes each product by a fused
  multiply-add, in K order (SgemmKernelFma3 / SgemmKernelAvx512F: vbroadcastss + vfmadd231ps);
- the blocks are added to the output one by one (the first block is stored, later ones added:
  the kernels' ZeroMode, then `C = acc * alpha + C` with alpha 1);
- a Conv's bias is added last (MlasActivation), a Gemm's first (ORT copies it into C, beta 1).

The block length StrideK follows the width of the slice of output columns a thread computes
(StrideK doubles while StrideN halves to fit the slice), and that slice follows the thread count:
`block_lengths` computes it per output column from the MLAS rules. A GEMM with one row of A and a
B that is not prepacked runs MlasSgemmKernelM1Avx instead: K in groups of 4 (then 2, then 1),
each group's products multiplied and added left to right without FMA, then added to C.

The K order of a Conv is ORT's im2col order: input channel, then kernel row, then kernel column.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.core import types
from numba.extending import intrinsic

from . import mlas_tile
from .jit import parallel_kernel

STRIDE_N, STRIDE_K = 128, 128  # MLAS_SGEMM_STRIDEN, MLAS_SGEMM_STRIDEK
PACKED_STRIDE_K = 256  # MLAS_SGEMM_PACKED_STRIDEK: a prepacked B (a constant Gemm / MatMul weight)
THREAD_ALIGN = 16  # MLAS_SGEMM_STRIDEN_THREAD_ALIGN
THREAD_COMPLEXITY = 64 * 1024  # MLAS_SGEMM_THREAD_COMPLEXITY: multiplies per extra thread
MAX_THREADS = 16  # MLAS_MAXIMUM_THREAD_COUNT
# MlasSgemmKernelM1Avx's order (one row of A) over K blocks of S: M1_FLAG + S
M1_FLAG = 1 << 30
# MlasSgemmKernelM1TransposeBAvx's order for a row that the kernel reduces in a block of 4, 2 or 1
# rows (its 8 lane sums are added in a different tree for each): M1T_BLOCK - rows
M1T_BLOCK = -10


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c in float32, rounded once (llvm.fma: the vfmadd instruction on FMA3 hosts)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


def slice_stride_k(n: int, k: int) -> int:
    """StrideK of MlasSgemmOperation / MlasConvOperation for a slice n columns wide: K's block."""
    stride_n, stride_k = STRIDE_N, STRIDE_K
    if n >= k:
        while stride_k // 2 >= k:
            stride_n, stride_k = stride_n * 2, stride_k // 2
    else:
        while stride_n > 16 and stride_n // 2 >= n:
            stride_k, stride_n = stride_k * 2, stride_n // 2
    return stride_k


def partition(index: int, count: int, total: int) -> tuple[int, int]:
    """MlasPartitionWork: (start, length) of part `index` of `count` of `total` items."""
    per, extra = divmod(total, count)
    if index < extra:
        return (per + 1) * index, per + 1
    return per * index + extra, per


def target_threads(m: int, n: int, k: int, threads: int) -> int:
    """The threads MLAS gives an SGEMM or a Conv of m x n x k multiplies, at most `threads`."""
    complexity = float(m) * float(n) * float(k)
    if complexity < float(THREAD_COMPLEXITY * MAX_THREADS):
        target = int(complexity / float(THREAD_COMPLEXITY)) + 1
    else:
        target = MAX_THREADS
    return min(target, threads)


def gemm_blocks(m: int, n: int, k: int, threads: int, packed: bool = False, batch: int = 1):
    """MlasGemmBatch's partition of an m x n x k product (one of `batch`) over the threads, as the K
    block length of each output element: (rows [m], cols [n]), one of them None; element (i, j)
    takes rows[i] or cols[j] (M1_FLAG + S: MlasSgemmKernelM1Avx, a slice of one row)."""
    if packed:  # MlasSgemmPackedOperation: fixed K slices, no M1 kernel
        return np.full(m, PACKED_STRIDE_K, np.int64), None
    target = target_threads(m, n, k, threads)
    per_gemm = max(1, (target + batch - 1) // batch)
    if n > m:  # slices of columns, 16-aligned
        blocked = (n + THREAD_ALIGN - 1) // THREAD_ALIGN
        count = min(per_gemm, blocked)
        cols = np.empty(n, np.int64)
        for t in range(count):
            start, length = partition(t, count, blocked)
            start, length = start * THREAD_ALIGN, min(n - start * THREAD_ALIGN, length * THREAD_ALIGN)
            if length > 0:
                cols[start : start + length] = M1_FLAG + k if m == 1 else slice_stride_k(length, k)
        return None, cols
    count = min(per_gemm, m)
    rows = np.empty(m, np.int64)
    for t in range(count):
        start, length = partition(t, count, m)
        if length == 1:
            rows[start] = M1_FLAG + k
        elif n == 1:  # MlasSgemmOperation's N == 1 case: the M1 kernel with A and B swapped
            fours = length // 4 * 4
            rows[start : start + fours] = M1T_BLOCK - 4
            rest = start + fours
            if length - fours >= 2:
                rows[rest : rest + 2] = M1T_BLOCK - 2
                rest += 2
            rows[rest : start + length] = M1T_BLOCK - 1
        else:
            rows[start : start + length] = slice_stride_k(n, k)
    return rows, None


def _m1(filters: int) -> int:
    """MlasConvOperation's SGEMM of one filter row runs MlasSgemmKernelM1Avx on each K block."""
    return M1_FLAG if filters == 1 else 0


def conv_blocks(
    filters: int, groups: int, out_size: int, k: int, pointwise: bool, threads: int
) -> tuple[np.ndarray, np.ndarray]:
    """The K block lengths of a Conv with `filters` per group (batch 1), as MlasConvPrepare and
    MlasConv choose: (per output position [out_size], per filter [filters], 0 where the position's
    applies). Pointwise (stride 1, no padding, K == input channels per group) runs the GEMM on the
    input directly; more filters than output positions expand all of im2col and run the threaded
    GEMM; the rest slice the output positions over the threads (MlasConvOperation per slice)."""
    per_filter = np.zeros(filters, np.int64)
    if pointwise and groups > 1:  # MlasConvGemmDirectThreaded: one MlasSgemmOperation per group
        rows, cols = gemm_blocks(filters, out_size, k, 1)
    elif pointwise or filters > out_size:  # MlasGemm, threaded
        rows, cols = gemm_blocks(filters, out_size, k, threads)
    elif groups > 1:  # MlasConvExpandThenGemmSegmentedThreaded: each group whole
        return np.full(out_size, _m1(filters) + slice_stride_k(out_size, k), np.int64), per_filter
    else:
        target = target_threads(filters, out_size, k, threads)
        stride = -(-out_size // target)
        if target > 1:
            stride = (stride + THREAD_ALIGN - 1) & ~(THREAD_ALIGN - 1)
        blocks = np.empty(out_size, np.int64)
        if stride >= out_size:  # MlasConvTryMultithread declines: one slice
            stride = out_size
        for start in range(0, out_size, stride):
            length = min(stride, out_size - start)
            blocks[start : start + length] = _m1(filters) + slice_stride_k(length, k)
        return blocks, per_filter
    if cols is not None:
        return cols, per_filter
    if np.all(rows == rows[0]):  # one order for every filter: the filters vectorize
        return np.full(out_size, rows[0], np.int64), per_filter
    return np.zeros(out_size, np.int64), rows


@nb.njit(inline="always")
def _m1t(patch, wt, g, f, depth, rows):
    """MlasSgemmKernelM1TransposeBAvx's sum: eight lane sums (lane j takes the products of k = j mod 8
    in K order, multiply then add), reduced in the tree of a block of `rows` rows."""
    lanes = np.zeros(8, np.float32)
    for k in range(depth):
        lanes[k % 8] = lanes[k % 8] + patch[k] * wt[g, k, f]
    if rows == 4:  # transpose, then (((x0 + x1) + x2) + x3) per half, halves added
        lo = ((lanes[0] + lanes[1]) + lanes[2]) + lanes[3]
        hi = ((lanes[4] + lanes[5]) + lanes[6]) + lanes[7]
        return lo + hi
    if rows == 2:  # unpck, add: ((x0 + x2) + (x4 + x6)) + ((x1 + x3) + (x5 + x7))
        even = (lanes[0] + lanes[2]) + (lanes[4] + lanes[6])
        return even + ((lanes[1] + lanes[3]) + (lanes[5] + lanes[7]))
    # vhaddps twice, halves added
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))


@nb.njit(inline="always")
def _dot(patch, wt, g, f, depth, block, start):
    """One output element's sum in MLAS's order, from `start` (a Gemm's bias, else None as NaN)."""
    first = np.isnan(start)
    tot = np.float32(0.0) if first else start
    if block <= M1T_BLOCK - 1:
        t = _m1t(patch, wt, g, f, depth, M1T_BLOCK - block)
        return t if first else t + tot
    m1 = block >= M1_FLAG
    size = block - M1_FLAG if m1 else block
    k0 = 0
    while k0 < depth:
        k1 = min(k0 + size, depth)
        if m1:  # MlasSgemmKernelM1Avx: groups of 4, 2, 1 within the block; multiply then add, no FMA
            kk = k0
            while kk < k1:
                kn = kk + (4 if k1 - kk >= 4 else (2 if k1 - kk >= 2 else 1))
                t = patch[kk] * wt[g, kk, f]
                for i in range(kk + 1, kn):
                    t = t + patch[i] * wt[g, i, f]
                tot = t if first else t + tot
                first = False
                kk = kn
        else:
            t = np.float32(0.0)
            for kk in range(k0, k1):
                t = fma32(patch[kk], wt[g, kk, f], t)
            tot = t if first else t + tot
            first = False
        k0 = k1
    return tot


@parallel_kernel
def _dequantize_padded(x, x_scale, x_zp, pt, pl, out):
    """out[b, c, pt + y, pl + x] = DequantizeLinear of x[b, y, x, c] (NHWC int8 -> padded NCHW
    float32, (q - zp) * scale); out is zero outside (the im2col padding)."""
    batch, height, width, channels = x.shape
    for bc in nb.prange(batch * channels):
        b = bc // channels
        c = bc - b * channels
        for y in range(height):
            for xx in range(width):
                out[b, c, pt + y, pl + xx] = np.float32(np.int32(x[b, y, xx, c]) - x_zp) * x_scale
    return out


@nb.njit(inline="always")
def _axpy(v, w, acc, n):
    """acc[f] = fma(v, w[f], acc[f]) for f < n (a vfmadd per lane, each rounded once)."""
    for f in range(n):
        acc[f] = fma32(v, w[f], acc[f])


@nb.njit(inline="always")
def _quantize(y, y_scale, lo, hi, y_zp):
    """MlasQuantizeLinear: divide, clamp, round half to even, add the zero point."""
    q = y / y_scale
    q = min(max(q, lo), hi)
    return np.int8(np.int32(np.rint(q)) + y_zp)


@nb.njit(inline="always")
def _four(xp, wt, bias, bias_first, b, oy, ox, kh, kw, sh, sw, dh, dw, block, patches, acc4, tot4):
    """tot4[j] = the sums (bias included) of output positions ox + j, j < 4, of one group-1 Conv
    whose K blocks are all `block` long: the same order as one position at a time."""
    depth, filters = wt.shape[1], wt.shape[2]
    cg = depth // (kh * kw)
    k = 0
    for c in range(cg):
        for ky in range(kh):
            row = xp[b, c, oy * sh + ky * dh]
            for kx in range(kw):
                for j in range(4):
                    patches[j, k] = row[(ox + j) * sw + kx * dw]
                k += 1
    for j in range(4):
        for f in range(filters):
            tot4[j, f] = bias[f] if bias_first else np.float32(0.0)
    first = not bias_first
    k0 = 0
    while k0 < depth:
        k1 = min(k0 + block, depth)
        acc4[:, :] = np.float32(0.0)
        for kk in range(k0, k1):
            w = wt[0, kk]
            for j in range(4):  # one simple loop per position: what LLVM vectorizes over the filters
                _axpy(patches[j, kk], w, acc4[j], filters)
        for j in range(4):
            for f in range(filters):
                tot4[j, f] = acc4[j, f] if first else acc4[j, f] + tot4[j, f]
        first = False
        k0 = k1
    if not bias_first:
        for j in range(4):
            for f in range(filters):
                tot4[j, f] = tot4[j, f] + bias[f]


@parallel_kernel
def _conv(xp, wt, bias, bias_first, geometry, blocks, filter_blocks, y_scale, y_zp, out, sums):
    """out[b, oy, ox, g * F + f] = QuantizeLinear(sum over k of xd[k] * wt[g, k, f] and the bias), xd
    the im2col column of (b, oy, ox) in group g, in MLAS's order (module docstring). xp: the
    dequantized input, NCHW, zero-padded; wt float32 [G, K, F], K ordered channel, kernel row,
    kernel column; bias [G * F]; geometry (kh, kw, stride h, w, dilation h, w); blocks [OH * OW],
    filter_blocks [F] (conv_blocks). sums: float32 like out to receive the float results before
    QuantizeLinear (what ORT's float Conv outputs; the tests compare them bit for bit), or empty."""
    batch = xp.shape[0]
    keep = sums.size > 0
    groups, depth, filters = wt.shape
    kh, kw, sh, sw = geometry[0], geometry[1], geometry[2], geometry[3]
    dh, dw = geometry[4], geometry[5]
    oh, ow = out.shape[1], out.shape[2]
    cg = depth // (kh * kw)
    lo, hi = np.float32(-128 - y_zp), np.float32(127 - y_zp)
    uniform = True
    for f in range(filters):
        if filter_blocks[f] != 0:
            uniform = False
    nan = np.float32(np.nan)
    for bp in nb.prange(batch * oh):
        b = bp // oh
        oy = bp - b * oh
        patch = np.empty(depth, np.float32)
        tot = np.empty(filters, np.float32)
        acc = np.empty(filters, np.float32)
        patches = np.empty((4, depth), np.float32)
        acc4 = np.empty((4, filters), np.float32)
        tot4 = np.empty((4, filters), np.float32)
        ox = 0
        while ox < ow:
            block = blocks[oy * ow + ox]
            p = oy * ow + ox
            if (
                groups == 1
                and uniform
                and 0 < block < M1_FLAG
                and ox + 4 <= ow
                and blocks[p + 1] == block
                and blocks[p + 2] == block
                and blocks[p + 3] == block
            ):  # four output positions at once: each weight loaded once for four sums
                _four(xp, wt, bias, bias_first, b, oy, ox, kh, kw, sh, sw, dh, dw, block, patches, acc4, tot4)
                for j in range(4):
                    for f in range(filters):
                        out[b, oy, ox + j, f] = _quantize(tot4[j, f], y_scale, lo, hi, y_zp)
                        if keep:
                            sums[b, oy, ox + j, f] = tot4[j, f]
                ox += 4
                continue
            for g in range(groups):
                k = 0
                for c in range(cg):
                    for ky in range(kh):
                        row = xp[b, g * cg + c, oy * sh + ky * dh]
                        for kx in range(kw):
                            patch[k] = row[ox * sw + kx * dw]
                            k += 1
                if uniform and 0 < block < M1_FLAG:  # vectorized over the filters
                    first = not bias_first
                    for f in range(filters):
                        tot[f] = bias[g * filters + f] if bias_first else np.float32(0.0)
                    k0 = 0
                    while k0 < depth:
                        k1 = min(k0 + block, depth)
                        for f in range(filters):
                            acc[f] = np.float32(0.0)
                        for kk in range(k0, k1):
                            _axpy(patch[kk], wt[g, kk], acc, filters)
                        for f in range(filters):
                            tot[f] = acc[f] if first else acc[f] + tot[f]
                        first = False
                        k0 = k1
                else:
                    for f in range(filters):
                        fb = block if filter_blocks[f] == 0 else filter_blocks[f]
                        start = bias[g * filters + f] if bias_first else nan
                        tot[f] = _dot(patch, wt, g, f, depth, fb, start)
                for f in range(filters):
                    y = tot[f] if bias_first else tot[f] + bias[g * filters + f]
                    out[b, oy, ox, g * filters + f] = _quantize(y, y_scale, lo, hi, y_zp)
                    if keep:
                        sums[b, oy, ox, g * filters + f] = y
            ox += 1
    return out


def fast_form(wt, blocks, filter_blocks, bias_first=False) -> str | None:
    """Which kernel of mlas_tile computes this Conv in MLAS's order: "tile" (one group, every filter
    in the same K block per output position, fused multiply-adds), "one filter" (one group of one
    filter: the M = 1 kernel's order), "depthwise" (one input channel and one filter per group, the
    M = 1 kernel's order), else None (_conv's loops)."""
    blocks = np.asarray(blocks)
    if np.any(filter_blocks) or blocks.size == 0:
        return None
    groups, depth, filters = wt.shape
    if groups == 1 and filters > 1 and bool(np.all((blocks > 0) & (blocks < M1_FLAG))):
        return "tile"
    if groups == 1 and filters == 1 and bool(np.all(blocks > M1_FLAG)):
        return "one filter"
    if groups > 1 and filters == 1 and not bias_first and bool(np.all(blocks > M1_FLAG)):
        return "depthwise"
    return None


def packed_weights(wt, blocks, filter_blocks, bias_first=False):
    """wt in the layout of its fast_form's kernel (tile: [K, F] padded to whole vectors; depthwise:
    [K, C]; one filter: [K]), else None: conv()'s `packed`."""
    form = fast_form(wt, blocks, filter_blocks, bias_first)
    if form == "tile":
        return mlas_tile.pack_weights(wt[0], mlas_tile.lanes_for(wt.shape[2]))
    if form == "depthwise":
        return np.ascontiguousarray(wt[:, :, 0].T)
    if form == "one filter":
        return np.ascontiguousarray(wt[0, :, 0])
    return None


def conv(
    x, x_scale, x_zp, wt, bias, bias_first, geometry, blocks, filter_blocks, y_scale, y_zp, out, sums=None,
    packed=None,
):  # fmt: skip
    """See _conv; x int8 NHWC, geometry (kh, kw, stride h, w, dilation h, w, pad top, left); packed:
    packed_weights(wt, blocks, filter_blocks), made here if not given."""
    geometry = np.asarray(geometry, np.int64)
    kh, kw, sh, sw, dh, dw, pt, pl = (int(v) for v in geometry)
    batch, height, width, channels = x.shape
    oh, ow = out.shape[1], out.shape[2]
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    hp, wp = max(need_h, pt + height), max(need_w, pl + width)
    keep = np.empty((0, 0, 0, 0), np.float32) if sums is None else sums
    form = fast_form(wt, blocks, filter_blocks, bias_first)
    if form == "depthwise" and wt.shape[1] != kh * kw:
        form = None  # a group of several input channels
    if form is not None:
        if packed is None:
            packed = packed_weights(wt, blocks, filter_blocks, bias_first)
        xp = np.zeros((batch, hp, wp, channels), np.float32)
        mlas_tile.dequantize_nhwc(x, np.float32(x_scale), np.int32(x_zp), pt, pl, xp)
        ys, yz, bias = np.float32(y_scale), np.int32(y_zp), np.asarray(bias, np.float32)
        blocks = np.asarray(blocks, np.int64)
        if form == "depthwise":
            return mlas_tile.depthwise_m1(xp, packed, bias, geometry, blocks, ys, yz, out, keep)
        koff = mlas_tile.tap_offsets(channels, kh, kw, dh, dw, wp)
        if form == "one filter":
            args = (xp, koff, packed, bias, bool(bias_first), geometry, blocks, ys, yz, out, keep)
            return mlas_tile.one_filter_m1(*args)
        kernel = mlas_tile.tiled_conv(mlas_tile.lanes_for(wt.shape[2]))
        padded = np.zeros(packed.shape[1], np.float32)
        padded[: bias.size] = bias
        return kernel(xp, koff, packed, padded, bool(bias_first), geometry, blocks, ys, yz, out, keep)
    xp = np.zeros((batch, channels, hp, wp), np.float32)
    _dequantize_padded(x, np.float32(x_scale), np.int32(x_zp), pt, pl, xp)
    return _conv(
        xp,
        wt,
        bias,
        bool(bias_first),
        geometry,
        blocks,
        filter_blocks,
        np.float32(y_scale),
        np.int32(y_zp),
        out,
        keep,
    )
