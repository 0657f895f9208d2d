"""ST Edge AI's epoch-controller blobs (npu/ec_blob.py), their mapping to the model's ops
(npu/compiled.py) and the 2.x two-stage requantization (npu/n6_compiler.py), against ST Edge AI
2.1's own compile of YOLOX-nano (../shared/models/stm32n6/st_compiler/yolox_nano_480_stedgeai_2.1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import npusim.app.cli
from npusim.formats.model_io import load_model
from npusim.npu.compiled import differs, read_compiled
from npusim.npu.compiled_wiring import ordered_chains, wired_chains
from npusim.npu.ec_blob import (
    MAGIC,
    CompiledError,
    arith_fields,
    decode_blob,
    read_ecblobs,
    streng_fields,
    switch_links,
)
from npusim.npu.neural_art import N6Options, bc_vector, graph_stages

from shared_paths import SHARED, need

FOLDER = SHARED / "models" / "stm32n6" / "st_compiler"
MODEL = FOLDER / "yolox_nano_480" / "st_yolo_x_nano_480_1.0_0.25_3_st_int8.tflite"
BLOBS = FOLDER / "yolox_nano_480_stedgeai_2.1" / "network_ecblobs.h"


def cli(*args):
    return CliRunner().invoke(npusim.app.cli.main, [str(a) for a in args], catch_exceptions=False)


def _program(*body):
    """A blob: magic, length, the program words, the end (op 12)."""
    words = [*body, 0xC]
    return [MAGIC, len(words), *words]


def test_decode_one_arith_configuration():
    # epoch 7; ARITH1 CTRL (op 2: default then the value), SHIFT (op 0), COEFFAC+COEFFB (op 3),
    # two channels of coefficient memory (op 3 from word 0x100), a wait (op 4), an end-of-epoch clear
    a = 0x5C00 + 0x400
    ctrl = (
        1 << 2 | 1 << 3 | 1 << 4 | 1 << 5 | 1 << 6 | 1 << 7 | 1 << 21 | 1 << 22 | 1 << 24 | 1 << 26 | 1 << 28
    )
    words = _program(
        7 << 5 | 29,
        a << 16 | 2 << 5 | 2,
        0x08000000,
        ctrl,
        (a + 2) << 16 | 0x3E0 << 5 | 0,
        20 << 15,
        (a + 0x100) << 16 | 4 << 5 | 3,
        0xEF885500,
        0xFD84,
        0x00015500,
        0x0002,
        0x80 << 16 | 4,
        0x64,
        0,
        a << 16 | 0x3E0 << 5,
        0x48000000,
    )
    (epoch,) = decode_blob("_ec_blob_t", words, "t.h")
    assert epoch.number == 7 and [u.name for u in epoch.units] == ["ARITH1"]
    f = arith_fields(epoch.units[0])
    assert (f["scalar"], f["bcast"], f["combinebc"], f["outbytes_o"], f["shift_o"]) == (
        0,
        "ARITH_BCAST_CHAN",
        1,
        1,
        20,
    )
    assert (f["rounding_o"], f["saturation_o"], f["round_mode_o"]) == (1, 1, 1)
    assert f["A_vector"] == [21760, 21760]
    assert f["C_vector"] == [np.int32(np.uint32(0xEF88FD84)), 0x00010002]


def test_decode_stream_switch_and_engines():
    # STRSWITCH (word 0x1000): DST 28 (ARITH0 port 0) <- link 19 (ARITH1), DST 19 (CONVACC3
    # port 0) <- link 20 (ARITH2) with EN1 off; then the epoch's end writes the ports 0 (ignored).
    # STRENG6 (word 0x2c00): CTRL with DIR (a write engine), ADDR.
    sw, eng = 0x1000, 0x1400 + 6 * 0x400
    words = _program(
        4 << 5 | 29,
        (sw + 2 + 28) << 16 | 0x3E0 << 5,
        19 << 1 | 1,
        (sw + 2 + 19) << 16 | 0x3E0 << 5,
        0xFF280229,
        eng << 16 | 0x3E0 << 5,
        0x880108,
        (eng + 2) << 16 | 0x3E0 << 5,
        0x341A8C00,
        (sw + 2 + 28) << 16 | 0x3E0 << 5,
        0,
        0x4C00 << 16 | 0x3E0 << 5,  # the unit after CONVACC3: DECUN0, not a "CONVACC4"
        1,
    )
    (epoch,) = decode_blob("_ec_blob_t", words, "t.h")
    assert {u.name for u in epoch.units} == {"STRSWITCH", "STRENG6", "DECUN0"}
    assert switch_links(epoch) == {"CONVACC3.0": ["ARITH2"], "ARITH0.0": ["ARITH1"]}
    engine = next(u for u in epoch.units if u.name == "STRENG6")
    assert streng_fields(engine) == {"unit": "STRENG", "write": True, "addr": 0x341A8C00}


def test_bad_blob_names_blob_epoch_and_word():
    words = _program(3 << 5 | 29, 0x5C00 << 16 | 7)  # op 7: no such instruction
    with pytest.raises(CompiledError, match=r"blob _ec_blob_t, epoch 3, word 3: unknown instruction"):
        decode_blob("_ec_blob_t", words, "t.h")
    short = _program(3 << 5 | 29)
    short[1] += 1  # states one word more than it has before its end
    with pytest.raises(CompiledError, match=r"epoch 3, word 3: ends before its stated end 4"):
        decode_blob("_ec_blob_t", short + [0, 0], "t.h")


def test_every_blob_decodes_to_its_stated_end():
    epochs = read_ecblobs(need(BLOBS))
    assert len(epochs) == 222 and epochs[0].number == 1 and epochs[-1].number == 230


@pytest.fixture(scope="module")
def yolox21():
    graph = load_model(need(MODEL), plan_only=True)
    return graph, read_compiled(need(BLOBS), graph)


def _bc(stage: dict, channels: int) -> np.ndarray:
    """A requantizing ARITH's BC per channel (combinebc; a scalar ARITH's {B_scalar, C_scalar})."""
    if stage["C_vector"] is not None:
        return np.asarray(stage["C_vector"], np.int64)
    return np.full(channels, (stage["B_scalar"] << 16) + (stage["C_scalar"] & 0xFFFF), np.int64)


def test_2x_chain_derived_equals_the_compiled_one(yolox21, capsys):
    graph, program = yolox21
    derived = graph_stages(graph, N6Options(compiler="2.1"))
    mac = sum(op.kind in ("CONV_2D", "DEPTHWISE_CONV_2D") for op in graph.ops)
    two = {i: c for i, c in program.mapped.items() if len(c.ariths) == 2}
    exact_fields = bc_layers = bc_channels = channels = split = scalar = suboffs = 0
    for index, chain in two.items():
        d = differs(derived[index], chain.stages())
        exact_fields += not [f for f in d if f != "ARITH.C_vector"]
        n = chain.channels
        bc = _bc(derived[index][-1], n) == _bc(chain.ariths[-1], n)
        bc_layers += bool(bc.all())
        bc_channels += int(bc.sum())
        channels += n
        split += chain.arith_epochs[-1] != chain.epoch
        suboffs += chain.suboff is not None
        scalar += chain.ariths[-1]["scalar"]
    with capsys.disabled():
        print(
            f"\n2.1 blobs: {len(program.chains)} conv chains, {len(program.mapped)} mapped of "
            f"{mac} conv layers ({suboffs} with their suboff wired, {split} requantized in a later epoch "
            "than their CONVACC pipe, "
            f"{scalar} with a scalar off_bias); two-stage layers {len(two)}: every field but BC "
            f"exact {exact_fields}/{len(two)}, BC exact {bc_layers}/{len(two)} layers, "
            f"{bc_channels}/{channels} channels"
        )
    assert len(program.mapped) == len(two) == mac  # every conv, each with two requantizing ARITHs
    assert exact_fields == len(two)  # suboff, A1, s1, A2, shift 20, widths, roundings, the CONVACC's S
    assert suboffs == mac
    assert bc_channels == channels  # one fixed 2^-23 rounding missed 161 of 11,196
    assert split >= 11 and scalar >= 9  # the chains that cutting within one epoch missed
    # the 3.0 chain (the default) is not what 2.1 compiled
    derived30 = graph_stages(graph, N6Options())
    assert all("stages" in differs(derived30[i], c.stages()) for i, c in two.items())


def test_wiring_and_order_agree_and_network_c_names_the_epochs(yolox21):
    """Two readings of the program give the same chains: the stream switch and stream engines'
    wiring, and configuration order alone. And where ST's network.c names a conv's intermediate
    buffer (`<node>_mul_scale_out`, `<node>_off_bias_out`, with the epoch that writes it), that is
    the epoch of the chain's ARITH; ST's node names are those of the quantization file beside the
    3.0 trace (the same .tflite)."""
    graph, program = yolox21
    epochs = read_ecblobs(need(BLOBS))

    def key(c):
        return c.epoch, tuple(c.arith_epochs), len(c.convaccs), tuple(str(a["A_vector"]) for a in c.ariths)

    wired = sorted(map(key, wired_chains(epochs)))
    assert len(wired) == 186 and wired == sorted(map(key, ordered_chains(epochs)))
    qfile = MODEL.with_name("st_yolo_x_nano_480_1.0_0.25_3_st_int8_OE_3_3_1_Q.json")
    nodes = json.loads(Path(need(qfile)).read_text())["nodes"]
    node_of = {name: node for node, v in nodes.items() for name in v.get("names", [])}
    text = Path(need(BLOBS.parent / "network.c")).read_text()
    written = {}
    for name, epoch in re.findall(r'\.name = "([^"]+)",.*?\.epoch = (\d+),', text, re.S):
        written.setdefault(name.rsplit("_", 1)[0], set()).add(int(epoch))
    checked = 0
    for index, chain in program.mapped.items():
        node = node_of[f"{graph.ops[index].kind}_{index}"]
        for stage, epoch in zip(("mul_scale_out", "off_bias_out"), chain.arith_epochs):
            if f"{node}_{stage}" in written:
                assert written[f"{node}_{stage}"] == {epoch}, (node, stage)
                checked += 1
    assert checked >= 40  # 6 mul_scale and 39 off_bias buffers on the shared compile
    # the data-movement epochs (stream engines only): the op each copies for is the Concat_N or
    # Resize_N whose output buffer network.c says that epoch writes (15 of the 16; the 16th, epoch
    # 92, copies the SPP conv's output, `Conv2D_427_off_bias_out_inserted`, for its concatenation)
    by_epoch = {}
    for name, epoch in re.findall(r'\.name = "([^"]+)",.*?\.epoch = (\d+),', text, re.S):
        by_epoch.setdefault(int(epoch), set()).add(name)
    named = 0
    for epoch, ops in program.movement.items():
        nodes_written = {n.split("_out")[0].split("_resize")[0] for n in by_epoch.get(epoch, ())}
        ops_written = {nodes[n]["names"][0] for n in nodes_written if n.startswith(("Concat", "Resize"))}
        if ops_written:
            assert {f"{graph.ops[i].kind}_{i}" for i in ops} == ops_written, epoch
            named += 1
    assert len(program.movement) == 16 and named == 15


def test_inspect_compiled_json_and_errors(yolox21, tmp_path):
    r = cli(
        "inspect",
        need(MODEL),
        "--target",
        "stm32n6",
        "--format",
        "json",
        "--compiled",
        need(BLOBS),
        "--n6-compiler",
        "2.1",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    with_compiled = [o for o in data["ops"] if "compiled" in o.get("neural_art", {})]
    program = yolox21[1]
    moved = {i for ops in program.movement.values() for i in ops}  # concatenations and resizes
    assert len(with_compiled) == len(program.mapped) + len(program.singles) + len(program.pools) + len(moved)
    assert all(o["neural_art"]["compiled"]["differs"] == [] for o in with_compiled)
    kinds = program.summary()["epoch_kinds"]
    # every epoch with an ARITH, CONVACC or POOL unit maps to ops; the others only move data (16)
    # or run nothing on the NPU (the input's and output's transposes, the end: 3)
    assert kinds["unmapped"] == 0 and (kinds["mapped"], kinds["movement"], kinds["empty"]) == (203, 16, 3)
    assert {program.singles[i].fields["role"] for i in program.singles} == {"add", "quantize"}
    # the SPP pools (5x5, 9x9, 13x13) as 2, 4 and 6 chained POOL units after a padding CONVACC each,
    # in the epochs network.c names (MaxPool_433 in 93, MaxPool_432 in 97-98, MaxPool_431 in 94-96)
    pools = {graph_op: (p.pools, p.epochs, len(p.pads)) for graph_op, p in program.pools.items()}
    assert sorted(pools.values()) == [(2, [93], 1), (4, [93, 97, 98], 1), (6, [93, 94, 95, 96], 1)]
    c = next(o for o in with_compiled if o["kind"] == "CONV_2D")["neural_art"]["compiled"]
    assert set(c) >= {"stages", "differs", "epochs"} and c["stages"][0]["role"] == "suboff"
    assert c["stages"][1]["unit"] == "CONVACC" and c["differs"] == []
    assert "stages" in with_compiled[0]["neural_art"]
    bad = tmp_path / "network_ecblobs.h"
    bad.write_text("static const uint64_t _ec_blob_1 [] = {0x0000000300000000UL};")
    r = cli("inspect", need(MODEL), "--target", "stm32n6", "--compiled", bad)
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "blob _ec_blob_1, word 0" in r.output
    r = cli("inspect", need(MODEL), "--compiled", bad)
    assert r.exit_code == 2 and "apply only with --target stm32n6" in r.output


def test_bc_rounds_at_the_fraction_bits_int32_leaves():
    # b + z_y as one int32 vector: max |b + z| < 256 leaves F = 23 fraction bits, in [256, 512) 22.
    # A channel 0.9 / 2^20 above an integer at shift 20: floor at F = 23, one above at F = 22.
    z, frac = -128, 0.9 / 2**20
    small = bc_vector([5 + frac, 100.0], 20, z)
    wide = bc_vector([5 + frac, -200.0], 20, z)
    assert small[0] == (5 + z) << 20 and wide[0] == ((5 + z) << 20) + 1
    assert small[1] == (100 + z) << 20 and wide[1] == (-200 + z) << 20
    # negative, 0.1 / 2^20 below an integer: floor at F = 23, the integer at F = 22
    assert bc_vector([-5 - 0.1 / 2**20, 0.0], 20, z)[0] == ((-5 + z) << 20) - 1
    assert bc_vector([-5 - 0.1 / 2**20, -200.0], 20, z)[0] == (-5 + z) << 20


def test_n6_options_refused_under_other_profiles(tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 4), np.int8))
    model = need(MODEL)
    r = cli("run", model, "--input", x, "--output", tmp_path / "y.npy", "--n6-compiler", "2.1")
    assert r.exit_code == 2 and "--n6-compiler apply only to --profile neural-art, not to tflm" in r.output


def test_profile_runs_the_compiled_chain(yolox21):
    from npusim.npu.compiled import run_stages
    from npusim.npu.neural_art_run import NeuralArtProfile

    graph, program = yolox21
    index, chain = next((i, c) for i, c in sorted(program.mapped.items()) if len(c.ariths) == 2)
    profile = NeuralArtProfile(N6Options(compiler="2.1", compiled=need(BLOBS)))
    stages = profile._stages(graph, graph.ops[index])
    assert stages == run_stages(graph_stages(graph, N6Options(compiler="2.1"))[index], chain)
    assert [s["A_vector"] for s in stages[2:]] == [a["A_vector"] for a in chain.ariths]
