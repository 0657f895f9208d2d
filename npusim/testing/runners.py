"""The runners of the test oracles: TFLM, LiteRT and npusim on the same inputs, and how two outputs
are compared; oracle re-exports them. Each runtime is imported where it runs (TFLM and LiteRT are
test oracles, not dependencies of npusim)."""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np
from ai_edge_litert import schema_py_generated as schema


def _as_inputs(x_batch) -> list[np.ndarray]:
    xs = list(x_batch) if isinstance(x_batch, (list, tuple)) else [x_batch]
    n = xs[0].shape[0]
    if any(x.shape[0] != n for x in xs):
        raise ValueError("all inputs need the same batch size")
    return xs


def tflm_interpreter(model_bytes: bytes, x_batch, arena_size: int | None = None):
    """A TFLM interpreter for the model, its arena sized for inputs like x_batch's (4 MB plus room
    for the model and a few copies of one image's inputs)."""
    from tflite_micro.python.tflite_micro import runtime

    if arena_size is None:
        arena_size = (4 << 20) + 4 * len(model_bytes)
        arena_size += 8 * sum(int(x[:1].nbytes) for x in _as_inputs(x_batch))
    return runtime.Interpreter.from_bytes(bytes(model_bytes), arena_size=arena_size)


def run_tflm(model_bytes: bytes, x_batch, arena_size: int | None = None) -> np.ndarray:
    """TFLM output 0 for a batch (inputs stacked on axis 0; a list for several graph inputs).
    TFLM runs batch 1 per invoke; one interpreter serves the whole batch."""
    xs = _as_inputs(x_batch)
    interp = tflm_interpreter(model_bytes, xs, arena_size)
    outs = []
    for i in range(xs[0].shape[0]):
        for k, x in enumerate(xs):
            interp.set_input(np.ascontiguousarray(x[i : i + 1]), k)
        interp.invoke()
        outs.append(np.array(interp.get_output(0), copy=True))
    return np.concatenate(outs, axis=0)


def run_tflm_outputs(model_bytes: bytes, x_batch, arena_size: int | None = None) -> list[np.ndarray]:
    """Every TFLM graph output for a batch, in the graph's output order."""
    xs = _as_inputs(x_batch)
    interp = tflm_interpreter(model_bytes, xs, arena_size)
    count = len(schema.ModelT.InitFromPackedBuf(bytes(model_bytes), 0).subgraphs[0].outputs)
    outs: list[list[np.ndarray]] = [[] for _ in range(count)]
    for i in range(xs[0].shape[0]):
        for k, x in enumerate(xs):
            interp.set_input(np.ascontiguousarray(x[i : i + 1]), k)
        interp.invoke()
        for k in range(count):
            outs[k].append(np.array(interp.get_output(k), copy=True))
    return [np.concatenate(o, axis=0) for o in outs]


_RESOLVERS = {
    "AUTO": "AUTO",
    "REF": "BUILTIN_REF",
    "BUILTIN_REF": "BUILTIN_REF",
    "BUILTIN": "BUILTIN",
    "BUILTIN_WITHOUT_DEFAULT_DELEGATES": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
    "NODELEGATE": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
}


