"""Output size and leading padding of a sliding window (TFLite's ComputePaddingHeightWidth)."""
from __future__ import annotations

from ..errors import NpusimError


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
