"""--profile neural-art, the Neural-ART unit chains in `inspect --format json`, and `inspect --lint`,
on one-op models built here (no shared data). The coefficients against ST's own compiled blob:
tests/test_neural_art_trace.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import npusim.app.cli
from npusim.kernels import neural_art as units
from npusim.npu import N6Options, NeuralArtProfile
from npusim.npu.cost import NPU, placement
from npusim.npu.neural_art import add_stage, fixed_point, op_stages
from npusim.npu.neural_art_lint import add_error, lint
from npusim.npu.neural_art_run import Chain
from npusim.runtime.interpreter import Interpreter
from npusim.testing import oracle as O

ISSUE_FIELDS = {"shift_a", "shift_o", "outbytes_o", "rounding_o", "saturation_o", "round_mode_o"}
ARITH_FIELDS = {"A_scalar", "B_scalar", "C_scalar", "A_vector", "B_vector", "C_vector"}
ARITH_FIELDS |= {"Ax_shift", "By_shift", "C_shift", "shift_o", "rounding_o", "saturation_o"}


def cli(*args):
    return CliRunner().invoke(npusim.app.cli.main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def conv_model():
    rng = np.random.default_rng(3)
    w = rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8)
    b = rng.integers(-3000, 3000, 8).astype(np.int32)
    return O.conv2d_model((1, 8, 8, 4), w, b, 0.05, -3, rng.uniform(0.001, 0.01, 8), 0.3, 5)


FORUM = (0.05, -3, 0.05 / 16, 10, 0.06, 0)  # a residual ADD whose inputs are 16x apart in scale


def test_shift_round_modes():
    cases = [(5, 1), (7, 1), (-5, 1), (-7, 1), (12, 3), (20, 3), (-12, 3), (13, 0)]
    for v, s in cases:
        exact = v / 2**s
        assert units.shift_round(np.int64(v), s, units.TRUNCATE) == v >> s
        assert units.shift_round(np.int64(v), s, units.HALF_UP) == int(np.floor(exact + 0.5))
        assert units.shift_round(np.int64(v), s, units.HALF_EVEN) == int(np.round(exact))


def test_add_coefficients_normalised():
    st = add_stage(*FORUM)
    ra, rb = 0.05 / 0.06, 0.05 / 16 / 0.06
    assert 2**14 <= st["A_scalar"] < 2**15 and 2**14 <= st["B_scalar"] < 2**15
    assert st["A_scalar"] / 2.0 ** (st["shift_o"] + st["Ax_shift"]) == pytest.approx(ra, rel=2**-14)
    assert st["B_scalar"] / 2.0 ** (st["shift_o"] + st["By_shift"]) == pytest.approx(rb, rel=2**-14)
    assert st["By_shift"] == 4  # the 16x: B keeps its 15 bits through By_shift
    # a constant below one step: rounded at full precision, then floor-shifted (ST's Add_330)
    assert fixed_point(-0.288 / 2**15, 15) == (-1, 0)
    assert fixed_point(31219.725 * 32 / 2**15, 15) == (31220, 5)


def test_forum_add_what_each_option_predicts():
    """The forum's case, inputs 16x apart: what each reading of the ADD datapath predicts, in output
    steps against the exact sum, over all 65,536 input pairs."""
    st = add_stage(*FORUM)
    table = {}
    for rounding in ("half-up", "half-even", "truncate"):
        for products in ("exact", "rounded"):
            table[rounding, products] = add_error(
                st, *FORUM, N6Options(rounding=rounding, add_products=products)
            )
    print(
        "\nforum ADD (16x): "
        + "; ".join(f"{r}/{p}: max {e['max']}, rms {e['rms']:.3f}" for (r, p), e in table.items())
    )
    assert table["half-up", "exact"]["max"] <= 0.5 + 1e-6  # one rounding: as good as TFLM
    assert table["half-up", "rounded"]["max"] > 1.0  # each product rounded: the small term loses
    assert table["truncate", "exact"]["max"] == pytest.approx(1.0, abs=1e-6)
    assert table["truncate", "rounded"]["max"] > 2.5
    graph = Interpreter(O.add_model((1, 4, 4, 8), (1, 4, 4, 8), *FORUM), plan_only=True).graph
    assert lint(graph, N6Options()) == []
    (warning,) = lint(graph, N6Options(add_products="rounded"))
    assert "16x apart" in warning["reason"] and warning["predicted_error_steps"] > 1.0


def _conv_by_formula(x, graph, stages):
    """The chain's arithmetic written out in Python integers: suboff, CONVACC, off_bias."""
    sub, ca, ob = stages
    w = graph.tensors[graph.ops[0].inputs[1]].data.astype(np.int64)
    offset = ((sub["B_scalar"] << 16) + (sub["C_scalar"] & 0xFFFF)) >> 14  # suboff: (16384 x + BC) >> 14
    assert sub["A_scalar"] == 16384 and offset == 3  # the default subtracts the zero point, -3
    feature = x.astype(np.int64) + offset
    padded = np.pad(feature, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-3 + offset)
    n, h, wd, _ = x.shape
    out = np.zeros((n, h, wd, w.shape[0]), np.int64)
    s, sh = ca["shift_o"], ob["shift_o"]
    for i in range(h):
        for j in range(wd):
            acc = np.einsum("nhwc,ohwc->no", padded[:, i : i + 3, j : j + 3], w)
            y = np.clip((acc + (1 << (s - 1) if s else 0)) >> s, -32768, 32767)
            v = (np.array(ob["A_vector"]) * y + np.array(ob["C_vector"]) + (1 << (sh - 1))) >> sh
            out[:, i, j] = np.clip(v, -128, 127)
    return out


