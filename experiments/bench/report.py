"""The bench's Markdown report (experiments/bench/main.py): the main table, the floors and targets, and
the sections in their order."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

from .machine import (
    blas_threads,
    compile_target,
    cpu_family_model,
    cpu_flags,
    cpu_model,
    kernel_path,
    peak_rss_mb,
    steal_share,
    versions,
)
from .timing import LITERT_THREADS, Row, fmt_ms

# Floors and targets of the speed issue (throughput ratios, higher is better for npusim).
FLOOR_TFLM, FLOOR_LITERT = 20.0, 0.25


TARGET_TFLM, TARGET_LITERT = 50.0, 1.0


@dataclass
class Results:
    """What the workloads measured, section by section of the report."""

    rows: list = field(default_factory=list)  # list[Row]: the main table
    notes: list = field(default_factory=list)
    memory: list = field(default_factory=list)  # table lines of "Memory of a model run"
    breakdown: list = field(default_factory=list)  # lines of "Where npusim's time goes"
    paths: list = field(default_factory=list)  # lines of "Kernel paths"
    zo: list = field(default_factory=list)  # lines of the ZO step section
    # workload -> (model bytes, input images, npusim's repetitions by batch), for the Haswell section
    inputs: dict = field(default_factory=dict)
    haswell: list = field(default_factory=list)  # lines of "AVX2 code compiled for Haswell"
    onnx: list = field(default_factory=list)  # lines of "ONNX: YOLO26-256 against ONNX Runtime"
    oneshot: list = field(default_factory=list)  # lines of "One shot: a fresh process per run"


# Issue 57: under load, npusim/LiteRT no lower than quiet by more than 20%.
LOADED_GOAL = 0.8


def loaded_ratio(r: Row) -> float:
    return r.litert_loaded / r.npusim_loaded


def table(rows: list[Row]) -> list[str]:
    head = (
        "| workload | batch | MMAC/img | npusim ms | npusim min ms | npusim 1T ms | LiteRT ms | TFLM ms* | "
        "npusim GMAC/s | LiteRT GMAC/s | TFLM GMAC/s | npusim img/s | LiteRT img/s | TFLM img/s | "
        "npusim/TFLM | npusim/LiteRT | meets 1.0x LiteRT | loaded: npusim ms | loaded: LiteRT ms | "
        "loaded npusim/LiteRT | loaded over quiet ratio (goal >= 0.8) | exact vs TFLM | exact vs LiteRT** |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lrt_note = "" if r.litert_batched else " (1-by-1)"
        lines.append(
            f"| {r.workload} | {r.batch} | {r.macs / 1e6:.1f} | {fmt_ms(r.npusim)} | {fmt_ms(r.npusim_min)} "
            f"| {fmt_ms(r.npusim_1t)} | {fmt_ms(r.litert)}{lrt_note} | {fmt_ms(r.tflm)} | "
            f"{r.gmacs(r.npusim):.2f} | {r.gmacs(r.litert):.2f} | {r.gmacs(r.tflm):.2f} | "
            f"{r.ips(r.npusim):.0f} | {r.ips(r.litert):.0f} | {r.ips(r.tflm):.1f} | {r.tflm / r.npusim:.1f}x "
            f"| {r.litert / r.npusim:.2f}x | {'yes' if r.litert >= r.npusim else 'NO'} | "
            f"{fmt_ms(r.npusim_loaded)} | {fmt_ms(r.litert_loaded)} | {loaded_ratio(r):.2f}x | "
            f"{loaded_ratio(r) / (r.litert / r.npusim):.2f} "
            f"{'(met)' if loaded_ratio(r) >= LOADED_GOAL * r.litert / r.npusim else '(MISSED)'} | "
            f"{r.exact_tflm} | {r.exact_litert} |"
        )
    return lines


def targets(rows: list[Row]) -> list[str]:
    def check(r: Row, label: str, need_t: float, need_l: float) -> str:
        st, sl = r.tflm / r.npusim, r.litert / r.npusim
        st1, sl1 = r.tflm / r.npusim_1t, r.litert / r.npusim_1t
        ok = "met" if st >= need_t and sl >= need_l else "MISSED"
        return (
            f"- {r.workload} batch {r.batch} {label} (>= {need_t:g}x TFLM, >= {need_l:g}x LiteRT): "
            f"{st:.1f}x / {sl:.3f}x -> {ok} (npusim on 1 thread: {st1:.1f}x / {sl1:.3f}x)"
        )

    out = [
        check(r, "floor", FLOOR_TFLM, FLOOR_LITERT) for r in rows if r.workload == "conv" and r.batch == 16
    ]
    out += [
        check(r, "target", TARGET_TFLM, TARGET_LITERT)
        for r in rows
        if (r.workload == "conv" and r.batch == 16) or (r.workload != "conv" and r.batch == 256)
    ]
    return out


def main_table(rows, tflm_imgs) -> list:
    """The workloads' table and what its columns mean."""
    return [
        *table(rows),
        "",
        "Times are medians over repetitions after one untimed warm-up call, npusim and LiteRT called in "
        "turn, for the whole batch, including "
        "set_tensor/get_tensor (LiteRT) and the input check (npusim). npusim: `Interpreter(model, "
        "profile='tflm').run(x)` on the whole batch. LiteRT: default "
        "interpreter (XNNPACK delegate), input resized to the batch.",
        "*TFLM runs batch 1 per invoke: its time is the median per image over "
        + ", ".join(f"{n} image(s) ({w})" for w, n in tflm_imgs)
        + ", multiplied by the batch (extrapolated, not measured on the whole batch).",
        "npusim 1T: the same run with numba.set_num_threads(1) and OpenBLAS set to 1 thread (diagnostic; "
        "the ratios use the default threads).",
        "loaded: the same interleaved runs with one busy process per core but one "
        "(experiments/bench/machine.py "
        "busy_cores: a spinning Python loop each), both sides under the same load; the goal is a loaded "
        "npusim/LiteRT ratio at least 0.8 of the quiet one. 'quiet' is this machine as the bench found "
        "it (see the load average above).",
        "Ratios are throughput ratios (other runtime's time / npusim's time): >1 means npusim is faster.",
        "exact vs TFLM: npusim (tflm profile) output == TFLM output on the images TFLM ran. **exact vs "
        "LiteRT: npusim (xnnpack profile) output == LiteRT output on the whole timed batch, for the conv "
        "and the whole models alike (the xnnpack profile is LiteRT's default interpreter op by op: "
        "docs/numerics.md).",
        *[f"- {r.workload} batch {r.batch}: {n}" for r in rows for n in r.notes],
    ]


