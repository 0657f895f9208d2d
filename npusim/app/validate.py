"""`npusim validate`: how far an int8 model is from float, per output and layer by layer.

The int8 model runs on npusim (bit-exact TFLM); the reference is a float model (--float, run by
npusim's float interpreter, reference.py) or, without one, the int8 graph itself in float on
dequantized weights (TFLite's QuantizationDebugger reference). Per layer, `local` is the op's int8
output against its float form on the same dequantized int8 inputs (the error the layer adds by
itself), `propagated` the int8 output against the reference's matching tensor. Definitions and
degenerate cases: npusim/app/metrics.py and docs/validate.md.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import NpusimError
from ..formats.model_io import load_model
from ..graph import Graph, computes_in_float
from ..profiles import PROFILES
from ..runtime.interpreter import Interpreter, check_int8
from ..runtime.reference import FloatInterpreter, dequantize
from .display import shown
from .metrics import NAMES, ErrorStats, json_ready
from .validate_layers import QuantStats, agreement, breaks_first, dynamic_range_note, in_steps


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
    warnings: list = field(default_factory=list)  # what the reference cannot know (stderr, not JSON)
    worst_pair: tuple | None = None  # (layer record, float form output, int8 dequantized)
    breaks_first: dict | None = None  # the layer whose propagated error grows most (validate_layers)
    agreement: float | None = None  # top-1 agreement on output 0, labels or not
    notes: list = field(default_factory=list)

    @property
    def json(self) -> dict:
        return json_ready(
            {
                "outputs": self.outputs,
                "layers": self.layers,
                "accuracy": self.accuracy,
                "breaks_first": self.breaks_first,
                "agreement": self.agreement,
                "notes": self.notes,
            }
        )


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
    producer = int8.producer()
    for i, j in zip(int8.outputs, ref.outputs):  # a boundary DEQUANTIZE for the float output, when
        op = producer.get(i)  # what it dequantizes is matched to what computes that output
        if op is not None and op.kind == "DEQUANTIZE" and mapping.get(op.inputs[0]) == j:
            mapping[i] = j
    matched = {id(op) for op in pairs.values()}
    unmatched = [(op.index, op.kind) for op in core_ops(ref) if id(op) not in matched]
    return mapping, unmatched


# ----------------------------------------------------------------------------------------------
# The run


# Float32 bytes that one chunk of samples may hold across all its tensors (the int8 run's, its
# dequantized copies, the reference's and the local float outputs): a batch of any size is
# validated in chunks, its metrics accumulated (metrics.ErrorStats) to the result of the whole.
CHUNK_BYTES = 256 << 20
SCATTER_POINTS = 10000  # per layer, kept from the first chunk for the worst layer's scatter plot


def _pooled(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def check_labels(labels: np.ndarray, n: int, graph: Graph) -> np.ndarray:
    out = graph.output(0)
    if labels.ndim != 1 or labels.shape[0] != n or labels.dtype.kind not in "iu":
        raise NpusimError(
            f"--labels: {labels.dtype.name} {list(labels.shape)}, expected {n} integer class labels"
        )
    if len(out.shape) != 2:
        raise NpusimError(
            f"--labels: output 0 ({out.name!r}) has shape {list(out.shape)}, expected [N, classes] scores"
        )
    return labels


def chunk_size(graphs, n: int) -> int:
    """Samples per chunk: CHUNK_BYTES over four float32 copies of every activation of one sample."""
    per_sample = 0
    for graph in graphs:
        for op in graph.ops:
            per_sample += sum(int(np.prod(graph.tensors[t].shape[1:], dtype=np.int64)) for t in op.outputs)
    return max(1, min(n, CHUNK_BYTES // max(1, 16 * per_sample)))


class _Tally:
    """What validate accumulates over the chunks."""

    def __init__(self, int8: Graph, n_outputs: int):
        self.local = {op.index: ErrorStats() for op in int8.ops}
        self.propagated = {op.index: ErrorStats() for op in int8.ops}
        self.outputs = [ErrorStats() for _ in range(n_outputs)]
        self.pairs = [([], []) for _ in range(n_outputs)]
        self.scatter: dict = {}
        self.predictions = ([], [])


def _add_chunk(tally: _Tally, int8: Graph, ref_outputs, q_values, r_values, local, mapping):
    tensors = int8.tensors

    def real(t):
        return dequantize(tensors[t], q_values[t])

    for op in int8.ops:
        got = _pooled(real(t) for t in op.outputs)
        mine = _pooled(local[op.index])
        tally.local[op.index].add(mine, got)
        if op.index not in tally.scatter:
            step = max(1, got.size // SCATTER_POINTS)
            tally.scatter[op.index] = (mine[::step].astype(np.float32), got[::step].astype(np.float32))
        stats = tally.propagated[op.index]
        if stats is not None and all(t in mapping for t in op.outputs):
            refs = [r_values[mapping[t]] for t in op.outputs]
            if all(np.size(r) == np.size(q_values[t]) for r, t in zip(refs, op.outputs)):
                stats.add(_pooled(refs), got)
                continue
        tally.propagated[op.index] = None
    for k, (i, j) in enumerate(zip(int8.outputs, ref_outputs)):
        r, g = r_values[j], real(i)
        tally.outputs[k].add(r, g)
        tally.pairs[k][0].append(np.asarray(r, np.float32).ravel())
        tally.pairs[k][1].append(np.asarray(g, np.float32).ravel())
        if k == 0:
            tally.predictions[0].append(g.reshape(g.shape[0], -1).argmax(axis=1))
            tally.predictions[1].append(np.asarray(r).reshape(g.shape[0], -1).argmax(axis=1))


def validate(
    int8_model,
    x: np.ndarray,
    float_model=None,
    labels: np.ndarray | None = None,
    profile: str = "tflm",
    n6=None,
) -> Validation:
    """Validate int8_model (a path, bytes or Graph) on samples x against float_model or, without
    one, against its own graph in float. profile "neural-art" (n6: its N6Options) also runs tflm,
    and each layer gives tflm's propagated error beside the N6's ("tflm_propagated")."""
    int8 = int8_model if isinstance(int8_model, Graph) else load_model(int8_model)
    onnx = int8.source.format == "onnx"
    if onnx and float_model is not None and not isinstance(float_model, Graph):
        return _validate_onnx_pair(int8, x, float_model, labels, profile, n6)
    if computes_in_float(int8):
        raise NpusimError(
            f"{int8.origin}: a float model: npusim runs int8 models; as INT8_MODEL give its int8 model, "
            "and this one as --float"
        )
    samples = _samples(int8, x, labels)
    ref_graph = None
    if float_model is not None:
        ref_graph = float_model if isinstance(float_model, Graph) else load_model(float_model)
        check_pair(int8, ref_graph)
    # An ONNX QuantizeLinear may fold a ReLU or Clip into its range (ORT's quantize_static does): the
    # graph in float keeps each layer within its quantization range, or it would drop them.
    ranges = onnx and ref_graph is None
    local_forms = FloatInterpreter(int8, ranges=ranges)
    reference = local_forms if ref_graph is None else FloatInterpreter(ref_graph)
    mapping, unmatched = reference_tensors(int8, ref_graph)
    against = _Against(
        reference,
        local_forms,
        (ref_graph or int8).outputs,
        mapping,
        unmatched,
        [RANGES_WARNING] if ranges else [],
        "float model" if ref_graph is not None else "int8 graph in float",
        [note] if (note := dynamic_range_note(ref_graph)) else [],
    )
    return _run(int8, samples, against, profile, n6)


@dataclass
class _Against:
    """What the int8 run is compared with: the reference (run_all of the real-valued samples), each
    layer's local float form, the reference's output tensors in the int8 outputs' order, the int8 ->
    reference tensor mapping, what matched nothing, warnings, and the reference's name in reports."""

    reference: object
    local_forms: FloatInterpreter
    outputs: list
    mapping: dict
    unmatched: list
    warnings: list
    what: str
    notes: list = field(default_factory=list)  # what the report says of the --float model


