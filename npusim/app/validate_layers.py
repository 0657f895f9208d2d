"""What `npusim validate` adds per layer beside the SQNR (docs/validate.md): where the propagated
error grows most ("breaks first"), the error in output steps, each int8 output's scale, observed
range and saturation count (what ST's validate and TFLite's QuantizationDebugger show), the
float-vs-int8 agreement without labels, and a note for a dynamic-range "float" reference."""

from __future__ import annotations

import math

import numpy as np

from ..graph import Graph


class QuantStats:
    """Per op: the int8 codes its (first) output took over the batch: min, max, how many sat at the
    type's limits (the minimum only where it is below a real 0), of how many."""

    def __init__(self, int8: Graph):
        self.graph = int8
        self.seen = {op.index: [None, None, 0, 0] for op in int8.ops}

    def add(self, q_values: dict):
        for op in self.graph.ops:
            t = self.graph.tensors[op.outputs[0]]
            q = q_values.get(op.outputs[0])
            if q is None or t.quant is None or np.dtype(t.dtype).kind not in "iu":
                continue
            info = np.iinfo(t.dtype)
            s = self.seen[op.index]
            lo, hi = int(q.min()), int(q.max())
            s[0] = lo if s[0] is None else min(s[0], lo)
            s[1] = hi if s[1] is None else max(s[1], hi)
            # the type's minimum is a real 0 where the zero point sits there (a ReLU's floor, by design)
            floor = int(np.count_nonzero(q == info.min)) if t.zero_point > info.min else 0
            s[2] += floor + int(np.count_nonzero(q == info.max))
            s[3] += int(q.size)

    def record(self, op) -> dict:
        """{"scale", "zero_point", "range" (real, observed), "saturated", "elements"}; None where the
        output is not an integer tensor with one scale."""
        t = self.graph.tensors[op.outputs[0]]
        lo, hi, sat, n = self.seen[op.index]
        if lo is None or t.quant.per_channel:
            return {"scale": None, "zero_point": None, "range": None, "saturated": None, "elements": n}
        scale, zp = float(t.quant.scale[0]), int(t.zero_point)
        return {
            "scale": scale,
            "zero_point": zp,
            "range": [scale * (lo - zp), scale * (hi - zp)],
            "saturated": sat,
            "elements": n,
        }


def in_steps(stats: dict | None, scale: float | None) -> dict | None:
    """A record's rmse and max_abs in output steps (LSB of the layer's int8 output)."""
    if stats is None or not scale:
        return None
    return {"rmse": stats["rmse"] / scale, "max_abs": stats["max_abs"] / scale}


# An int8 tensor that uses its full range carries 6.02 * 8 + 1.76 dB of SQNR: an exact input (inf)
# counts as that much signal going into a layer, so that the first layer's drop is finite.
INT8_SQNR_DB = 6.02 * 8 + 1.76


def _db(v) -> float:
    if v is None:  # a null in JSON: +inf (exact) where it came from an exact layer
        return math.inf
    return float(v)


# Ops that move an int8 tensor's codes without changing them (a layer's padded copy, the import's
# layout transposes): a layer fed by one without a propagated value is fed what that op was fed.
_MOVES = ("PAD", "PADV2", "TRANSPOSE", "RESHAPE", "SQUEEZE", "EXPAND_DIMS")


def _sqnr_into(int8: Graph, t: int, producer: dict, by_op: dict):
    """The propagated SQNR of activation tensor t: its producer's record, followed back through
    the ops of _MOVES that have none (and the QUANTIZE of a graph input, exact: inf); None where
    it is not known (a computing op without a record)."""
    while True:
        src = producer.get(t)
        if src is None:  # a graph input: exact
            return math.inf
        p = by_op[src.index]["propagated"] if src.index in by_op else None
        if p is not None:
            return _db(p["sqnr_db"])
        ins = [i for i in src.inputs if i >= 0 and not int8.tensors[i].is_constant]
        graph_quantize = src.kind == "QUANTIZE" and ins and producer.get(ins[0]) is None
        if len(ins) != 1 or not (src.kind in _MOVES or graph_quantize):
            return None
        t = ins[0]


def breaks_first(int8: Graph, layers: list) -> dict | None:
    """The layer where the propagated SQNR drops most from its inputs' (the worst of its activation
    inputs, an exact input counted as INT8_SQNR_DB): {"op", "kind", "tensor", "sqnr_db_before",
    "sqnr_db", "drop_db"}. Only layers whose output and every activation input have a propagated
    value take part. None when no layer does."""
    producer = int8.producer()
    by_op = {r["op"]: r for r in layers}
    best, best_drop = None, -math.inf
    for r in layers:
        p = r["propagated"]
        if p is None:
            continue
        op = int8.ops[r["op"]]
        before = [
            _sqnr_into(int8, t, producer, by_op)
            for t in op.inputs
            if t >= 0 and not int8.tensors[t].is_constant
        ]
        if None in before:
            continue
        worst_before = min(before) if before else math.inf
        drop = min(worst_before, INT8_SQNR_DB) - min(_db(p["sqnr_db"]), INT8_SQNR_DB)
        if drop > best_drop:
            best, best_drop = (r, worst_before), drop
    if best is None:
        return None
    r, before = best
    return {
        "op": r["op"],
        "kind": r["kind"],
        "tensor": r["tensor"],
        "sqnr_db_before": before,
        "sqnr_db": r["propagated"]["sqnr_db"],
        "drop_db": best_drop,
    }


def agreement(predictions) -> float | None:
    """Top-1 agreement of the int8 model and the reference on output 0, labels or not."""
    a, b = predictions
    if not a:
        return None
    return float(np.mean(np.concatenate(a) == np.concatenate(b)))


def dynamic_range_note(ref: Graph | None) -> str | None:
    """A --float model whose MAC weights are int8 (dynamic-range quantization): its reference
    quantizes those layers' inputs on the fly, as LiteRT's hybrid kernels do (hybrid.py)."""
    if ref is None:
        return None
    for op in ref.ops:
        if (
            op.kind in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL")
            and len(op.inputs) > 1
        ):
            w = ref.tensors[op.inputs[1]] if op.inputs[1] >= 0 else None
            if w is not None and w.is_constant and np.dtype(w.dtype) == np.int8:
                return (
                    "the --float model's weights are int8 (a dynamic-range model): its reference quantizes "
                    "each such layer's input on the fly, as LiteRT's hybrid kernels do"
                )
    return None
