"""A fresh classifier head for a new task: replace the model's FULLY_CONNECTED head, or append one.

The head starts at zero (every class equally likely, loss ln C: ZO need not undo a random init), and
its quantization is chosen once, from the frozen features of a calibration batch, as the device's
compiler would fix it before training; from then on the frozen-scale rule holds:
- logits: zero point 0 and a scale that spans [-LOGIT_RANGE, LOGIT_RANGE] (softmax margins up to
  2 * LOGIT_RANGE, more than a confident classifier needs);
- weights: per class, a scale at which a +-1-step perturbation of a whole row moves the logit by
  PROBE_CODES codes for a feature vector of the batch's RMS norm. Coarser, and a step of the
  estimator would jump past the optimum; finer, and the logits could not resolve the perturbation
  (every probe difference zero). The weight range then spans far more than the logits can hold.
- bias: in_scale * w_scale, as TFLite requires.
"""

from __future__ import annotations

import copy

import numpy as np

from npusim.graph import Graph, Op, Quantization, Tensor

from .errors import ZoError

LOGIT_RANGE = 8.0
PROBE_CODES = 1.0
# Ops between the classifier and the graph output that carry the logits unchanged in meaning.
PASS_THROUGH = ("DEQUANTIZE", "SOFTMAX", "RESHAPE", "SQUEEZE")


def passes_through(graph: Graph, op: Op) -> bool:
    """Whether op carries the logits (or their softmax) on unchanged in meaning: PASS_THROUGH, and a
    QUANTIZE int8 -> int8 (an ONNX Softmax -> QuantizeLinear: the import's SOFTMAX, at 1/256, then its
    requantization to the file's scale)."""
    if op.kind == "QUANTIZE":
        return graph.tensors[op.inputs[0]].dtype == np.int8
    return op.kind in PASS_THROUGH


def logits_op(graph: Graph) -> Op | None:
    """The op that computes the graph output, walking back through SOFTMAX, DEQUANTIZE, RESHAPE, a
    requantizing QUANTIZE (passes_through); None when the output is the graph input."""
    producer = graph.producer()
    op = producer.get(graph.outputs[0])
    while op is not None and passes_through(graph, op):
        op = producer.get(op.inputs[0])
    return op


def find_head(graph: Graph) -> Op | None:
    """The FULLY_CONNECTED that produces the logits (logits_op), or the bias-less one whose output
    only an ADD of a constant bias reads (bias_add: ONNX's MatMul + Add); None when the model ends
    otherwise (an embedding, a detector)."""
    op = logits_op(graph)
    if op is not None and op.kind == "ADD":
        op = bias_add(graph, op)
    return op if op is not None and op.kind == "FULLY_CONNECTED" else None


def bias_add(graph: Graph, add: Op) -> Op | None:
    """The FULLY_CONNECTED without a bias whose logits `add` (an ADD of one constant, as wide as
    the classes) is the bias of, read by nothing else: ONNX's MatMul + Add (QLinearMatMul +
    QLinearAdd), one head in two ops; else None."""
    inputs = [t for t in add.inputs if t >= 0]
    consts = [t for t in inputs if graph.tensors[t].is_constant]
    acts = [t for t in inputs if not graph.tensors[t].is_constant]
    if len(inputs) != 2 or len(consts) != 1 or len(acts) != 1:
        return None
    fc = graph.producer().get(acts[0])
    classes = graph.tensors[acts[0]].shape[-1:]
    if (
        fc is None
        or fc.kind != "FULLY_CONNECTED"
        or (len(fc.inputs) > 2 and fc.inputs[2] >= 0)
        or fc.options.get("fused_activation_function", "NONE") != "NONE"
        or int(np.prod(graph.tensors[consts[0]].shape)) != int(np.prod(classes))
        or sum(acts[0] in op.inputs for op in graph.ops) != 1
        or acts[0] in graph.outputs
    ):
        return None
    return fc