def _samples(int8: Graph, x: np.ndarray, labels) -> tuple:
    """(int8 inputs, real inputs, checked labels) of the samples x, for a one-input int8 model."""
    check_int8(int8)  # a legacy uint8 model
    if len(int8.inputs) != 1:
        raise NpusimError(f"the int8 model has {len(int8.inputs)} inputs, validate feeds one")
    x_int8, x_real = split_inputs(x, int8)
    if labels is not None:
        labels = check_labels(labels, x.shape[0], int8)
    return x_int8, x_real, labels


RANGES_WARNING = (
    "the reference is the int8 graph in float, each layer kept within its quantization range, where a "
    "QuantizeLinear may fold a ReLU or Clip; whether a range is such an activation or only the "
    "calibration's, the graph cannot tell: give the float model as --float for the truth"
)


def _validate_onnx_pair(int8: Graph, x, float_model, labels, profile, n6=None) -> Validation:
    """An ONNX int8 model against its float ONNX original (formats/onnx/float_reference.py)."""
    from ..formats.model_io import _read
    from ..formats.onnx.float_reference import OnnxFloatReference

    data, where = _read(float_model)
    reference = OnnxFloatReference(data, int8, where)
    samples = _samples(int8, x, labels)
    warnings = []
    if reference.unmatched:
        listed = ", ".join(f"{k} ({kind})" for k, kind in reference.unmatched[:8])
        warnings.append(
            f"{len(reference.unmatched)} float node(s) matched no int8 tensor by value or node name "
            f"(their layers have no propagated error): {listed}"
        )
    against = _Against(
        reference,
        FloatInterpreter(int8, clamps=reference.clamps),
        int8.outputs,
        reference.mapping(),
        reference.unmatched,
        warnings,
        "float model",
    )
    return _run(int8, samples, against, profile, n6)


