"""Where npusim's time goes (experiments/bench/main.py): the stages of a CONV_2D call, timed with the
engines' own functions (npusim/kernels/), each kernel path's rate, and the time per step of
Interpreter.run."""

from __future__ import annotations

import statistics
import time

import numpy as np

from npusim.testing import oracle

from .machine import single_thread
from .timing import equal, median_time
from .workloads import conv_model, depthwise_model


def conv_stages(model: bytes, x: np.ndarray, reps: int) -> list[tuple[str, float, float]]:
    """Time the stages of Conv2D.__call__ with the engines' own functions (the padded copy and the
    prepared filters of vnni.py, which amx.py shares; the VNNI kernel alone on them; the AMX engine
    with its filters prepared once; on a host whose conv runs the avx2 engine, its widened copy,
    filters and kernel instead), then the whole call on every kernel path, with the default
    threads and with one Numba and one BLAS thread. Same calls on the same arrays: the stages do not
    pay the page faults of fresh buffers that a real call pays."""
    import npusim
    from npusim.kernels import amx, host, vnni
    from npusim.kernels.geometry import row_runs
    from npusim.kernels.microkernel import run_conv
    from npusim.ops.base import WeightMemo

    sim = npusim.Interpreter(model, profile="tflm")
    kern = sim.kernels[0]
    w = sim.graph.tensors[kern.op.inputs[1]].data
    b = sim.graph.tensors[kern.op.inputs[2]].data
    g, stage, zp, profile = kern.geometry, kern.stage, kern.inputs[0].zero_point, kern.profile
    wg = w[None]  # [G, O, kh, kw, C] with one weight group, as Conv2D hands its weights to an engine

    def kernel_stage(label, kernel, xp, taps, groups, packed, params, unsigned=0):
        """A stage timing the micro-kernel `kernel` alone on its prepared input and filters."""
        return label, lambda: run_conv(
            kernel,
            x,
            wg,
            xp,
            taps,
            groups,
            packed,
            params,
            g.stride,
            g.out_hw,
            False,
            stage,
            profile,
            unsigned,
        )

    if kern.engine.name == "avx2":  # an AVX2-only host: the stages of the engine it runs
        stages = avx2_stages(x, wg, b, g, stage, zp, kernel_stage)
    else:

        def padded():
            return vnni.padded_input(x, g.kh, g.kw, g.stride, g.dilation, g.pad, g.out_hw, zp, unsigned=True)

        rows = row_runs(g.kw, g.dilation[1])  # as vnni.convolve reads the filter

        def filters():  # the VNNI engine takes the accumulator offset at the unsigned zero point
            return vnni.prepared_filters("vnni", wg, b, zp + 128, stage, rows=rows)

        xp, taps, unsigned = padded()
        taps, quads = vnni.reduction(taps, g.kw, g.in_channels, rows)
        packed, params = filters()
        stages = [
            ("vnni.padded_input (Numba: the padded int8 copy)", padded),
            ("vnni.prepared_filters (packed filters and output parameters)", filters),
        ]
    paths = []
    if host.has_amx():
        memo = WeightMemo()
        stages.append(
            (
                "amx.convolve (padded copy, AMX tiles, vector output stage; filters prepared once)",
                lambda: amx.convolve(
                    x, wg, b, zp, g.stride, g.dilation, g.pad, g.out_hw, stage, profile, memo=memo
                ),
            )
        )
        paths.append("AMX")
    if host.has_vnni():
        stages.append(
            kernel_stage(
                "conv_vnni (VNNI micro-kernel + vector output stage)",
                vnni.conv_vnni,
                xp,
                taps,
                quads,
                packed,
                params,
                unsigned,
            )
        )
        paths.append("VNNI")
    if host.has_avx2():
        paths.append("AVX2")
    paths.append("BLAS")
    for name in paths:
        what = {
            "AMX": "AMX",
            "VNNI": "VNNI",
            "AVX2": "AVX2",
            "BLAS": "float32 BLAS (im2col + sgemm; here under Numba's OpenMP layer, which fights "
            "OpenBLAS's threads: a host without VNNI runs it under the workqueue layer)",
        }[name]
        on_path = npusim.Interpreter(model, profile="tflm", backend=name.lower()).kernels[0]
        stages.append((f"whole Conv2D.__call__, {what} path", lambda k=on_path: k(x, w, b)))
    stages.append(("whole Interpreter.run (default path)", lambda: sim.run(x)))
    default = [median_time(fn, reps, warmup=1) for _, fn in stages]
    with single_thread():
        one = [median_time(fn, reps, warmup=1) for _, fn in stages]
    return [(label, t, t1) for (label, _), t, t1 in zip(stages, default, one)]


def avx2_stages(x, wg, b, g, stage, zp, kernel_stage) -> list:
    """conv_stages' stages of the avx2 engine: its widened copy, its prepared filters and its
    micro-kernel alone on them (kernel_stage, conv_stages' helper)."""
    from npusim.kernels import avx2
    from npusim.kernels.geometry import row_runs

    rows = row_runs(g.kw, g.dilation[1])
    xp, taps, pairs = avx2.widened_input(x, g.kh, g.kw, g.stride, g.dilation, g.pad, g.out_hw, zp)
    packed, params = avx2.prepared_filters(wg, b, stage, rows)
    return [
        (
            "avx2.widened_input (Numba: the padded int16 copy of x - zp)",
            lambda: avx2.widened_input(x, g.kh, g.kw, g.stride, g.dilation, g.pad, g.out_hw, zp),
        ),
        (
            "avx2.prepared_filters (packed filters and output parameters)",
            lambda: avx2.prepared_filters(wg, b, stage, rows),
        ),
        kernel_stage(
            "conv_avx2 (AVX2 micro-kernel + vector output stage)",
            avx2.conv_avx2,
            xp,
            taps,
            pairs,
            packed,
            params,
        ),
    ]


