"""A classifier head in two ops, a FULLY_CONNECTED without a bias then an ADD of a constant bias (what
ONNX's MatMul + Add imports as; a .tflite may hold it too): zo's fresh head takes the ADD in as its
bias, and the model is written back as one FULLY_CONNECTED with a bias (tests/test_onnx_zo.py holds
the ONNX side against ORT)."""

from __future__ import annotations

import numpy as np

import npusim
from npusim import write_model
from npusim.formats.tflite_io import schema
from npusim.testing.builder import ModelBuilder
from zo.head import find_head, fresh_head


def fc_add_classifier() -> bytes:
    """[1, 16] int8 -> FULLY_CONNECTED (3 classes, no bias) -> ADD of a constant [3] -> SOFTMAX."""
    b = ModelBuilder()
    rng = np.random.default_rng(0)
    x = b.add_tensor([1, 16], np.int8, 0.05, -3)
    w = b.add_const(rng.integers(-100, 100, (3, 16)).astype(np.int8), scale=0.01)
    mm = b.add_tensor([1, 3], np.int8, 0.1, 2)
    c = b.add_const(rng.integers(-50, 50, (3,)).astype(np.int8), scale=0.05, zero_point=1)
    y = b.add_tensor([1, 3], np.int8, 0.12, 0)
    b.add_op("FULLY_CONNECTED", [x, w, -1], [mm], schema.FullyConnectedOptionsT())
    b.add_op("ADD", [mm, c], [y], schema.AddOptionsT())
    p = b.add_tensor([1, 3], np.int8, 1 / 256, -128)
    softmax = schema.SoftmaxOptionsT()
    softmax.beta = 1.0
    b.add_op("SOFTMAX", [y], [p], softmax)
    return b.build([x], [p])


def test_a_bias_add_is_taken_into_the_fresh_head_and_written_back():
    g = npusim.load_model(fc_add_classifier())
    assert find_head(g) is g.ops[0]  # the head is the FULLY_CONNECTED the ADD is the bias of
    h = fresh_head(g, 5, np.random.default_rng(0).uniform(0, 1, (8, 16)))
    head = find_head(h)
    assert [op.kind for op in h.ops] == ["FULLY_CONNECTED", "SOFTMAX"] and len(head.inputs) == 3
    h.tensors[head.inputs[1]].data[:] = np.random.default_rng(1).integers(-50, 50, (5, 16))
    h.tensors[head.inputs[2]].data[:] = np.random.default_rng(2).integers(-5000, 5000, 5)
    written = npusim.load_model(write_model(h))
    assert [op.kind for op in written.ops] == ["FULLY_CONNECTED", "SOFTMAX"]
    assert [written.tensors[t].shape for t in written.ops[0].inputs] == [(1, 16), (5, 16), (5,)]
    x = np.random.default_rng(0).integers(-128, 127, (4, 16)).astype(np.int8)
    y = npusim.Interpreter(written).run(x)
    assert y.shape == (4, 5) and np.array_equal(y, npusim.Interpreter(h).run(x))


def test_an_add_that_is_not_the_heads_bias_is_left_alone():
    """An ADD whose FULLY_CONNECTED has a bias already is no bias ADD: no head is found there."""
    g = npusim.load_model(fc_add_classifier())
    fc = g.ops[0]
    g.tensors.append(g.tensors[g.ops[1].inputs[1]])  # any constant as a bias operand
    fc.inputs = [fc.inputs[0], fc.inputs[1], len(g.tensors) - 1]
    assert find_head(g) is None
