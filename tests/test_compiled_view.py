"""The N6 view counted on ST's compiled program (npu/compiled_view.py) and the buffer rule the shared
compiles showed (npu/memory.py's suboff copies), on ST Edge AI 2.1's compile of YOLOX-nano 480."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import npusim.app.cli
from npusim.npu import device_structure, plan_device
from npusim.npu.compiled import read_compiled
from npusim.npu.compiled_view import compiled_view, network_c_beside, read_network_c
from npusim.runtime.interpreter import Interpreter

from shared_paths import SHARED, need

FOLDER = SHARED / "models" / "stm32n6" / "st_compiler"
MODEL = FOLDER / "yolox_nano_480" / "st_yolo_x_nano_480_1.0_0.25_3_st_int8.tflite"
NETWORK_C = FOLDER / "yolox_nano_480_stedgeai_2.1" / "network.c"
BLOBS = FOLDER / "yolox_nano_480_stedgeai_2.1" / "network_ecblobs.h"


def cli(*args):
    return CliRunner().invoke(npusim.app.cli.main, [str(a) for a in args], catch_exceptions=False)


def test_network_c_epochs_pools_and_buffers():
    net = read_network_c(need(NETWORK_C))
    assert network_c_beside(BLOBS) == NETWORK_C
    # 222 epochs in the blobs (1-117, 119-136, 138-165, 168-195, 198-226, 229-230), 8 on the M55
    assert len(net.hw_epochs) == 222 and net.sw_epochs == [118, 137, 166, 167, 196, 197, 227, 228]
    used = net.used()
    # the highest byte a buffer reaches in each bank is what network.c's header says of the pool
    assert {p.name: p.stated_bytes for p in net.pools if p.name in used and p.on_chip} == {
        n: used[n] for n in ("npuRAM3", "npuRAM4", "npuRAM5", "npuRAM6", "cpuRAM2")
    }
    assert net.internal_bytes == 2_476_800  # 2418.75 KiB
    assert sum("_zero_off_out" in n for n in net.buffers) == 182


def test_view_on_the_compiled_epochs_and_buffers():
    interp = Interpreter(need(MODEL), plan_only=True)
    dev = plan_device(interp)
    view = compiled_view(dev, read_compiled(BLOBS, interp.graph), read_network_c(NETWORK_C))
    counts = (view["hardware_epochs"], view["software_epochs"], view["npu_layers_not_in_program"])
    assert counts == (222, 8, 0)
    assert view["internal_ram_bytes"] == 2_476_800 and view["equals_stated_pools"]
    # the roofline is npusim's, the epochs the compiler's: within 10 % of npusim's own grouping here
    assert view["latency_s"] == pytest.approx(dev.latency_s(1), rel=0.1)
    assert view["npusim_internal_ram_bytes"] == pytest.approx(view["internal_ram_bytes"], rel=0.1)


def test_suboff_copies_as_the_compile_places_them():
    interp = Interpreter(need(MODEL), plan_only=True)
    s = device_structure(interp)
    # every conv reads its own x + 128 copy (all 186 inputs have zero point -128; network.c names
    # 182 `_zero_off_out` buffers); an int8 output only convs read stays off memory: 133 of the 186
    # conv outputs (network.c keeps 52 `_off_bias_out` ones) and the uint8 input's QUANTIZE output
    assert len(s.memory.copies) == 186
    producer = {t: op.kind for op in interp.graph.ops for t in op.outputs}
    dropped = [producer[t] for t in s.memory.streamed - s.fusion.streamed]
    assert len(dropped) == 134 and dropped.count("QUANTIZE") == 1


def test_inspect_compiled_network_c(tmp_path):
    r = cli("inspect", need(MODEL), "--target", "stm32n6", "--compiled", need(NETWORK_C), "--n6-compiler=2.1")
    assert r.exit_code == 0, r.output
    assert "N6 view on the compiled epochs: 222 hardware + 8 software epochs" in r.output
    assert "2418.8 KiB" in r.output and "as network.c states its pools" in r.output
    r = cli("inspect", MODEL, "--target", "stm32n6", "--format", "json", "--compiled", BLOBS)
    view = json.loads(r.output)["compiled"]["n6_view"]
    assert view["memory_pools"]["npuRAM4"]["used_bytes"] == 403_200
    bad = tmp_path / "network.c"
    bad.write_text("int main(void) { return 0; }\n")
    r = cli("inspect", MODEL, "--target", "stm32n6", "--compiled", bad)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "includes no _ecblobs.h" in r.output
