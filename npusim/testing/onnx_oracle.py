"""ONNX Runtime as a test oracle: one-op float ONNX models, quantized by ORT's own quantize_static,
and ORT runners with its graph optimizations on or off.

    m = conv_model((1, 3, 8, 8), w, bias, strides=(2, 2), pads=(1, 1, 1, 1), group=1)
    q = quantize(m, fmt="QOperator", per_channel=True, activation="int8")   # bytes of a .onnx
    y_opt = run_ort(q, x)                    # default optimizations (QDQ patterns fused)
    y_lit = run_ort(q, x, optimize=False)    # ORT_DISABLE_ALL: the literal QDQ semantics
    ops = optimized_op_types(q)              # which kernels ORT actually runs

Models are NCHW float32, opset 17, one graph input "x" (float32) and one output "y" unless the
builder says otherwise. quantize() runs onnxruntime.quantization.quantize_static on calibration
data drawn from a seeded generator, so a test's model is fixed by its arguments.

onnx and onnxruntime are imported inside the functions: npusim.testing is imported by the tests and
the bench, which must not pay for ORT (or need it) unless they use this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from typing import Sequence

import numpy as np

OPSET = 17
IR_VERSION = 9  # ORT 1.32 reads IR <= 11; 9 is what opset 17 tools write


# ----------------------------------------------------------------------------------------------
# Float model builders (onnx.helper)
# ----------------------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, initializers=(), opset: int = OPSET):
    from onnx import helper

    graph = helper.make_graph(
        list(nodes), "npusim_onnx_oracle", list(inputs), list(outputs), list(initializers)
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    return model


def _value(name: str, shape: Sequence[int] | None):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None if shape is None else list(shape))


def _init(name: str, array):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def conv_model(x_shape, w, bias=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group: int = 1):
    """Conv on x [N, C, H, W] with weights w [O, C / group, kh, kw] (float32), bias [O] or None;
    pads (top, left, bottom, right) as ONNX orders them."""
    from onnx import helper

    w = np.asarray(w, dtype=np.float32)
    inits = [_init("w", w)] + ([] if bias is None else [_init("b", bias)])
    node = helper.make_node(
        "Conv",
        ["x", "w"] + ([] if bias is None else ["b"]),
        ["y"],
        kernel_shape=list(w.shape[2:]),
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        group=group,
    )
    return _model([node], [_value("x", x_shape)], [_value("y", None)], inits)


def matmul_model(x_shape, w):
    """MatMul of x [..., K] with a constant w [K, O]."""
    from onnx import helper

    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    return _model([node], [_value("x", x_shape)], [_value("y", None)], [_init("w", w)])


def gemm_model(x_shape, w, bias=None, trans_b: bool = True, alpha: float = 1.0, beta: float = 1.0):
    """Gemm of x [M, K] with a constant w ([O, K] when trans_b, else [K, O]) and bias [O]."""
    from onnx import helper

    inits = [_init("w", w)] + ([] if bias is None else [_init("b", bias)])
    node = helper.make_node(
        "Gemm",
        ["x", "w"] + ([] if bias is None else ["b"]),
        ["y"],
        transB=int(trans_b),
        alpha=alpha,
        beta=beta,
    )
    return _model([node], [_value("x", x_shape)], [_value("y", None)], inits)


def binary_model(kind: str, a_shape, b_shape=None, b_const=None):
    """Add, Mul, Sub or Div of two inputs "a" and "b" (b_shape), or of "a" and a constant b_const."""
    from onnx import helper

    node = helper.make_node(kind, ["a", "b"], ["y"])
    if b_const is not None:
        return _model([node], [_value("a", a_shape)], [_value("y", None)], [_init("b", b_const)])
    return _model([node], [_value("a", a_shape), _value("b", b_shape)], [_value("y", None)])


def concat_model(shapes, axis: int = 1):
    """Concat of len(shapes) inputs x0, x1, ... along axis."""
    from onnx import helper

    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Concat", names, ["y"], axis=axis)
    return _model([node], [_value(n, s) for n, s in zip(names, shapes)], [_value("y", None)])


def unary_model(kind: str, x_shape, **attrs):
    """A one-input op: Sigmoid, LeakyRelu (alpha=), Softmax (axis=), GlobalAveragePool, Relu, ..."""
    from onnx import helper

    node = helper.make_node(kind, ["x"], ["y"], **attrs)
    return _model([node], [_value("x", x_shape)], [_value("y", None)])


def pool_model(
    kind: str,
    x_shape,
    kernel,
    strides=None,
    pads=(0, 0, 0, 0),
    count_include_pad: int = 0,
    ceil_mode: int = 0,
):
    """AveragePool or MaxPool on x [N, C, H, W]; pads (top, left, bottom, right)."""
    from onnx import helper

    attrs = dict(
        kernel_shape=list(kernel), strides=list(strides or kernel), pads=list(pads), ceil_mode=ceil_mode
    )
    if kind == "AveragePool":
        attrs["count_include_pad"] = count_include_pad
    node = helper.make_node(kind, ["x"], ["y"], **attrs)
    return _model([node], [_value("x", x_shape)], [_value("y", None)])


def resize_model(
    x_shape, scales, mode: str = "nearest", transform: str = "asymmetric", nearest_mode: str = "floor"
):
    """Resize of x [N, C, H, W] by scales (4 floats) with the given mode and coordinate transform."""
    from onnx import helper

    attrs = dict(mode=mode, coordinate_transformation_mode=transform)
    if mode == "nearest":
        attrs["nearest_mode"] = nearest_mode
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    return _model([node], [_value("x", x_shape)], [_value("y", None)], [_init("scales", scales)])


def small_cnn_model(
    seed: int = 0, channels: int = 3, size: int = 16, classes: int = 5, activation: str = "Relu"
):
    """A small float CNN of the layers ORT runs as integer ops once quantize_static has quantized
    it in QOperator format: Conv + Relu, depthwise Conv, Conv (stride 2), Add (residual),
    MaxPool, GlobalAveragePool, Flatten, Gemm. activation "Relu6": each Relu is a Clip to [0, 6]."""
    from onnx import helper

    rng = np.random.default_rng(seed)

    def weights(*shape):
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    c1, c2 = 8, 16
    inits = [
        _init("w1", weights(c1, channels, 3, 3)),
        _init("b1", rng.standard_normal(c1) * 0.1),
        _init("w2", weights(c1, 1, 3, 3)),
        _init("b2", rng.standard_normal(c1) * 0.1),
        _init("w3", weights(c2, c1, 3, 3)),
        _init("b3", rng.standard_normal(c2) * 0.1),
        _init("w4", weights(c2, c2, 1, 1)),
        _init("b4", rng.standard_normal(c2) * 0.1),
        _init("wf", weights(classes, c2)),
        _init("bf", rng.standard_normal(classes) * 0.1),
    ]
    conv = helper.make_node
    if activation not in ("Relu", "Relu6"):
        raise ValueError(f"activation {activation!r}, expected 'Relu' or 'Relu6'")
    if activation == "Relu6":
        inits += [_init("lo", np.float32(0.0)), _init("hi", np.float32(6.0))]

    def act(x, y):
        return conv("Relu", [x], [y]) if activation == "Relu" else conv("Clip", [x, "lo", "hi"], [y])

    nodes = [
        conv("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        act("c1", "r1"),
        conv("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=c1),
        act("c2", "r2"),
        conv("Conv", ["r2", "w3", "b3"], ["c3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
        act("c3", "r3"),
        conv("Conv", ["r3", "w4", "b4"], ["c4"], kernel_shape=[1, 1]),
        conv("Add", ["c4", "r3"], ["s"]),
        conv("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        conv("GlobalAveragePool", ["p"], ["g"]),
        conv("Flatten", ["g"], ["f"]),
        conv("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    return _model(nodes, [_value("x", (1, channels, size, size))], [_value("y", None)], inits)


# ----------------------------------------------------------------------------------------------
# Quantization by ORT (quantize_static)
# ----------------------------------------------------------------------------------------------


def input_shapes(model) -> dict[str, tuple[int, ...]]:
    """The graph inputs (not initializers) and their static shapes."""
    inits = {i.name for i in model.graph.initializer}
    return {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in model.graph.input
        if v.name not in inits
    }


def random_inputs(model, n: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> list[dict]:
    """n feeds of uniform random float32 data (batch 1 each) for the model's graph inputs."""
    rng = np.random.default_rng(seed)
    shapes = input_shapes(model)
    return [
        {name: rng.uniform(low, high, size=shape).astype(np.float32) for name, shape in shapes.items()}
        for _ in range(n)
    ]