def _merge_bias_add(g: Graph, head: Op, b_quant: Quantization, num_classes: int):
    """A bias-less head followed by its bias ADD (bias_add) becomes one FULLY_CONNECTED with a bias
    that writes the ADD's output; the ADD leaves the graph (the ONNX writer writes the pair as one
    QGemm or Gemm)."""
    add = next(op for op in g.ops if head.outputs[0] in op.inputs)
    g.tensors.append(
        Tensor(
            f"{g.tensors[head.inputs[1]].name}/zo_bias",
            (num_classes,),
            np.dtype(np.int32),
            b_quant,
            np.zeros(num_classes, dtype=np.int32),
        )
    )
    head.inputs = [head.inputs[0], head.inputs[1], len(g.tensors) - 1]
    head.outputs = [add.outputs[0]]
    g.ops.remove(add)


def no_head_error(graph: Graph, num_classes: int, append_refused: str | None = None) -> ZoError:
    """Why a new class count cannot be given to a model without a FULLY_CONNECTED head, and what to
    do: name the op the logits come from; a FULLY_CONNECTED then an ADD of a constant (ONNX's MatMul +
    Add, QLinearMatMul + QLinearAdd in a QOperator file) is a classifier whose head zo cannot replace
    (appending a head would read its logits), so say how to get one it can; append_refused: why a
    head appended with --new-head could not be written back (an ONNX graph), else None."""
    op = logits_op(graph)
    classes = graph.output().shape[-1]
    producer = graph.producer()
    if op is not None and op.kind == "ADD":
        inputs = [t for t in op.inputs if t >= 0]
        before = [producer.get(t) for t in inputs if not graph.tensors[t].is_constant]
        constant = any(graph.tensors[t].is_constant for t in inputs)
        if constant and len(before) == 1 and before[0] is not None and before[0].kind == "FULLY_CONNECTED":
            return ZoError(
                f"the model's {classes} logits are op {before[0].index} (FULLY_CONNECTED) then "
                f"op {op.index} ({op.kind}) of a constant bias (ONNX's MatMul + Add; QLinearMatMul + "
                "QLinearAdd), not one FULLY_CONNECTED head (ONNX's Gemm), the only head zo can give "
                f"{num_classes} classes: export the classifier as one Gemm (a Dense layer with its bias) "
                f"and quantize it again, or train on data of its {classes} classes"
            )
    ends = f"op {op.index} ({op.kind})" if op is not None else "its input"
    way = (
        f", and a head appended with --new-head could not be written back into the file ({append_refused})"
        if append_refused
        else ": pass --new-head to append one"
    )
    return ZoError(
        f"the model ends in {ends} with {classes} outputs, not a FULLY_CONNECTED classifier for "
        f"{num_classes} classes{way}"
    )


def feature_tensor(graph: Graph) -> int:
    """The tensor a fresh head reads: the replaced head's input, else the int8 output (before a
    final DEQUANTIZE) to which a head is appended."""
    head = find_head(graph)
    if head is not None:
        return head.inputs[0]
    if len(graph.outputs) != 1:
        raise ZoError(
            f"cannot append a classifier head: the model has {len(graph.outputs)} outputs, expected one"
        )
    t = graph.outputs[0]
    op = graph.producer().get(t)
    if op is not None and op.kind == "DEQUANTIZE":
        t = op.inputs[0]
    if graph.tensors[t].dtype != np.int8:
        raise ZoError(
            f"cannot append a classifier head to output {graph.tensors[t].name!r} of type "
            f"{np.dtype(graph.tensors[t].dtype).name}: expected an int8 feature tensor"
        )
    return t


def head_quantization(features: np.ndarray, num_classes: int) -> tuple[np.ndarray, Quantization]:
    """(per-class weight scales, logits quantization) from real features [N, K] of a calibration batch."""
    rms = float(np.sqrt(np.mean(np.sum(np.square(features, dtype=np.float64), axis=1))))
    if not rms > 0:
        raise ZoError(
            "the frozen features of the calibration batch are all zero: a new head cannot learn "
            "from them (check the input mapping, --input-range or --mean/--std)"
        )
    logit_scale = 2 * LOGIT_RANGE / 255
    w_scale = np.full(num_classes, PROBE_CODES * logit_scale / rms, dtype=np.float32)
    return w_scale, Quantization(
        scale=np.array([logit_scale], dtype=np.float32), zero_point=np.zeros(1, dtype=np.int64)
    )


