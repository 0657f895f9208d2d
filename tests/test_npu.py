"""The STM32N6 Neural-ART view: placement, epochs, MACs, memory plan and latency estimate, through
`npusim inspect --target stm32n6` and the importable API (plan_device, plan_arena)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from npusim import Interpreter, NpusimError, Quantization, Tensor, npu
from npusim.app.cli import main
from npusim.npu import (
    M55,
    NPU,
    Buffer,
    CostModel,
    activation_lifetimes,
    greedy_first_fit,
    placement,
    plan_arena,
    plan_device,
)

from shared_paths import MOBILENET, RESNET, SHARED, need

# Ops that must fall back to the Cortex-M55 on each real model.
# (MobileNetV2's QUANTIZE of its uint8 input is one ARITH on the NPU, as in ST's YOLOX compile.)
EXPECTED_M55 = {RESNET.name: {"SOFTMAX"}, MOBILENET.name: {"SOFTMAX", "DEQUANTIZE"}}
EXPECTED_EPOCHS = {RESNET.name: [NPU, M55], MOBILENET.name: [NPU, M55]}


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module", params=[RESNET, MOBILENET], ids=["resnet8", "mobilenetv2"])
def model(request):
    path = need(request.param)
    return path, Interpreter(path)


class NoEval:
    """A kernel stand-in that exposes the plan but refuses to compute."""

    def __init__(self, kernel):
        self._kernel = kernel

    def __getattr__(self, name):
        return getattr(self._kernel, name)

    def __call__(self, *args):
        raise AssertionError("the device model must not run kernels")


# -- inspect --target stm32n6 ----------------------------------------------------------------


def test_inspect_stm32n6_cli(model):
    path, interp = model
    result = cli("inspect", path, "--target", "stm32n6")
    assert result.exit_code == 0, result.output
    out = result.stdout
    name = Path(path).name
    m55 = EXPECTED_M55[name]
    n_ops = len(interp.kernels)
    assert f"ops: {n_ops - len(m55)} on NPU, {len(m55)} on M55 ({', '.join(sorted(m55))})" in out
    total = sum(k.macs() for k in interp.kernels)
    assert f"MACs: {total:,} per image" in out
    dev = plan_device(interp)
    assert f"activation arena: peak {dev.arena.peak_bytes:,} B" in out
    assert f"naive sum {dev.arena.naive_bytes:,} B" in out
    assert f"weight memory: {dev.weight_bytes:,} B" in out
    assert re.search(r"estimated latency: \d+\.\d+ ms per image", out)
    # one row per op with its unit
    for k in interp.kernels:
        assert re.search(rf"^\s*{k.op.index}\s+{k.op.kind}\s+(NPU|M55)\s", out, re.M)


def test_placement_epochs_and_macs(model):
    path, interp = model
    dev = plan_device(interp)
    name = Path(path).name
    assert {o.kind for o in dev.m55_ops} == EXPECTED_M55[name]
    assert all(o.reason for o in dev.m55_ops) and not any(o.reason for o in dev.npu_ops)
    assert [e.unit for e in dev.epochs] == EXPECTED_EPOCHS[name]
    # epochs are maximal runs of one unit, covering every op once in execution order
    assert [o for e in dev.epochs for o in e.ops] == dev.ops
    assert all(a.unit != b.unit for a, b in zip(dev.epochs, dev.epochs[1:]))
    assert dev.total_macs == sum(k.macs() for k in interp.kernels) == interp.macs()
    assert sum(e.macs for e in dev.epochs) == dev.total_macs
    assert sum(o.macs for o in dev.npu_ops) > 0.99 * dev.total_macs
    # weights: every constant tensor the ops read, once
    consts = {
        t for k in interp.kernels for t in k.op.inputs if t >= 0 and interp.graph.tensors[t].is_constant
    }
    assert dev.weight_bytes == sum(interp.graph.tensors[t].data.nbytes for t in consts)
    assert sum(e.weight_bytes for e in dev.epochs) == dev.weight_bytes
    d = dev.to_dict()
    assert d["total_macs"] == dev.total_macs and len(d["ops"]) == len(interp.kernels)


def test_arena_plan_is_valid_and_bounded(model):
    _, interp = model
    for batch in (1, 3):
        plan = plan_arena(interp, batch)
        sizes = [b.size for b in plan.buffers]
        assert plan.largest_tensor_bytes == max(sizes)
        assert plan.largest_tensor_bytes < plan.peak_bytes <= plan.naive_bytes
        assert plan.max_live_bytes <= plan.peak_bytes
        # no two tensors alive at the same time share memory
        for i, a in enumerate(plan.buffers):
            for b in plan.buffers[i + 1 :]:
                if a.first <= b.last and b.first <= a.last:
                    assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (a, b)
    one, three = plan_arena(interp, 1), plan_arena(interp, 3)
    assert three.peak_bytes <= 3 * one.peak_bytes + 16 * len(one.buffers)
    # every activation tensor of the plan is in it, with its producer and last reader
    life = activation_lifetimes(interp)
    assert set(life) == {b.tensor for b in one.buffers}
    assert set(interp.graph.inputs) <= set(life)


def test_model_comes_from_the_plan_not_from_kernels(model):
    _, interp = model
    before = plan_device(interp).to_dict()

    class Blind:
        graph = interp.graph
        kernels = [NoEval(k) for k in interp.kernels]

    after = plan_device(Blind()).to_dict()
    assert after == before


def test_latency_scales_and_follows_the_cost_model(model, monkeypatch):
    _, interp = model
    dev = plan_device(interp)
    t1 = dev.latency_s(1)
    assert 1e-5 < t1 < 1.0
    assert dev.latency_s(4) == pytest.approx(4 * t1)
    assert dev.latency_s(1) == pytest.approx(dev.unit_seconds(NPU) + dev.unit_seconds(M55))
    assert dev.latency_s(1, first=len(dev.ops) - 1) < t1
    slow = plan_device(interp, CostModel(npu_efficiency=dev.cost.npu_efficiency / 2))
    assert slow.unit_seconds(NPU) > dev.unit_seconds(NPU)
    assert slow.unit_seconds(M55) == pytest.approx(dev.unit_seconds(M55))
    # module constants are the defaults of every later estimate; one overhead per hardware or
    # software epoch
    epochs = sum(1 for o in dev.ops if o.overhead_s > 0)
    assert epochs == dev.hardware_epochs + dev.software_epochs
    monkeypatch.setattr(npu.cost, "EPOCH_OVERHEAD_S", 1e-3)
    assert plan_device(interp).latency_s(1) == pytest.approx(t1 + epochs * (1e-3 - dev.cost.epoch_overhead_s))
    # every op: max(compute, memory) + its epoch's overhead; convolutions at peak x efficiency x u(depth)
    for o in dev.ops:
        assert o.seconds == pytest.approx(max(o.compute_s, o.memory_s) + o.overhead_s)
    conv = next(o for o in dev.ops if o.kind == "CONV_2D")
    k = interp.kernels[conv.position]
    depth = k.macs() / np.prod(k.outputs[0].shape)
    rate = 300e9 * dev.cost.npu_efficiency * depth / (depth + dev.cost.ca_half_depth)
    assert conv.compute_s == pytest.approx(conv.macs / rate)


def test_cli_cost_options(model):
    path, _ = model
    base = cli("inspect", path, "--target", "stm32n6").stdout
    fast = cli(
        "inspect", path, "--target", "stm32n6", "--npu-efficiency", "1.0", "--m55-macs-per-cycle", "8"
    ).stdout

    def ms(out):
        return float(re.search(r"estimated latency: ([\d.]+) ms", out).group(1))

    assert ms(fast) < ms(base)
    assert "x 1 efficiency" in fast and "x 8 MAC/cycle" in fast
    for bad in (["--npu-efficiency", "0"], ["--npu-efficiency", "1.5"], ["--m55-macs-per-cycle", "-1"]):
        r = cli("inspect", path, "--target", "stm32n6", *bad)
        assert r.exit_code == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.output
    r = cli("inspect", path, "--npu-efficiency", "0.5")
    assert r.exit_code == 2 and "stm32n6" in r.stderr


# -- placement rules and the planner on small cases ------------------------------------------------


def _t(shape, dtype=np.int8, data=None, name="t"):
    q = Quantization(np.array([0.1], np.float32), np.array([0])) if np.dtype(dtype) == np.int8 else None
    return Tensor(name=name, shape=tuple(shape), dtype=np.dtype(dtype), quant=q, data=data)


def _kernel(kind, inputs, outputs, **options):
    return SimpleNamespace(
        op=SimpleNamespace(kind=kind, options=options, inputs=[], outputs=[], index=0),
        inputs=inputs,
        outputs=outputs,
        macs=lambda: 0,
    )


def test_placement_rules():
    x, y = _t((1, 8, 8, 4)), _t((1, 8, 8, 4))
    assert (
        placement(
            _kernel(
                "CONV_2D",
                [x, _t((4, 1, 1, 4), data=np.zeros((4, 1, 1, 4), np.int8))],
                [y],
                fused_activation_function="RELU6",
            )
        )[0]
        == NPU
    )
    assert placement(_kernel("CONV_2D", [x], [y], fused_activation_function="TANH"))[0] == M55
    assert placement(_kernel("ADD", [_t((1, 8, 8, 4), np.float32), x], [y]))[0] == M55
    assert placement(_kernel("SOFTMAX", [x], [y]))[0] == M55
    # integer to int8: an ARITH on the NPU (ST's compile of YOLOX-nano); from float: SW_FLOAT
    assert placement(_kernel("QUANTIZE", [_t((1, 8, 8, 4), np.uint8)], [y]))[0] == NPU
    assert placement(_kernel("QUANTIZE", [_t((1, 8, 8, 4), np.float32)], [y]))[0] == M55
    assert placement(_kernel("DEQUANTIZE", [x], [_t((1, 8, 8, 4), np.float32)]))[0] == M55
    assert placement(_kernel("CUSTOM:foo", [x], [y]))[0] == M55

    def axes(a):
        return _t((len(a),), np.int32, data=np.array(a, np.int32))

    assert placement(_kernel("MEAN", [x, axes([1, 2])], [_t((1, 4))]))[0] == NPU
    assert placement(_kernel("MEAN", [x, axes([-3, -2])], [_t((1, 4))]))[0] == NPU
    assert placement(_kernel("MEAN", [x, axes([3])], [_t((1, 8, 8))]))[0] == M55
    assert (
        placement(_kernel("TRANSPOSE", [_t((1, 2, 3, 4, 5)), axes([0, 1, 2, 4, 3])], [_t((1, 2, 3, 5, 4))]))[
            0
        ]
        == M55
    )
    assert placement(_kernel("RESHAPE", [x, axes([1, 256])], [_t((1, 256))]))[0] == NPU


def test_greedy_first_fit_reuses_memory_of_dead_tensors():
    bufs = [Buffer(0, 100, 0, 1), Buffer(1, 50, 1, 2), Buffer(2, 100, 2, 3), Buffer(3, 30, 3, 3)]
    peak = greedy_first_fit(bufs)
    off = {b.tensor: b.offset for b in bufs}
    assert off[0] == 0 and off[2] == 0  # same memory, disjoint lifetimes
    assert off[1] == 100 and off[3] == 100  # 3 fits where 1 was, after 1 died
    assert peak == 150


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("npu_efficiency", 0.0, r"cost model: npu_efficiency must be in \(0, 1\], got 0.0$"),
        ("npu_efficiency", 1.5, r"cost model: npu_efficiency must be in \(0, 1\], got 1.5$"),
        ("m55_macs_per_cycle", 0.0, "cost model: m55_macs_per_cycle must be positive, got 0.0$"),
        ("npu_clock_hz", -1.0, "cost model: npu_clock_hz must be positive, got -1.0$"),
        ("weight_bytes_per_s", float("nan"), "cost model: weight_bytes_per_s must be positive, got nan$"),
        ("npu_conv_accelerators", 0, "cost model: npu_conv_accelerators must be >= 1, "),
        ("epoch_overhead_s", -1e-6, "epoch_overhead_s and ca_half_depth >= 0$"),
    ],
)
def test_cost_model_validation_names_the_field(field, value, message):
    with pytest.raises(NpusimError, match=message):
        CostModel(**{field: value})


def test_cost_model_validation():
    CostModel(npu_efficiency=1.0)  # the bound itself is valid
    c = CostModel()
    assert c.npu_peak_macs_per_s == pytest.approx(300e9)
    assert "300 GMAC/s" in c.describe()


# -- the STM32N6 deployment models: every op placed, with its source ------------------------------

STM32N6 = SHARED / "models" / "stm32n6"
YOLO_DETECT = STM32N6 / "yolov8n_256_quant_pc_uf_od_coco-person.tflite"
YOLO_SEGMENT = STM32N6 / "yolov8n_256_quant_pc_ii_seg_coco-st.tflite"
# The YOLOv8n models' software epochs: the graph-edge conversions and the DFL softmax.
YOLO_M55 = {
    YOLO_DETECT.name: {"DEQUANTIZE", "SOFTMAX"},
    YOLO_SEGMENT.name: {"SOFTMAX"},
}


@pytest.mark.parametrize("path", [YOLO_DETECT, YOLO_SEGMENT], ids=["detect", "segment"])
def test_inspect_stm32n6_yolo(path):
    """`npusim inspect --target stm32n6` on ST's YOLOv8n models: LOGISTIC, MUL, SUB, STRIDED_SLICE,
    RESIZE_NEAREST_NEIGHBOR, TRANSPOSE_CONV, CONCATENATION on the NPU, the rest on the M55."""
    p = need(path)
    result = cli("inspect", p, "--target", "stm32n6")
    assert result.exit_code == 0, result.output
    interp = Interpreter(p)
    dev = plan_device(interp)
    m55 = {o.kind for o in dev.m55_ops}
    assert m55 == YOLO_M55[path.name]
    n_m55 = len(dev.m55_ops)
    line = f"ops: {len(interp.kernels) - n_m55} on NPU, {n_m55} on M55 ({', '.join(sorted(m55))})"
    assert line in result.stdout
    npu = {o.kind for o in dev.npu_ops}
    assert {"LOGISTIC", "MUL", "SUB", "STRIDED_SLICE", "CONCATENATION", "RESIZE_NEAREST_NEIGHBOR"} <= npu
    if path == YOLO_SEGMENT:
        assert "TRANSPOSE_CONV" in npu
        tc = [o for o in dev.npu_ops if o.kind == "TRANSPOSE_CONV"]
        assert all(o.macs > 0 for o in tc)  # costed on the convolution accelerators


def test_every_kernel_has_a_placement_source():
    """Every op the simulator runs is placed on purpose: in NPU_KIND_SOURCES or M55_KIND_SOURCES."""
    from npusim.npu.cost import M55_KIND_SOURCES, NPU_KIND_SOURCES
    from npusim.ops import KERNELS

    missing = set(KERNELS) - set(NPU_KIND_SOURCES) - set(M55_KIND_SOURCES)
    assert not missing, f"no placement source for {sorted(missing)}"
    assert not set(NPU_KIND_SOURCES) & set(M55_KIND_SOURCES)


def test_placement_of_the_new_ops():
    x, y = _t((1, 8, 8, 4)), _t((1, 8, 8, 4))
    for kind in ("TANH", "HARD_SWISH", "LEAKY_RELU", "LOGISTIC", "MUL", "SUB", "PRELU", "MAXIMUM", "SLICE"):
        assert placement(_kernel(kind, [x], [y]))[0] == NPU, kind
    for kind in ("RESIZE_BILINEAR", "GATHER", "TILE", "SUM", "BATCH_MATMUL"):
        unit, reason = placement(_kernel(kind, [x], [y]))
        assert unit == M55 and kind in reason, kind
    # ReduceMax maps to the NPU as global max pooling (ST table), other reductions do not
    hw = _t((2,), np.int32, data=np.array([1, 2], np.int32))
    assert placement(_kernel("REDUCE_MAX", [x, hw], [_t((1, 4))]))[0] == NPU
    c = _t((1,), np.int32, data=np.array([3], np.int32))
    assert placement(_kernel("REDUCE_MAX", [x, c], [_t((1, 8, 8))]))[0] == M55
    assert placement(_kernel("SHAPE", [x], [_t((4,), np.int32)]))[0] == M55


# -- the cost model's pieces on synthetic layers ----------------------------------------------------

from npusim.npu import MEMORY_POOLS, device_structure, fit_cost_model, plan_fusion, plan_memory  # noqa: E402
from npusim.npu.calibration import CSV_COLUMNS, estimate_ms, read_calibration_csv  # noqa: E402
from npusim.testing.oracle import (  # noqa: E402
    concat_model,
    conv2d_model,
    depthwise_model,
    fully_connected_model,
    softmax_model,
)


def _conv(h, w, cin, cout, k=1):
    rng = np.random.default_rng(0)
    return conv2d_model(
        (1, h, w, cin), rng.integers(-9, 9, (cout, k, k, cin)), np.zeros(cout), 0.05, 0, 0.01, 0.1, 0
    )


def _depthwise(h, w, c, k=3):
    rng = np.random.default_rng(0)
    return depthwise_model(
        (1, h, w, c), rng.integers(-9, 9, (1, k, k, c)), np.zeros(c), 0.05, 0, 0.01, 0.1, 0
    )


def _only_op(model_bytes, cost=None):
    dev = plan_device(Interpreter(model_bytes), cost or CostModel())
    assert len(dev.ops) == 1
    return dev.ops[0]


def test_pointwise_runs_the_accelerators_better_than_depthwise():
    """Same MACs: a depthwise 3x3 layer sums 9 products per output, a pointwise layer 64, so the
    accelerators are busier on the pointwise one: u = depth / (depth + CA_HALF_DEPTH)."""
    cost = CostModel(epoch_overhead_s=0.0)
    pw = _only_op(_conv(32, 32, 64, 9), cost)  # 32*32*9 outputs x 64 = 589,824 MACs
    dw = _only_op(_depthwise(32, 32, 64), cost)  # 32*32*64 outputs x 9 = 589,824 MACs
    assert pw.macs == dw.macs
    assert pw.bound == dw.bound == "compute"
    u = cost.ca_utilisation
    assert pw.compute_s == pytest.approx(pw.macs / (cost.npu_peak_macs_per_s * cost.npu_efficiency * u(64)))
    assert dw.compute_s / pw.compute_s == pytest.approx(u(64) / u(9))
    assert dw.seconds > 2 * pw.seconds
    # a deeper layer approaches the fitted efficiency
    deep = _only_op(_conv(16, 16, 256, 16, k=3), cost)
    assert deep.macs / deep.compute_s > 0.95 * cost.npu_peak_macs_per_s * cost.npu_efficiency


def test_a_weight_heavy_layer_is_bound_by_the_flash():
    """A dense layer reads every weight once for one output row: the octo-SPI flash, not the
    accelerators, sets its time."""
    rng = np.random.default_rng(0)
    fc = fully_connected_model(
        (1, 1024), rng.integers(-9, 9, (1000, 1024)), np.zeros(1000), 0.05, 0, 0.01, 0.1, 0
    )
    cost = CostModel()
    o = _only_op(fc, cost)
    assert o.bound == "memory" and o.memory_s > 10 * o.compute_s
    weights = 1000 * 1024 + 4 * 1000
    assert o.weight_bytes == weights
    npu_ram = MEMORY_POOLS[0].bytes_per_npu_cycle * cost.npu_clock_hz
    assert o.memory_s == pytest.approx(weights / cost.weight_bytes_per_s + (1024 + 1000) / npu_ram)
    assert o.seconds == pytest.approx(o.memory_s + cost.epoch_overhead_s)
    # weights in on-chip RAM instead: the same layer is 16 times faster to feed
    fast = _only_op(fc, CostModel(weight_bytes_per_s=6.4e9))
    assert fast.memory_s < o.memory_s / 10


def test_softmax_falls_back_to_the_m55():
    cost = CostModel()
    o = _only_op(softmax_model((1, 1000), 0.1, 0), cost)
    assert o.unit == M55 and "SOFTMAX" in o.reason
    cycles = 1000 * cost.m55_cycles_per_element["SOFTMAX"]
    assert o.compute_s == pytest.approx(cycles / cost.m55_clock_hz)
    assert o.seconds == pytest.approx(cycles / 800e6 + cost.epoch_overhead_s)
    faster = _only_op(softmax_model((1, 1000), 0.1, 0), CostModel(m55_clock_hz=400e6))
    assert faster.compute_s == pytest.approx(2 * o.compute_s)


def test_memory_banks_alignment_and_in_place_concatenation():
    # a 512 KiB activation does not fit a 448 KiB npuRAM bank: it goes to cpuRAM2 (1 MiB)
    interp = Interpreter(_conv(256, 256, 8, 8))
    dev = plan_device(interp)
    pools = {p.pool.name: p.used for p in dev.memory.pools if p.used}
    assert pools == {"cpuRAM2": 1024 * 1024}  # input and output, both live during the layer
    assert dev.memory.internal_bytes == sum(pools.values()) and dev.memory.external_bytes == 0
    # small buffers are aligned to the 64-byte MCU+NPU cache line (ST's compiled YOLOX trace)
    small = plan_device(Interpreter(_conv(3, 3, 3, 5)))
    assert small.memory.internal_bytes == 64 + 64  # 27 -> 64 and 45 -> 64 bytes, both live at once
    # two 600 KiB buffers live at once: one fills cpuRAM2 from 0, no bank holds the other, which goes
    # into the virtual pool over the contiguous cpuRAM2 and npuRAM3-6 (c_info.json), not hyperRAM
    big = plan_device(Interpreter(_conv(160, 240, 16, 16)))
    pools = {p.pool.name: p.used for p in big.memory.pools if p.used}
    assert big.memory.external_bytes == 0 and pools["cpuRAM2+npuRAM3-6"] == 2 * 600 * 1024
    assert pools["cpuRAM2"] == 1024 * 1024 and pools["npuRAM3"] == 2 * 600 * 1024 - 1024 * 1024
    assert big.memory.internal_bytes == 2 * 600 * 1024
    # the concatenation copies nothing: its inputs are written in place (graph inputs excepted)
    cat = Interpreter(concat_model([(1, 4, 4, 8), (1, 4, 4, 8)], 3, 0.1, 0))
    fusion = plan_fusion(cat, [NPU])
    assert fusion.roles == ["view"]
    assert plan_memory(cat, fusion).internal_bytes == 2 * 128 + 256  # graph inputs stay where they are


def _write_calibration(tmp_path, rows, header=CSV_COLUMNS):
    lines = [",".join(header)] + [",".join(str(r.get(c, "")) for c in header) for r in rows]
    path = tmp_path / "calibration.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_fit_recovers_known_constants(tmp_path):
    """Measurements made by a known cost model on three synthetic models: the fit, started elsewhere,
    finds the model's efficiency and epoch overhead again."""
    truth = CostModel(npu_efficiency=0.3, epoch_overhead_s=25e-6)
    models = {
        "deep.tflite": _conv(32, 32, 64, 64, k=3),
        "dw.tflite": _depthwise(16, 16, 32),
        "fc.tflite": None,
    }
    rng = np.random.default_rng(1)
    models["fc.tflite"] = fully_connected_model(
        (1, 256), rng.integers(-9, 9, (64, 256)), np.zeros(64), 0.05, 0, 0.01, 0.1, 0
    )
    rows = []
    for name, data in models.items():
        (tmp_path / name).write_bytes(data)
        ms = estimate_ms(device_structure(Interpreter(data)), truth)
        rows.append({"file": name, "npu_ms": f"{ms:.12g}", "stedgeai_version": "3.0.0"})
    rows.append({"file": "deep.tflite", "npu_ms": "99", "stedgeai_version": "2.0.0"})  # older: ignored
    measurements = read_calibration_csv(_write_calibration(tmp_path, rows))
    assert len(measurements) == 3
    cal = fit_cost_model(measurements, CostModel(npu_efficiency=0.05, epoch_overhead_s=5e-6))
    assert cal.cost.npu_efficiency == pytest.approx(0.3, rel=1e-4)
    assert cal.cost.epoch_overhead_s == pytest.approx(25e-6, rel=1e-4)
    assert cal.degrees_of_freedom == 1
    assert all(r == pytest.approx(1.0, abs=1e-6) for r in cal.ratios)
    # the command line refits the same way and says so
    out = cli(
        "inspect",
        tmp_path / "deep.tflite",
        "--target",
        "stm32n6",
        "--calibration",
        tmp_path / "calibration.csv",
    )
    assert out.exit_code == 0, out.output
    assert "calibrated on 3 measurement(s): npu_efficiency = 0.3," in out.stdout


