"""A step of the hybrid trainer priced on the device, part by part (zo/cost.step_parts, `zo cost`):
the parts add up, and each scales with what it should (batch, q, layer sizes)."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema
from click.testing import CliRunner

import zo.cli
from npusim import load_model
from npusim.testing.oracle import ModelBuilder, bias_scale
from zo.cost import M55_PEAK_MACS_PER_CYCLE, m55_mac_seconds, step_parts
from zo.model import TrainableModel


def two_conv_classifier(side: int = 4, hidden: int = 8, classes: int = 4) -> bytes:
    """input -> CONV 1x1 + RELU -> CONV 1x1 + RELU -> global AVERAGE_POOL -> RESHAPE -> FC -> SOFTMAX:
    the second conv is the head's exact tail, the first lies below it."""
    rng = np.random.default_rng(0)
    b = ModelBuilder("two convs")
    x = b.add_tensor((1, side, side, 3), np.int8, 1.0, -128, name="input")
    h, channels = x, 3
    for i in range(2):
        scale = np.full(hidden, 0.001, np.float32)
        w = b.add_const(
            rng.integers(-127, 128, (hidden, 1, 1, channels)).astype(np.int8), scale=scale,
            zero_point=np.zeros(hidden, np.int64), name=f"conv{i}/weights",
        )  # fmt: skip
        bias = b.add_const(
            np.zeros(hidden, np.int32), scale=bias_scale(0.2, scale), zero_point=np.zeros(hidden, np.int64),
            name=f"conv{i}/bias",
        )  # fmt: skip
        out = b.add_tensor((1, side, side, hidden), np.int8, 0.2, -128, name=f"conv{i}/out")
        opt = schema.Conv2DOptionsT()
        opt.padding, opt.strideH, opt.strideW = schema.Padding.VALID, 1, 1
        opt.fusedActivationFunction = schema.ActivationFunctionType.RELU
        b.add_op("CONV_2D", [h, w, bias], [out], opt)
        h, channels = out, hidden
    pooled = b.add_tensor((1, 1, 1, hidden), np.int8, 0.2, -128, name="pool/out")
    popt = schema.Pool2DOptionsT()
    popt.padding, popt.strideH, popt.strideW, popt.filterHeight, popt.filterWidth = (
        schema.Padding.VALID, 1, 1, side, side,
    )  # fmt: skip
    b.add_op("AVERAGE_POOL_2D", [h], [pooled], popt)
    flat = b.add_tensor((1, hidden), np.int8, 0.2, -128, name="flatten/out")
    ropt = schema.ReshapeOptionsT()
    ropt.newShape = [1, hidden]
    b.add_op("RESHAPE", [pooled, b.add_const(np.array([1, hidden], np.int32))], [flat], ropt)
    scale = np.full(classes, 0.001, np.float32)
    w = b.add_const(
        rng.integers(-20, 21, (classes, hidden)).astype(np.int8), scale=scale,
        zero_point=np.zeros(classes, np.int64), name="head/weights",
    )  # fmt: skip
    bias = b.add_const(
        np.zeros(classes, np.int32), scale=bias_scale(0.2, scale), zero_point=np.zeros(classes, np.int64),
        name="head/bias",
    )  # fmt: skip
    logits = b.add_tensor((1, classes), np.int8, 0.05, 0, name="head/logits")
    b.add_op("FULLY_CONNECTED", [flat, w, bias], [logits], schema.FullyConnectedOptionsT())
    probs = b.add_tensor((1, classes), np.int8, 1 / 256, -128, name="probs")
    sopt = schema.SoftmaxOptionsT()
    sopt.beta = 1.0
    b.add_op("SOFTMAX", [logits], [probs], sopt)
    return b.build([x], [probs])


def parts(tmp_path, q=4, batch=8, hidden=8, side=4, trainable="last:3"):
    path = tmp_path / f"m{hidden}-{side}.tflite"
    path.write_bytes(two_conv_classifier(hidden=hidden, side=side))
    m = TrainableModel(load_model(str(path)), trainable)
    return step_parts(m.interp, [p.tensor for p in m.params], q, batch)


