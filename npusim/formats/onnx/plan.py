"""Import for planning only (`npusim inspect`): a node npusim cannot lower is recorded, with the one
line that `npusim run` would stop at, instead of ending the import.

The node becomes an op of its ONNX type (e.g. "Erf"), which no kernel runs, so the Interpreter's
plan_only lists it in `unsupported` as it lists a .tflite op npusim lacks (docs/inspect.md). Its
outputs get the shapes ONNX shape inference gives them, int8 at the scale of the QuantizeLinear that
reads them (so the nodes after it lower as usual), float32 otherwise. An output whose shape
inference cannot tell, or a scalar, stays unbound: the nodes that read it are recorded in turn, each with its
own line. What a failed lowering had already added to the graph is taken back first (Mark).
"""

from __future__ import annotations

import numpy as np

from ...errors import NpusimError
from .context import Lowering, Value, identity
from .reader import check_shape, node_name


class Mark:
    """The state of a Lowering before one node, to undo a lowering that raised halfway."""

    def __init__(self, ctx: Lowering):
        self.ctx = ctx
        self.ops, self.tensors = len(ctx.ops), len(ctx.tensors)
        self.env = set(ctx.env)
        self.skip = set(ctx.skip)

    def undo(self):
        ctx = self.ctx
        for t in ctx.tensors[self.tensors :]:
            ctx.names.discard(t.name)
        del ctx.ops[self.ops :], ctx.tensors[self.tensors :]
        for k in [k for k in ctx.env if k not in self.env]:
            del ctx.env[k]
        ctx.skip = self.skip
        ctx.transposed = {k: v for k, v in ctx.transposed.items() if v < self.tensors}
        ctx.weights = {k: v for k, v in ctx.weights.items() if k < self.tensors}
        ctx.storage = {k: v for k, v in ctx.storage.items() if k < self.tensors}
        ctx.single_rounding = {k: v for k, v in ctx.single_rounding.items() if k < self.ops}


def _inferred(ctx: Lowering) -> dict:
    """{value name: (shape or None, elem type)} from ONNX shape inference, run once per import."""
    if ctx.inferred is None:
        import onnx

        try:
            model = onnx.shape_inference.infer_shapes(ctx.model)
        except Exception:  # inference of a damaged or contrib-op graph: every shape unknown
            model = ctx.model
        ctx.inferred = {}
        for info in list(model.graph.value_info) + list(model.graph.output):
            tt = info.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            known = tt.HasField("shape") and all(d > 0 for d in dims)
            ctx.inferred[info.name] = (tuple(dims) if known else None, tt.elem_type)
    return ctx.inferred


def unlowered(ctx: Lowering, node, reason: str):
    """Record node as one npusim cannot lower (op type, node name, reason) and stand an op of its
    ONNX type in for it where it reads an activation."""
    entry = {"node": node.name or node_name(node), "op": node.op_type, "reason": reason, "index": None}
    ctx.unlowered.append(entry)
    # read in the declared layout, as the node would (its outputs are declared-layout too)
    inputs = [ctx.logical(ctx.env[i]) for i in node.input if i and isinstance(ctx.env.get(i), Value)]
    if not inputs:  # an op that reads only constants is no op of the graph (check_activations)
        return
    outputs = []
    for name in node.output:
        shape = _inferred(ctx).get(name, (None, 0))[0] if name else None
        if not shape:  # unknown, or a scalar (a stand-in's outputs carry the batch axis)
            continue
        try:
            shape = check_shape(shape, name, ctx.where)
            q = ctx.q_consumer(name)
            quant = ctx.qparams(q, 1, 2)[0] if q is not None else None
        except NpusimError:
            continue
        t = ctx.tensor(name, shape, np.int8 if quant is not None else np.float32, quant)
        ctx.env[name] = Value(t, identity(len(shape)))
        outputs.append(t)
    if not outputs:
        return
    op = ctx.emit(node.op_type, inputs, outputs, onnx_node=entry["node"], unlowered=reason)
    entry["index"] = op.index
