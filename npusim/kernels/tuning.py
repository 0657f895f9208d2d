"""Process-wide settings that make npusim fast, applied only when a program asks (tune_process):
a library must not change its host process at import, and each of these does."""

from __future__ import annotations

import functools
import os

from . import aligned, backend, host


def choose_threading_layer():
    """Where the MAC ops run on the float32 BLAS (hosts without AVX-512 VNNI), OpenMP's spin-waiting
    workers and OpenBLAS's threads steal each other's cores on a small machine (measured: several
    times slower), so the workqueue layer, which sleeps, is used. With the VNNI/AMX kernels no BLAS
    runs, and OpenMP starts each parallel region sooner (measured on the batch-16 conv: 1.9 ms
    against 2.6 ms with workqueue): Numba's default choice is kept. An explicit
    NUMBA_THREADING_LAYER wins. Numba takes the layer at the first parallel call: this must come
    before it."""
    if "NUMBA_THREADING_LAYER" in os.environ or backend.select().name != "blas":
        return
    import numba

    os.environ["NUMBA_THREADING_LAYER"] = "workqueue"  # for child processes too
    numba.config.THREADING_LAYER = "workqueue"


@functools.cache
def tune_process() -> None:
    """Tune this process for npusim, once: the Numba threading layer (choose_threading_layer),
    malloc's trimming and the pool of large freed mappings (aligned.keep_freed_memory; resident
    memory then stays at the peak of a run), and the OS permission for AMX tiles (host.has_amx).
    The results are the same bits with or without it; only speed and memory differ."""
    choose_threading_layer()
    aligned.keep_freed_memory()
    host.has_amx()
