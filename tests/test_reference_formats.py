"""The float reference (runtime/reference.FloatInterpreter) loads its model through the formats table
(formats/model_io.load_model, by the file's content): an int8 ONNX graph runs as its real-valued
meaning, as a .tflite does.

Against ONNX Runtime's float32 run of the float model that quantize_static quantized: on ops with no
weights (Sigmoid, Softmax, AveragePool) the int8 graph's real-valued meaning is that float model
itself (the input dequantized exactly, no rounding between ops), so the two differ only by the float
kernels' own last bits: atol 1e-6 on outputs within [-1, 1] (measured at most 6e-8, one float32 ulp
of 0.5; exp and the sums' order are the only sources). A float ONNX model is refused in one line:
the importer lowers int8 graphs only."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.errors import NpusimError
from npusim.runtime.reference import FloatInterpreter

T = pytest.importorskip("npusim.testing.onnx_oracle")
pytest.importorskip("onnxruntime")

CASES = [
    ("Sigmoid", lambda: T.unary_model("Sigmoid", (1, 4, 6, 6))),
    ("Softmax", lambda: T.unary_model("Softmax", (1, 4, 6, 6), axis=-1)),
    ("AveragePool", lambda: T.pool_model("AveragePool", (1, 4, 6, 6), (2, 2), (2, 2))),
]


@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_an_onnx_int8_graph_is_the_float_twin_as_ort_runs_it(name, make):
    float_model = make()
    qdq = T.quantize(float_model, fmt="QDQ", force_input=True)
    reference = FloatInterpreter(qdq)  # the bytes: the formats table picks the ONNX reader
    assert reference.graph.source.format == "onnx"
    x = np.random.default_rng(1).uniform(-1, 1, (3, 4, 6, 6)).astype(np.float32)
    want = T.run_ort(float_model.SerializeToString(), x)
    np.testing.assert_allclose(reference.run(x), want, rtol=0, atol=1e-6, err_msg=name)


def test_a_float_onnx_model_is_one_line_before_any_work():
    float_model = T.unary_model("Sigmoid", (1, 4, 6, 6)).SerializeToString()
    with pytest.raises(NpusimError) as e:
        FloatInterpreter(float_model)
    assert "\n" not in str(e.value) and "a float model" in str(e.value)
