"""What `npusim inspect` reports: how to feed the model (its inputs and outputs with dtype and
quantization) and one row per op (shapes, MACs, parameters, whether npusim runs it).

Inputs and outputs of a .tflite are what the file declares, field for field what LiteRT's
get_input_details() / get_output_details() give (scale and zero point null where it gives (0.0, 0)).
An ONNX file declares no quantization on its graph inputs and outputs: they are float32 and NCHW, as
ONNX Runtime takes them, and their quantization is the QuantizeLinear that reads the input (the
DequantizeLinear that writes the output), in the file's codes (a uint8 model's zero point is the
uint8 one). That is what a user needs to quantize data or read the output range (docs/onnx.md).
"""

from __future__ import annotations

import numpy as np

from ..graph import Graph, Quantization, Tensor
from .display import abbreviated, shown


def _numbers(values, kind):
    """Per-tensor: one number; per-channel: the list."""
    out = [kind(v) for v in np.asarray(values).reshape(-1)]
    return out[0] if len(out) == 1 else out


def _quant_fields(quant: Quantization | None) -> dict:
    if quant is None:
        return {"scale": None, "zero_point": None}
    # float(np.float32): the stored float32, as LiteRT returns it
    zero_point = np.asarray(quant.zero_point, np.int64) + quant.offset  # the file's codes
    return {
        "scale": _numbers(np.asarray(quant.scale, np.float32), float),
        "zero_point": _numbers(zero_point, int),
    }


def _edge_quantization(graph: Graph, t: int, is_input: bool) -> Quantization | None:
    """ONNX: the quantization of the QUANTIZE that reads graph input t, or of the DEQUANTIZE that
    writes graph output t (the import's forms of QuantizeLinear and DequantizeLinear)."""
    if is_input:
        for op in graph.ops:
            if op.kind == "QUANTIZE" and op.inputs[0] == t:
                return graph.tensors[op.outputs[0]].quant
        return None
    op = graph.producer().get(t)
    return graph.tensors[op.inputs[0]].quant if op is not None and op.kind == "DEQUANTIZE" else None


def io_details(graph: Graph) -> tuple[list, list]:
    """(inputs, outputs): per graph input and output {name, shape, dtype, scale, zero_point}."""
    onnx = graph.source.format == "onnx"

    def detail(t: int, is_input: bool) -> dict:
        tensor: Tensor = graph.tensors[t]
        quant = tensor.quant
        if onnx and quant is None:
            quant = _edge_quantization(graph, t, is_input)
        return {
            "name": tensor.name,
            "shape": [int(d) for d in tensor.shape],
            "dtype": np.dtype(tensor.dtype).name,
            **_quant_fields(quant),
        }

    return [detail(t, True) for t in graph.inputs], [detail(t, False) for t in graph.outputs]


def io_lines(inputs: list, outputs: list, onnx: bool = False) -> list[str]:
    """The text form of io_details: one line per tensor, before the op table. onnx: the
    quantization is the edge's QuantizeLinear (DequantizeLinear), and the line says so."""
    width = max(len(shown(e["name"])) for e in inputs + outputs)
    lines = []
    for title, entries, node in (
        ("inputs", inputs, "QuantizeLinear"),
        ("outputs", outputs, "DequantizeLinear"),
    ):
        lines.append(f"{title}:")
        for e in entries:
            shape = "x".join(str(d) for d in e["shape"]) or "scalar"
            if e["scale"] is None:
                quant = "no quantization"
            elif isinstance(e["scale"], list):
                quant = f"per-channel quantization ({len(e['scale'])} scales)"
            else:
                quant = f"scale {e['scale']:.9g}, zero point {e['zero_point']}"
            if onnx and e["scale"] is not None:
                quant = f"its {node}: {quant}"
            lines.append(f"  {shown(e['name']):<{width}}  {e['dtype']:<7}  {shape:<14}  {quant}")
    return lines


def batch_lines(batch) -> list[str]:
    """The line that says a model runs image by image, and why (none for one that runs its batch
    whole): after the inputs and outputs, once."""
    if not batch.by_image:
        return []
    return [f"batch: declared {batch.declared}, runs image by image: {batch.why}"]


