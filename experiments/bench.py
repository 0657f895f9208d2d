"""Speed benchmark: npusim against LiteRT (XNNPACK) and TFLite Micro, with exactness checks.

    python -m experiments.bench --shared ../shared [--quick] [--out experiments/results/bench.md]
                                [--only all|conv|models] [--conv-batches 1,16] [--model-batches 64,256]

One run times
  1. a one-op CONV_2D 1x56x56x64 -> 64, 3x3, SAME, stride 1, per-channel int8 weights, RELU (built
     here with the flatbuffer object API of ai_edge_litert) at batch 1 and 16;
  2. each shared model (ResNet-8 CIFAR-10, MobileNetV2 0.35 128 flowers) at batch 64 and 256;
with npusim (profile tflm, `Interpreter.run` on the whole batch), LiteRT's default interpreter
(XNNPACK, 2 threads, input resized to the batch) and TFLM (batch 1 per invoke: a few single images
are timed and the per-image median is multiplied by N). Every time is the median over repetitions
after a warm-up call (npusim's first call loads or compiles its Numba kernels; XNNPACK packs its
weights on the first invoke).

Exactness is checked on the timed inputs: npusim (tflm) against TFLM on the images TFLM ran, and
npusim (xnnpack profile) against LiteRT on the whole timed batch. Speed without exactness means
nothing, so every row says whether its outputs were equal.
Unless --quick or --no-breakdown, a breakdown section times the stages of Conv2D.__call__ and the
time spent per op kind in each model.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import gc
import importlib.metadata
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import flatbuffers
import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench.md"
MODELS = {
    "resnet8": "resnet8_cifar10_int8.tflite",
    "mobilenet_v2": "mobilenet_v2_0.35_128_flowers_int8.tflite",
}
LITERT_THREADS = 2

# Floors and targets of the speed issue (throughput ratios, higher is better for npusim).
FLOOR_TFLM, FLOOR_LITERT = 20.0, 0.25
TARGET_TFLM, TARGET_LITERT = 50.0, 1.0


# ----------------------------------------------------------------------------------------------
# The one-op conv model
# ----------------------------------------------------------------------------------------------

def conv_model(seed: int = 0) -> bytes:
    """CONV_2D 1x56x56x64 -> 64, 3x3, SAME, stride 1, per-channel int8 weights, int32 bias, RELU."""
    from ai_edge_litert import schema_py_generated as schema

    rng = np.random.default_rng(seed)
    n, h, w, c, o, k = 1, 56, 56, 64, 64, 3
    in_scale, in_zp = np.float32(0.05), -10
    w_scale = np.exp(rng.uniform(np.log(0.002), np.log(0.01), o)).astype(np.float32)
    weights = rng.integers(-127, 128, (o, k, k, c), dtype=np.int8)
    taps = k * k * c
    # Output scale: put a typical accumulator (~127*73*sqrt(taps)) at ~40 LSB of the output.
    typical = float(in_scale) * float(np.median(w_scale)) * 127 * 73 * np.sqrt(taps)
    out_scale, out_zp = np.float32(typical / 40.0), -20
    span = int(127 * 64 * np.sqrt(taps))
    bias = rng.integers(-span, span + 1, o).astype(np.int32)
    bias_scale = (np.float64(in_scale) * w_scale.astype(np.float64)).astype(np.float32)

    buffers = [schema.BufferT()]
    tensors = []

    def tensor(shape, ttype, name, scale, zp, axis=0, data=None):
        t = schema.TensorT()
        t.shape, t.type, t.name = list(shape), ttype, name
        q = schema.QuantizationParametersT()
        q.scale = [float(s) for s in np.atleast_1d(scale)]
        q.zeroPoint = [int(z) for z in np.broadcast_to(np.atleast_1d(zp), (len(q.scale),))]
        q.quantizedDimension = axis
        t.quantization = q
        if data is None:
            t.buffer = 0
        else:
            b = schema.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8)
            buffers.append(b)
            t.buffer = len(buffers) - 1
        tensors.append(t)
        return len(tensors) - 1

    x = tensor((n, h, w, c), schema.TensorType.INT8, "input", in_scale, in_zp)
    wt = tensor((o, k, k, c), schema.TensorType.INT8, "weights", w_scale, 0, 0, weights)
    bt = tensor((o,), schema.TensorType.INT32, "bias", bias_scale, 0, 0, bias)
    y = tensor((n, h, w, o), schema.TensorType.INT8, "output", out_scale, out_zp)

    code = schema.OperatorCodeT()
    code.builtinCode = schema.BuiltinOperator.CONV_2D
    code.deprecatedBuiltinCode = schema.BuiltinOperator.CONV_2D
    code.version = 3
    opt = schema.Conv2DOptionsT()
    opt.padding = schema.Padding.SAME
    opt.strideH = opt.strideW = 1
    opt.dilationHFactor = opt.dilationWFactor = 1
    opt.fusedActivationFunction = schema.ActivationFunctionType.RELU
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [x, wt, bt], [y]
    op.builtinOptionsType = schema.BuiltinOptions.Conv2DOptions
    op.builtinOptions = opt

    sg = schema.SubGraphT()
    sg.tensors, sg.inputs, sg.outputs, sg.operators, sg.name = tensors, [x], [y], [op], "main"
    model = schema.ModelT()
    model.version, model.operatorCodes, model.subgraphs, model.buffers = 3, [code], [sg], buffers
    model.description = "npusim bench conv"
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


# ----------------------------------------------------------------------------------------------
# Timing and runtimes
# ----------------------------------------------------------------------------------------------

def timings(fn, reps: int, warmup: int = 1) -> list[float]:
    """Wall times of reps calls of fn(), after warmup calls that are not timed."""
    for _ in range(warmup):
        fn()
    times = []
    gc.collect()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn, reps: int, warmup: int = 1) -> float:
    return statistics.median(timings(fn, reps, warmup))


class LiteRT:
    """LiteRT's default interpreter (AUTO resolver = XNNPACK delegate) with the input resized to N."""

    def __init__(self, model: bytes, batch: int, threads: int = LITERT_THREADS):
        from ai_edge_litert.interpreter import Interpreter

        self.batched = True
        self.it = Interpreter(model_content=model, num_threads=threads)
        inp = self.it.get_input_details()[0]
        self.in_index = inp["index"]
        self.out_index = self.it.get_output_details()[0]["index"]
        self.batch = batch
        if batch != 1:
            try:
                self.it.resize_tensor_input(self.in_index, [batch] + list(inp["shape"][1:]), strict=False)
                self.it.allocate_tensors()
                if self.it.get_output_details()[0]["shape"][0] != batch:
                    raise ValueError("output batch does not follow the input batch")
            except (ValueError, RuntimeError):
                # A graph with a hard-coded batch (e.g. RESHAPE to [1, K]): feed images one by one.
                self.batched = False
                self.it = Interpreter(model_content=model, num_threads=threads)
                self.it.allocate_tensors()
        else:
            self.it.allocate_tensors()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.batched:
            self.it.set_tensor(self.in_index, x)
            self.it.invoke()
            return self.it.get_tensor(self.out_index)
        outs = []
        for i in range(x.shape[0]):
            self.it.set_tensor(self.in_index, x[i:i + 1])
            self.it.invoke()
            outs.append(self.it.get_tensor(self.out_index))
        return np.concatenate(outs)


