"""Threads only on cores that are free: the CPU budget (affinity, cgroup quota), the run queue, and
ParallelKernel's choice of form from them (issue 57: threaded regions on a busy machine waited for
descheduled threads, 16-35x slower)."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.kernels import host, jit


def _cgroup(tmp_path, lines, files):
    (tmp_path / "cgroup").write_text("\n".join(lines) + "\n")
    for rel, text in files.items():
        f = tmp_path / "fs" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return str(tmp_path / "cgroup"), str(tmp_path / "fs")


def test_cgroup_v2_quota(tmp_path):
    proc, root = _cgroup(tmp_path, ["0::/job"], {"job/cpu.max": "150000 100000\n"})
    assert host._cgroup_quota(proc, root) == 1.5


def test_cgroup_v2_without_quota(tmp_path):
    proc, root = _cgroup(tmp_path, ["0::/job"], {"job/cpu.max": "max 100000\n"})
    assert host._cgroup_quota(proc, root) is None


def test_cgroup_v1_quota(tmp_path):
    proc, root = _cgroup(
        tmp_path,
        ["4:memory:/x", "1:cpu,cpuacct:/job"],
        {"cpu,cpuacct/job/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/job/cpu.cfs_period_us": "100000\n"},
    )
    assert host._cgroup_quota(proc, root) == 2.0


def _tasks(tmp_path, states):
    d = tmp_path / "task"
    for i, s in enumerate(states):
        (d / str(i)).mkdir(parents=True)
        (d / str(i) / "stat").write_text(f"{i} (py thon) {s} 1 2 3\n")
    return str(d)


@pytest.mark.parametrize(
    "running, own, free", [(1, "R", 4), (2, "RS", 3), (3, "RS", 2), (9, "R", 1), (3, "RRS", 3)]
)
def test_free_cores_now_counts_other_processes(tmp_path, monkeypatch, running, own, free):
    monkeypatch.setattr(host, "cpu_budget", lambda: 4)
    load = tmp_path / "loadavg"
    load.write_text(f"3.0 2.0 1.0 {running}/300 999\n")
    assert host.free_cores_now(str(load), _tasks(tmp_path, own)) == free


def test_budget_is_at_most_the_affinity_mask():
    import os

    assert 1 <= host.cpu_budget() <= len(os.sched_getaffinity(0))


class _Spy:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __call__(self, *args):
        self.calls.append(self.name)


@pytest.mark.parametrize("free, form", [(1, "serial"), (2, "threaded")])
def test_parallel_kernel_takes_threads_only_on_free_cores(monkeypatch, free, form):
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2 or numba.get_num_threads() < 2:
        pytest.skip("one Numba thread: only the serial form runs")

    def kernel(a):  # never compiled: both forms are replaced by spies
        return a

    k = jit.ParallelKernel(kernel)
    calls = []
    k.serial, k.threaded = _Spy("serial", calls), _Spy("threaded", calls)
    monkeypatch.setattr(host, "free_cores", lambda: free)
    k(np.zeros(jit.PARALLEL_MIN_WORK, np.int8))
    k(np.zeros(16, np.int8))  # small work: serial whatever is free
    assert calls == [form, "serial"]
