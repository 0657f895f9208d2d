"""npusim's STM32N6 memory and epoch plan against ST Edge AI 3.0's own report for YOLOX-nano 480
(../shared/models/stm32n6/st_compiler/yolox_nano_480: c_info.json, default_blob_trace.c), the
figures docs/stm32n6.md quotes."""

import json
import re

import pytest

from npusim.npu import plan_device
from npusim.npu.memory import NPU_BUFFER_ALIGNMENT
from npusim.runtime.interpreter import Interpreter

from shared_paths import SHARED, need

FOLDER = SHARED / "models" / "stm32n6" / "st_compiler" / "yolox_nano_480"
MODEL = FOLDER / "st_yolo_x_nano_480_1.0_0.25_3_st_int8.tflite"


@pytest.fixture(scope="module")
def st():
    info = json.load(open(need(FOLDER / "c_info.json")))
    trace = open(need(FOLDER / "default_blob_trace.c")).read()
    return info, trace


def test_memory_against_c_info(st):
    info, trace = st
    pools = {p["name"]: p for p in info["memory_pools"]}
    banks = ("npuRAM3", "npuRAM4", "npuRAM5", "npuRAM6", "cpuRAM2")
    st_internal = sum(pools[b]["used_size_bytes"] for b in banks)
    assert pools["hyperRAM"]["used_size_bytes"] == 0
    assert pools["cpuRAM2_npuRAM3_npuRAM4_npuRAM5_npuRAM6"]["buffers"]  # ST spans the banks
    dev = plan_device(Interpreter(need(MODEL), plan_only=True))
    print(f"\ninternal RAM: npusim {dev.memory.internal_bytes:,} B, ST {st_internal:,} B")
    assert dev.memory.external_bytes == 0
    assert dev.memory.internal_bytes == pytest.approx(st_internal, rel=0.15)
    line = re.search(r"MCU\+NPU cache line size equal to (\d+) bytes", trace)
    assert int(line.group(1)) == NPU_BUFFER_ALIGNMENT


def test_epochs_against_the_trace(st):
    _, trace = st
    st_epochs = len(re.findall(r"ec_trace_start_epoch\(", trace))
    dev = plan_device(Interpreter(need(MODEL), plan_only=True))
    ours = dev.hardware_epochs + dev.software_epochs
    print(f"\nepochs: npusim {ours} ({dev.hardware_epochs} NPU + {dev.software_epochs} M55), ST {st_epochs}")
    assert ours == pytest.approx(st_epochs, rel=0.05)
