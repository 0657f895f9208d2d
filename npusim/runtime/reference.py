"""The float reference: a graph run on its ops' float forms (ops/float_form.py).

On a float32 .tflite it is that model. On an int8 graph it is the graph's real-valued meaning on
dequantized weights, with no rounding and no int8 range: the reference TFLite's
QuantizationDebugger compares a quantized model with. Every tensor is a float32 array of real
values (index tensors such as SHAPE's output stay integers).

A path or the file's bytes is read through the formats table (formats/model_io.load_model, by the
content): a .tflite, or an int8 .onnx graph as its real-valued meaning. A float .onnx is refused in
one line before any work (the ONNX importer lowers int8 graphs only); `npusim validate --float` runs
such a float twin on onnx.reference instead (formats/onnx/float_reference.py).
"""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..formats.model_io import load_model
from ..graph import Graph
from ..ops import KERNELS
from ..ops.float_form import real_value
from .hybrid import hybrid_call, is_hybrid
from .interpreter import batch_plan, by_image, execution_order, image_chunks
from .walker import Walker


def dequantize(tensor, values: np.ndarray) -> np.ndarray:
    """An int8 run's array of `tensor` as real numbers (float32 arrays pass through)."""
    return real_value(tensor, values)


class FloatInterpreter:
    """A graph prepared on float forms. `run_all(x)` evaluates a batch of real-valued inputs."""

    def __init__(self, graph: Graph | str | bytes, ranges: bool = False, clamps: dict | None = None):
        """ranges: keep each op's output within the range its int8 tensor can hold (an ONNX
        QuantizeLinear that folds a ReLU or Clip writes it only as that range). clamps: {tensor:
        (low, high)}, the activations a float model applies where the int8 graph folded them."""
        self.graph = graph if isinstance(graph, Graph) else load_model(graph)
        # {tensor: (low, high)}: the clamps, and the int8 outputs' ranges when ranges
        self.ranges = {t: (np.float32(lo), np.float32(hi)) for t, (lo, hi) in (clamps or {}).items()}
        if ranges:
            for op in self.graph.ops:
                for t in op.outputs:
                    q = self.graph.tensors[t].quant
                    if self.graph.tensors[t].dtype == np.int8 and q is not None and not q.per_channel:
                        s, z = np.float64(q.scale[0]), int(q.zero_point[0])
                        lo, hi = self.ranges.get(t, (-np.inf, np.inf))
                        lo, hi = max(lo, s * (-128 - z)), min(hi, s * (127 - z))
                        self.ranges[t] = (np.float32(lo), np.float32(hi))
        ops = execution_order(self.graph)
        self.forms = []
        for op in ops:
            if op.kind not in KERNELS:
                raise NpusimError(f"op {op.index} ({op.kind}): operator is not supported")
            try:
                self.forms.append(KERNELS[op.kind].float_form(op, self.graph))
            except NpusimError as e:  # shared helpers (padding) do not know the op
                if str(e).startswith(f"op {op.index} "):
                    raise
                raise NpusimError(f"op {op.index} ({op.kind}): {e}") from None
            except (ValueError, IndexError, KeyError, TypeError) as e:
                # A float model's shapes and options are read as the file states them (the integer
                # Interpreter's Prepare checks an int8 graph before its forms are made).
                raise NpusimError(f"op {op.index} ({op.kind}): malformed for its float form ({e})") from None
        # A float model's MAC ops with int8 weights run as LiteRT's hybrid kernels do (hybrid.py).
        self.hybrid = {p for p, form in enumerate(self.forms) if is_hybrid(form.op, self.graph)}
        # Run image by image as the integer Interpreter does, for the same reason (interpreter.py).
        self.batch = batch_plan(self.graph, self.forms)
        # Each op's constant inputs as real values, once (a MAC op's bias depends on its op).
        tensors = self.graph.tensors
        self.constants = [
            {t: form.constant(k) for k, t in enumerate(form.op.inputs) if t >= 0 and tensors[t].is_constant}
            for form in self.forms
        ]
        self.walker = _FloatWalk(self)

    def check_input(self, x: np.ndarray, k: int = 0) -> np.ndarray:
        t = self.graph.input(k)
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            got = type(x).__name__ if not isinstance(x, np.ndarray) else x.dtype.name
            raise NpusimError(f"input {k} ({t.name!r}): {got}, expected real values (float32)")
        if x.ndim != len(t.shape) or x.ndim == 0 or tuple(x.shape[1:]) != tuple(t.shape[1:]):
            expected = ", ".join(["N", *map(str, t.shape[1:])])
            raise NpusimError(f"input {k} ({t.name!r}): shape {list(x.shape)}, expected [{expected}]")
        if x.shape[0] == 0:
            raise NpusimError(f"input {k} ({t.name!r}): empty batch, expected at least one input")
        if not np.all(np.isfinite(x)):
            raise NpusimError(f"input {k} ({t.name!r}): holds NaN or infinite values")
        return np.ascontiguousarray(x, dtype=np.float32)

    def call(self, position: int, values: dict):
        """The float form at `position` in the plan on the values of its inputs (constants: their
        real values); a tuple, one array per output."""
        return self.walker.step(position, self.forms[position], values)

    def evaluate(self, values: dict) -> dict:
        """Run every op on {tensor index: real array}, adding their outputs."""
        if self.batch.by_image:
            return by_image(self.graph, values, self._walk)
        return self._walk(values)

    def _walk(self, values: dict) -> dict:
        return self.walker.walk(self.forms, values)

    def run_all(self, x: np.ndarray) -> dict:
        """Every tensor's real value for the batch x (real values of the graph input's shape)."""
        if len(self.graph.inputs) != 1:
            raise NpusimError(f"model has {len(self.graph.inputs)} inputs, run_all feeds one")
        return self.evaluate({self.graph.inputs[0]: self.check_input(x)})

    def run(self, x: np.ndarray) -> np.ndarray:
        return self.run_all(x)[self.graph.outputs[0]]

    def local(self, int8_values: dict) -> dict:
        """{op index: the op's float outputs on its int8 inputs dequantized}: each layer on exactly
        what the int8 run fed it, so the difference to its int8 output is that layer's own error."""
        tensors = self.graph.tensors
        real = {t: dequantize(tensors[t], v) for t, v in int8_values.items()}
        if not self.batch.by_image:
            return {form.op.index: self.call(p, real) for p, form in enumerate(self.forms)}
        parts = [
            {f.op.index: self.call(p, chunk) for p, f in enumerate(self.forms)}
            for chunk in image_chunks(self.graph, real)
        ]
        return {i: tuple(np.concatenate(ys) for ys in zip(*(part[i] for part in parts))) for i in parts[0]}