def tflm_run(model: bytes, x: np.ndarray, images: int) -> tuple[float, np.ndarray]:
    """TFLM on the first `images` images of x, one invoke each (after one untimed warm-up invoke).
    Returns the median seconds per image and the outputs."""
    from tflite_micro.python.tflite_micro import runtime

    arena = (4 << 20) + 4 * len(model) + 8 * int(x[:1].nbytes)
    it = runtime.Interpreter.from_bytes(bytes(model), arena_size=arena)
    it.set_input(np.ascontiguousarray(x[:1]), 0)
    it.invoke()
    times, outs = [], []
    for i in range(images):
        xi = np.ascontiguousarray(x[i:i + 1])
        t0 = time.perf_counter()
        it.set_input(xi, 0)
        it.invoke()
        out = np.array(it.get_output(0), copy=True)
        times.append(time.perf_counter() - t0)
        outs.append(out)
    return statistics.median(times), np.concatenate(outs)


def equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))


def describe_difference(a: np.ndarray, b: np.ndarray) -> str:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return f"{int((d != 0).sum())}/{a.size} differ, max |diff| {d.max():g}"


# ----------------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------------

@dataclass
class Row:
    workload: str
    batch: int
    macs: int  # per image
    npusim: float  # seconds for the batch (median)
    npusim_min: float
    npusim_1t: float  # median with 1 Numba thread and 1 BLAS thread
    litert: float
    tflm: float  # extrapolated: per-image median x batch
    tflm_images: int
    litert_batched: bool
    exact_tflm: str
    exact_litert: str
    notes: list = field(default_factory=list)

    def gmacs(self, seconds: float) -> float:
        return self.macs * self.batch / seconds / 1e9

    def ips(self, seconds: float) -> float:
        return self.batch / seconds


