"""`npusim validate` on an ONNX QDQ model: its float reference is its own graph without the Q/DQ
pairs (the lowered int8 graph in float on dequantized weights), on ST's face-landmarks model."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from npusim.cli import main

from shared_paths import SHARED, need

FACE = SHARED / "models" / "onnx" / "face_landmarks_v1_192_int8_pc.onnx"


def test_an_onnx_model_validates_against_its_own_float_graph(tmp_path):
    model = need(FACE)
    x = np.random.default_rng(3).random((2, 3, 192, 192), dtype=np.float32)  # pixels on [0, 1]
    np.save(tmp_path / "x.npy", x)
    r = CliRunner().invoke(main, ["validate", model, "--input", str(tmp_path / "x.npy"), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["accuracy"] is None and len(d["outputs"]) == 1
    assert d["outputs"][0]["cos"] > 0.98  # int8 against float: close, not equal
    # Without --float the reference is the graph in float: every layer has a propagated record.
    assert all(layer["propagated"] is not None for layer in d["layers"])
    # A convolution's int32 bias carries no quantization of its own in ONNX: its float form must
    # still read it in input scale x weight scale units, or every conv's local error explodes.
    convs = [layer for layer in d["layers"] if layer["kind"] in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    sqnr = [layer["local"]["sqnr_db"] for layer in convs]
    assert convs and all(s is None or s > 15 for s in sqnr), sqnr
