"""Robustness fuzzing of the ONNX importer: hostile .onnx files never crash, hang or mislead.

The contract of tests/test_fuzz.py, with its machinery (run_case, the time and memory guards): every
case ends in NpusimError with a one-line message or in a correct run. Seeds: small QDQ and QOperator
models quantized by ONNX Runtime, and ST's face-landmarks model where the shared folder has it.
Structured mutations edit the ModelProto (shapes and dims, missing or retyped initializers, dangling
and cyclic edges, op types, attributes, scales and zero points, graph inputs and outputs, and the
kinds ORT refuses: strides, dilations or kernels of 0, duplicate initializers, 8-bit data relabelled
4-bit and 4-bit data cut short, int4 / uint4 flips, opsets and IR versions, node domains, axes out of
range); byte mutations then damage the serialized file (truncation, bit flips, overwritten runs,
splices). Every file npusim runs is run by ONNX Runtime too (optimizations off), which must take it
and agree (`against_ort`). Each case is a pure function of its index, so a failure replays from the
printed index.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_fuzz import Campaign, CaseFailure, checked_case, memory_guard, run_case, valid_input  # noqa: E402

from npusim import Interpreter, load_model  # noqa: E402
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
    out["int8_io"] = integer_io(out["qdq_cnn"])
    face = SHARED / "models" / "onnx" / "face_landmarks_v1_192_int8_pc.onnx"
    if face.exists():
        out["face_landmarks"] = face.read_bytes()
    return out


def integer_io(data: bytes) -> bytes:
    """The QDQ seed with its input's QuantizeLinear and output's DequantizeLinear taken out: int8
    graph input and output (the codes themselves, as ONNX allows)."""
    m = onnx.load_from_string(data)
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == m.graph.input[0].name)
    dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    m.graph.node.remove(q)
    m.graph.input[0].CopyFrom(helper.make_tensor_value_info(q.output[0], TensorProto.INT8, dims))
    dq = next(n for n in m.graph.node if n.output[0] == m.graph.output[0].name)
    dims = [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim]
    m.graph.node.remove(dq)
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info(dq.input[0], TensorProto.INT8, dims))
    return m.SerializeToString()


def _ints(rng, n):
    return [int(rng.choice(HUGE)) for _ in range(n)]


def mutate(m, rng):
    """One structured edit of the ModelProto, in place."""
    g = m.graph
    kind = int(rng.integers(0, 12 + len(VALIDITY)))
    if kind >= 12:
        return VALIDITY[kind - 12](m, rng)
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


def _node_with(m, rng, attrs=None, op_types=None):
    nodes = [
        n
        for n in m.graph.node
        if (op_types is None or n.op_type in op_types)
        and (attrs is None or any(a.name in attrs for a in n.attribute) or op_types is not None)
    ]
    return nodes[int(rng.integers(0, len(nodes)))] if nodes else None


def _set_ints(node, name, values):
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, values))


def zero_window(m, rng):
    """strides, dilations or kernel_shape with a 0 (a ZeroDivisionError once)."""
    node = _node_with(m, rng, op_types=("Conv", "MaxPool", "AveragePool", "QLinearConv"))
    if node is not None:
        name = str(rng.choice(["strides", "dilations", "kernel_shape"]))
        _set_ints(node, name, [0, int(rng.choice([0, 1, 2]))])


def duplicate_initializer(m, rng):
    """An initializer given twice, the copy with other values or the same."""
    if m.graph.initializer:
        t = onnx.TensorProto()
        t.CopyFrom(m.graph.initializer[int(rng.integers(0, len(m.graph.initializer)))])
        if rng.random() < 0.5 and t.raw_data:
            t.raw_data = bytes(reversed(t.raw_data))
        m.graph.initializer.append(t)


def relabel_4bit(m, rng):
    """An 8-bit initializer relabelled int4 or uint4, a 4-bit one's data cut, or a zero point's
    4-bit type flipped against its codes'."""
    eight = [t for t in m.graph.initializer if t.data_type in (2, 3, 21, 22)]
    if not eight:
        return
    t = eight[int(rng.integers(0, len(eight)))]
    choice = int(rng.integers(0, 3))
    if choice == 0:
        t.data_type = int(rng.choice([21, 22]))
    elif choice == 1:
        t.data_type = int(rng.choice([21, 22]))
        arr = numpy_helper.to_array(t) if t.data_type not in (21, 22) else None
        t.ClearField("int32_data")
        t.raw_data = b"\x11" if arr is None else b"\x11" * int(rng.integers(1, 4))
    else:
        t.data_type = {2: 21, 3: 22, 21: 22, 22: 21}[t.data_type]