def test_conv_chain_runs_the_formula_and_stays_near_tflm(conv_model):
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (3, 8, 8, 4)).astype(np.int8)
    n6 = Interpreter(conv_model, profile=NeuralArtProfile())
    assert isinstance(n6.kernels[0], Chain) and n6.profile == "neural-art"
    got = n6.run(x)
    stages = op_stages(n6.graph, n6.graph.ops[0])
    assert np.array_equal(got, _conv_by_formula(x, n6.graph, stages))
    tflm = Interpreter(conv_model).run(x)
    assert np.abs(got.astype(int) - tflm).max() <= 1
    # another rounding mode changes the result: the option reaches the units
    trunc = Interpreter(conv_model, profile=NeuralArtProfile(N6Options(rounding="truncate"))).run(x)
    assert not np.array_equal(trunc, got)
    # folding the input zero point instead: another configuration, the same sums but for rounding
    fold = N6Options(input_offset="fold")
    folded = op_stages(n6.graph, n6.graph.ops[0], fold)
    assert folded[0]["B_scalar"] == 32 and folded[1]["f_unsigned"] == 1  # x + 128, unsigned
    assert stages[1]["f_unsigned"] == 0 and stages[1]["inbytes_f"] == 2  # x + 3 in [-125, 130]: 9 bits
    assert folded[2]["C_vector"] != stages[2]["C_vector"]
    near = Interpreter(conv_model, profile=NeuralArtProfile(fold)).run(x)
    assert np.abs(near.astype(int) - got).max() <= 1


def test_ops_off_the_npu_keep_tflm():
    m = O.softmax_model((1, 10), 0.1, 0)
    interp = Interpreter(m, profile=NeuralArtProfile())
    for k in interp.kernels:
        assert not isinstance(k, Chain)
    x = np.random.default_rng(5).integers(-128, 128, (2, 10)).astype(np.int8)
    assert np.array_equal(interp.run(x), Interpreter(m).run(x))
    conv = Interpreter(O.conv2d_model((1, 4, 4, 2), np.ones((2, 1, 1, 2)), None, 0.1, 0, 0.1, 0.2, 0))
    assert placement(conv.kernels[0])[0] == NPU


def test_interpreter_refuses_the_bare_name(conv_model):
    with pytest.raises(npusim.NpusimError, match="NeuralArtProfile"):
        Interpreter(conv_model, profile="neural-art")


def test_inspect_json_stages_and_lint(conv_model, tmp_path):
    path = tmp_path / "conv.tflite"
    path.write_bytes(conv_model)
    r = cli("inspect", path, "--target", "stm32n6", "--format", "json", "--lint")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    stages = data["ops"][0]["neural_art"]["stages"]
    assert [s["unit"] for s in stages] == ["ARITH", "CONVACC", "ARITH"]
    assert ISSUE_FIELDS <= set(stages[1]) and ARITH_FIELDS <= set(stages[2])
    assert len(stages[2]["A_vector"]) == 8 and isinstance(data["lint"], list)
    add = tmp_path / "add.tflite"
    add.write_bytes(O.add_model((1, 4, 4, 8), (1, 4, 4, 8), *FORUM))
    r = cli("inspect", add, "--target", "stm32n6", "--lint", "--n6-add-products", "rounded")
    assert r.exit_code == 0 and "16x apart" in r.output
    r = cli("inspect", add, "--lint")
    assert r.exit_code == 2 and "--target stm32n6" in r.output