@pytest.mark.parametrize(
    "content, message",
    [
        ("model,npu_ms\nx,1\n", "missing column(s) file"),
        ("file,model\nm.tflite,x\n", "missing column(s) npu_ms"),
        ("file,npu_ms\nm.tflite,fast\n", "line 2: npu_ms 'fast' is not a number"),
        ("file,npu_ms\nm.tflite,-3\n", "line 2: npu_ms must be a positive number"),
        ("file,npu_ms\nm.tflite,\n", "line 2: column npu_ms is empty"),
        ("file,npu_ms\nnowhere.tflite,2\n", "model file"),
        ("file,npu_ms\n", "no measurements"),
        (None, "cannot read"),
    ],
)
def test_calibration_file_errors_are_one_line(tmp_path, content, message):
    (tmp_path / "m.tflite").write_bytes(_conv(8, 8, 8, 8))
    path = tmp_path / "cal.csv"
    if content is not None:
        path.write_text(content)
    r = cli("inspect", tmp_path / "m.tflite", "--target", "stm32n6", "--calibration", path)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output
    # one measurement cannot fit two constants
    if content is None:
        path.write_text("file,npu_ms\nm.tflite,1\n")
        r = cli("inspect", tmp_path / "m.tflite", "--target", "stm32n6", "--calibration", path)
        assert r.exit_code == 2 and "cannot fit 2 constants" in r.stderr