def opset_or_ir(m, rng):
    choice = int(rng.integers(0, 4))
    if choice == 0 and m.opset_import:
        m.opset_import[0].version = int(rng.choice([1, 7, 28, 99]))
    elif choice == 1:
        m.ClearField("opset_import")
    elif choice == 2:
        m.ir_version = int(rng.choice([0, 2, 99]))
    else:
        for o in m.opset_import:
            if o.domain == "com.microsoft":
                o.version = int(rng.choice([0, 2, 99]))


def node_domain(m, rng):
    node = _node_with(m, rng, op_types=[n.op_type for n in m.graph.node])
    if node is not None:
        domain = str(rng.choice(["custom.ops", "com.microsoft", "ai.onnx.ml", ""]))
        if rng.random() < 0.5:
            m.opset_import.append(helper.make_opsetid(domain, 1))
        node.domain = domain


def axis_out_of_range(m, rng):
    node = _node_with(m, rng, op_types=("Concat", "Flatten", "Softmax", "DequantizeLinear", "QuantizeLinear"))
    if node is not None:
        _set_ints(node, "axis", int(rng.choice([-9, -5, 4, 5, 7, 1 << 31])))


# Mutation kinds of the reader's validity checks (npusim/formats/onnx/validity.py): ORT refuses all of them.
VALIDITY = [zero_window, duplicate_initializer, relabel_4bit, opset_or_ir, node_domain, axis_out_of_range]


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


def against_ort(data: bytes) -> float:
    """A file npusim ran (exit 0) against ONNX Runtime's literal run (ORT_DISABLE_ALL) of the same
    input: ORT must run it too, with the same output shape, and npusim's `--profile onnxruntime` must
    agree with it (the share of output elements within one output step, returned). A file npusim
    runs and ORT refuses, or a different answer, is what a silently misread file looks like."""
    graph = load_model(data)
    t = graph.input(0)
    x = valid_input(t.shape, t.dtype, t.shape[0], np.random.default_rng(1))
    try:
        y_ort = oo.run_ort(data, x, optimize=False)
    except Exception as e:
        raise CaseFailure(f"npusim runs a file ONNX Runtime refuses: {str(e).splitlines()[0][-200:]}") from e
    y = Interpreter(graph, profile="onnxruntime").run(x)
    y = y[0] if isinstance(y, list) else y
    if y.shape != y_ort.shape:
        raise CaseFailure(f"npusim's output is {list(y.shape)}, ORT's {list(y_ort.shape)}")
    try:
        scale, zp = oo.output_quantization(data)
    except Exception:  # an integer output, or a mutated output node: compare the values
        scale, zp = 1.0, 0
    if y.dtype.kind == "f":
        y, y_ort = oo.output_steps(y, scale, zp), oo.output_steps(y_ort, scale, zp)
    return oo.within_one_step(y, y_ort)


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
    compared = 0
    with memory_guard():
        for index in range(total):
            name = names[index % len(names)] if index % 5 else "qdq_cnn"  # face landmarks is slow
            data = build_case(models[name], index)
            try:
                outcome = checked_case(data, traced=index % 8 == 0)
                campaign.record(outcome)
                if outcome == "ok":  # every file npusim runs, ORT runs, with the same answer
                    share = against_ort(data)
                    if share < 0.99:
                        raise CaseFailure(f"only {share:.3f} of the output within one step of ORT's")
                    compared += 1
            except CaseFailure as e:
                raise CaseFailure(f"seed {name}, case {index}: {e}") from e
    print(campaign.summary())
    print(f"{compared} files npusim ran, each run by ORT too with the same answer")
    assert sum(campaign.counts.values()) == total
    assert compared >= total // 20  # the comparison is not vacuous: enough mutants stay valid