def render(results: Results, command: str, quick: bool, started, load_start, ticks_start=None) -> str:
    """The Markdown report."""
    import numba

    rows = results.rows
    tflm_imgs = sorted({(r.workload, r.tflm_images) for r in rows})
    lines = [
        "# npusim speed benchmark",
        "",
        f"- CPU: {cpu_model()} ({cpu_family_model()}); features: {cpu_flags()}",
        f"- date: {started.isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}; "
        f"{cpu_flags()}; {platform.platform()}",
        f"- command: `{command}`"
        + (" (--quick: a smoke test, few repetitions; not a measurement)" if quick else ""),
        f"- versions: {versions()}",
        f"- load average (1/5/15 min) at start {' '.join(f'{v:.2f}' for v in load_start)}, at end "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} "
        "(other processes on the machine skew every time here); CPU time stolen by the hypervisor "
        f"during the run (/proc/stat steal): {steal_share(ticks_start)}",
        f"- threads: LiteRT num_threads={LITERT_THREADS}; numba.get_num_threads()={numba.get_num_threads()} "
        f"(layer {numba.threading_layer() if rows else 'n/a'}); BLAS: {blas_threads()}",
        f"- npusim MAC kernels (CONV_2D, FULLY_CONNECTED): {kernel_path()}",
        f"- npusim kernels compiled for: {compile_target()}",
    ]
    if rows:  # a run of other sections only (--only oneshot, onnx, zo) has no main table
        lines += ["", *main_table(rows, tflm_imgs)]
    lines += [*[f"- {n}" for n in results.notes], ""]
    if rows:
        lines += ["## Floors and targets", "", *targets(rows), ""]
    lines += results.zo
    if results.oneshot:
        lines += ["## One shot: a fresh process per run", "", *results.oneshot]
    if results.onnx:
        lines += ["## ONNX: YOLO26-256 against ONNX Runtime", "", *results.onnx]
    if results.memory:
        lines += [
            "## Memory of a model run",
            "",
            "Each model at the largest batch, alone in a fresh process (`memory_child`): resident memory "
            "after loading the model and the input, the peak of the first run (VmHWM), and the resident "
            "memory after each of 10 further runs. A flat last column means no allocation outlives a call.",
            "",
            "| model | batch | input MB | RSS after setup MB | peak RSS of the run MB | peak - setup MB | "
            "RSS after each further run MB | growth over 10 runs MB |",
            "|---|---|---|---|---|---|---|---|",
            *results.memory,
            "",
        ]
    if results.paths:
        lines += [
            "## Kernel paths",
            "",
            f"CPU features: {cpu_flags()}; kernels compiled for {compile_target()}. Each path that this "
            "host runs, forced with `Interpreter(model, backend=...)` (median of whole `run` calls, tflm "
            "profile; DEPTHWISE_CONV_2D takes the vector form of the selection). A path missing here "
            "does not run on this host and was not measured.",
            "",
            *results.paths,
            "",
        ]
    if results.haswell:
        lines += ["## AVX2 code compiled for Haswell, on this host", "", *results.haswell]
    if results.breakdown:
        lines += ["## Where npusim's time goes", "", *results.breakdown]
    lines.append(f"Peak RSS of the bench process: {peak_rss_mb():.0f} MB (resource.getrusage ru_maxrss).")
    return "\n".join(lines) + "\n"