def _reader(feeds: list[dict]):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        """The calibration feeds, one per get_next()."""

        def __init__(self):
            self._it = iter(feeds)

        def get_next(self):
            return next(self._it, None)

        def rewind(self):
            self._it = iter(feeds)

    return Reader()


@contextlib.contextmanager
def _quiet():
    """quantize_static logs advice (pre-processing, QDQ on x64) at WARNING on the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


_TYPES = {"int8": "QInt8", "uint8": "QUInt8"}


def quantize(
    model,
    fmt: str = "QOperator",
    per_channel: bool = False,
    activation: str = "int8",
    weight: str = "int8",
    calibration=None,
    samples: int = 16,
    seed: int = 0,
    extra_options: dict | None = None,
    force_input: bool = False,
    reduce_range: bool = False,
) -> bytes:
    """The bytes of `model` quantized by onnxruntime.quantization.quantize_static (MinMax
    calibration) in fmt "QOperator" or "QDQ", activations and weights "int8" or "uint8".
    calibration: a list of feeds (dicts of input name -> float32 array), else `samples` random
    feeds in [-1, 1) from `seed`. reduce_range: 7-bit weights, which keeps ORT's u8s8 GEMM on AVX2
    (VPMADDUBSW, int16 pair sums that saturate) exact."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    if fmt not in ("QOperator", "QDQ"):
        raise ValueError(f"fmt {fmt!r}, expected 'QOperator' or 'QDQ'")
    feeds = calibration if calibration is not None else random_inputs(model, samples, seed)
    # force_input: a lone MaxPool, Resize or (Global)AveragePool on the float graph input stays float
    # unless told otherwise (in a multi-layer model the option would unfuse layers: leave it off).
    options = {"ForceQuantizeNoInputCheck": bool(force_input), **(extra_options or {})}
    with tempfile.TemporaryDirectory() as tmp, _quiet():
        # From a file: quantize_static edits a ModelProto it is given (its initializers move to
        # external data), which would break a second quantization of the same model.
        src, out = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "q.onnx")
        with open(src, "wb") as f:
            f.write(model.SerializeToString())
        quantize_static(
            src,
            out,
            _reader(feeds),
            quant_format=getattr(QuantFormat, fmt),
            per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=getattr(QuantType, _TYPES[activation]),
            weight_type=getattr(QuantType, _TYPES[weight]),
            extra_options=options,
        )
        with open(out, "rb") as f:
            return f.read()