def bench_workload(name: str, model: bytes, inputs: np.ndarray, batches, reps: dict, tflm_images: int,
                   log) -> list[Row]:
    import npusim

    sim = npusim.Interpreter(model, profile="tflm")
    sim_x = npusim.Interpreter(model, profile="xnnpack")
    macs = sim.macs()
    tflm_images = min(tflm_images, inputs.shape[0])
    t_img, tflm_out = tflm_run(model, inputs, tflm_images)
    log(f"  TFLM: {t_img * 1e3:.2f} ms/image over {tflm_images} image(s)")
    rows = []
    for n in batches:
        x = np.ascontiguousarray(inputs[:n])
        if x.shape[0] != n:
            raise SystemExit(f"{name}: only {inputs.shape[0]} input images, need {n}")
        t0 = time.perf_counter()
        y_sim = sim.run(x)  # first call: Numba kernels load from the cache (or compile)
        first = time.perf_counter() - t0
        ts = timings(lambda: sim.run(x), reps["npusim"][n], warmup=1)
        t_sim = statistics.median(ts)
        lrt = LiteRT(model, n)
        tl = timings(lambda: lrt(x), reps["litert"][n], warmup=1)
        t_lrt = statistics.median(tl)
        with single_thread():
            t_1t = median_time(lambda: sim.run(x), reps["npusim"][n], warmup=1)
        y_lrt = lrt(x)
        y_simx = sim_x.run(x)
        k = min(tflm_images, n)
        ok_t = equal(y_sim[:k], tflm_out[:k])
        ok_l = equal(y_simx, y_lrt)
        row = Row(name, n, macs, t_sim, min(ts), t_1t, t_lrt, t_img * n, tflm_images, lrt.batched,
                  f"{'yes' if ok_t else 'no'} ({k} img)", f"{'yes' if ok_l else 'no'} ({n} img)")
        if not ok_t:
            row.notes.append(f"npusim tflm vs TFLM: {describe_difference(y_sim[:k], tflm_out[:k])}")
        if not ok_l:
            row.notes.append(f"npusim xnnpack vs LiteRT: {describe_difference(y_simx, y_lrt)}")
        if not lrt.batched:
            row.notes.append("LiteRT could not resize the batch; images fed one by one")
        log(f"  batch {n}: npusim {t_sim * 1e3:.1f} ms [{min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f}] (first call {first * 1e3:.0f} ms), "
            f"npusim 1 thread {t_1t * 1e3:.1f} ms, LiteRT {t_lrt * 1e3:.2f} ms [{min(tl) * 1e3:.2f}-{max(tl) * 1e3:.2f}], "
            f"exact TFLM {row.exact_tflm}, exact LiteRT {row.exact_litert}")
        rows.append(row)
        lrt = None  # release the runtime (and its threads) before the next batch
    return rows


# ----------------------------------------------------------------------------------------------
# Breakdowns (where npusim's time goes)
# ----------------------------------------------------------------------------------------------

