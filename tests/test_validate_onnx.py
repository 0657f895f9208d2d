"""`npusim validate` on ONNX QDQ models: against its own graph in float (the lowered int8 graph in
float on dequantized weights, each layer within its quantization range), on ST's face-landmarks
model; and against its float ONNX original (`--float`, evaluated by onnx.reference, matched by value
and node names) on a small CNN quantized by ORT's quantize_static, whose Relus ORT folds into the
QuantizeLinears' zero points."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from npusim.app.cli import main

from shared_paths import SHARED, need

FACE = SHARED / "models" / "onnx" / "face_landmarks_v1_192_int8_pc.onnx"


def test_an_onnx_model_validates_against_its_own_float_graph(tmp_path):
    model = need(FACE)
    x = np.random.default_rng(3).random((2, 3, 192, 192), dtype=np.float32)  # pixels on [0, 1]
    np.save(tmp_path / "x.npy", x)
    r = CliRunner().invoke(main, ["validate", model, "--input", str(tmp_path / "x.npy"), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert "warning: the reference is the int8 graph in float" in r.stderr
    assert d["accuracy"] is None and len(d["outputs"]) == 1
    assert d["outputs"][0]["cos"] > 0.98  # int8 against float: close, not equal
    # Without --float the reference is the graph in float: every layer has a propagated record.
    assert all(layer["propagated"] is not None for layer in d["layers"])
    # A convolution's int32 bias carries no quantization of its own in ONNX: its float form must
    # still read it in input scale x weight scale units, or every conv's local error explodes.
    convs = [layer for layer in d["layers"] if layer["kind"] in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    sqnr = [layer["local"]["sqnr_db"] for layer in convs]
    assert convs and all(s is None or s > 15 for s in sqnr), sqnr


def _pair(tmp_path):
    pytest.importorskip("onnxruntime")
    from npusim.testing import onnx_oracle as oo

    m = oo.small_cnn_model(seed=2, size=16)
    feeds = oo.random_inputs(m, 16, seed=4, low=0.0, high=1.0)
    q = oo.quantize(m, fmt="QDQ", per_channel=True, calibration=feeds)
    (tmp_path / "f.onnx").write_bytes(m.SerializeToString())
    (tmp_path / "q.onnx").write_bytes(q)
    x = np.concatenate([f["x"] for f in oo.random_inputs(m, 24, seed=9, low=0.0, high=1.0)])
    np.save(tmp_path / "x.npy", x)
    return m, q, x


def test_validate_onnx_against_its_float_original(tmp_path):
    """--float takes the float ONNX: the reference is the float model itself, so its outputs are
    the float model's (ORT's float run within float32 rounding), and every layer is matched."""
    from npusim.testing import onnx_oracle as oo

    m, q, x = _pair(tmp_path)
    args = ["validate", str(tmp_path / "q.onnx"), "--input", str(tmp_path / "x.npy")]
    r = CliRunner().invoke(main, [*args, "--float", str(tmp_path / "f.onnx"), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    from npusim.app.validate import validate

    result = validate(str(tmp_path / "q.onnx"), x, str(tmp_path / "f.onnx"))
    ref, got = result.output_pairs[0]
    truth = oo.run_ort(m.SerializeToString(), x, optimize=False)
    np.testing.assert_allclose(ref.reshape(truth.shape), truth, rtol=1e-4, atol=1e-5)
    assert result.unmatched_float == [] and result.warnings == []
    computed = ("CONV_2D", "DEPTHWISE_CONV_2D", "ADD", "MAX_POOL_2D", "MEAN", "RESHAPE", "FULLY_CONNECTED")
    # every layer that computes a float node's value is matched (the import's own QUANTIZE, layout
    # TRANSPOSEs, PAD and DEQUANTIZE have no float node)
    assert all(layer["propagated"] is not None for layer in d["layers"] if layer["kind"] in computed)
    truth_cos = d["outputs"][0]["cos"]
    assert truth_cos > 0.99
    # Without --float, the graph in float keeps the Relus ORT folded into the zero points (each layer
    # within its range): close to the truth, where dropping them gave a reference far from it.
    r = CliRunner().invoke(main, [*args, "--format", "json"])
    assert r.exit_code == 0 and "warning: the reference is the int8 graph in float" in r.stderr
    own = json.loads(r.stdout)["outputs"][0]
    assert (
        own["cos"] > 0.999 and own["sqnr_db"] > 30
    )  # 38.6 dB against the float model; 0.2 dB without ranges


def test_validate_onnx_refuses_an_integer_model_as_float(tmp_path):
    _, _, _ = _pair(tmp_path)
    args = ["validate", str(tmp_path / "q.onnx"), "--input", str(tmp_path / "x.npy")]
    r = CliRunner().invoke(main, [*args, "--float", str(tmp_path / "q.onnx")])
    assert r.exit_code == 2 and "the model computes in integers, expected a float32 model" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_validate_onnx_matches_by_topology_where_names_differ(tmp_path):
    """Every value and node of the float model renamed: the match falls back on the topology (the
    int8 file's node of the same op type reading the same tensors, a folded Relu taking its Conv's
    match), and every layer's propagated error is the one the names gave."""
    from npusim.app.validate import validate

    m, q, x = _pair(tmp_path)
    by_name = validate(q, x, m.SerializeToString())
    by_topology = validate(q, x, _renamed(m))
    assert by_topology.unmatched_float == [] and by_topology.warnings == []
    assert [layer["propagated"] for layer in by_topology.layers] == [
        layer["propagated"] for layer in by_name.layers
    ]


