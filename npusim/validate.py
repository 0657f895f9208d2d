"""`npusim validate`: how far an int8 model is from float, per output and layer by layer.

The int8 model runs on npusim (bit-exact TFLM); the reference is a float model (--float, run by
npusim's float interpreter, reference.py) or, without one, the int8 graph itself in float on
dequantized weights (TFLite's QuantizationDebugger reference). Per layer, `local` is the op's int8
output against its float form on the same dequantized int8 inputs (the error the layer adds by
itself), `propagated` the int8 output against the reference's matching tensor. Definitions and
degenerate cases: npusim/metrics.py and docs/validate.md.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

import numpy as np

from .errors import NpusimError
from .graph import Graph, computes_in_float
from .interpreter import Interpreter
from .metrics import NAMES, error_metrics, json_ready
from .reference import FloatInterpreter, dequantize
from .tflite_io import load_model

BOUNDARY = ("QUANTIZE", "DEQUANTIZE")


@dataclass
class Validation:
    """The result: `json` holds exactly the contract's keys; the rest feeds the text and the report."""

    outputs: list
    layers: list
    accuracy: dict | None
    samples: int
    reference: str  # "float model" or "int8 graph in float"
    unmatched_float: list = field(default_factory=list)  # (op index, kind) of the float model
    output_pairs: list = field(default_factory=list)  # per output: (reference, int8 dequantized)
    worst_pair: tuple | None = None  # (layer record, float form output, int8 dequantized)

    @property
    def json(self) -> dict:
        return json_ready({"outputs": self.outputs, "layers": self.layers, "accuracy": self.accuracy})


# ----------------------------------------------------------------------------------------------
# Inputs


def round_half_away(v: np.ndarray) -> np.ndarray:
    """TfLiteRound, as reference_ops::AffineQuantize quantizes a model input."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def split_inputs(x: np.ndarray, graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """(the int8 model's input, the reference's real-valued input) for samples x: float32 samples
    are the float model's domain, quantized by the int8 model's input quantization; samples in the
    int8 model's own dtype are dequantized for the reference."""
    t = graph.input(0)
    if not isinstance(x, np.ndarray) or x.ndim == 0:
        raise NpusimError("--input: expected an array of N samples")
    if x.dtype.newbyteorder("=") != x.dtype:
        x = x.astype(x.dtype.newbyteorder("="))
    dtype = np.dtype(t.dtype)
    if x.dtype == np.float32:
        if not np.all(np.isfinite(x)):
            raise NpusimError("--input: holds NaN or infinite values")
        if dtype == np.float32:
            return x, x
        if t.quant is None or dtype.kind not in "iu" or t.quant.per_channel:
            raise NpusimError(
                f"input {t.name!r} is {dtype.name} without one scale: cannot quantize float32 samples"
            )
        info = np.iinfo(dtype)
        q = round_half_away(x.astype(np.float64) / float(t.quant.scale[0])) + t.zero_point
        return np.clip(q, info.min, info.max).astype(dtype), x
    if x.dtype == dtype and dtype.kind in "iu":
        return x, dequantize(t, x)
    raise NpusimError(
        f"--input: dtype {x.dtype.name}, expected float32 (the float model's domain) or "
        f"{dtype.name} (the int8 model's input {t.name!r})"
    )


# ----------------------------------------------------------------------------------------------
# Matching a float model's tensors to the int8 graph's


def core_ops(graph: Graph) -> list:
    """The ops that compute the network: not QUANTIZE reading a graph input, nor DEQUANTIZE writing a
    graph output, nor an op reading only constants (a float16 weight's DEQUANTIZE)."""
    ins, outs = set(graph.inputs), set(graph.outputs)
    core = []
    for op in graph.ops:
        if op.kind == "QUANTIZE" and op.inputs[0] in ins or op.kind == "DEQUANTIZE" and op.outputs[0] in outs:
            continue
        if all(t < 0 or graph.tensors[t].is_constant for t in op.inputs):
            continue
        core.append(op)
    return core


def _signature(graph: Graph, op) -> tuple:
    return (op.kind, tuple(tuple(graph.tensors[t].shape[1:]) for t in op.outputs))