def test_lint_says_near_dead_channels_as_such():
    """A channel whose weight scale is 1e-9 next to 1e-3: its output is its bias, constant; the lint
    says so (predicted error 0) instead of a 255-step scale-spread error, and gives remedies."""
    rng = np.random.default_rng(3)
    w = rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8)
    b = rng.integers(-3000, 3000, 8).astype(np.int32)
    scales = rng.uniform(0.001, 0.01, 8)
    scales[5] = 1e-9
    graph = Interpreter(O.conv2d_model((1, 8, 8, 4), w, b, 0.05, -3, scales, 0.3, 5), plan_only=True).graph
    found = lint(graph)
    dead = [f for f in found if "near-dead" in f["reason"]]
    assert len(dead) == 1 and dead[0]["near_dead_channels"] == [5] and dead[0]["predicted_error_steps"] == 0
    assert all(f["predicted_error_steps"] < 255 for f in found)
    assert all("Remedy" in f["reason"] for f in found)


def test_compare_and_validate(conv_model, tmp_path):
    path = tmp_path / "conv.tflite"
    path.write_bytes(conv_model)
    x = np.random.default_rng(6).integers(-128, 128, (4, 8, 8, 4)).astype(np.int8)
    np.save(tmp_path / "x.npy", x)
    r = cli("compare", path, "--input", tmp_path / "x.npy", "--a", "tflm", "--b", "neural-art")
    assert r.exit_code == 0 and "B = neural-art" in r.output
    assert "first difference: op 0 (CONV_2D)" in r.output or "no difference" in r.output.lower()
    r = cli("validate", path, "--input", tmp_path / "x.npy", "--profile", "neural-art", "--format", "json")
    assert r.exit_code == 0, r.output
    layer = json.loads(r.output)["layers"][0]
    assert layer["propagated"] is not None and layer["tflm_propagated"] is not None
    r = cli("validate", path, "--input", tmp_path / "x.npy", "--profile", "neural-art")
    assert "tflm propagated sqnr_db" in r.output


def test_compare_applies_n6_options_per_side(conv_model, tmp_path):
    """--n6-* options apply to both sides, so neural-art against itself never parts; a side given
    as a spec (neural-art:KEY=VALUE,...) has its own choices over the shared ones."""
    path = tmp_path / "conv.tflite"
    path.write_bytes(conv_model)
    x = np.random.default_rng(6).integers(-128, 128, (4, 8, 8, 4)).astype(np.int8)
    np.save(tmp_path / "x.npy", x)
    run = ("compare", path, "--input", tmp_path / "x.npy", "--a", "neural-art")
    both = cli(*run, "--b", "neural-art", "--n6-rounding", "truncate")
    assert both.exit_code == 0 and "first difference" not in both.output
    side = cli(*run, "--b", "neural-art:rounding=truncate")
    assert side.exit_code == 0 and "B = neural-art:rounding=truncate" in side.output
    assert "first difference: op 0 (CONV_2D)" in side.output
    # the shared option, then B's own back to the default: the sides part again
    back = cli(*run, "--b", "neural-art:rounding=half-up", "--n6-rounding", "truncate")
    assert "first difference: op 0 (CONV_2D)" in back.output
    for bad, says in (
        ("neural-art:rounding=sideways", "rounding is one of half-up, half-even, truncate"),
        ("neural-art:speed=fast", "is not KEY=VALUE with KEY one of"),
        ("tflm:rounding=truncate", "options after ':' apply only to neural-art"),
        ("nope", "the profile is one of"),
    ):
        r = cli(*run, "--b", bad)
        assert r.exit_code == 2 and says in r.output and r.output.count("\n") <= 2, r.output


def test_fully_connected_and_pool_chains():
    rng = np.random.default_rng(7)
    w = rng.integers(-127, 128, (6, 20)).astype(np.int8)
    m = O.fully_connected_model(
        (1, 20), w, rng.integers(-500, 500, 6).astype(np.int32), 0.04, 2, 0.01, 0.2, -1
    )
    interp = Interpreter(m, profile=NeuralArtProfile())
    assert isinstance(interp.kernels[0], Chain)
    x = rng.integers(-128, 128, (5, 20)).astype(np.int8)
    assert np.abs(interp.run(x).astype(int) - Interpreter(m).run(x)).max() <= 1
    pool = Interpreter(O.max_pool_model((1, 9, 9, 2), 0.1, 0, (9, 9), (1, 1), "SAME"), plan_only=True)
    stages = op_stages(pool.graph, pool.graph.ops[0])
    # ST's decomposition: a CONVACC pads the 9x9 input by 4 (with -128), then 4 chained 3x3 POOLs
    pad, *pools = stages
    assert pad["unit"] == "CONVACC" and pad["left_padding"] == 4 and pad["zfbias"] == -128
    assert len(pools) == 4 and all(s["poolWinX"] == 3 and s["unit"] == "POOL" for s in pools)
    assert [s["inputX"] for s in pools] == [17, 15, 13, 11] and pools[-1]["outputX"] == 9