def _run(int8, samples: tuple, against: _Against, profile, n6=None) -> Validation:
    """One pass over the samples (_samples): the int8 run (and under neural-art the tflm baseline
    beside it), the reference, the per-layer tallies."""
    from ..npu.neural_art_run import profile_object

    x_int8, x_real, labels = samples
    reference, local_forms, ref_outputs, mapping = (
        against.reference,
        against.local_forms,
        against.outputs,
        against.mapping,
    )

    chosen = profile_object(profile, n6)  # a name, or a Profile with options of its own
    interpreter = Interpreter(int8, profile=chosen, warm=False)  # one run
    # the profile whose kernels run the ops this one does not take (neural-art: tflm) runs beside it
    base = PROFILES[interpreter.profile].baseline
    baseline = Interpreter(int8, profile=base, warm=False) if base else None
    tally = _Tally(int8, len(int8.outputs))
    ref_graph = getattr(reference, "graph", None)
    base_tally = _Tally(int8, len(int8.outputs)) if baseline is not None else None
    quant = QuantStats(int8)
    chunk = chunk_size([int8] if ref_graph in (None, int8) else [int8, ref_graph], x_int8.shape[0])
    for start in range(0, x_int8.shape[0], chunk):
        q_values = interpreter.run_all(x_int8[start : start + chunk])
        r_values = reference.run_all(x_real[start : start + chunk])
        local = local_forms.local(q_values)
        _add_chunk(tally, int8, ref_outputs, q_values, r_values, local, mapping)
        quant.add(q_values)
        if baseline is not None:
            b_values = baseline.run_all(x_int8[start : start + chunk])
            _add_chunk(
                base_tally, int8, ref_outputs, b_values, r_values, local_forms.local(b_values), mapping
            )
            del b_values
        del q_values, r_values, local
    layers = []
    for op in int8.ops:
        p = tally.propagated[op.index]
        q = quant.record(op)
        propagated = None if p is None else p.result()
        layers.append(
            {
                "op": op.index,
                "kind": op.kind,
                "tensor": int8.tensors[op.outputs[0]].name,
                "local": tally.local[op.index].result(),
                "propagated": propagated,
                "propagated_steps": in_steps(propagated, q["scale"]),
                **q,
            }
        )
        if base_tally is not None:
            bp = base_tally.propagated[op.index]
            layers[-1]["tflm_propagated"] = None if bp is None else bp.result()
    worst = min(layers, key=_rank_key)
    outputs = [
        {"index": k, "name": int8.tensors[i].name, **stats.result()}
        for k, (i, stats) in enumerate(zip(int8.outputs, tally.outputs))
    ]
    acc = None
    if labels is not None:
        a, b = (np.concatenate(p) for p in tally.predictions)
        acc = {
            "int8": float(np.mean(a == labels)),
            "reference": float(np.mean(b == labels)),
            "agreement": float(np.mean(a == b)),
        }
    classes = len(int8.output(0).shape) == 2
    return Validation(
        outputs,
        layers,
        acc,
        samples=int(x_int8.shape[0]),
        reference=against.what,
        unmatched_float=against.unmatched,
        warnings=against.warnings,
        output_pairs=[(np.concatenate(r), np.concatenate(g)) for r, g in tally.pairs],
        worst_pair=(worst, *tally.scatter[worst["op"]]),
        breaks_first=breaks_first(int8, layers),
        agreement=agreement(tally.predictions) if classes else None,
        notes=against.notes,
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
    rows = [[str(o["index"]), shown(o["name"][:40]), *(_num(o[k]) for k in NAMES)] for o in result.outputs]
    out += _table(head, rows)
    out += ["", f"layers, worst {min(worst, len(result.layers))} of {len(result.layers)} by local SQNR"]
    beside = any("tflm_propagated" in r for r in result.layers)  # --profile neural-art
    head = ["op", "kind", "local sqnr_db", "local max_abs", "propagated sqnr_db", "propagated cos"]
    head += ["tflm propagated sqnr_db"] * beside + ["rmse steps", "saturated", "tensor"]
    rows = []
    for r in worst_layers(result, worst):
        p, t = r["propagated"], r.get("tflm_propagated")
        rows.append(
            [
                str(r["op"]),
                r["kind"],
                _num(r["local"]["sqnr_db"]),
                _num(r["local"]["max_abs"]),
                _num(p["sqnr_db"] if p else None),
                _num(p["cos"] if p else None),
                *([_num(t["sqnr_db"] if t else None)] if beside else []),
                _num(r["propagated_steps"]["rmse"] if r.get("propagated_steps") else None),
                _sat(r),
                shown(r["tensor"][:48]),
            ]
        )
    out += _table(head, rows)
    b = result.breaks_first
    if b is not None:
        out += [
            "",
            f"breaks first: op {b['op']} ({b['kind']}), where the propagated SQNR drops most: "
            f"{_num(b['sqnr_db_before'])} dB into it, {_num(b['sqnr_db'])} dB out, "
            f"-{_num(b['drop_db'])} dB ({shown(b['tensor'][:48])})",
        ]
    if result.agreement is not None:
        out += ["", f"top-1 agreement of int8 and reference on output 0: {result.agreement:.4f}"]
    out += ["", *("note: " + n for n in result.notes)] if result.notes else []
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


def _sat(r: dict) -> str:
    """Saturated int8 outputs of a layer, as a count and a share."""
    if r.get("saturated") is None:
        return "-"
    return f"{r['saturated']} ({100.0 * r['saturated'] / max(r['elements'], 1):.2g} %)"


def _table(head: list, rows: list) -> list:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def csv_report(result: Validation) -> str:
    """One row per layer: op, kind, tensor, then local_<metric> and propagated_<metric> (empty
    when the layer has no reference tensor); infinities as inf and -inf. The tensor name shown as a
    terminal shows it (control characters escaped: one row per line)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["op", "kind", "tensor", *(f"local_{k}" for k in NAMES), *(f"propagated_{k}" for k in NAMES)])
    for r in result.layers:
        p = r["propagated"]
        w.writerow(
            [r["op"], r["kind"], shown(r["tensor"]), *(repr(r["local"][k]) for k in NAMES)]
            + [repr(p[k]) if p else "" for k in NAMES]
        )
    return buf.getvalue()
