"""`--compiled` on ST Edge AI 3.0's readable trace (npu/blob_trace.py) as on 2.1's blobs, the
non-conv units of both shared compiles of YOLOX-nano against npusim's derived chains field by field,
what neither compile shows (kernel splits, pipes beyond 4 CONVACCs, the ops the model lacks), and the
one-line errors for a program that cannot be read or mapped. Skips loudly without ../shared."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from click.testing import CliRunner

import npusim.app.cli
from npusim.formats.model_io import load_model
from npusim.npu.compiled import differs, differs_pool, differs_single, read_compiled
from npusim.npu.compiled_wiring import wire
from npusim.npu.ec_blob import arith_fields, switch_links
from npusim.npu.neural_art import N6Options, graph_stages

from shared_paths import SHARED, need

FOLDER = SHARED / "models" / "stm32n6" / "st_compiler"
MODEL = FOLDER / "yolox_nano_480" / "st_yolo_x_nano_480_1.0_0.25_3_st_int8.tflite"
TRACE = FOLDER / "yolox_nano_480" / "default_blob_trace.c"
C_INFO = FOLDER / "yolox_nano_480" / "c_info.json"
BLOBS = FOLDER / "yolox_nano_480_stedgeai_2.1" / "network_ecblobs.h"
OTHER = SHARED / "models" / "stm32n6" / "blazeface_front_128_quant_pc_ff_od_widerface.tflite"
COMPILES = {"3.0": TRACE, "2.1": BLOBS}


def cli(*args):
    return CliRunner().invoke(npusim.app.cli.main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def programs():
    graph = load_model(need(MODEL))
    return graph, {v: read_compiled(need(path), graph) for v, path in COMPILES.items()}


def test_every_unit_of_both_compiles_equals_the_derived_one(programs, capsys):
    """Each compile against its own compiler's derived chains: every conv, ADD, QUANTIZE and max
    pool (its padding CONVACC and each POOL unit) equal in every compared field."""
    graph, progs = programs
    lines = []
    for version, program in progs.items():
        derived = graph_stages(graph, N6Options(compiler=version))
        convs = [differs(derived[i], c.stages()) for i, c in program.mapped.items()]
        singles = Counter(graph.ops[i].kind for i, p in program.singles.items())
        single_bad = [i for i, p in program.singles.items() if differs_single(derived[i], p.stages())]
        pools = {i: differs_pool(derived[i], p.stages()) for i, p in program.pools.items()}
        units = sorted(sum(s["unit"] == "POOL" for s in p.stages()) for p in program.pools.values())
        kinds = program.summary()["epoch_kinds"]
        lines.append(
            f"{version}: conv {sum(not d for d in convs)}/{len(convs)}, ADD {singles['ADD']}, "
            f"QUANTIZE {singles['QUANTIZE']} (differing {len(single_bad)}), max pools "
            f"{sum(not d for d in pools.values())}/{len(pools)} ({units} POOL units), epochs "
            f"{kinds['mapped']} mapped, {kinds['movement']} copies, {kinds['empty']} without NPU units"
        )
        assert len(convs) == 186 and not any(convs)
        assert singles == {"ADD": 21, "QUANTIZE": 1} and not single_bad
        assert len(pools) == 3 and not any(pools.values()) and units == [2, 4, 6]
        assert kinds["unmapped"] == 0
        moved = {i for ops in program.movement.values() for i in ops}
        # the copies work for concatenations and resizes only, for which npusim derives no unit
        assert moved and {graph.ops[i].kind for i in moved} <= {"CONCATENATION", "RESIZE_NEAREST_NEIGHBOR"}
        assert not moved & set(derived)
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_comparison_sees_a_wrong_field(programs):
    graph, progs = programs
    index, chain = next(iter(progs["3.0"].mapped.items()))
    derived = [dict(s) for s in graph_stages(graph)[index]]
    assert differs(derived, chain.stages()) == []
    derived[1]["bot_padding"] += 1  # the frame is compared too (neural_art.conv_geometry)
    assert differs(derived, chain.stages()) == ["CONVACC.bot_padding"]
    index, chain = next(iter(progs["2.1"].pools.items()))
    derived = graph_stages(graph, N6Options(compiler="2.1"))[index]
    wrong = [dict(s) for s in derived]
    wrong[0]["zfbias"], wrong[-1]["inputX"] = 0, wrong[-1]["inputX"] + 1
    assert differs_pool(wrong, chain.stages()) == ["CONVACC[pad].zfbias", f"POOL[{len(wrong) - 2}].inputX"]
    assert differs_pool(derived[:-1], chain.stages()) == ["stages"]


def test_no_kernel_split_no_pipe_beyond_four(programs):
    """Neither compile splits a kernel over parallel CONVACCs summed by an ARITH add, nor pipes more
    than 4 CONVACCs: pipes of 1, 2 and 4 units, and no two-input ARITH fed by a CONVACC."""
    graph, progs = programs
    for version, program in progs.items():
        lengths = Counter(len(c.convaccs) for c in wire(program.epochs).chains if c.ariths)
        assert set(lengths) == {1, 2, 4}, (version, lengths)
        for e in program.epochs:
            links = switch_links(e)
            for u in e.units:
                if u.name.startswith("ARITH") and arith_fields(u)["dualinput"]:
                    fed = links.get(f"{u.name}.0", []) + links.get(f"{u.name}.1", [])
                    assert not any(s.startswith("CONVACC") for s in fed), (version, e.number)
        assert not any(u.name.startswith(("ACTIV", "DECUN")) for e in program.epochs for u in e.units)
    # what the model does not have, so neither compile can show it (docs/neural-art.md: unverified)
    kinds = {op.kind for op in graph.ops}
    assert not kinds & {"FULLY_CONNECTED", "MUL", "PRELU", "AVERAGE_POOL_2D", "LOGISTIC", "HARD_SWISH"}
    concat = [op for op in graph.ops if op.kind == "CONCATENATION"]
    t = graph.tensors
    assert all(  # no requantizing concatenation: every input has the output's scale and zero point
        (t[i].scale, t[i].zero_point) == (t[op.outputs[0]].scale, t[op.outputs[0]].zero_point)
        for op in concat
        for i in op.inputs
    )


def test_inspect_compiled_trace_json(programs):
    r = cli("inspect", need(MODEL), "--target", "stm32n6", "--format", "json", "--compiled", need(TRACE))
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    ops = [o for o in data["ops"] if "compiled" in o.get("neural_art", {})]
    assert all(o["neural_art"]["compiled"]["differs"] == [] for o in ops)
    conv = next(o for o in ops if o["kind"] == "DEPTHWISE_CONV_2D")["neural_art"]["compiled"]
    assert [s["unit"] for s in conv["stages"][:2]] == ["ARITH", "CONVACC"]
    assert conv["stages"][0]["role"] == "suboff" and conv["stages"][-1]["A_vector"]
    pool = next(o for o in ops if o["kind"] == "MAX_POOL_2D")["neural_art"]["compiled"]["stages"]
    assert pool[0]["zfbias"] == -128 and pool[1]["operation"] == "POOL_MAX"
    assert data["compiled"]["mapped_chains"] == 186 and data["compiled"]["mapped_pools"] == 3
    # the N6 view: latency on the trace's epochs, internal RAM on the buffers of the c_info.json beside it
    view = data["compiled"]["n6_view"]
    assert view["network_c"].endswith("c_info.json") and view["hardware_epochs"] == 209
    assert view["internal_ram_bytes"] == 2_655_232 and view["equals_stated_pools"]  # 2593.0 KiB


def _one_line_error(*args) -> str:
    r = cli("inspect", *args)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    return r.output


def test_unreadable_or_unmapped_programs_say_where(tmp_path):
    model = need(MODEL)
    text = open(need(TRACE)).read()
    cut = tmp_path / "default_blob_trace.c"
    cut.write_text(text[: len(text) // 2])
    assert re.search(
        r"epoch \d+, line \d+: the epoch does not end",
        _one_line_error(model, "--target", "stm32n6", "--compiled", cut),
    )
    bad = tmp_path / "bad_blob_trace.c"
    bad.write_text(text.replace(".shift_o = 19,", ".shift_o = x19,", 1))
    out = _one_line_error(model, "--target", "stm32n6", "--compiled", bad)
    assert re.search(r"epoch 4, line \d+: field \.shift_o = 'x19' is not a number", out)
    blobs = open(need(BLOBS)).read()
    short = tmp_path / "network_ecblobs.h"
    short.write_text(blobs[:600_000])
    out = _one_line_error(model, "--target", "stm32n6", "--compiled", short)
    assert re.search(r"blob _ec_blob_1, epoch \d+, word \d+: the array ends without", out)
    # the instruction after epoch 5's start made an unknown op: the error names that epoch and word
    mutated = tmp_path / "mutated_ecblobs.h"
    mutated.write_text(_mutated(blobs, epoch=5))
    out = _one_line_error(model, "--target", "stm32n6", "--compiled", mutated)
    assert re.search(r"epoch 5, word \d+: unknown instruction", out)
    out = _one_line_error(model, "--target", "stm32n6", "--compiled", need(C_INFO))
    assert "no unit's configuration" in out
    out = _one_line_error(need(OTHER), "--target", "stm32n6", "--compiled", need(TRACE))
    assert "matches a conv of the model: compiled from another model?" in out


def _mutated(text: str, epoch: int) -> str:
    """text with the 32-bit word after epoch `epoch`'s start marker (op 29) given op 7."""
    items = list(re.finditer(r"0x([0-9a-fA-F]{1,16})UL", text))
    words = [w for m in items for w in (int(m.group(1), 16) & 0xFFFFFFFF, int(m.group(1), 16) >> 32)]
    k = words.index(epoch << 5 | 29) + 1
    words[k] = (words[k] & ~0x1F) | 7
    m = items[k // 2]
    value = words[k // 2 * 2] | words[k // 2 * 2 + 1] << 32
    return text[: m.start()] + f"0x{value:016x}UL" + text[m.end() :]
