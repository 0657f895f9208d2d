"""The two kernel paths of the MAC ops (CONV_2D, FULLY_CONNECTED): exact int32 on AVX-512 VNNI
where the host has it, and the chunked float32 BLAS GEMM everywhere. The oracle tests run on both.
"""
import contextlib

import pytest

from npusim.ops import vnni

PATHS = [
    pytest.param("vnni", marks=pytest.mark.skipif(
        not vnni.SUPPORTED, reason="this CPU has no AVX-512 VNNI: the VNNI kernel path is NOT tested on this machine")),
    "blas",
]


@contextlib.contextmanager
def kernel_path(name: str):
    saved = vnni.ENABLED
    vnni.ENABLED = name == "vnni"
    try:
        yield
    finally:
        vnni.ENABLED = saved