def conv_stages(model: bytes, x: np.ndarray, reps: int) -> list[tuple[str, float, float]]:
    """Time each stage of Conv2D.__call__ on the AMX and VNNI paths (same calls, same arrays: the stages
    do not pay the page faults of fresh buffers that a real call pays), and the whole call on every
    kernel path, with the default threads and with one Numba and one BLAS thread."""
    import npusim
    from npusim import host
    from npusim.ops import aligned, amx, vnni
    from npusim.ops.gemm import accumulator_offset
    from npusim.ops.output_stage import output_parameters
    from npusim.ops.padding import pad_input

    sim = npusim.Interpreter(model, profile="tflm")
    kern = sim.kernels[0]
    w = sim.graph.tensors[kern.op.inputs[1]].data
    b = sim.graph.tensors[kern.op.inputs[2]].data
    o, c, zp = kern.options, x.shape[3], kern.inputs[0].zero_point
    sh, sw, dh, dw = o.get("stride_h", 1), o.get("stride_w", 1), o.get("dilation_h_factor", 1), o.get("dilation_w_factor", 1)
    wg = w[None]
    cp = (c + 3) // 4 * 4
    hp, wp = (kern.out_h - 1) * sh + (kern.kh - 1) * dh + 1, (kern.out_w - 1) * sw + (kern.kw - 1) * dw + 1
    xp = aligned.empty((x.shape[0], hp, wp, cp), np.int8)
    taps = np.array([(ky * dh * wp + kx * dw) * cp for ky in range(kern.kh) for kx in range(kern.kw)], dtype=np.int64)
    packed = vnni.pack_filters(wg.reshape(1, kern.out_channels, kern.kh * kern.kw, c), cp)
    s = kern.stage
    out = aligned.empty((x.shape[0] * kern.out_h * kern.out_w, kern.out_channels), np.int8)
    stage_args = (np.int64(kern.profile), np.int64(s.zero_point), np.int64(s.lo), np.int64(s.hi))

    stages = [("pad_input (Numba: the padded int8 copy)", lambda: pad_input(x, kern.pad_top, kern.pad_left, np.int8(zp), xp)),
              ("pack_filters (Numba)", lambda: vnni.pack_filters(wg.reshape(1, kern.out_channels, kern.kh * kern.kw, c), cp))]
    paths = []
    if host.has_amx():
        chunk = amx.chunk_for(cp)
        params = output_parameters(accumulator_offset(wg, b, zp), s)
        stages.append(("conv_amx (AMX tiles + vector output stage)",
                       lambda: amx.conv_amx(xp, packed, taps, cp, chunk, kern.out_h, kern.out_w, sh, sw, 1, False, kern.out_channels,
                                            params, *stage_args, amx.tile_config(chunk), out)))
        paths.append("AMX")
    if host.has_vnni():
        params_u = output_parameters(accumulator_offset(wg, b, zp + 128), s)
        stages.append(("conv_vnni (VNNI micro-kernel + vector output stage)",
                       lambda: vnni.conv_vnni(xp, packed, taps, cp // 4, kern.out_h, kern.out_w, sh, sw, 1, False, kern.out_channels,
                                              params_u, *stage_args, out)))
        paths.append("VNNI")
    paths.append("BLAS")
    for name in paths:
        what = {"AMX": "AMX", "VNNI": "VNNI",
                "BLAS": "float32 BLAS (im2col + sgemm; here under Numba's OpenMP layer, which fights OpenBLAS's threads: "
                        "a host without VNNI runs it under the workqueue layer)"}[name]
        on_path = npusim.Interpreter(model, profile="tflm", backend=name.lower()).kernels[0]
        stages.append((f"whole Conv2D.__call__, {what} path", lambda k=on_path: k(x, w, b)))
    stages.append(("whole Interpreter.run (default path)", lambda: sim.run(x)))
    default = [median_time(fn, reps, warmup=1) for _, fn in stages]
    with single_thread():
        one = [median_time(fn, reps, warmup=1) for _, fn in stages]
    return [(label, t, t1) for (label, _), t, t1 in zip(stages, default, one)]


def op_breakdown(model: bytes, x: np.ndarray, reps: int) -> list[tuple[str, int, float, float]]:
    """Median time per op kind, running the plan one kernel at a time (Interpreter.evaluate), with the
    default threads and with one Numba and one BLAS thread."""
    default = _op_times(model, x, reps)
    with single_thread():
        one = _op_times(model, x, reps)
    return [(kind, c, t, one[kind][1]) for kind, (c, t) in sorted(default.items(), key=lambda kv: -kv[1][1])]


def _op_times(model: bytes, x: np.ndarray, reps: int) -> dict:
    import npusim

    sim = npusim.Interpreter(model, profile="tflm")
    sim.run(x)
    totals: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    for _ in range(reps):
        values = {sim.graph.inputs[0]: sim.check_input(x)}
        per = {}
        for kern in sim.kernels:
            t0 = time.perf_counter()
            sim.evaluate(values, kernels=[kern])
            per[kern.kind] = per.get(kern.kind, 0.0) + time.perf_counter() - t0
        for kind, t in per.items():
            totals.setdefault(kind, []).append(t)
    for kern in sim.kernels:
        counts[kern.kind] = counts.get(kern.kind, 0) + 1
    return {kind: (counts[kind], statistics.median(ts)) for kind, ts in totals.items()}


# ----------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------

