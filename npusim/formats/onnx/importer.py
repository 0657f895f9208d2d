"""ONNX (QDQ or QOperator) to npusim's Graph: the walk over the nodes.

QuantizeLinear and DequantizeLinear are not ops of the Graph: a DequantizeLinear of an activation
names the same int8 tensor (same real values), a QuantizeLinear after a float op gives that op's
output its scale and zero point, so DQ -> op -> Q becomes one integer op (as TFLite's converter
builds it). They become QUANTIZE / DEQUANTIZE only where the graph really changes representation:
a float graph input, a requantization between two different scales, a float graph output.
"""

from __future__ import annotations

import numpy as np

from ...errors import NpusimError
from ...graph import Quantization, Source
from .. import limits
from . import plan
from .context import ELEM_TYPES, Const, Lowering, Value, identity, same_quant, to_graph
from .reader import check_shape, execution_order, node_name, parse
from .table import LOWERINGS
from .validity import check_model


def load_onnx(data: bytes, where: str, plan_only: bool = False):
    """plan_only (what `npusim inspect` asks for): a node npusim cannot lower becomes an op of its
    ONNX type, which no kernel runs (plan.py), instead of ending the import; a malformed file still
    raises."""
    model = parse(data, where)
    try:
        order = execution_order(model, where)  # first: its messages name the node at fault
        check_model(model, data, where, order)
        return _lower(model, order, where, plan_only)
    except NpusimError:
        raise
    except RecursionError:
        raise NpusimError(f"{where}: ONNX graph nests too deeply") from None
    except (ValueError, TypeError, IndexError, KeyError, ArithmeticError, AttributeError) as e:
        detail = str(e).splitlines()[0][:160] if str(e) else ""
        raise NpusimError(f"{where}: malformed ONNX model ({type(e).__name__}: {detail})") from None


def _lower(model, order: list, where: str, plan_only: bool = False):
    integer = ("QuantizeLinear", "DynamicQuantizeLinear", "QLinear", "ConvInteger", "MatMulInteger")
    # Any graph input that is not float32 (int8, uint8, and the types _graph_inputs refuses by name,
    # such as int4) makes it no float model.
    other_input = any(i.type.tensor_type.elem_type != 1 for i in model.graph.input)
    if not other_input and not any(n.op_type.startswith(integer) for n in order):
        # no node makes an integer tensor: the same one line as a float .tflite, not a per-node complaint
        raise NpusimError(
            f"{where}: a float model: npusim runs int8 models; quantize it to int8 (QDQ or QOperator, e.g. "
            "onnxruntime.quantization.quantize_static)"
        )
    ctx = Lowering(model, where)
    ctx.load_initializers()
    inputs = _graph_inputs(ctx)
    for node in order:
        ctx.node = node
        if id(node) in ctx.skip:
            continue
        if not plan_only:
            _lower_node(ctx, node)
            continue
        mark = plan.Mark(ctx)
        try:
            _lower_node(ctx, node)
        except NpusimError as e:
            mark.undo()
            plan.unlowered(ctx, node, str(e))
    ctx.node = None
    outputs = _graph_outputs(ctx, plan_only)
    values = {k: (v.tensor, v.perm) for k, v in ctx.env.items() if isinstance(v, Value)}
    source = Source(
        format="onnx",
        model=model,
        weights=ctx.weights,
        values=values,
        storage=ctx.storage,
        rebuilt=_rebuilt_weights(ctx),
        unlowered=ctx.unlowered,
        origin=ctx.origin,
        single_rounding=ctx.single_rounding,
        normalized={n.input[0] for n in model.graph.node if n.op_type == "BatchNormalization" and n.input},
        op_count=len(ctx.ops),
        tensor_count=len(ctx.tensors),
    )
    return to_graph(ctx, inputs, outputs, source)


