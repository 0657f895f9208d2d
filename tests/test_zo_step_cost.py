"""A step of the hybrid trainer priced on the device, part by part (zo/cost.step_parts, `zo cost`):
the parts add up, and each scales with what it should (batch, q, layer sizes)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import zo.cli
from npusim import load_model
from zo.cost import M55_PEAK_MACS_PER_CYCLE, m55_mac_seconds, step_parts
from zo.model import TrainableModel

from zo_fixtures import tiny_classifier


def parts(tmp_path, q=4, batch=8, hidden=8, side=4, trainable="last:2"):
    path = tmp_path / f"m{hidden}-{side}.tflite"
    path.write_bytes(tiny_classifier(hidden=hidden, side=side))
    m = TrainableModel(load_model(str(path)), trainable)
    return step_parts(m.interp, [p.tensor for p in m.params], q, batch)


def test_the_parts_add_up(tmp_path):
    r = parts(tmp_path)
    assert r["fixed_s"] == pytest.approx(sum(r["fixed"].values()))
    assert r["per_direction_s"] == pytest.approx(sum(r["per_direction"].values()))
    assert r["total_s"] == pytest.approx(r["fixed_s"] + r["q"] * r["per_direction_s"])
    assert all(v > 0 for v in r["fixed"].values()) and all(v > 0 for v in r["per_direction"].values())
    assert r["per_direction"]["probe_passes"] == pytest.approx(2 * r["fixed"]["head_pass"])


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
    # layer sizes: the conv's local gradient is its forward MACs (side^2 x hidden x channels an image)
    wider = parts(tmp_path, hidden=16)
    bigger = parts(tmp_path, side=8)
    assert base["local_gradient_macs"] == 8 * 4 * 4 * 8 * 3
    assert wider["local_gradient_macs"] == 2 * base["local_gradient_macs"]
    assert bigger["local_gradient_macs"] == 4 * base["local_gradient_macs"]
    assert wider["head_outer_macs"] == 2 * base["head_outer_macs"] == 2 * 8 * 4 * 8
    assert wider["fixed"]["write_back"] > base["fixed"]["write_back"]


def test_macs_are_charged_at_the_cited_rates():
    int8, fp32 = m55_mac_seconds(8e6, "int8"), m55_mac_seconds(8e6, "fp32")
    assert fp32 / int8 == pytest.approx(M55_PEAK_MACS_PER_CYCLE["int8"] / M55_PEAK_MACS_PER_CYCLE["fp32"])
    assert int8 == pytest.approx(8e6 / 2.0 / 800e6)  # npusim.npu.cost's CMSIS-NN int8 rate


def test_the_head_alone_has_no_local_gradient_and_no_directions(tmp_path):
    r = parts(tmp_path, trainable="last:1")
    assert r["local_gradient_macs"] == 0 and r["perturbed_layers"] == 0
    assert r["per_direction"]["directions"] == 0


def test_zo_cost_prints_each_part(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(tiny_classifier())
    result = CliRunner().invoke(
        zo.cli.main, ["cost", "--model", str(path), "--trainable", "last:2", "--q", "4", "--batch", "8"]
    )
    assert result.exit_code == 0, result.output
    for part in (
        "head pass",
        "local weight gradients",
        "head outer product",
        "write-back",
        "2 suffix passes",
    ):
        assert part in result.output
