"""Robustness fuzzing of the ONNX importer: hostile .onnx files never crash, hang or mislead.

The contract of tests/test_fuzz.py, with its machinery (run_case, the time and memory guards): every
case ends in NpusimError with a one-line message or in a correct run. Seeds: small QDQ and QOperator
models quantized by ONNX Runtime, and ST's face-landmarks model where the shared folder has it.
Structured mutations edit the ModelProto (shapes and dims, missing or retyped initializers, dangling
and cyclic edges, op types, attributes, scales and zero points, graph inputs and outputs); byte
mutations then damage the serialized file (truncation, bit flips, overwritten runs, splices). Each
case is a pure function of its index, so a failure replays from the printed index.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402
from test_fuzz import Campaign, CaseFailure, checked_case, memory_guard, run_case  # noqa: E402

from npusim.testing import onnx_oracle as oo  # noqa: E402

from shared_paths import SHARED  # noqa: E402

OP_TYPES = [
    "Conv",
    "Relu",
    "Add",
    "Mul",
    "Sigmoid",
    "Concat",
    "Reshape",
    "MaxPool",
    "Gemm",
    "Softmax",
    "Transpose",
    "Split",
    "Slice",
    "Resize",
    "Pad",
    "GlobalAveragePool",
    "Erf",
    "LSTM",
    "Loop",
    "QuantizeLinear",
    "DequantizeLinear",
    "QLinearConv",
    "QLinearAdd",
    "Identity",
]
HUGE = [0, -1, -7, 1, 3, 1 << 20, 1 << 31, 1 << 40]


def seeds() -> dict:
    m = oo.small_cnn_model(seed=5, size=8)
    feeds = oo.random_inputs(m, 4, seed=1)
    out = {
        "qdq_cnn": oo.quantize(m, fmt="QDQ", per_channel=True, calibration=feeds),
        "qop_cnn": oo.quantize(m, fmt="QOperator", per_channel=False, calibration=feeds),
    }
    face = SHARED / "models" / "onnx" / "face_landmarks_v1_192_int8_pc.onnx"
    if face.exists():
        out["face_landmarks"] = face.read_bytes()
    return out


def _ints(rng, n):
    return [int(rng.choice(HUGE)) for _ in range(n)]


def mutate(m, rng):
    """One structured edit of the ModelProto, in place."""
    g = m.graph
    kind = int(rng.integers(0, 12))
    nodes = list(g.node)
    node = nodes[int(rng.integers(0, len(nodes)))] if nodes else None
    if kind == 0 and g.input:  # a declared input shape
        dims = g.input[0].type.tensor_type.shape.dim
        if dims:
            dims[int(rng.integers(0, len(dims)))].dim_value = int(rng.choice(HUGE[3:]))
    elif kind == 1 and g.initializer:  # an initializer's dims, its data left as it was
        t = g.initializer[int(rng.integers(0, len(g.initializer)))]
        del t.dims[:]
        t.dims.extend(_ints(rng, int(rng.integers(0, 5))))
    elif kind == 2 and g.initializer:  # a missing initializer
        del g.initializer[int(rng.integers(0, len(g.initializer)))]
    elif kind == 3 and g.initializer:  # an initializer's element type
        g.initializer[int(rng.integers(0, len(g.initializer)))].data_type = int(
            rng.choice([1, 2, 3, 6, 7, 9, 10, 16, 21, 22, 0, 99])
        )
    elif kind == 4 and node is not None and node.input:  # a dangling edge
        node.input[int(rng.integers(0, len(node.input)))] = "nowhere"
    elif kind == 5 and len(nodes) > 1:  # a cycle: an early node reads a later node's output
        i, j = sorted(rng.choice(len(nodes), 2, replace=False))
        if nodes[i].input and nodes[j].output:
            nodes[i].input[0] = nodes[j].output[0]
    elif kind == 6 and node is not None:
        node.op_type = str(rng.choice(OP_TYPES))
    elif kind == 7 and node is not None and node.attribute:  # an attribute value
        a = node.attribute[int(rng.integers(0, len(node.attribute)))]
        if a.type == onnx.AttributeProto.INTS:
            del a.ints[:]
            a.ints.extend(_ints(rng, int(rng.integers(0, 6))))
        elif a.type == onnx.AttributeProto.INT:
            a.i = int(rng.choice(HUGE))
        elif a.type == onnx.AttributeProto.FLOAT:
            a.f = float(rng.choice([0.0, -1.0, np.inf, np.nan, 1e30]))
    elif kind == 8 and g.initializer:  # a scale or zero point value
        floats = [t for t in g.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) <= 1]
        if floats:
            t = floats[int(rng.integers(0, len(floats)))]
            v = float(rng.choice([0.0, -0.5, np.inf, np.nan, 1e-40, 1e38]))
            t.CopyFrom(
                helper.make_tensor(
                    t.name, TensorProto.FLOAT, list(t.dims), [v] * max(1, int(np.prod(t.dims)))
                )
            )
    elif kind == 9 and g.output:  # graph outputs
        if rng.random() < 0.5:
            del g.output[:]
        else:
            g.output[0].name = str(
                rng.choice([g.input[0].name if g.input else "x", "nowhere", nodes[0].output[0]])
            )
    elif kind == 10 and node is not None:  # a node duplicated: a value written twice
        g.node.append(node)
    elif kind == 11 and node is not None:  # a node removed
        g.node.remove(node)


def damage(data: bytes, rng) -> bytes:
    b = bytearray(data)
    kind = int(rng.integers(0, 4))
    if kind == 0:
        return bytes(b[: int(rng.integers(0, len(b)))])
    if kind == 1:
        for _ in range(int(rng.integers(1, 9))):
            i = int(rng.integers(0, len(b)))
            b[i] ^= 1 << int(rng.integers(0, 8))
    elif kind == 2:
        i = int(rng.integers(0, len(b)))
        b[i : i + 8] = bytes(rng.integers(0, 256, 8, dtype=np.uint8))
    else:
        i, j = sorted(rng.integers(0, len(b), 2))
        b = b[:i] + b[j:] + b[i:j]
    return bytes(b)


def build_case(seed: bytes, index: int) -> bytes:
    rng = np.random.default_rng(index)
    m = onnx.load_from_string(seed)
    for _ in range(int(rng.integers(0, 4))):
        mutate(m, rng)
    data = m.SerializeToString()
    if rng.random() < 0.4:
        data = damage(data, rng)
    return data


def test_fuzz_onnx(request):
    total = max(60, request.config.getoption("--fuzz-examples") // 10)
    models = seeds()
    names = sorted(models, key=lambda k: k == "face_landmarks")  # a small seed first
    for name in names:  # the seeds run as they are (and the kernels compile outside the case timer)
        assert run_case(models[name]) == "ok", name
    campaign = Campaign("onnx")
    with memory_guard():
        for index in range(total):
            name = names[index % len(names)] if index % 5 else "qdq_cnn"  # face landmarks is slow
            data = build_case(models[name], index)
            try:
                campaign.record(checked_case(data, traced=index % 8 == 0))
            except CaseFailure as e:
                raise CaseFailure(f"seed {name}, case {index}: {e}") from e
    print(campaign.summary())
    assert sum(campaign.counts.values()) == total
