"""The MAC backends (npusim/kernels/backend.py): exact int32 on AMX tiles (CONV_2D with output rows of
16 pixels or more), on AVX-512 VNNI and on AVX2 (VPMADDWD) where the host has them, and the
chunked float32 BLAS GEMM everywhere. The oracle tests run on each: `with kernel_path(name):` makes
run_npusim build its Interpreter with backend=name (DEPTHWISE_CONV_2D's vector code follows it too,
see DEPTHWISE_PATHS).
"""

import pytest

from npusim.kernels import host
from npusim.testing.oracle import on_backend as kernel_path  # noqa: F401 (the tests' name for it)

AMX = pytest.param(
    "amx",
    marks=pytest.mark.skipif(
        not host.has_amx(),
        reason="this CPU (or OS) has no AMX-INT8: the AMX kernel path is NOT tested on this machine",
    ),
)
VNNI = pytest.param(
    "vnni",
    marks=pytest.mark.skipif(
        not host.has_vnni(),
        reason="this CPU has no AVX-512 VNNI: the VNNI kernel path is NOT tested on this machine",
    ),
)
AVX2 = pytest.param(
    "avx2",
    marks=pytest.mark.skipif(
        not host.has_avx2(),
        reason="this CPU has no AVX2: the AVX2 kernel path is NOT tested on this machine",
    ),
)
PATHS = [AMX, VNNI, AVX2, "blas"]
# DEPTHWISE_CONV_2D follows the selection with its vector code in one of three forms: VNNI on the
# amx and vnni selections alike, AVX2 on avx2, generic on blas (the code a host without either
# runs). These cover all three. On an AVX-512 host the avx2 paths are compiled for that host (LLVM
# may fuse VPMADDWD and its add into VPDPWSSD): tests/test_avx2_cpu.py compiles them for Haswell.
DEPTHWISE_PATHS = [VNNI, AVX2, "blas"]


def run_compiled_for(cpu_name: str, child: str, cases: list, tmp_path) -> str:
    """Run the script `child` (a format string with {cases}: the path of the pickled cases) in a fresh
    process whose Numba compiles for cpu_name with no extra features (NUMBA_CPU_FEATURES empty: a
    named CPU such as haswell keeps the host's otherwise), in its own Numba cache, with no NPUSIM_*
    path switch inherited. Asserts that it exits 0 and says "all equal"; returns its stdout."""
    import os
    import pickle
    import subprocess
    import sys

    path = tmp_path / "cases.pkl"
    with open(path, "wb") as f:
        pickle.dump(cases, f)
    env = dict(
        os.environ,
        NUMBA_CPU_NAME=cpu_name,
        NUMBA_CPU_FEATURES="",
        NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"),
    )
    for switch in ("NPUSIM_AVX2", "NPUSIM_VNNI", "NPUSIM_AMX"):
        env.pop(switch, None)
    result = subprocess.run(
        [sys.executable, "-c", child.format(cases=str(path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "all equal" in result.stdout
    return result.stdout
