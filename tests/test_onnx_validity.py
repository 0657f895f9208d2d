"""The ONNX reader refuses what ONNX Runtime refuses, in one line (npusim/formats/onnx/validity.py).

Each hostile file is a valid QDQ Conv model with one edit. `npusim run` must exit 2 with one stderr
line naming what is wrong; ONNX Runtime itself (session and run) must refuse the same file, except
where the notes say ORT takes it with a warning and the ONNX checker refuses it.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx_import import conv_qdq, feeds_for, model, rng_of  # noqa: E402

import npusim  # noqa: E402
from npusim.testing import onnx_oracle as oo  # noqa: E402


def _init(m, name):
    return next(i for i in m.graph.initializer if i.name == name)


def _set_attr(node, name, value):
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))


def _conv(m):
    return next(n for n in m.graph.node if n.op_type == "Conv")


def _relabel_int4(m):
    """The int8 weights and their zero points relabelled int4, their data left as it is."""
    for name in ("w_q", "w_z"):
        _init(m, name).data_type = TensorProto.INT4


def _relabel_int4_raw(m):
    w = _init(m, "w_q")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w), "w_q"))  # 108 bytes of raw_data
    _relabel_int4(m)


def _short_int4(m):
    w = _init(m, "w_q")
    w.ClearField("int32_data")
    w.raw_data = b"\x11"


def _flatten_axis(m):
    """A Flatten appended after the Conv's output Q/DQ, its axis outside the rank."""
    dq = next(n for n in m.graph.node if n.output[0] == m.graph.output[0].name)
    dq.output[0] = "before_flatten"
    m.graph.node.append(helper.make_node("Flatten", ["before_flatten"], [m.graph.output[0].name], axis=9))


# (edit, weights of the seed, what the one line says, whether ORT refuses too)
CASES = {
    "conv stride 0": (lambda m: _set_attr(_conv(m), "strides", [0, 0]), "int8", "strides must only", True),
    "conv dilation 0": (lambda m: _set_attr(_conv(m), "dilations", [1, 0]), "int8", "dilations must", True),
    # ORT warns and takes one of the two; the checker refuses, and so does npusim
    "duplicate initializer": (
        lambda m: m.graph.initializer.append(_init(m, "w_s")),
        "int8",
        "name is not unique",
        False,
    ),
    "int8 relabelled int4": (_relabel_int4, "int8", "holds 108 int32_data, its shape and type need 54", True),
    "int8 raw_data relabelled int4": (_relabel_int4_raw, "int8", "holds 108 bytes", True),
    "int4 raw_data one byte": (_short_int4, "int4", "raw_data size (1 bytes) is too small", True),
    "int4 codes, uint4 zero point": (
        lambda m: setattr(_init(m, "w_z"), "data_type", TensorProto.UINT4),
        "int4",
        "x_zero_point has inconsistent type",
        True,
    ),
    "opset 1": (lambda m: setattr(m.opset_import[0], "version", 1), "int8", "No Op registered", True),
    "opset 99": (lambda m: setattr(m.opset_import[0], "version", 99), "int8", "opset 99 of ai.onnx", True),
    "no opset": (lambda m: m.ClearField("opset_import"), "int8", "must specify opset_import", True),
    "ir_version 99": (lambda m: setattr(m, "ir_version", 99), "int8", "ir_version 99 is higher", True),
    "custom domain": (
        lambda m: (
            m.opset_import.append(helper.make_opsetid("my.ops", 1)),
            setattr(_conv(m), "domain", "my.ops"),
        ),
        "int8",
        "of domain 'my.ops'",
        True,
    ),
    "com.microsoft Conv": (
        lambda m: (
            m.opset_import.append(helper.make_opsetid("com.microsoft", 1)),
            setattr(_conv(m), "domain", "com.microsoft"),
        ),
        "int8",
        "of domain 'com.microsoft' is not supported",
        True,
    ),
    "axis out of range": (_flatten_axis, "int8", "Invalid value(9) for attribute 'axis'", True),
}


def hostile(kind: str) -> bytes:
    edit, weights, _, _ = CASES[kind]
    m = onnx.load_from_string(conv_qdq(weights))
    edit(m)
    return m.SerializeToString()


def ort_refuses(data: bytes) -> bool:
    x = np.zeros((1, 3, 6, 6), np.float32)
    try:
        oo.run_ort(data, x, optimize=False)
    except Exception:
        return True
    return False


@pytest.mark.parametrize("kind", list(CASES))
def test_refused_in_one_line_as_ort_refuses(kind, tmp_path):
    from click.testing import CliRunner

    from npusim.app.cli import main

    data = hostile(kind)
    message, ort_too = CASES[kind][2], CASES[kind][3]
    with pytest.raises(npusim.NpusimError) as e:
        npusim.load_model(data)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert ort_refuses(data) == ort_too
    f = tmp_path / "m.onnx"
    f.write_bytes(data)
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 6, 6), np.float32))
    res = CliRunner().invoke(
        main, ["run", str(f), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]
    )
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert "Traceback" not in res.output


def test_seeds_are_valid():
    """The unedited seeds pass the checker and run (the refusals above are the edits' doing),
    including a graph output that declares no shape (onnx.helper's builders write those; ORT runs them)
    and nodes out of order in the file (ORT sorts them; the checker is given them sorted)."""
    for weights in ("int8", "int4"):
        data = conv_qdq(weights)
        assert onnx.load_from_string(data).graph.output[0].type.tensor_type.HasField("shape") is False
        npusim.load_model(data)
        assert not ort_refuses(data)
    m = onnx.load_from_string(conv_qdq())
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    npusim.load_model(m.SerializeToString())


def test_per_axis_dequantize_axis_out_of_range():
    """npusim's own limit: a per-axis DequantizeLinear's axis inside the weight's rank."""
    m = onnx.load_from_string(conv_qdq())
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w_q")
    _set_attr(dq, "axis", 7)
    with pytest.raises(npusim.NpusimError, match="axis 7 is outside the 4 axes"):
        npusim.load_model(m.SerializeToString())


def test_flatten_seed_runs_with_a_valid_axis():
    """The axis case's seed is valid with axis 1: the refusal is the axis, not the Flatten."""
    rng = rng_of("flatten-valid")
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Flatten", ["c"], ["y"], axis=1),
    ]
    m = model(nodes, [("x", (1, 3, 6, 6))], [("w", w)])
    from onnx_qdq import qdq

    data = qdq(m, feeds_for(m, rng))
    assert npusim.load_model(data).output().shape == (1, 144)
