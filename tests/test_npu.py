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
from npusim.cli import main
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
EXPECTED_M55 = {RESNET.name: {"SOFTMAX"}, MOBILENET.name: {"QUANTIZE", "SOFTMAX", "DEQUANTIZE"}}
EXPECTED_EPOCHS = {RESNET.name: [NPU, M55], MOBILENET.name: [M55, NPU, M55]}


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
    # module constants are the defaults of every later estimate
    monkeypatch.setattr(npu.cost, "EPOCH_OVERHEAD_S", 1e-3)
    assert plan_device(interp).latency_s(1) == pytest.approx(
        t1 + len(dev.epochs) * (1e-3 - dev.cost.epoch_overhead_s)
    )
    # CONV-type ops cost MACs / (peak * efficiency)
    conv = next(o for o in dev.ops if o.kind == "CONV_2D")
    assert conv.seconds == pytest.approx(conv.macs / (300e9 * dev.cost.npu_efficiency))


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
    assert placement(_kernel("QUANTIZE", [_t((1, 8, 8, 4), np.uint8)], [y]))[0] == M55
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


def test_cost_model_validation():
    with pytest.raises(NpusimError):
        CostModel(npu_efficiency=0)
    with pytest.raises(NpusimError):
        CostModel(m55_macs_per_cycle=0)
    c = CostModel()
    assert c.npu_peak_macs_per_s == pytest.approx(300e9)
    assert "300 GMAC/s" in c.describe()


# -- the STM32N6 deployment models: every op placed, with its source ------------------------------

STM32N6 = SHARED / "models" / "stm32n6"
YOLO_DETECT = STM32N6 / "yolov8n_256_quant_pc_uf_od_coco-person.tflite"
YOLO_SEGMENT = STM32N6 / "yolov8n_256_quant_pc_ii_seg_coco-st.tflite"
# The YOLOv8n models' software epochs: the graph-edge conversions and the DFL softmax.
YOLO_M55 = {
    YOLO_DETECT.name: {"DEQUANTIZE", "QUANTIZE", "SOFTMAX"},
    YOLO_SEGMENT.name: {"QUANTIZE", "SOFTMAX"},
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
    for kind in ("RESIZE_BILINEAR", "GATHER", "TILE", "SUM", "REDUCE_MAX", "BATCH_MATMUL"):
        unit, reason = placement(_kernel(kind, [x], [y]))
        assert unit == M55 and kind in reason, kind
    assert placement(_kernel("SHAPE", [x], [_t((4,), np.int32)]))[0] == M55
