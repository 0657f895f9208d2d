"""The kernel paths of the MAC ops: exact int32 on AMX tiles (CONV_2D with output rows of 16
pixels or more) and on AVX-512 VNNI where the host has them, and the chunked float32 BLAS GEMM
everywhere. The oracle tests run on each.
"""
import contextlib

import pytest

from npusim.ops import amx, vnni

AMX = pytest.param("amx", marks=pytest.mark.skipif(
    not amx.SUPPORTED, reason="this CPU (or OS) has no AMX-INT8: the AMX kernel path is NOT tested on this machine"))
VNNI = pytest.param("vnni", marks=pytest.mark.skipif(
    not vnni.SUPPORTED, reason="this CPU has no AVX-512 VNNI: the VNNI kernel path is NOT tested on this machine"))
PATHS = [AMX, VNNI, "blas"]


@contextlib.contextmanager
def kernel_path(name: str):
    """amx: AMX where it applies, VNNI for the rest; vnni: VNNI only; blas: the float32 GEMM only."""
    saved = amx.ENABLED, vnni.ENABLED
    amx.ENABLED, vnni.ENABLED = name == "amx", name in ("amx", "vnni")
    try:
        yield
    finally:
        amx.ENABLED, vnni.ENABLED = saved
