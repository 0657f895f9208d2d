"""Spatial padding: output size and leading padding of a sliding window (TFLite's
ComputePaddingHeightWidth), and the padded copy of NHWC activations that kernels and PAD use."""

from __future__ import annotations

import numba as nb

from ..errors import NpusimError
from .jit import parallel_kernel


def compute_padding(in_size: int, k: int, stride: int, dilation: int, padding: str) -> tuple[int, int]:
    """(out_size, pad_before) for one spatial axis. Taps that fall in the padding contribute nothing."""
    if stride < 1 or dilation < 1 or k < 1:
        raise NpusimError(f"window {k}, stride {stride}, dilation {dilation}: expected all >= 1")
    effective = (k - 1) * dilation + 1
    if padding == "SAME":
        out = (in_size + stride - 1) // stride
        total = max((out - 1) * stride + effective - in_size, 0)
        return out, total // 2
    if padding == "VALID":
        out = (in_size - effective) // stride + 1
        if out < 1:
            raise NpusimError(f"VALID window of extent {effective} does not fit an input of size {in_size}")
        return out, 0
    raise NpusimError(f"padding {padding!r} is not supported, expected SAME or VALID")


@parallel_kernel
def pad_input(x, pad_top, pad_left, fill, flip, out):
    """out[n, y, x, c] = x[n, y - pad_top, x - pad_left, c] ^ flip inside the image, fill outside,
    for the rows and columns of out (which may end before or after the image); out has x's
    channels. flip: 0 for a plain copy, or -128 for the unsigned bytes x + 128 that VPDPBUSD reads
    (vnni.padded_input), so that its kernel broadcasts them straight from memory."""
    n_batch, in_h, in_w, channels = x.shape
    _, hp, wp, _ = out.shape
    inside = max(0, min(in_w, wp - pad_left))  # image columns that land in out
    for row in nb.prange(n_batch * hp):
        n = row // hp
        y = row - n * hp
        iy = y - pad_top
        dst = out[n, y].reshape(-1)
        if iy < 0 or iy >= in_h:
            dst[:] = fill
            continue
        # Whole rows are contiguous on both sides: one flat copy between the two fills.
        first, count = pad_left * channels, inside * channels
        dst[:first] = fill
        dst[first + count :] = fill
        # A loop over two slices, indexed by the loop variable alone, is one vector loop (10x a
        # slice assignment's copy in the serial form, which became a loop of one byte at a time).
        inner, src = dst[first : first + count], x[n, iy].reshape(-1)[:count]
        for k in range(count):
            inner[k] = src[k] ^ flip
    return out