def match_ops(int8: Graph, ref: Graph) -> dict:
    """{int8 op index: reference op} by structure: the longest alignment of the two core op
    sequences in order, where a pair must agree in kind and output shapes, and a pair whose output
    names also agree counts double (so names decide between equal structures). Ops left out of
    the alignment stay unmatched."""
    a, b = core_ops(int8), core_ops(ref)
    sa = [_signature(int8, op) for op in a]
    sb = [_signature(ref, op) for op in b]
    na = [int8.tensors[op.outputs[0]].name for op in a]
    nb = [ref.tensors[op.outputs[0]].name for op in b]
    n, m = len(a), len(b)
    score = np.zeros((n + 1, m + 1), np.int64)
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best = max(score[i + 1, j], score[i, j + 1])
            if sa[i] == sb[j]:
                best = max(best, score[i + 1, j + 1] + (2 if na[i] == nb[j] else 1))
            score[i, j] = best
    pairs, i, j = {}, 0, 0
    while i < n and j < m:
        if sa[i] == sb[j] and score[i, j] == score[i + 1, j + 1] + (2 if na[i] == nb[j] else 1):
            pairs[a[i].index] = b[j]
            i, j = i + 1, j + 1
        elif score[i + 1, j] >= score[i, j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def check_pair(int8: Graph, ref: Graph):
    """A float model that cannot be the int8 model's reference: exit 2 with what differs."""
    if not computes_in_float(ref):
        raise NpusimError("--float: the model computes in integers, expected a float32 model")
    for what, xs, ys in (("inputs", int8.inputs, ref.inputs), ("outputs", int8.outputs, ref.outputs)):
        if len(xs) != len(ys):
            raise NpusimError(f"the model pair does not correspond: {len(xs)} and {len(ys)} {what}")
        for k, (i, j) in enumerate(zip(xs, ys)):
            si, sj = int8.tensors[i].shape[1:], ref.tensors[j].shape[1:]
            if tuple(si) != tuple(sj):
                raise NpusimError(
                    f"the model pair does not correspond: {what[:-1]} {k} is [N, "
                    f"{', '.join(map(str, si))}] in the int8 model, "
                    f"[N, {', '.join(map(str, sj))}] in the float one"
                )
    if ref.input(0).dtype != np.float32:
        raise NpusimError(
            f"--float: input {ref.input(0).name!r} is {np.dtype(ref.input(0).dtype).name}, expected float32"
        )


def reference_tensors(int8: Graph, ref: Graph | None) -> tuple[dict, list]:
    """{int8 tensor index: reference tensor index} for every op output that has a match, and the
    reference's unmatched core ops. Without a float model the reference is the int8 graph itself."""
    if ref is None:
        return {t: t for op in int8.ops for t in op.outputs}, []
    pairs = match_ops(int8, ref)
    mapping = {}
    for index, op in pairs.items():
        mapping.update(zip(int8.ops[index].outputs, op.outputs))
    for i, j in zip(int8.inputs, ref.inputs):  # a boundary QUANTIZE stands for the float input
        for op in int8.ops:
            if op.kind == "QUANTIZE" and op.inputs[0] == i:
                mapping[op.outputs[0]] = j
    for i, j in zip(int8.outputs, ref.outputs):  # and a boundary DEQUANTIZE for the float output
        mapping[i] = j
    matched = {id(op) for op in pairs.values()}
    unmatched = [(op.index, op.kind) for op in core_ops(ref) if id(op) not in matched]
    return mapping, unmatched


# ----------------------------------------------------------------------------------------------
# The run


def _pooled(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def accuracy(labels: np.ndarray, int8_out: np.ndarray, ref_out: np.ndarray) -> dict:
    n = int8_out.shape[0]
    if labels.ndim != 1 or labels.shape[0] != n or labels.dtype.kind not in "iu":
        raise NpusimError(
            f"--labels: {labels.dtype.name} {list(labels.shape)}, expected {n} integer class labels"
        )
    if int8_out.ndim != 2:
        raise NpusimError(
            f"--labels: output 0 has shape {list(int8_out.shape)}, expected [N, classes] scores"
        )
    a, b = int8_out.argmax(axis=1), ref_out.argmax(axis=1)
    return {
        "int8": float(np.mean(a == labels)),
        "reference": float(np.mean(b == labels)),
        "agreement": float(np.mean(a == b)),
    }


def validate(
    int8_model,
    x: np.ndarray,
    float_model=None,
    labels: np.ndarray | None = None,
    profile: str = "tflm",
) -> Validation:
    """Validate int8_model (a path, bytes or Graph) on samples x against float_model or, without
    one, against its own graph in float."""
    int8 = int8_model if isinstance(int8_model, Graph) else load_model(int8_model)
    if computes_in_float(int8):
        raise NpusimError("INT8_MODEL is a float model; give it as --float, with its int8 model first")
    ref_graph = None
    if float_model is not None:
        ref_graph = float_model if isinstance(float_model, Graph) else load_model(float_model)
        check_pair(int8, ref_graph)
    if len(int8.inputs) != 1:
        raise NpusimError(f"the int8 model has {len(int8.inputs)} inputs, validate feeds one")
    x_int8, x_real = split_inputs(x, int8)
    q_values = Interpreter(int8, profile=profile).run_all(x_int8)
    local_forms = FloatInterpreter(int8)
    reference = local_forms if ref_graph is None else FloatInterpreter(ref_graph)
    r_values = reference.run_all(x_real)
    local = local_forms.local(q_values)
    del local_forms  # the local outputs are all it was needed for
    mapping, unmatched = reference_tensors(int8, ref_graph)
    tensors = int8.tensors

    def real(t):
        return dequantize(tensors[t], q_values[t])

    layers, worst = [], None
    for op in int8.ops:
        got = [real(t) for t in op.outputs]
        record = {
            "op": op.index,
            "kind": op.kind,
            "tensor": tensors[op.outputs[0]].name,
            "local": error_metrics(_pooled(local[op.index]), _pooled(got)),
            "propagated": None,
        }
        if all(t in mapping for t in op.outputs):
            refs = [r_values[mapping[t]] for t in op.outputs]
            if all(np.size(r) == np.size(g) for r, g in zip(refs, got)):
                record["propagated"] = error_metrics(_pooled(refs), _pooled(got))
        layers.append(record)
        if worst is None or _rank_key(record) < _rank_key(worst[0]):
            worst = (record, _pooled(local[op.index]), _pooled(got))
    outputs, pairs = [], []
    for k, (i, j) in enumerate(zip(int8.outputs, (ref_graph or int8).outputs)):
        r, g = r_values[j], real(i)
        outputs.append({"index": k, "name": tensors[i].name, **error_metrics(r, g)})
        pairs.append((np.asarray(r, np.float64).ravel(), np.asarray(g, np.float64).ravel()))
    acc = None
    if labels is not None:
        acc = accuracy(labels, real(int8.outputs[0]), r_values[(ref_graph or int8).outputs[0]])
    return Validation(
        outputs,
        layers,
        acc,
        samples=int(x.shape[0]),
        reference="float model" if ref_graph is not None else "int8 graph in float",
        unmatched_float=unmatched,
        output_pairs=pairs,
        worst_pair=worst,
    )


def _rank_key(record: dict) -> float:
    """Worst first: the lowest local SQNR (NaN never occurs: metrics.py defines every case)."""
    return record["local"]["sqnr_db"]


# ----------------------------------------------------------------------------------------------
# Formats


def _num(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}g}"


def worst_layers(result: Validation, count: int = 10) -> list:
    return sorted(result.layers, key=_rank_key)[:count]


def text_report(result: Validation, worst: int = 10) -> str:
    out = [f"{result.samples} samples; reference: {result.reference}", "", "outputs"]
    head = ["index", "name", *NAMES]
    rows = [[str(o["index"]), o["name"][:40], *(_num(o[k]) for k in NAMES)] for o in result.outputs]
    out += _table(head, rows)
    out += ["", f"layers, worst {min(worst, len(result.layers))} of {len(result.layers)} by local SQNR"]
    head = ["op", "kind", "local sqnr_db", "local max_abs", "propagated sqnr_db", "propagated cos", "tensor"]
    rows = []
    for r in worst_layers(result, worst):
        p = r["propagated"]
        rows.append(
            [
                str(r["op"]),
                r["kind"],
                _num(r["local"]["sqnr_db"]),
                _num(r["local"]["max_abs"]),
                _num(p["sqnr_db"] if p else None),
                _num(p["cos"] if p else None),
                r["tensor"][:48],
            ]
        )
    out += _table(head, rows)
    missing = [f"{r['op']} ({r['kind']})" for r in result.layers if r["propagated"] is None]
    if missing:
        out += ["", "int8 ops without a reference tensor (propagated: none): " + ", ".join(missing)]
    if result.unmatched_float:
        listed = ", ".join(f"{i} ({k})" for i, k in result.unmatched_float)
        out += ["", "float model ops matched to no int8 op: " + listed]
    if result.accuracy is not None:
        a = result.accuracy
        out += [
            "",
            f"top-1 accuracy: int8 {a['int8']:.4f}, reference {a['reference']:.4f}, "
            f"agreement {a['agreement']:.4f}",
        ]
    return "\n".join(out) + "\n"


def _table(head: list, rows: list) -> list:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return lines


def csv_report(result: Validation) -> str:
    """One row per layer: op, kind, tensor, then local_<metric> and propagated_<metric> (empty
    when the layer has no reference tensor); infinities as inf and -inf."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["op", "kind", "tensor", *(f"local_{k}" for k in NAMES), *(f"propagated_{k}" for k in NAMES)])
    for r in result.layers:
        p = r["propagated"]
        w.writerow(
            [r["op"], r["kind"], r["tensor"], *(repr(r["local"][k]) for k in NAMES)]
            + [repr(p[k]) if p else "" for k in NAMES]
        )
    return buf.getvalue()