def fresh_head(graph: Graph, num_classes: int, features: np.ndarray) -> Graph:
    """A copy of graph with a zero num_classes-way head on feature_tensor(graph), quantized from
    features (real values [N, K] of that tensor on a calibration batch)."""
    g = copy.deepcopy(graph)
    head = find_head(g)
    w_scale, logits_quant = head_quantization(features.reshape(len(features), -1), num_classes)
    x_index = feature_tensor(g)
    x = g.tensors[x_index]
    w_quant = Quantization(scale=w_scale, zero_point=np.zeros(num_classes, dtype=np.int64), axis=0)
    b_quant = Quantization(
        scale=(np.float64(x.scale) * w_scale.astype(np.float64)).astype(np.float32),
        zero_point=np.zeros(num_classes, dtype=np.int64),
        axis=0,
    )
    if head is None:
        depth = int(np.prod(x.shape[1:]))
        _append_head(g, x_index, num_classes, depth, w_quant, b_quant, logits_quant)
        return g
    if logits_op(g) is not head:
        _merge_bias_add(g, head, b_quant, num_classes)
    w = g.tensors[head.inputs[1]]
    old = w.shape[0]
    depth = w.shape[1]
    w.shape, w.data, w.quant = (num_classes, depth), np.zeros((num_classes, depth), dtype=np.int8), w_quant
    if len(head.inputs) > 2 and head.inputs[2] >= 0:
        b = g.tensors[head.inputs[2]]
        b.shape, b.data, b.quant = (num_classes,), np.zeros(num_classes, dtype=np.int32), b_quant
    g.tensors[head.outputs[0]].quant = logits_quant
    # A zero head must be able to give every class a negative logit too: no fused activation.
    head.options["fused_activation_function"] = "NONE"
    # Every activation downstream of the head with a class axis of the old size follows; the logits'
    # pure reshapes (as converters write FC -> RESHAPE -> SOFTMAX) carry the new logits quantization,
    # and their shape operand and option name the new class count.
    frontier = {head.outputs[0]}
    for op in g.ops[g.ops.index(head) :]:
        if op is head or any(t in frontier for t in op.inputs):
            for t in op.outputs:
                tensor = g.tensors[t]
                if tensor.shape and tensor.shape[-1] == old:
                    tensor.shape = tensor.shape[:-1] + (num_classes,)
                frontier.add(t)
            if op.kind in ("RESHAPE", "SQUEEZE") and op.inputs[0] in frontier and op.outputs[0] in frontier:
                g.tensors[op.outputs[0]].quant = logits_quant
                _follow_class_count(g, op, old, num_classes)
    return g


def _follow_class_count(g: Graph, op: Op, old: int, num_classes: int):
    """A RESHAPE of the logits: its target shape (operand and option) with the new class count."""
    if op.kind != "RESHAPE":
        return
    if len(op.inputs) > 1 and op.inputs[1] >= 0 and g.tensors[op.inputs[1]].data is not None:
        shape = g.tensors[op.inputs[1]]
        data = np.array(shape.data)
        if data.size and data[-1] == old:
            data[-1] = num_classes
            shape.data = data.astype(shape.data.dtype)
    new_shape = list(op.options.get("new_shape") or [])
    if new_shape and new_shape[-1] == old:
        op.options["new_shape"] = new_shape[:-1] + [num_classes]


def _append_head(g: Graph, x: int, num_classes: int, depth: int, w_quant, b_quant, logits_quant):
    def add(tensor: Tensor) -> int:
        g.tensors.append(tensor)
        return len(g.tensors) - 1

    w = add(
        Tensor(
            "zo_head/weights",
            (num_classes, depth),
            np.dtype(np.int8),
            w_quant,
            np.zeros((num_classes, depth), dtype=np.int8),
        )
    )
    b = add(
        Tensor(
            "zo_head/bias", (num_classes,), np.dtype(np.int32), b_quant, np.zeros(num_classes, dtype=np.int32)
        )
    )
    y = add(Tensor("zo_head/logits", (1, num_classes), np.dtype(np.int8), logits_quant))
    options = {
        "fused_activation_function": "NONE",
        "weights_format": 0,
        "keep_num_dims": False,
        "asymmetric_quantize_inputs": False,
    }
    g.ops.append(Op("FULLY_CONNECTED", [x, w, b], [y], options, index=len(g.ops)))
    g.outputs = [y]