def test_a_qoperator_file_matches_by_topology_where_names_differ():
    """The same on a QOperator file: its QLinearConv, QLinearAdd and QGemm nodes stand for the float
    model's Conv, Add and Gemm (the folded Clips taking their Convs' matches)."""
    import onnx

    from npusim.app.validate import validate

    m, q, x = _relu6_pair("QOperator")
    by_name = validate(q, x, m)
    by_topology = validate(q, x, _renamed(onnx.load_from_string(m)))
    assert by_topology.unmatched_float == [] and by_topology.warnings == []
    assert [layer["propagated"] for layer in by_topology.layers] == [
        layer["propagated"] for layer in by_name.layers
    ]


def _renamed(m) -> bytes:
    """The float model m with every node and every value but the graph outputs renamed."""
    import onnx

    renamed = onnx.ModelProto()
    renamed.CopyFrom(m)
    new = {}
    for k, node in enumerate(renamed.graph.node):
        node.name = f"n{k}"
        for j, o in enumerate(node.output):
            if o not in {v.name for v in renamed.graph.output}:
                new[o] = node.output[j] = f"v{k}_{j}"
    for node in renamed.graph.node:
        for j, i in enumerate(node.input):
            node.input[j] = new.get(i, i)
    return renamed.SerializeToString()


def _relu6_pair(fmt: str):
    """A small CNN with Relu6 (Clip to [0, 6]) quantized by ORT's quantize_static in fmt, on inputs
    large enough for every Clip to clamp; ORT folds each Clip into its layer's output range."""
    pytest.importorskip("onnxruntime")
    from npusim.testing import onnx_oracle as oo

    m = oo.small_cnn_model(seed=2, size=16, activation="Relu6")
    feeds = oo.random_inputs(m, 16, seed=4, low=0.0, high=8.0)
    q = oo.quantize(m, fmt=fmt, per_channel=True, calibration=feeds)
    x = np.concatenate([f["x"] for f in oo.random_inputs(m, 8, seed=9, low=0.0, high=8.0)])
    return m.SerializeToString(), q, x


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_folded_activation_clamp_is_no_local_error(fmt):
    """A Relu6 that ORT folded into a layer's output range clamps the int8 output: the layer's
    local float form clamps as the float model's Clip does (0.7-2.9 dB before, the clamp counted as
    error), so local SQNR stays above the propagated one; on the QOperator file every float node is
    matched (its values named <float name>_quantized, its nodes QLinearConv, QGemm, ...)."""
    from npusim.app.validate import validate

    m, q, x = _relu6_pair(fmt)
    result = validate(q, x, m)
    assert result.unmatched_float == [] and result.warnings == []
    convs = [r for r in result.layers if r["kind"] in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    assert len(convs) == 4 and all(r["propagated"] is not None for r in convs)
    assert all(r["local"]["sqnr_db"] > r["propagated"]["sqnr_db"] for r in convs), [
        (r["local"]["sqnr_db"], r["propagated"]["sqnr_db"]) for r in convs
    ]
    if fmt == "QOperator":  # the same layers have a propagated error as in the QDQ file
        qdq = validate(_relu6_pair("QDQ")[1], x, m)
        assert [r["propagated"] is None for r in result.layers] == [
            r["propagated"] is None for r in qdq.layers
        ]


def test_breaks_first_names_a_layer_whose_inputs_have_a_propagated_value():
    """A conv fed by the import's PAD (no float counterpart, no propagated value) is measured from
    what the PAD was fed, never named with "inf dB into it" (op 5 was, on this model)."""
    from npusim.app.validate import validate
    from npusim.formats.model_io import load_model

    m, q, x = _relu6_pair("QDQ")
    graph = load_model(q)
    result = validate(graph, x, m)
    b, producer = result.breaks_first, graph.producer()
    by_op = {r["op"]: r for r in result.layers}
    ins = [t for t in graph.ops[b["op"]].inputs if t >= 0 and not graph.tensors[t].is_constant]
    before = []
    for t in ins:  # each input's value has a propagated record, or is the quantized graph input
        src = producer[t]
        while by_op[src.index]["propagated"] is None and src.kind in ("PAD", "TRANSPOSE"):
            src = producer[src.inputs[0]]
        p = by_op[src.index]["propagated"]
        assert p is not None or src.kind == "QUANTIZE"
        before.append(float("inf") if p is None else p["sqnr_db"])
    assert b["sqnr_db_before"] == min(before)
    # the model has a conv fed by a PAD without a propagated value
    pads = {r["op"] for r in result.layers if r["kind"] == "PAD" and r["propagated"] is None}
    assert any(producer.get(t) is not None and producer[t].index in pads for o in graph.ops for t in o.inputs)
