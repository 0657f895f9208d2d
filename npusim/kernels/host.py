"""What this host's CPU and OS offer the kernels: detected on first use, never at import.

Each answer is cached for the life of the process (the CPU does not change under it); a test that
needs another answer runs a fresh process (see tests/test_generic_cpu.py).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
import time

import llvmlite.binding
import numba as nb


def _compiling_for_host() -> bool:
    """Numba compiles for this CPU unless NUMBA_CPU_NAME or NUMBA_CPU_FEATURES name another (as set
    for portable caches, e.g. 'generic'): then instructions of this host may be unselectable."""
    return not (nb.config.CPU_NAME or nb.config.CPU_FEATURES)


def _has_features(*names: str) -> bool:
    features = llvmlite.binding.get_host_cpu_features()
    return all(features.get(f, False) for f in names)


# LLVM's names of x86 CPUs with AVX2 (and FMA), for NUMBA_CPU_NAME: compiling for one of them on a
# newer host is how an AVX2-only machine's code is built and run here (tests/test_avx2_cpu.py).
AVX2_CPU_NAMES = frozenset(
    "haswell broadwell skylake skylake-avx512 cascadelake cooperlake cannonlake icelake-client "
    "icelake-server tigerlake rocketlake alderlake raptorlake meteorlake arrowlake gracemont "
    "sapphirerapids emeraldrapids graniterapids znver1 znver2 znver3 znver4 znver5 x86-64-v3 "
    "x86-64-v4".split()
)


def _target_has(feature: str, cpu_names) -> bool:
    """Whether the CPU that Numba compiles for has `feature`: this host's, or the one that
    NUMBA_CPU_NAME names (one of cpu_names) with NUMBA_CPU_FEATURES' +feature / -feature on top."""
    if _compiling_for_host():
        return True
    features = (nb.config.CPU_FEATURES or "").split(",")
    if f"-{feature}" in features:
        return False
    return f"+{feature}" in features or (nb.config.CPU_NAME or "") in cpu_names | {"host"}


@functools.cache
def has_avx2() -> bool:
    """Whether VPMADDWD on YMM registers (AVX2) can be compiled and run here: this CPU has AVX2, and
    Numba compiles for it or for a named CPU that has it (NUMBA_CPU_NAME=haswell builds on an
    AVX-512 host the code that an AVX2-only CPU runs)."""
    return _has_features("avx2") and _target_has("avx2", AVX2_CPU_NAMES)


@functools.cache
def has_vnni() -> bool:
    """Whether VPDPBUSD (AVX-512 VNNI, with AVX-512 VL for its 256-bit form, which every VNNI CPU
    has) can be compiled and run here. The depthwise and ADD kernels take their vector form from
    this when Numba compiles them."""
    return _compiling_for_host() and _has_features("avx512f", "avx512bw", "avx512vl", "avx512vnni")


@functools.cache
def has_vbmi() -> bool:
    """Whether VPERMI2B on ZMM registers (AVX-512 VBMI) can be compiled and run here (the byte-table
    lookup, kernels/lookup.py)."""
    return _compiling_for_host() and _has_features("avx512f", "avx512bw", "avx512vbmi")


@functools.cache
def has_amx() -> bool:
    """Whether AMX-INT8 tiles run here: the CPU flags, Numba compiling for this host, and Linux's
    permission for the tile data state (without it the first tile instruction raises SIGILL).
    Asking for the permission changes the process (its signal frames grow by the 8 KB tile state),
    so it is asked on first use of the AMX backend or by tune_process(), never at import."""
    if not _compiling_for_host() or not sys.platform.startswith("linux"):
        return False
    if not _has_features("amx-tile", "amx-int8", "avx512f", "avx512bw"):
        return False
    arch_prctl, req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    try:
        return ctypes.CDLL(None, use_errno=True).syscall(arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0
    except (OSError, AttributeError):
        return False


# --- Cores free for threads: asked per threaded kernel call, cheaply (a cached snapshot). ---

_FREE_TTL_S = 0.02  # a snapshot of the run queue serves the kernel calls of the next 20 ms


def _cgroup_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs' worth of time the process's cgroup may use (cgroup v2 cpu.max, else v1's
    cpu.cfs_quota_us / cpu.cfs_period_us), or None where it has no quota or none can be read."""
    try:
        lines = open(proc_cgroup).read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        try:
            if controllers == "":  # v2: "max 100000" or "200000 100000"
                quota, period = open(f"{root}{path}/cpu.max").read().split()
                if quota != "max":
                    return int(quota) / int(period)
            elif "cpu" in controllers.split(","):
                base = f"{root}/{controllers}{path}"
                quota = int(open(f"{base}/cpu.cfs_quota_us").read())
                if quota > 0:
                    return quota / int(open(f"{base}/cpu.cfs_period_us").read())
        except (OSError, ValueError):
            continue
    return None


@functools.cache
def cpu_budget() -> int:
    """CPUs this process may run on: its affinity mask, bounded by its cgroup's CPU quota (a CI
    runner's container of 2 CPUs on a 64-core host has 2, not 64). Fixed for the process's life."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _own_running_threads(task_dir: str = "/proc/self/task") -> int:
    """This process's threads that are running or runnable now (state R), the caller included."""
    n = 0
    try:
        for tid in os.listdir(task_dir):
            try:
                stat = open(f"{task_dir}/{tid}/stat").read()
            except OSError:
                continue
            n += stat[stat.rindex(")") + 2] == "R"  # the state follows the command's parentheses
    except OSError:
        return 1
    return max(n, 1)


def free_cores_now(loadavg: str = "/proc/loadavg", task_dir: str = "/proc/self/task") -> int:
    """cpu_budget() less the other processes' threads that are runnable right now (the run queue of
    /proc/loadavg's fourth field, less this process's own): at least 1. Where it cannot be read,
    the budget."""
    budget = cpu_budget()
    try:
        running = int(open(loadavg).read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return budget
    others = max(0, running - _own_running_threads(task_dir))
    return max(1, min(budget, budget - others))


_FREE = [0.0, 0]  # [time of the snapshot, its answer]


def free_cores() -> int:
    """free_cores_now(), taken at most once per _FREE_TTL_S: a parallel region run on more threads
    than there are free cores waits for a descheduled thread at its end (a scheduler quantum, some
    milliseconds, per region; issue 57 measured 16-35x slower runs under load)."""
    now = time.monotonic()
    if now - _FREE[0] > _FREE_TTL_S:
        _FREE[0], _FREE[1] = now, free_cores_now()
    return _FREE[1]