def _lower_node(ctx: Lowering, node):
    if node.domain not in ("", "ai.onnx", "com.microsoft"):
        raise ctx.error(f"operator domain {node.domain!r} is not supported")
    if node.domain == "com.microsoft" and node.op_type not in CONTRIB_OPS:
        # ORT's com.microsoft ops are not the ONNX ops of the same name: never lowered as those
        raise ctx.error("operator of domain 'com.microsoft' is not supported (docs/onnx.md lists the ops)")
    if node.op_type == "Constant":
        _constant(ctx, node)
    elif node.op_type == "DequantizeLinear":
        _dequantize(ctx, node)
    elif node.op_type == "QuantizeLinear":
        _quantize(ctx, node)
    elif node.op_type in LOWERINGS:
        if all(isinstance(ctx.env.get(i), Const) for i in node.input if i) and node.op_type in FOLDABLE:
            _fold(ctx, node)
        else:
            LOWERINGS[node.op_type].lower(ctx, node)
    else:
        raise ctx.error("operator is not supported (docs/onnx.md lists the ops npusim lowers)")


# The com.microsoft ops npusim lowers (ORT's quantized QOperator kernels and its Q/DQ).
CONTRIB_OPS = {
    "QLinearAdd",
    "QLinearMul",
    "QLinearConcat",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearSoftmax",
    "QGemm",
    "QuantizeLinear",
    "DequantizeLinear",
}

MAC_KINDS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def _rebuilt_weights(ctx: Lowering) -> dict:
    """{tensor: its data at import} for the weights and biases of MAC ops that are not the file's codes
    (a folded BatchNormalization, a filter scale widened for its bias, a split group, Gemm's alpha):
    writer.py cannot put them back, and refuses if training changed them."""
    out = {}
    for op in ctx.ops:
        if op.kind in MAC_KINDS:
            for t in op.inputs[1:3]:
                if t >= 0 and t not in ctx.weights and ctx.tensors[t].data is not None:
                    out[t] = ctx.tensors[t].data.copy()
    return out


# Why 4-bit graph inputs and outputs are refused, not run: numpy has no 4-bit type to hold them, and
# ONNX Runtime's Python API refuses one from numpy too (1.32: "Unexpected input data type. Actual:
# (tensor(int8)), expected: (tensor(Int4x2))"; an ml_dtypes int4 array: "can't be converted").
def _four_bit_hint(elem: int) -> str:
    """The refusal's reason for an int4 / uint4 graph input or output; empty for any other type."""
    if ELEM_TYPES.get(elem) not in ("int4", "uint4"):
        return ""
    return " (4-bit graph inputs and outputs: no numpy type holds them; keep 4 bits for weights)"


def _graph_inputs(ctx: Lowering) -> list:
    inputs = []
    initializers = {t.name for t in ctx.model.graph.initializer}
    for info in ctx.model.graph.input:
        if info.name in initializers:  # old exporters list initializers as inputs too
            continue
        elem = info.type.tensor_type.elem_type
        if elem not in (1, 2, 3):
            raise NpusimError(
                f"{ctx.where}: graph input {info.name!r} is {ELEM_TYPES.get(elem, elem)}, expected float32 "
                "(quantized by the graph's first QuantizeLinear), int8 or uint8" + _four_bit_hint(elem)
            )
        dims = tuple(
            int(d.dim_value) if d.HasField("dim_value") else -1 for d in info.type.tensor_type.shape.dim
        )
        shape = check_shape(dims, info.name, ctx.where)
        if elem == 1:
            t = ctx.tensor(info.name, shape, np.float32)
            ctx.env[info.name] = Value(t, identity(len(shape)))
        else:
            t = _integer_input(ctx, info.name, shape, elem)
        inputs.append(t)
    if not inputs:
        raise NpusimError(f"{ctx.where}: the graph has no inputs")
    return inputs


# QOperator ops: the (scale, zero point) inputs that describe input k of the node.
_QLINEAR_PARAMS = {0: (1, 2), 3: (4, 5)}