def test_the_parts_add_up(tmp_path):
    r = parts(tmp_path)
    assert r["fixed_s"] == pytest.approx(sum(r["fixed"].values()))
    assert r["per_direction_s"] == pytest.approx(sum(r["per_direction"].values()))
    assert r["total_s"] == pytest.approx(r["fixed_s"] + r["q"] * r["per_direction_s"])
    assert all(v > 0 for v in r["fixed"].values()) and all(v > 0 for v in r["per_direction"].values())
    # a probe pass runs what follows the perturbed layer: less than the whole suffix
    assert 0 < r["per_direction"]["probe_passes"] < 2 * r["fixed"]["head_pass"]


def test_each_part_scales_with_what_it_should(tmp_path):
    base = parts(tmp_path)
    # q: only the per-direction parts grow, the fixed ones do not move
    more_q = parts(tmp_path, q=8)
    assert more_q["fixed"] == base["fixed"] and more_q["per_direction"] == base["per_direction"]
    assert more_q["total_s"] - base["total_s"] == pytest.approx(4 * base["per_direction_s"])
    # batch: every part is per image, except the write-back (once a step)
    twice = parts(tmp_path, batch=16)
    for name, value in base["fixed"].items():
        assert twice["fixed"][name] == pytest.approx(value if name == "write_back" else 2 * value), name
    for name, value in base["per_direction"].items():
        assert twice["per_direction"][name] == pytest.approx(2 * value), name
    # layer sizes: a conv's local gradient is its forward MACs (side^2 x out x in channels an image):
    # the tail's conv (8 x 8) and the perturbed one below it (8 x 3), batch 8
    wider = parts(tmp_path, hidden=16)
    bigger = parts(tmp_path, side=8)
    assert (base["tail_layers"], base["perturbed_layers"]) == (1, 1)
    assert base["exact_tail_macs"] == 8 * 4 * 4 * 8 * 8
    assert base["local_gradient_macs"] == 8 * 4 * 4 * (8 * 8 + 8 * 3)
    assert wider["exact_tail_macs"] == 4 * base["exact_tail_macs"]
    assert bigger["local_gradient_macs"] == 4 * base["local_gradient_macs"]
    assert wider["head_outer_macs"] == 2 * base["head_outer_macs"] == 2 * 8 * 4 * 8
    assert wider["fixed"]["write_back"] > base["fixed"]["write_back"]


def test_macs_are_charged_at_the_cited_rates():
    int8, fp32 = m55_mac_seconds(8e6, "int8"), m55_mac_seconds(8e6, "fp32")
    assert fp32 / int8 == pytest.approx(M55_PEAK_MACS_PER_CYCLE["int8"] / M55_PEAK_MACS_PER_CYCLE["fp32"])
    assert int8 == pytest.approx(8e6 / 2.0 / 800e6)  # npusim.npu.cost's CMSIS-NN int8 rate


def test_the_head_alone_has_no_local_gradient_and_the_tail_no_directions(tmp_path):
    r = parts(tmp_path, trainable="last:1")
    assert r["local_gradient_macs"] == 0 and r["perturbed_layers"] == 0
    assert r["per_direction_s"] == 0 and r["head_outer_macs"] == 8 * 4 * 8
    tail = parts(tmp_path, trainable="last:2")  # the head and its exact tail: nothing estimated
    assert (tail["tail_layers"], tail["perturbed_layers"]) == (1, 0)
    assert tail["per_direction_s"] == 0 and tail["local_gradient_macs"] == tail["exact_tail_macs"] > 0


def test_zo_cost_prints_each_part(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(two_conv_classifier())
    result = CliRunner().invoke(
        zo.cli.main, ["cost", "--model", str(path), "--trainable", "last:3", "--q", "4", "--batch", "8"]
    )
    assert result.exit_code == 0, result.output
    for part in (
        "head pass",
        "local weight gradients",
        "head outer product",
        "write-back",
        "2 passes after the perturbed layer",
    ):
        assert part in result.output