# ----------------------------------------------------------------------------------------------
# Runners
# ----------------------------------------------------------------------------------------------


def session(model_bytes: bytes, optimize: bool = True, threads: int = 1, optimized_path: str | None = None):
    """An ORT CPU session: optimize True is ORT's default (ORT_ENABLE_ALL: QDQ patterns fused into
    integer kernels), False is ORT_DISABLE_ALL (every DequantizeLinear, float op and QuantizeLinear
    run as written: the literal QDQ semantics). One inter-op thread, `threads` intra-op threads (0: ORT's
    default, the physical cores)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    if optimized_path is not None:
        so.optimized_model_filepath = optimized_path
    return ort.InferenceSession(model_bytes, sess_options=so, providers=["CPUExecutionProvider"])


def _feeds(sess, x) -> list[dict]:
    """x: one array (the single input, N samples on axis 0) or a list of arrays, one per input."""
    names = [i.name for i in sess.get_inputs()]
    xs = [x] if isinstance(x, np.ndarray) else list(x)
    if len(xs) != len(names):
        raise ValueError(f"{len(xs)} input arrays for inputs {names}")
    n = xs[0].shape[0]
    return [{name: a[i : i + 1] for name, a in zip(names, xs)} for i in range(n)]


def run_ort_outputs(
    model_bytes: bytes, x, optimize: bool = True, threads: int = 1, sess=None
) -> list[np.ndarray]:
    """All outputs of the model on x, one sample per run (the models have batch 1), stacked on axis 0."""
    sess = sess or session(model_bytes, optimize, threads)
    runs = [sess.run(None, feed) for feed in _feeds(sess, x)]
    return [np.concatenate([r[k] for r in runs], axis=0) for k in range(len(runs[0]))]


def run_ort(model_bytes: bytes, x, optimize: bool = True, threads: int = 1) -> np.ndarray:
    """The first output of the model on x (see run_ort_outputs)."""
    return run_ort_outputs(model_bytes, x, optimize, threads)[0]


def with_value_info(model_bytes: bytes) -> bytes:
    """The model with a value_info (type and shape) for every node output, as ORT computes them on
    one random feed. quantize_static writes none for the outputs of com.microsoft ops (QLinearAdd,
    QLinearAveragePool, ...), which ONNX shape inference cannot type; an importer that needs static
    shapes then stops there (the tests say where they use this)."""
    import onnx
    from onnx import helper

    m = onnx.load_from_string(model_bytes)
    known = {v.name for v in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input)}
    names = [o for n in m.graph.node for o in n.output if o and o not in known]
    probe = onnx.load_from_string(model_bytes)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    sess = session(probe.SerializeToString(), optimize=False)
    feed = random_inputs(m, 1)[0]
    values = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    for n in names:
        v = values[n]
        m.graph.value_info.append(
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        )
    return m.SerializeToString()


def optimized_op_types(model_bytes: bytes) -> list[str]:
    """The op types of the graph ORT runs after its default optimizations (what it fused)."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "opt.onnx")
        session(model_bytes, optimize=True, optimized_path=path)
        return [n.op_type for n in onnx.load(path).graph.node]