def _integer_input(ctx: Lowering, name: str, shape: tuple, elem: int) -> int:
    """An int8 or uint8 graph input: its parameters are those its readers (a DequantizeLinear, a
    QOperator op) give it, all the same. A ConvInteger or MatMulInteger reading it gives only a zero
    point, and its sums no scale: read by those alone, it is at scale 1 (lower_integer.py checks their
    zero points against it). A uint8 input is shifted to int8 by a QUANTIZE, as
    TFLite's converter writes a uint8 input (the same real values)."""
    found, integer = [], []
    for c in ctx.consumers.get(name, []):
        ks = [k for k, i in enumerate(c.input) if i == name]
        if c.op_type in ("ConvInteger", "MatMulInteger") and ks == [0]:
            integer.append(_integer_reader_params(ctx, c, elem))
        elif c.op_type == "DequantizeLinear" and ks == [0]:
            found.append(ctx.qparams(c, 1, 2, boundary=True))
        elif c.op_type.startswith("QLinear") or c.op_type == "QGemm":
            if len(ks) != 1 or ks[0] not in _QLINEAR_PARAMS or c.op_type == "QLinearConcat":
                raise NpusimError(
                    f"{ctx.where}: graph input {name!r} is read by {node_name(c)} as an operand "
                    "npusim cannot take its parameters from"
                )
            found.append(ctx.qparams(c, *_QLINEAR_PARAMS[ks[0]]))
        else:
            raise NpusimError(
                f"{ctx.where}: integer graph input {name!r} is read by {node_name(c)}, expected a "
                "DequantizeLinear, a QLinear op (which give its scale and zero point), a ConvInteger or a "
                "MatMulInteger"
            )
    found = found or integer[:1]
    if not found:
        raise NpusimError(
            f"{ctx.where}: integer graph input {name!r} is read by nothing that gives its scale"
        )
    if any(not same_quant(q, found[0][0]) for q, _ in found):
        raise NpusimError(
            f"{ctx.where}: integer graph input {name!r} is read at {len(found)} different scales or zero "
            "points, expected one"
        )
    quant, storage = found[0]
    quant = _axis_in_rank(ctx, quant, shape)
    expected = "int8" if elem == 3 else "uint8"
    if storage != expected:
        raise NpusimError(
            f"{ctx.where}: graph input {name!r} is {expected}, its readers' zero point {storage}"
        )
    perm = identity(len(shape))
    if elem == 3:
        t = ctx.tensor(name, shape, np.int8, quant)
        ctx.env[name] = Value(t, perm)
        return t
    stored = Quantization(quant.scale, quant.zero_point + 128, quant.axis)
    t = ctx.tensor(name, shape, np.uint8, stored)
    out = ctx.tensor(name + "_int8", shape, np.int8, quant)
    ctx.emit("QUANTIZE", [t], [out])
    ctx.env[name] = Value(out, perm)
    return t


def _integer_reader_params(ctx: Lowering, node, elem: int):
    """(Quantization at scale 1, storage) of a graph input read as input 0 of a ConvInteger or
    MatMulInteger: its zero point is that op's a zero point (0 if none), in int8."""
    zp_c = ctx.const(node, 2, required=False)
    storage = ("int8" if elem == 3 else "uint8") if zp_c is None else zp_c.value.dtype.name
    zp = 0 if zp_c is None else zp_c.value.astype(np.int64).ravel()
    if np.size(zp) != 1:
        raise NpusimError(
            f"{ctx.where}: {node_name(node)}: input zero point {np.ravel(zp).tolist()}, expected one"
        )
    shift = 128 if storage == "uint8" else 0
    quant = Quantization(
        np.ones(1, np.float32), np.asarray([int(np.ravel(zp)[0]) - shift], np.int64), offset=shift
    )
    return quant, storage