def run_litert(model_bytes: bytes, x_batch, resolver: str = "AUTO", threads: int = 1) -> np.ndarray:
    """LiteRT output 0, one invoke per batch element. resolver: AUTO (XNNPACK), REF (BUILTIN_REF),
    BUILTIN, NODELEGATE (BUILTIN_WITHOUT_DEFAULT_DELEGATES)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    xs = _as_inputs(x_batch)
    interp = Interpreter(
        model_content=bytes(model_bytes),
        experimental_op_resolver_type=getattr(OpResolverType, _RESOLVERS[resolver.upper()]),
        num_threads=threads,
    )
    interp.allocate_tensors()
    ins = interp.get_input_details()
    out = interp.get_output_details()[0]["index"]
    outs = []
    for i in range(xs[0].shape[0]):
        for k, x in enumerate(xs):
            interp.set_tensor(ins[k]["index"], np.ascontiguousarray(x[i : i + 1]))
        interp.invoke()
        outs.append(np.array(interp.get_tensor(out), copy=True))
    return np.concatenate(outs, axis=0)


class BatchedLiteRT:
    """LiteRT's default interpreter (AUTO resolver = XNNPACK delegate) with the input resized to the
    batch, as a user would run it for speed; a graph with a hard-coded batch (e.g. RESHAPE to
    [1, K]) is fed image by image instead (`batched` False)."""

    def __init__(self, model: bytes, batch: int, threads: int = 1):
        from ai_edge_litert.interpreter import Interpreter

        self.batched = True
        self.it = Interpreter(model_content=model, num_threads=threads)
        inp = self.it.get_input_details()[0]
        self.in_index = inp["index"]
        self.out_index = self.it.get_output_details()[0]["index"]
        self.batch = batch
        if batch != 1:
            try:
                self.it.resize_tensor_input(self.in_index, [batch] + list(inp["shape"][1:]), strict=False)
                self.it.allocate_tensors()
                if self.it.get_output_details()[0]["shape"][0] != batch:
                    raise ValueError("output batch does not follow the input batch")
            except (ValueError, RuntimeError):
                self.batched = False
                self.it = Interpreter(model_content=model, num_threads=threads)
                self.it.allocate_tensors()
        else:
            self.it.allocate_tensors()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.batched:
            self.it.set_tensor(self.in_index, x)
            self.it.invoke()
            return self.it.get_tensor(self.out_index)
        outs = []
        for i in range(x.shape[0]):
            self.it.set_tensor(self.in_index, x[i : i + 1])
            self.it.invoke()
            outs.append(self.it.get_tensor(self.out_index))
        return np.concatenate(outs)


_BACKEND = contextvars.ContextVar("npusim_backend", default="auto")


@contextlib.contextmanager
def on_backend(name: str):
    """run_npusim within the block uses the MAC backend `name` (npusim/kernels/backend.py) unless told
    otherwise. A context rather than an argument so that a test's body, from which Hypothesis
    derives its derandomized examples, stays the same whichever backend it runs on."""
    token = _BACKEND.set(name)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def run_npusim(model_bytes, x_batch, profile: str = "tflm", backend: str | None = None) -> np.ndarray:
    """npusim output 0 for the whole batch at once, on `backend` (default: the one on_backend set,
    else "auto"). A single-input single-output model goes through the public `Interpreter.run`;
    several graph inputs or outputs through `Interpreter.evaluate`."""
    import npusim

    graph = npusim.load_model(model_bytes)
    interp = npusim.Interpreter(graph, profile=profile, backend=backend or _BACKEND.get())
    xs = _as_inputs(x_batch)
    if len(xs) == 1 and len(graph.outputs) == 1:
        return interp.run(xs[0])
    values = {graph.inputs[k]: np.ascontiguousarray(x) for k, x in enumerate(xs)}
    return interp.evaluate(values)[graph.outputs[0]]


def run_npusim_outputs(model_bytes, x_batch, profile: str = "tflm") -> list[np.ndarray]:
    """Every npusim graph output for the whole batch, in the graph's output order."""
    import npusim

    graph = npusim.load_model(model_bytes)
    interp = npusim.Interpreter(graph, profile=profile, backend=_BACKEND.get())
    values = {graph.inputs[k]: np.ascontiguousarray(x) for k, x in enumerate(_as_inputs(x_batch))}
    values = interp.evaluate(values)
    return [values[t] for t in graph.outputs]


def first_difference(a: np.ndarray, b: np.ndarray) -> str:
    """A readable description of where two outputs first differ (for assertion messages)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    diff = np.argwhere(~((a == b) | (np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64)))))
    if len(diff) == 0:
        return "equal"
    idx = tuple(int(i) for i in diff[0])
    d = a.astype(np.float64) - b.astype(np.float64)
    return (
        f"{len(diff)}/{a.size} elements differ; first at {idx}: {a[idx]} vs {b[idx]}; "
        f"max |diff| {np.nanmax(np.abs(d))}"
    )


def assert_same(expected: np.ndarray, actual: np.ndarray, context: str = ""):
    if not (
        expected.shape == actual.shape and expected.dtype == actual.dtype and np.array_equal(expected, actual)
    ):
        raise AssertionError(f"{context}\n  {first_difference(expected, actual)}")


def litert_delegated(model_bytes: bytes) -> bool:
    """Whether LiteRT's default resolver (AUTO) hands the model to XNNPACK (a DELEGATE node appears
    in the execution plan). One-op models only: any delegated node counts."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(
        model_content=bytes(model_bytes), experimental_op_resolver_type=OpResolverType.AUTO, num_threads=1
    )
    interp.allocate_tensors()
    return any(d["op_name"] == "DELEGATE" for d in interp._get_ops_details())