class _FloatWalk(Walker):
    """The float reference's walk: inputs from the activations, then the form's real-valued
    constants; the hybrid MAC ops through hybrid_call; outputs clamped to ranges, then checked."""

    def __init__(self, reference: FloatInterpreter):
        self.graph = reference.graph
        self.constants = reference.constants
        self.hybrid = reference.hybrid
        self.ranges = reference.ranges

    def sources(self, position, values):
        return (values, self.constants[position])

    def missing(self, form, t):
        raise NpusimError(
            f"op {form.op.index} ({form.kind}): no value for tensor {t} "
            f"({self.graph.tensors[t].name!r}); expected every graph input to be given"
        )

    def call(self, position, form, args):
        try:
            with np.errstate(over="ignore", under="ignore"):  # exp of large inputs: inf, as float32's
                if position in self.hybrid:
                    return hybrid_call(form, self.graph, args[0], args[2] if len(args) > 2 else None)
                return form(*args)
        except (ValueError, IndexError) as e:  # shapes that contradict each other in a float model
            raise NpusimError(f"op {form.op.index} ({form.kind}): cannot evaluate ({e})") from None

    def output(self, form, t, y):
        if t in self.ranges:
            y = np.clip(y, *self.ranges[t])
        declared = self.graph.tensors[t].shape
        if np.ndim(y) != len(declared) or tuple(np.shape(y)[1:]) != tuple(declared[1:]):
            shape = ", ".join(["N", *map(str, declared[1:])])
            raise NpusimError(
                f"op {form.op.index} ({form.kind}): computed {list(np.shape(y))}, the model "
                f"declares [{shape}] for {self.graph.tensors[t].name!r}"
            )
        return y