def op_types(model_bytes: bytes) -> list[str]:
    """The op types of the model as written."""
    import onnx

    return [n.op_type for n in onnx.load_from_string(model_bytes).graph.node]


def output_quantization(model_bytes: bytes, index: int = 0) -> tuple[float, int]:
    """(scale, zero point) of the DequantizeLinear that produces graph output `index`."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load_from_string(model_bytes)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    name = m.graph.output[index].name
    for node in m.graph.node:
        if node.output[0] == name and node.op_type == "DequantizeLinear":
            zp = int(inits[node.input[2]].ravel()[0]) if len(node.input) > 2 and node.input[2] else 0
            return float(inits[node.input[1]].ravel()[0]), zp
    raise ValueError(f"output {name!r} is not produced by a DequantizeLinear")


def output_steps(y: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """A dequantized output back to its integer codes (exact: y = (q - zp) * scale in float32)."""
    return np.rint(np.asarray(y, dtype=np.float64) / scale).astype(np.int64) + zero_point


def within_one_step(a: np.ndarray, b: np.ndarray) -> float:
    """Share of elements whose integer codes differ by at most one."""
    return float(np.mean(np.abs(np.asarray(a, np.int64) - np.asarray(b, np.int64)) <= 1))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


# ----------------------------------------------------------------------------------------------
# Layer by layer against the literal run
# ----------------------------------------------------------------------------------------------


def literal_layer_codes(model_bytes: bytes, x: np.ndarray) -> dict:
    """{QuantizeLinear output name: its codes as int8 (uint8 shifted by -128)} of ORT's literal run
    (ORT_DISABLE_ALL) on x, one sample per run: every activation QuantizeLinear of the file made a
    graph output."""
    import onnx
    from onnx import helper

    m = onnx.load_from_string(model_bytes)
    inits = {i.name: i for i in m.graph.initializer}
    types = {}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits:
            zp = inits.get(n.input[2]) if len(n.input) > 2 else None
            types[n.output[0]] = zp.data_type if zp is not None else onnx.TensorProto.UINT8
    known = {o.name for o in m.graph.output}
    added = [k for k in types if k not in known]
    m.graph.output.extend(helper.make_tensor_value_info(k, types[k], None) for k in added)
    sess = session(m.SerializeToString(), optimize=False)
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, run_ort_outputs(b"", x, sess=sess)))
    return {
        k: (outs[k].astype(np.int64) - (128 if t == onnx.TensorProto.UINT8 else 0)).astype(np.int8)
        for k, t in types.items()
    }


def graph_layer_codes(graph, layers: dict) -> dict:
    """literal_layer_codes keyed by the Graph tensor the importer made of each (Source.values),
    in the Graph's layout (NHWC where it moved the channels)."""
    out = {}
    for name, codes in layers.items():
        if name in graph.source.values:
            t, perm = graph.source.values[name]
            out[t] = np.ascontiguousarray(codes.transpose(perm))
    return out


def layer_by_layer(interp, x: np.ndarray, ref: dict) -> list[tuple]:
    """Each op of the Interpreter run with ORT's codes (ref: graph_layer_codes) in place of every
    earlier output ORT has: (op index, kind, largest |difference| in codes, share of codes that
    differ) per op whose output ORT has, the error each layer adds on its own."""
    values = {interp.graph.inputs[0]: interp.check_input(x)}
    rows = []
    for k in interp.kernels:
        interp.evaluate(values, kernels=[k])
        o = k.op.outputs[0]
        if o in ref:
            diff = np.abs(values[o].astype(np.int64) - ref[o])
            rows.append((k.op.index, k.kind, int(diff.max(initial=0)), float(np.mean(diff != 0))))
            values[o] = ref[o]
    return rows