def kernel_path() -> str:
    from npusim import host
    from npusim.ops import backend

    chosen = [b.name for b in backend.select().backends]
    parts = []
    if "amx" in chosen:
        parts.append("AMX-INT8 tiles for CONV_2D with output rows of 16+ pixels (npusim/ops/amx.py)")
    if "vnni" in chosen:
        parts.append("AVX-512 VNNI for the other CONV_2D and FULLY_CONNECTED (npusim/ops/vnni.py)")
    else:
        why = "NPUSIM_VNNI=0" if host.has_vnni() else "this CPU has no AVX-512 VNNI"
        parts.append(f"float32 BLAS GEMM, exact by chunking ({why})")
    return "; ".join(parts) + ", all with exact integer accumulation"


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
                keep = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"]
                return " ".join(f for f in keep if f in flags) or "none of avx2/avx512/vnni"
    except OSError:
        pass
    return "unknown"


def _openblas():
    """(get_num_threads, set_num_threads, config string) of the OpenBLAS that numpy loaded, found in this
    process's memory map, or None (threadpoolctl is not a dependency of the project)."""
    try:
        libs = sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                       if "openblas" in line.lower() and ".so" in line.split()[-1]})
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

        return "; ".join(f"{i.get('internal_api')} {i.get('version')}: {i.get('num_threads')} threads"
                         for i in threadpool_info() if i.get("user_api") == "blas") or "no BLAS found"
    except ImportError:
        pass
    ob = _openblas()
    if ob is not None:
        return f"OpenBLAS ({' '.join(ob[2].split())}): {ob[0]()} threads (read via ctypes; threadpoolctl not installed)"
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} (threads unknown: threadpoolctl not installed)"
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


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


def memory_child(shared: str, name: str, batch: int, calls: int) -> None:
    """Run in a fresh process (see memory_of_run): one model at one batch, alone. Prints JSON with the
    resident memory after setup, the peak of the first run, and the resident memory after each of
    `calls` further runs (flat if no allocation outlives a call)."""
    import json

    import npusim

    npusim.tune_process()
    model = (Path(shared) / "models" / MODELS[name]).read_bytes()
    sim = npusim.Interpreter(model, profile="tflm")
    t_in = sim.graph.input(0)
    x, _ = model_inputs(Path(shared), name, batch, t_in.shape, t_in.dtype)
    x = np.ascontiguousarray(x)
    gc.collect()
    setup = current_rss_mb()
    sim.run(x)
    peak = process_peak_rss_mb()
    after = []
    for _ in range(calls):
        sim.run(x)
        gc.collect()
        after.append(current_rss_mb())
    print(json.dumps({"setup": setup, "peak": peak, "after": after, "input_mb": x.nbytes / 2**20}))


def memory_of_run(shared: Path, name: str, batch: int, calls: int = 10) -> dict:
    """memory_child in a fresh interpreter, so that the peak is this run's alone."""
    import json
    import subprocess

    code = f"from experiments.bench import memory_child; memory_child({str(shared)!r}, {name!r}, {batch}, {calls})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        raise SystemExit(f"memory run of {name} at batch {batch} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------
# Inputs for the shared models
# ----------------------------------------------------------------------------------------------

def model_inputs(shared: Path, name: str, n: int, shape, dtype) -> tuple[np.ndarray, str]:
    """Real images when the shared data is there (CIFAR-10 for ResNet-8, EuroSAT-64 upsampled 2x for
    MobileNetV2, cycled to n), random pixels otherwise."""
    h, w = shape[1], shape[2]
    src = {"resnet8": ("cifar10_subset.npz", 1), "mobilenet_v2": ("eurosat64_subset.npz", 2)}[name]
    path = shared / "data" / src[0]
    if path.exists():
        with np.load(path) as d:
            imgs = d["x_test"]
        f = src[1]
        if f > 1:
            imgs = imgs.repeat(f, axis=1).repeat(f, axis=2)
        if imgs.shape[1:3] == (h, w):
            imgs = np.resize(imgs, (n,) + imgs.shape[1:])
            desc = f"{src[0]} x_test" + (f" upsampled {f}x (nearest)" if f > 1 else "")
            if dtype == np.int8:
                return (imgs.astype(np.int16) - 128).astype(np.int8), desc + ", pixel - 128"
            return imgs.astype(dtype), desc
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, (n,) + tuple(shape[1:]), dtype=dtype), "random pixels"


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------

def fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def table(rows: list[Row]) -> list[str]:
    head = ("| workload | batch | MMAC/img | npusim ms | npusim min ms | npusim 1T ms | LiteRT ms | TFLM ms* | npusim GMAC/s | LiteRT GMAC/s | TFLM GMAC/s "
            "| npusim img/s | LiteRT img/s | TFLM img/s | npusim/TFLM | npusim/LiteRT | exact vs TFLM | exact vs LiteRT** |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lrt_note = "" if r.litert_batched else " (1-by-1)"
        lines.append(
            f"| {r.workload} | {r.batch} | {r.macs / 1e6:.1f} | {fmt_ms(r.npusim)} | {fmt_ms(r.npusim_min)} | {fmt_ms(r.npusim_1t)} | {fmt_ms(r.litert)}{lrt_note} | "
            f"{fmt_ms(r.tflm)} | {r.gmacs(r.npusim):.2f} | {r.gmacs(r.litert):.2f} | {r.gmacs(r.tflm):.2f} | "
            f"{r.ips(r.npusim):.0f} | {r.ips(r.litert):.0f} | {r.ips(r.tflm):.1f} | "
            f"{r.tflm / r.npusim:.1f}x | {r.litert / r.npusim:.2f}x | {r.exact_tflm} | {r.exact_litert} |")
    return lines


def targets(rows: list[Row]) -> list[str]:
    def check(r: Row, label: str, need_t: float, need_l: float) -> str:
        st, sl = r.tflm / r.npusim, r.litert / r.npusim
        st1, sl1 = r.tflm / r.npusim_1t, r.litert / r.npusim_1t
        ok = "met" if st >= need_t and sl >= need_l else "MISSED"
        return (f"- {r.workload} batch {r.batch} {label} (>= {need_t:g}x TFLM, >= {need_l:g}x LiteRT): "
                f"{st:.1f}x / {sl:.3f}x -> {ok} (npusim on 1 thread: {st1:.1f}x / {sl1:.3f}x)")

    out = [check(r, "floor", FLOOR_TFLM, FLOOR_LITERT) for r in rows if r.workload == "conv" and r.batch == 16]
    out += [check(r, "target", TARGET_TFLM, TARGET_LITERT) for r in rows
            if (r.workload == "conv" and r.batch == 16) or (r.workload != "conv" and r.batch == 256)]
    return out


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def parse_batches(s: str) -> list[int]:
    try:
        b = [int(v) for v in s.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes, got {s!r}") from None
    if not b or any(v < 1 for v in b):
        raise argparse.ArgumentTypeError(f"expected positive batch sizes, got {s!r}")
    return b


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, default=Path("../shared"), help="the shared folder (models/, data/)")
    p.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, not a measurement")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Markdown report (default experiments/results/bench.md)")
    p.add_argument("--only", choices=("all", "conv", "models", "zo"), default="all", help="which workloads to run")
    p.add_argument("--conv-batches", type=parse_batches, default=[1, 16], help="default 1,16")
    p.add_argument("--model-batches", type=parse_batches, default=[64, 256], help="default 64,256")
    p.add_argument("--no-breakdown", action="store_true", help="skip the per-stage / per-op breakdown")
    return p