def test_json_output_has_the_table_content(model):
    import json

    path, interp = model
    text = cli("inspect", path, "--target", "stm32n6").stdout
    data = json.loads(cli("inspect", path, "--target", "stm32n6", "--format", "json").stdout)
    dev = plan_device(interp)
    assert data["target"] == "stm32n6" and data["model"] == Path(path).name
    assert len(data["ops"]) == len(interp.kernels) == len(dev.ops)
    assert [o["unit"] for o in data["ops"]] == [o.unit for o in dev.ops]
    assert data["latency_s"] == pytest.approx(dev.latency_s(1))
    assert f"estimated latency: {data['latency_s'] * 1e3:.3f} ms per image" in text
    assert f"internal RAM: {data['internal_ram_bytes']:,} B" in text
    assert data["total_macs"] == dev.total_macs and data["weight_bytes"] == dev.weight_bytes
    assert f"{data['npu_hardware_epochs']} NPU hardware epochs" in text
    generic = json.loads(cli("inspect", path, "--format", "json").stdout)
    assert generic["total_macs"] == dev.total_macs and len(generic["ops"]) == len(dev.ops)


def test_the_shipped_constants_reproduce_the_published_fit():
    """The module constants are the fit on published.csv (experiments/tables/stm32n6.py), so the
    calibration models land within a few percent of ST's figures."""
    csv_path = SHARED / "models" / "stm32n6" / "published.csv"
    need(csv_path)
    measurements = read_calibration_csv(csv_path)
    for m in measurements:
        est = plan_device(Interpreter(str(m.path))).latency_s(1) * 1e3
        assert est == pytest.approx(m.npu_ms, rel=0.05), m.file
