"""The STM32N6 view of imported ONNX models: int4 / uint4 weights count packed (two per byte), and
the import's requantizing QUANTIZEs (a QuantizeLinear whose scale differs from what the op before it
wrote) are folded into the NPU layer that writes the tensor, as the N6 compiler folds them, not
charged as Cortex-M55 software epochs. The float input's QUANTIZE and the output's DEQUANTIZE stay
software epochs (SW_FLOAT in ST's compiler)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from onnx_qdq import qdq  # noqa: E402
from test_onnx_import import conv_qdq, feeds_for, model, rng_of  # noqa: E402

import npusim  # noqa: E402
from npusim.npu import plan_device  # noqa: E402

from shared_paths import SHARED  # noqa: E402


def device(data: bytes):
    return plan_device(npusim.Interpreter(npusim.load_model(data), plan_only=True))


@pytest.mark.parametrize("weights", ["int4", "uint4"])
def test_four_bit_weights_count_packed(weights):
    four, eight = device(conv_qdq(weights)), device(conv_qdq("int8"))
    conv4 = next(o for o in four.ops if o.kind == "CONV_2D")
    conv8 = next(o for o in eight.ops if o.kind == "CONV_2D")
    filter_values = 4 * 3 * 3 * 3  # [4, 3, 3, 3]
    assert conv8.weight_bytes - conv4.weight_bytes == filter_values - (filter_values + 1) // 2
    assert eight.weight_bytes - four.weight_bytes == filter_values // 2


def test_requantization_after_a_sigmoid_is_folded_into_the_npu_layer():
    """Conv -> Sigmoid: the import's LOGISTIC writes 1/256, a QUANTIZE takes it to the file's scale;
    on the N6 that QUANTIZE rides in the conv's epoch (no M55 epoch of its own)."""
    rng = rng_of("npu-sigmoid")
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["y"]),
    ]
    m = model(nodes, [("x", (1, 3, 8, 8))], [("w", w)])
    dev = device(qdq(m, feeds_for(m, rng)))
    kinds = [(o.kind, o.unit, o.role) for o in dev.ops]
    requant = [k for k in kinds if k[0] == "QUANTIZE"][1:]  # the first is the float input's
    assert requant == [("QUANTIZE", "NPU", "epilogue")], kinds
    assert [o.kind for o in dev.m55_ops] == ["QUANTIZE", "DEQUANTIZE"]  # the float boundary only


def test_yolo26_requantizations_are_no_m55_epochs():
    path = SHARED / "models" / "onnx" / "yolo26_256_qdq_int8_od_coco-person-st.onnx"
    if not path.exists():
        pytest.skip(f"SHARED DATA MISSING: {path}")
    dev = device(path.read_bytes())
    m55 = [o for o in dev.ops if o.unit == "M55"]
    assert not [o for o in m55 if o.kind == "QUANTIZE" and o.position > 0], "a requantization on the M55"
    assert dev.software_epochs <= 10  # 130 before (123 QUANTIZE epochs)


def test_four_bit_weights_count_packed_when_the_import_rebuilds_them():
    """A channel whose tiny filter scale puts its bias beyond the middle half of int32: the import
    widens that scale (fit_bias_range), so the graph's codes are no longer the file's and are not
    written back; on the N6 they are still the file's int4 codes, two per byte (issue 56: 19 of 30
    int4 convs of a YOLOv8n counted at a byte per weight)."""
    rng = rng_of("npu-int4-refit")
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    w[0] *= 2.5e-6 / np.abs(w[0]).max()  # its bias code lands between 2^30 and 2^31
    bias = np.array([10.0, 0.1, -0.1, 0.2], np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    m = model([node], [("x", (1, 3, 6, 6))], [("w", w), ("b", bias)])
    graph = npusim.load_model(qdq(m, feeds_for(m, rng), weight_bits=4))
    conv_op = next(op for op in graph.ops if op.kind == "CONV_2D")
    assert conv_op.inputs[1] not in graph.source.weights  # the rebuilt codes: not the file's
    dev = plan_device(npusim.Interpreter(graph, plan_only=True))
    conv = next(o for o in dev.ops if o.kind == "CONV_2D")
    assert conv.weight_bytes == (w.size + 1) // 2 + 4 * 4  # packed int4 filter + int32 bias


def test_inspect_shows_each_layers_weight_type(tmp_path):
    import json

    from click.testing import CliRunner

    from npusim.app.cli import main

    path = tmp_path / "conv4.onnx"
    path.write_bytes(conv_qdq("int4"))
    res = CliRunner().invoke(main, ["inspect", str(path), "--format", "json"])
    assert res.exit_code == 0, res.output
    ops = json.loads(res.output)["ops"]
    assert [o["weights"] for o in ops if o["op"] == "CONV_2D"] == ["int4"]
    assert all(o["weights"] is None for o in ops if o["op"] != "CONV_2D")
    lines = CliRunner().invoke(main, ["inspect", str(path)]).output.splitlines()
    assert "int4" in next(line for line in lines if " CONV_2D " in line)
