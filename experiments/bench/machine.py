"""The machine a benchmark runs on, as its report states it (CPU, flags, versions, threads, memory),
and a context that runs npusim on one thread for the diagnostic columns."""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import resource
from pathlib import Path

import numpy as np


def kernel_path() -> str:
    from npusim.kernels import backend, host

    chosen = [b.name for b in backend.select().backends]
    parts = []
    if "amx" in chosen:
        parts.append("AMX-INT8 tiles for CONV_2D with output rows of 16+ pixels (npusim/kernels/amx.py)")
    if "vnni" in chosen:
        rest = "the other CONV_2D" if "amx" in chosen else "CONV_2D"
        parts.append(f"AVX-512 VNNI for {rest} and FULLY_CONNECTED (npusim/kernels/vnni.py)")
    elif "avx2" in chosen:
        why = "NPUSIM_VNNI=0" if host.has_vnni() else "no AVX-512 VNNI in the compile target"
        parts.append(f"AVX2 VPMADDWD on int16-widened operands (npusim/kernels/avx2.py; {why})")
    else:
        why = "NPUSIM_VNNI=0 and NPUSIM_AVX2=0" if host.has_avx2() else "no AVX2 in the compile target"
        parts.append(f"float32 BLAS GEMM, exact by chunking ({why})")
    variant = backend.select().depthwise_variant()
    return "; ".join(parts) + f", all with exact integer accumulation; DEPTHWISE_CONV_2D: its {variant} form"


def compile_target() -> str:
    """The CPU that Numba compiles npusim's kernels for: this host, or NUMBA_CPU_NAME (with
    NUMBA_CPU_FEATURES), as when an AVX2-only CPU's code is measured on a newer one."""
    import numba

    name, features = numba.config.CPU_NAME, numba.config.CPU_FEATURES
    if not (name or features):
        return "this host's CPU (Numba's default)"
    shown = "its own features only" if features == "" else (features or "this host's features")
    return f"NUMBA_CPU_NAME={name or 'host'} ({shown}): an emulation on this host, not that CPU"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                keep = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"]
                keep += ["avx512_bf16", "avx_vnni", "amx_int8"]
                return " ".join(f for f in keep if f in flags) or "none of avx2/avx512/vnni"
    except OSError:
        pass
    return "unknown"


def _openblas():
    """(get_num_threads, set_num_threads, config string) of the OpenBLAS that numpy loaded, found in this
    process's memory map, or None (threadpoolctl is not a dependency of the project)."""
    try:
        libs = sorted(
            {
                line.split()[-1]
                for line in Path("/proc/self/maps").read_text().splitlines()
                if "openblas" in line.lower() and ".so" in line.split()[-1]
            }
        )
    except OSError:
        return None
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is None or put is None:
                    continue
                get.restype = ctypes.c_int
                put.argtypes = [ctypes.c_int]
                cfg = getattr(lib, f"{prefix}_get_config{suffix}", None)
                conf = Path(path).name
                if cfg is not None:
                    cfg.restype = ctypes.c_char_p
                    conf = cfg().decode(errors="replace").strip()
                return get, put, conf
    return None


def blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return (
            "; ".join(
                f"{i.get('internal_api')} {i.get('version')}: {i.get('num_threads')} threads"
                for i in threadpool_info()
                if i.get("user_api") == "blas"
            )
            or "no BLAS found"
        )
    except ImportError:
        pass
    ob = _openblas()
    if ob is not None:
        return (
            f"OpenBLAS ({' '.join(ob[2].split())}): {ob[0]()} threads "
            "(read via ctypes; threadpoolctl not installed)"
        )
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} (threads unknown: threadpoolctl not installed)"
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def cpu_family_model() -> str:
    """'family F model M' of /proc/cpuinfo (what tells Zen 3 from Zen 4 where the names agree)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()[:12]
        info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        return f"family {info['cpu family']} model {info['model']}"
    except (OSError, KeyError):
        return "family unknown"


class busy_cores:
    """Context: `n` processes that spin on the CPU (a busy CI runner's other jobs), started on entry
    and ended on exit. Each is a plain Python loop, started and ended by its own process id."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self):
        import subprocess
        import sys
        import time

        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        time.sleep(0.3)  # let them start spinning before the first timed call
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()
        return False


class single_thread:
    """Context: npusim on one Numba thread and one BLAS thread (restored on exit)."""

    def __enter__(self):
        import numba

        self.numba = numba.get_num_threads()
        numba.set_num_threads(1)
        self.ob = _openblas()
        self.blas = self.ob[0]() if self.ob else None
        if self.ob:
            self.ob[1](1)
        return self

    def __exit__(self, *exc):
        import numba

        numba.set_num_threads(self.numba)
        if self.ob:
            self.ob[1](self.blas)
        return False


def versions() -> str:
    import numba

    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}", f"numba {numba.__version__}"]
    for dist in ("ai-edge-litert", "tflite-micro", "npusim-zo"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return ", ".join(parts)


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs since boot, from /proc/stat (steal: time the
    hypervisor gave this VM's CPUs to others), or None where there is no such file."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def steal_share(start: tuple[int, int] | None) -> str:
    """The share of CPU time stolen by the hypervisor since start (cpu_ticks()), as text."""
    end = cpu_ticks()
    if start is None or end is None or end[1] <= start[1]:
        return "not measured"
    return f"{100 * (end[0] - start[0]) / (end[1] - start[1]):.1f}%"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def current_rss_mb() -> float:
    """Resident set size now (Linux /proc/self/statm), in MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def process_peak_rss_mb() -> float:
    """This process image's resident high-water mark (VmHWM), in MB. Unlike ru_maxrss, which a child
    inherits from its parent across fork and exec, it starts afresh in a new program."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return peak_rss_mb()