def _graph_outputs(ctx: Lowering, plan_only: bool = False) -> list:
    if not ctx.model.graph.output:
        raise NpusimError(f"{ctx.where}: the graph declares no outputs")
    outputs = []
    for info in ctx.model.graph.output:
        v = ctx.env.get(info.name)
        if plan_only and info.name not in ctx.env and ctx.unlowered:
            continue  # downstream of a node npusim cannot lower: listed there
        if not isinstance(v, Value):
            raise NpusimError(f"{ctx.where}: graph output {info.name!r} is a constant or was not computed")
        t = ctx.logical(v)  # outputs keep the declared layout
        elem = info.type.tensor_type.elem_type
        src = ctx.tensors[t]
        if elem == 1 and src.dtype == np.int8:  # dequantized where the graph dequantizes it
            out = ctx.tensor(info.name, src.shape, np.float32)
            ctx.emit("DEQUANTIZE", [t], [out])
            t = out
        elif elem == 1 and src.dtype == np.float32:
            if plan_only and any(t in op.outputs for op in ctx.ops):
                outputs.append(t)  # a stand-in's float output (plan.py)
                continue
            raise NpusimError(f"{ctx.where}: graph output {info.name!r} is the float input itself")
        elif elem == 2 and src.dtype == np.int8:  # uint8: the same codes shifted back, as TFLite writes it
            q = src.quant
            out = ctx.tensor(
                info.name, src.shape, np.uint8, Quantization(q.scale, q.zero_point + 128, q.axis)
            )
            ctx.emit("QUANTIZE", [t], [out])
            t = out
        elif (
            elem == 6 and src.dtype != np.int32 or elem not in (1, 3, 6) or src.dtype != np.int8 and elem == 3
        ):
            raise NpusimError(
                f"{ctx.where}: graph output {info.name!r} is {ELEM_TYPES.get(elem, elem)}, expected float32 "
                "(after a DequantizeLinear), int8, uint8, or int32 (a ConvInteger or MatMulInteger's own)"
                + _four_bit_hint(elem)
            )
        if t in outputs:
            raise NpusimError(f"{ctx.where}: graph output {info.name!r} repeats another output")
        outputs.append(t)
    return outputs


def _constant(ctx: Lowering, node):
    from .reader import tensor_array

    value = ctx.attr(node, "value")
    if value is None:
        for key in ("value_float", "value_floats", "value_int", "value_ints"):
            v = ctx.attr(node, key)
            if v is not None:
                ctx.env[node.output[0]] = Const(
                    node.output[0], np.asarray(v, np.float32 if "float" in key else np.int64)
                )
                return
        raise ctx.error("Constant without a tensor value is not supported")
    ctx.env[node.output[0]] = Const(node.output[0], tensor_array(value, ctx.where))


def _dequantize(ctx: Lowering, node):
    x = ctx.get(node.input[0])
    quant, storage = ctx.qparams(node, 1, 2, activation=False)
    if isinstance(x, Const):  # a quantized weight, bias or constant operand
        codes = x.value
        if codes.dtype.kind not in "iu":
            raise ctx.error(f"input {node.input[0]!r} is {codes.dtype.name}, expected integer codes")
        storage = ctx.initializer_storage(x.name) or storage
        zp_c = ctx.const(node, 2, required=False)  # the raw zero point, in the codes' own type
        zp = zp_c.value.astype(np.int64).ravel() if zp_c is not None else np.zeros(1, np.int64)
        zp = np.repeat(zp, quant.scale.size) if zp.size == 1 else zp
        axis = int(ctx.attr(node, "axis", 1))
        if quant.scale.size > 1 and not -codes.ndim <= axis < codes.ndim:
            raise ctx.error(f"axis {axis} is outside the {codes.ndim} axes of {node.input[0]!r}")
        axis %= max(codes.ndim, 1)
        shape = [1] * codes.ndim
        if quant.scale.size > 1:
            if codes.ndim == 0 or codes.shape[axis] != quant.scale.size:
                raise ctx.error(f"{quant.scale.size} scales for axis {axis} of {list(codes.shape)}")
            shape[axis] = quant.scale.size
        scale = quant.scale.reshape(shape) if codes.ndim else quant.scale.reshape(())
        real = (codes.astype(np.int64) - zp.reshape(shape if codes.ndim else ())) * scale.astype(np.float64)
        if real.size and np.max(np.abs(real)) >= np.finfo(np.float32).max:
            raise ctx.error(
                f"dequantized {node.input[0]!r} exceeds the float32 range (scale {quant.scale.max():g})"
            )
        ctx.env[node.output[0]] = Const(
            node.output[0],
            real.astype(np.float32),
            codes=codes,
            scale=quant.scale,
            zero_point=zp,
            axis=axis,
            storage=storage,
            source=x.name,
        )
        return
    t = ctx.tensors[x.tensor]
    if t.dtype != np.int8:
        raise ctx.error(f"input {node.input[0]!r} is {t.dtype.name}, expected a quantized tensor")
    if storage not in ("int8", "uint8") or not same_quant(t.quant, quant):
        raise ctx.error(
            f"scale/zero point ({float(quant.scale[0]):g}, {int(quant.zero_point[0])}) differ from those of "
            f"{node.input[0]!r} ({t.scale:g}, {t.zero_point}), which a DequantizeLinear cannot change"
        )
    ctx.env[node.output[0]] = x