def path_models(seed: int = 1) -> list[tuple[str, bytes, tuple]]:
    """One-op models that each kernel path runs: the conv of the main table, a MobileNet-style 3x3
    depthwise layer and a fully connected layer; (label, model, input shape per image, batch
    relative to the conv's: a fully connected layer needs many rows to be worth threads)."""
    rng = np.random.default_rng(seed)
    c = 96
    dw = depthwise_model(rng, c)
    k, units = 1024, 1000
    fc = oracle.fully_connected_model(
        (1, k),
        rng.integers(-127, 128, (units, k), dtype=np.int8),
        rng.integers(-50000, 50000, units).astype(np.int32),
        0.05,
        -10,
        0.004,
        4.0,
        3,
    )
    return [
        ("CONV_2D 56x56x64 -> 64, 3x3", conv_model(), (56, 56, 64), 1),
        (f"DEPTHWISE_CONV_2D 28x28x{c}, 3x3", dw, (28, 28, c), 1),
        (f"FULLY_CONNECTED {k} -> {units}", fc, (k,), 16),
    ]


def path_settings(args) -> tuple[int, int]:
    """(batch, repetitions) of the kernel path rates, for the host's paths and the Haswell code's alike."""
    return (1, 2) if args.quick else (16, 7)


def kernel_path_rates(batch: int, reps: int, log, only=None) -> list[str]:
    """One line per kernel path that this host runs (each backend forced in turn; DEPTHWISE_CONV_2D's
    vector form follows it), or per path named in `only` among them: GMAC/s with the default threads
    and with one thread, and whether the output has the same bits as the BLAS path's (itself held to
    TFLM by the tests)."""
    import npusim
    from npusim.kernels import backend

    names = [b.name for b in backend.BACKENDS if b.available() and (only is None or b.name in only)]
    lines = [
        "| op | kernel path | batch | GMAC/s | GMAC/s, 1 thread | same bits as blas |",
        "|---|---|---|---|---|---|",
    ]
    for label, model, shape, scale in path_models():
        n = batch * scale
        x = np.random.default_rng(2).integers(-128, 128, (n, *shape), dtype=np.int8)
        reference = npusim.Interpreter(model, profile="tflm", backend="blas").run(x)
        seen = set()
        for name in names:
            sim = npusim.Interpreter(model, profile="tflm", backend=name)
            kern = sim.kernels[0]
            path = kern.engine.name if hasattr(kern, "engine") else f"{kern.variant} form"
            if path in seen:  # e.g. DEPTHWISE_CONV_2D on amx and vnni: the same VNNI form
                continue
            seen.add(path)
            log(f"  kernel path {path}: {label}")
            same = "yes" if equal(sim.run(x), reference) else "NO"
            t = median_time(lambda s=sim, x=x: s.run(x), reps)
            with single_thread():
                t1 = median_time(lambda s=sim, x=x: s.run(x), reps)
            rate, rate1 = sim.macs() * n / t / 1e9, sim.macs() * n / t1 / 1e9
            lines.append(f"| {label} | {path} | {n} | {rate:.1f} | {rate1:.1f} | {same} |")
    return lines


def op_breakdown(model: bytes, x: np.ndarray, reps: int) -> tuple[list[tuple[str, int, float, float]], str]:
    """Median time per step kind of Interpreter.run's own walk (PADs folded into the convolution
    that reads them, elementwise chains run as one lookup: runtime/chains.py), with the default
    threads and with one Numba and one BLAS thread; and a sentence naming the kernels run() folds
    away (timed as a kernel of their own, they would count time no run spends)."""
    default, folded = _op_times(model, x, reps)
    with single_thread():
        one, _ = _op_times(model, x, reps)
    rows = [(kind, c, t, one[kind][1]) for kind, (c, t) in sorted(default.items(), key=lambda kv: -kv[1][1])]
    return rows, folded


def _step_kind(interp, kernel) -> str:
    chain = interp._chains.get(kernel.op.outputs[0])
    if chain is None:
        return kernel.kind
    return "+".join(k.kind for k in chain.kernels) + " (one lookup)"


def _op_times(model: bytes, x: np.ndarray, reps: int) -> tuple[dict, str]:
    import npusim
    from npusim.runtime import interpreter

    sim = npusim.Interpreter(model, profile="tflm")
    sim.run(x)
    steps, gone = [], {}  # run()'s own steps with their kinds; the kernels it folds away, by kind
    for k, r in zip(sim.kernels, sim._run_reads):
        if r is None:
            gone[k.kind] = gone.get(k.kind, 0) + 1
        else:
            steps.append((k, _step_kind(sim, k)))
    kinds = {id(k): kind for k, kind in steps}
    per: dict[str, float] = {}
    walk_call = interpreter._RunWalk.call

    def timed(self, position, kernel, args):
        t0 = time.perf_counter()
        y = walk_call(self, position, kernel, args)
        kind = kinds.get(id(kernel), kernel.kind)
        per[kind] = per.get(kind, 0.0) + time.perf_counter() - t0
        return y

    totals: dict[str, list[float]] = {}
    interpreter._RunWalk.call = timed
    try:
        for _ in range(reps):
            per.clear()
            sim.run(x)
            for kind, t in per.items():
                totals.setdefault(kind, []).append(t)
    finally:
        interpreter._RunWalk.call = walk_call
    counts: dict[str, int] = {}
    for _, kind in steps:
        counts[kind] = counts.get(kind, 0) + 1
    folded = ", ".join(f"{c} {kind}" for kind, c in sorted(gone.items())) or "none"
    return {kind: (counts[kind], statistics.median(ts)) for kind, ts in totals.items()}, folded