def bench_zo_step(shared: Path, reps: int, q: int = 16, batch: int = 32) -> list[str]:
    """Simulator wall time of one ZO step over the time of its 2q forward passes run plainly (full
    model, batch by batch), both on npusim: what the prefix cache and the batched probes save."""
    import npusim
    from zo.data import load_dataset, subset
    from zo.trainer import TrainConfig, Trainer, prepare_inputs

    model = shared / "models" / MODELS["resnet8"]
    data_path = shared / "data" / "eurosat32_subset.npz"
    data = subset(load_dataset(data_path), 1024, 200)
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        cfg = TrainConfig(model=str(model), data=str(data_path), trainable="last:4", q=f"fixed:{q}", batch=batch,
                          budget=10**9, checkpoint_every=10**9)
        trainer = Trainer(cfg, out, dataset=data)
        trainer.train_step(q)  # warm-up: compiles or loads the kernels
        step_times = timings(lambda: trainer.train_step(q), reps, warmup=0)
    interp = npusim.Interpreter(model)
    x = prepare_inputs(data.x_train[:batch], trainer.model)
    forward = median_time(lambda: interp.run(x), reps)
    step = float(np.median(step_times))
    ratio = step / (2 * q * forward)
    names = ", ".join(p.name.split("/")[-1][:40] for p in trainer.model.params)
    return ["## ZO step against plain forward passes", "",
            "| workload | batch | q | ZO step ms | one forward pass of the batch ms | 2q forward passes ms | ratio (target < 0.5) |",
            "|---|---|---|---|---|---|---|",
            f"| ResNet-8 last:4 (last residual block + classifier) | {batch} | {q} | {fmt_ms(step)} | {fmt_ms(forward)} | "
            f"{fmt_ms(2 * q * forward)} | {ratio:.3f} {'(met)' if ratio < 0.5 else '(MISSED)'} |", "",
            f"Trainable tensors: {names}. The step includes gathering the batch, the 2q perturbed passes of the "
            "trainable suffix on the cached prefix activations (one batched call), the host loss, regenerating the "
            "directions, the Adam update and the int8 write-back. Median of "
            f"{len(step_times)} steps; forward: median of `Interpreter.run` on the batch.", ""]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    import npusim

    npusim.tune_process()
    command = "python -m experiments.bench " + " ".join(argv)
    started = _dt.datetime.now().astimezone()
    load_start = os.getloadavg()

    def log(msg: str):
        print(msg, file=sys.stderr, flush=True)

    q = args.quick

    def reps_for(batches, fast, slow):
        return {n: (2 if q else (fast if n <= 16 else slow)) for n in batches}

    rows: list[Row] = []
    memory: list[str] = []
    notes: list[str] = []
    breakdown: list[str] = []
    import numba

    if args.only in ("all", "conv"):
        log("CONV_2D 1x56x56x64 -> 64, 3x3, SAME")
        model = conv_model()
        n_max = max(args.conv_batches)
        x = np.random.default_rng(2).integers(-128, 128, (n_max, 56, 56, 64), dtype=np.int8)
        reps = {"npusim": reps_for(args.conv_batches, 15, 5), "litert": reps_for(args.conv_batches, 15, 5)}
        rows += bench_workload("conv", model, x, args.conv_batches, reps, tflm_images=1 if q else 3, log=log)
        notes.append(f"conv: {rows[-1].macs / 1e6:.1f} MMAC per image = 56*56*64*3*3*64 (npusim Interpreter.macs(); the "
                     "'231 MMAC' of int8-numerics.md is twice that, 2 operations per MAC: if its GMAC/s anchors divide 231 M by the "
                     "time, they are twice the MAC rates of this table); "
                     "random int8 input, per-channel weights, RELU.")
        if not q and not args.no_breakdown:
            nb_ = 16 if 16 in args.conv_batches else n_max
            log(f"  breakdown of Conv2D.__call__ at batch {nb_}")
            stages = conv_stages(model, np.ascontiguousarray(x[:nb_]), reps=7)
            macs = rows[-1].macs
            breakdown += [f"### Conv2D.__call__ stages, conv at batch {nb_} (median ms, tflm profile)", "",
                          "| stage | ms | GMAC/s equiv. | ms, 1 thread | GMAC/s equiv., 1 thread |", "|---|---|---|---|---|"]
            breakdown += [f"| {label} | {fmt_ms(t)} | {macs * nb_ / t / 1e9:.1f} | {fmt_ms(t1)} | {macs * nb_ / t1 / 1e9:.1f} |"
                          for label, t, t1 in stages]
            breakdown.append("")

    if args.only in ("all", "models"):
        import npusim

        for name, fname in MODELS.items():
            path = args.shared / "models" / fname
            if not path.exists():
                raise SystemExit(f"{path}: not found (pass --shared, the folder that holds models/)")
            model = path.read_bytes()
            t_in = npusim.load_model(model).input(0)
            x, desc = model_inputs(args.shared, name, max(args.model_batches), t_in.shape, t_in.dtype)
            notes.append(f"{name} inputs: {desc}.")
            log(f"{name} ({fname}), inputs: {desc}")
            reps = {"npusim": reps_for(args.model_batches, 7, 3), "litert": reps_for(args.model_batches, 7, 3)}
            rows += bench_workload(name, model, x, args.model_batches, reps, tflm_images=2 if q else 16, log=log)
            nb_ = max(args.model_batches)
            mem = memory_of_run(args.shared, name, nb_)
            growth = max(mem["after"]) - mem["after"][0]
            memory.append(f"| {name} | {nb_} | {mem['input_mb']:.1f} | {mem['setup']:.0f} | {mem['peak']:.0f} | "
                          f"{mem['peak'] - mem['setup']:.0f} | {' '.join(f'{v:.0f}' for v in mem['after'])} | {growth:+.1f} |")
            if not q and not args.no_breakdown:
                nb_ = max(args.model_batches)
                log(f"  per-op breakdown at batch {nb_}")
                ops = op_breakdown(model, np.ascontiguousarray(x[:nb_]), reps=3)
                total = sum(t for _, _, t, _ in ops)
                total1 = sum(t1 for _, _, _, t1 in ops)
                breakdown += [f"### {name} per op kind at batch {nb_} (median ms, one kernel at a time)", "",
                              "| op kind | count | ms | share | ms, 1 thread | share, 1 thread |", "|---|---|---|---|---|---|"]
                breakdown += [f"| {k} | {c} | {fmt_ms(t)} | {100 * t / total:.0f}% | {fmt_ms(t1)} | {100 * t1 / total1:.0f}% |"
                              for k, c, t, t1 in ops]
                breakdown += [f"| total | {sum(c for _, c, _, _ in ops)} | {fmt_ms(total)} | | {fmt_ms(total1)} | |", ""]

    zo_lines: list[str] = []
    if args.only in ("all", "zo"):
        log("ZO step: ResNet-8, last residual block + classifier (last:4), batch 32, q = 16")
        zo_lines = bench_zo_step(args.shared, reps=3 if q else 10)

    rss = peak_rss_mb()
    tflm_imgs = sorted({(r.workload, r.tflm_images) for r in rows})
    lines = [
        "# npusim speed benchmark", "",
        f"- date: {started.isoformat(timespec='seconds')}",
        f"- machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {cpu_model()}; {cpu_flags()}; {platform.platform()}",
        f"- command: `{command}`" + (" (--quick: a smoke test, few repetitions; not a measurement)" if q else ""),
        f"- versions: {versions()}",
        f"- load average (1/5/15 min) at start {' '.join(f'{v:.2f}' for v in load_start)}, at end "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())} (other processes on the machine skew every time here)",
        f"- threads: LiteRT num_threads={LITERT_THREADS}; numba.get_num_threads()={numba.get_num_threads()} "
        f"(layer {numba.threading_layer() if rows else 'n/a'}); BLAS: {blas_threads()}",
        f"- npusim MAC kernels (CONV_2D, FULLY_CONNECTED): {kernel_path()}",
        "", *table(rows), "",
        "Times are medians over repetitions after one untimed warm-up call, for the whole batch, including "
        "set_tensor/get_tensor (LiteRT) and the input check (npusim). npusim: `Interpreter(model, profile='tflm').run(x)` "
        "on the whole batch. LiteRT: default interpreter (XNNPACK delegate), input resized to the batch.",
        "*TFLM runs batch 1 per invoke: its time is the median per image over "
        + ", ".join(f"{n} image(s) ({w})" for w, n in tflm_imgs)
        + ", multiplied by the batch (extrapolated, not measured on the whole batch).",
        "npusim 1T: the same run with numba.set_num_threads(1) and OpenBLAS set to 1 thread (diagnostic; "
        "the ratios use the default threads).",
        "Ratios are throughput ratios (other runtime's time / npusim's time): >1 means npusim is faster.",
        "exact vs TFLM: npusim (tflm profile) output == TFLM output on the images TFLM ran. "
        "**exact vs LiteRT: npusim (xnnpack profile) output == LiteRT output on the whole timed batch; the claim "
        "for the conv, informational for whole models (the xnnpack profile is XNNPACK's requantization of the MAC "
        "ops; other ops such as ADD, MEAN and SOFTMAX may round differently in XNNPACK).",
        *[f"- {n}" for n in notes],
        *[f"- {r.workload} batch {r.batch}: {n}" for r in rows for n in r.notes],
        "",
    ]
    if rows:
        lines += ["## Floors and targets", "", *targets(rows), ""]
    if zo_lines:
        lines += zo_lines
    if memory:
        lines += ["## Memory of a model run", "",
                  "Each model at the largest batch, alone in a fresh process (`memory_child`): resident memory after "
                  "loading the model and the input, the peak of the first run (VmHWM), and the resident memory after "
                  "each of 10 further runs. A flat last column means no allocation outlives a call.", "",
                  "| model | batch | input MB | RSS after setup MB | peak RSS of the run MB | peak - setup MB | "
                  "RSS after each further run MB | growth over 10 runs MB |",
                  "|---|---|---|---|---|---|---|---|", *memory, ""]
    if breakdown:
        lines += ["## Where npusim's time goes", "", *breakdown]
    lines.append(f"Peak RSS of the bench process: {rss:.0f} MB (resource.getrusage ru_maxrss).")
    report = "\n".join(lines) + "\n"
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    log(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