def op_records(interp) -> list[dict]:
    """One record per op in execution order; ops npusim lacks (interp.unsupported, an Interpreter
    prepared with plan_only=True) have their shapes and parameters but no MACs. A uint8 model's
    edge QUANTIZEs (npusim/runtime/uint8.py shifted) are npusim's, not the file's: left out."""
    from ..runtime.uint8 import EDGE

    g = interp.graph
    kernels = {k.op.index: k for k in interp.kernels}
    records = []
    for op in g.ops:
        if op.options.get(EDGE):
            continue
        k = kernels.get(op.index)
        records.append(
            {
                "index": op.index,
                "op": op.kind,
                "inputs": [
                    list(g.tensors[t].shape) for t in op.inputs if t >= 0 and not g.tensors[t].is_constant
                ],
                "outputs": [list(g.tensors[t].shape) for t in op.outputs],
                "macs": None if k is None else interp.op_macs(k),
                "params": int(
                    sum(g.tensors[t].data.size for t in op.inputs if t >= 0 and g.tensors[t].is_constant)
                ),
                "weights": _weight_type(g, op),
                "supported": k is not None,
            }
        )
    return records


def _weight_type(g: Graph, op) -> str | None:
    """How the file stores the op's weights (its first quantized constant that is not an int32 bias):
    "int8", or "int4" / "uint4" / "uint8" for an ONNX filter stored so (the N6 view counts 4 bits
    packed), "uint8" for a legacy uint8 .tflite's (held shifted, offset 128); None for an op without
    weights."""
    from ..npu.arena import weight_storage

    for t in op.inputs:
        tensor = g.tensors[t] if t >= 0 else None
        if tensor is None or not tensor.is_constant or tensor.quant is None:
            continue
        if np.dtype(tensor.dtype) != np.int32:
            return "uint8" if tensor.quant.offset == 128 else weight_storage(g, t)
    return None


def unsupported(interp) -> list[dict]:
    """What npusim cannot run, {"index", "op"} per op; an ONNX model's nodes it cannot lower also
    name the node and give the one line `npusim run` stops at ({"index", "op", "node", "reason"}, op
    the ONNX type; index the op standing in for the node, null where there is none: formats/onnx/plan.py)."""
    nodes = list(interp.graph.source.unlowered)
    stand_ins = {e["index"] for e in nodes}
    refusals = getattr(interp, "refusals", {})
    ops = [
        {"index": op.index, "op": op.kind, **({"reason": refusals[op.index]} if op.index in refusals else {})}
        for op in interp.unsupported
        if op.index not in stand_ins
    ]
    return ops + [
        {"index": e["index"], "op": e["op"], "node": e["node"], "reason": e["reason"]} for e in nodes
    ]


def unsupported_line(interp, what: str) -> str | None:
    """The summary line naming the ops npusim lacks (the ONNX nodes it cannot lower, each with its
    reason), or None when it runs every op."""
    entries = unsupported(interp)
    if not entries:
        return None
    n = len(entries)
    if any("node" in e for e in entries):
        names = "; ".join(shown(e.get("reason") or f"op {e['index']} ({e['op']})") for e in entries)
        return f"{n} node{'s' if n > 1 else ''} npusim cannot lower, {what}: {names}"
    names = ", ".join(e.get("reason") or f"op {e['index']} ({e['op']})" for e in entries)
    return f"{n} op{'s' if n > 1 else ''} npusim lacks, {what}: {names}"


def _shape_text(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def op_table(records: list) -> list[str]:
    """The generic report's table: one row per op, then the totals of the ops npusim runs."""
    header = ("#", "op", "inputs", "outputs", "MACs", "params", "weights")
    rows = [header]
    for r in records:
        rows.append(
            (
                str(r["index"]),
                r["op"] if r["supported"] else f"{r['op']} (unsupported)",
                abbreviated([_shape_text(s) for s in r["inputs"]], "inputs"),  # a SPLIT's 128 outputs:
                abbreviated([_shape_text(s) for s in r["outputs"]], "outputs"),  # one short cell
                "-" if r["macs"] is None else f"{r['macs']:,}",
                f"{r['params']:,}",
                r["weights"] or "",
            )
        )
    total_macs = sum(r["macs"] or 0 for r in records)
    rows.append(("", "total", "", "", f"{total_macs:,}", f"{sum(r['params'] for r in records):,}", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return [
        "  ".join(
            c.rjust(w) if i in (0, 4, 5) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]