def _axis_in_rank(ctx: Lowering, quant: Quantization, shape: tuple) -> Quantization:
    """A per-axis activation's axis, checked against its shape and made non-negative."""
    if not quant.per_channel:
        return quant
    rank = len(shape)
    if not -rank <= quant.axis < rank or shape[quant.axis] != quant.scale.size:
        raise ctx.error(f"{quant.scale.size} scales for axis {quant.axis} of a tensor of shape {list(shape)}")
    return Quantization(quant.scale, quant.zero_point, quant.axis % rank, quant.offset)


def _quantize(ctx: Lowering, node):
    x = ctx.get(node.input[0])
    at_input = isinstance(x, Value) and ctx.tensors[x.tensor].dtype == np.float32
    quant, storage = ctx.qparams(node, 1, 2, boundary=at_input)
    if isinstance(x, Const):  # a float constant quantized in the graph: fold it
        v = x.value.astype(np.float32)
        codes = np.clip(np.rint(v / quant.scale[0]) + quant.zero_point[0], -128, 127)
        real = (codes - quant.zero_point[0]) * np.float64(quant.scale[0])
        zp = quant.zero_point + (128 if storage == "uint8" else 0)
        ctx.env[node.output[0]] = Const(
            node.output[0],
            real.astype(np.float32),
            codes=(codes + (128 if storage == "uint8" else 0)).astype(np.int64),
            scale=quant.scale,
            zero_point=zp,
            storage=storage,
        )
        return
    t = ctx.tensors[x.tensor]
    if t.dtype == np.float32:  # a float graph input: QUANTIZE
        quant = _axis_in_rank(ctx, quant, t.shape)
        out = ctx.tensor(node.output[0], t.shape, np.int8, quant)
        ctx.emit("QUANTIZE", [x.tensor], [out])
        ctx.env[node.output[0]] = Value(out, x.perm)
        return
    ctx.env[node.output[0]] = Value(ctx.requantize(x.tensor, quant, node.output[0]), x.perm)


# Shape arithmetic some exporters leave in the graph on constants: computed at import.
FOLDABLE = {
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Concat",
    "Transpose",
    "Mul",
    "Add",
    "Sub",
    "Div",
    "Neg",
    "Flatten",
    "Slice",
}


def _fold(ctx: Lowering, node):
    vals = [ctx.env[i].value if i else None for i in node.input]
    a = vals[0]
    op = node.op_type
    if op in ("Mul", "Add", "Sub", "Div"):
        size = int(np.prod(np.broadcast_shapes(a.shape, vals[1].shape), dtype=np.float64))
        if size * 8 > limits.MAX_TENSOR_BYTES:
            raise ctx.error(f"constant arithmetic would make {size} values, more than the limit")
        with np.errstate(all="ignore"):
            r = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Div": np.divide}[op](a, vals[1])
        if op == "Div" and a.dtype.kind in "iu":
            r = np.trunc(r).astype(a.dtype)
    elif op == "Neg":
        r = -a
    elif op == "Concat":
        r = np.concatenate([v for v in vals if v is not None], axis=int(ctx.attr(node, "axis", 0)))
    elif op == "Transpose":
        r = np.transpose(a, ctx.attr(node, "perm", None))
    elif op in ("Reshape", "Unsqueeze", "Squeeze", "Flatten"):
        from .lower_movement import reshaped

        r = a.reshape(reshaped(ctx, node, a.shape))
    else:  # Slice
        from .lower_movement import slice_spec

        r = a[tuple(slice(b, e, s) for b, e, s in slice_spec(ctx, node, a.shape))]
    ctx.env[node.output[0]] = Const(node.output[0], np.asarray(r))


__all__ = ["load_onnx", "node_name", "Quantization"]
