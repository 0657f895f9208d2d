"""What every op module provides: prepare once in __init__, evaluate many times in __call__."""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..graph import Graph, Op, Tensor


def broadcast_crossing(operands, y, core: int = 0) -> str | None:
    """Why an op whose operands broadcast to y (numpy rules over all axes but the last `core`, a
    matrix's two for BATCH_MATMUL) does not keep axis 0 the batch, or None: a constant of y's rank
    that spans axis 0 ([2, 3] against an activation [1, 3]), an activation of another rank, or one
    broadcast along axis 0. TFLM computes these on the declared shapes; npusim runs them there
    too, image by image (Kernel.crosses_batch)."""
    for t in operands:
        if t.data is not None and len(t.shape) == len(y.shape) > core and t.shape[0] != 1:
            return f"takes constant {t.name!r} of shape {list(t.shape)} along axis 0"
    for t in operands:
        if t.data is None and (len(t.shape) != len(y.shape) or len(t.shape) <= core):
            return f"broadcasts activation {t.name!r} of shape {list(t.shape)} to {list(y.shape)}"
        if t.data is None and t.shape[0] != y.shape[0]:
            return f"broadcasts activation {t.name!r} of shape {list(t.shape)} along axis 0"
    return None


class Kernel:
    """Prepare (TFLM's Prepare, fills the op data) in __init__; Eval in __call__.

    __call__ receives the op's input arrays in op.inputs order (None for an omitted optional input);
    activations carry a leading batch axis N, constants come as stored in the model.
    It returns one array per op output: a single array when the op has one output, else a tuple in
    op.outputs order.
    """

    kind = ""
    # The first `required_inputs` inputs must be present (not -1); at most `max_inputs` (None: any
    # number). `num_outputs` outputs (None: one or more; __call__ then returns a tuple, one array
    # per output, as it does for any fixed number above 1).
    required_inputs = 1
    max_inputs: int | None = 1
    num_outputs: int | None = 1
    # Whether __init__ takes backends=, the MAC engines chosen by the interpreter (kernels/backend.py).
    takes_backends = False
    # Set in __init__ by an op that moves elements across axis 0 (what it does, for inspect): it is
    # valid at the model's declared shapes only, so the Interpreter runs the model image by image.
    crosses_batch: str | None = None

    @property
    def elementwise(self) -> bool:
        """Whether each output element is a function of the inputs' elements at its own position
        (no broadcasting of anything but scalars): such kernels over one 8-bit tensor run as one
        table (npusim/runtime/chains.py)."""
        return False

    def __init__(self, op: Op, graph: Graph, profile: int):
        self.op = op
        self.graph = graph
        self.profile = profile
        n = len(op.inputs)
        outputs_ok = len(op.outputs) >= 1 if self.num_outputs is None else len(op.outputs) == self.num_outputs
        if (
            n < self.required_inputs
            or (self.max_inputs is not None and n > self.max_inputs)
            or not outputs_ok
        ):
            if self.max_inputs is None:
                expected = f"at least {self.required_inputs}"
            elif self.max_inputs == self.required_inputs:
                expected = str(self.required_inputs)
            else:
                expected = f"{self.required_inputs} to {self.max_inputs}"
            outputs = "at least 1 output" if self.num_outputs is None else f"{self.num_outputs} output"
            outputs += "" if self.num_outputs == 1 else "s"
            raise self.error(
                f"{n} inputs and {len(op.outputs)} outputs, expected {expected} inputs and {outputs}"
            )
        for k in range(self.required_inputs):
            if op.inputs[k] < 0:
                raise self.error(f"input {k} is omitted (-1) but required")
        self.inputs: list[Tensor | None] = [graph.tensors[i] if i >= 0 else None for i in op.inputs]
        self.outputs: list[Tensor] = [graph.tensors[i] for i in op.outputs]

    def error(self, message: str) -> NpusimError:
        return NpusimError(f"op {self.op.index} ({self.kind}): {message}")

    def require_int8(self, *tensors: Tensor):
        for t in tensors:
            if t.dtype != np.int8:
                raise self.error(f"tensor {t.name!r} has type {np.dtype(t.dtype).name}, expected int8")
            if t.quant is None:
                raise self.error(
                    f"tensor {t.name!r} has no quantization parameters, "
                    "expected int8 with scale and zero point"
                )
            if t.data is None and not np.all(t.quant.scale > 0):
                raise self.error(
                    f"tensor {t.name!r} has scale {t.quant.scale[0]:g}, expected a positive scale"
                )

    def require_constant(self, t: Tensor, what: str):
        if t.data is None:
            raise self.error(f"{what} {t.name!r} is not a constant, expected constant data in the model")

    def require_broadcast(self, a: Tensor, b: Tensor, y: Tensor) -> tuple[int, ...]:
        """The output of a binary elementwise op has the broadcast shape of its two inputs."""
        try:
            shape = np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            raise self.error(f"input shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
        if tuple(shape) != tuple(y.shape):
            raise self.error(
                f"output shape {list(y.shape)} is not the broadcast shape {list(shape)} of the inputs"
            )
        return tuple(shape)

    def broadcast_batch(self, a: np.ndarray, b: np.ndarray, out_image: tuple) -> tuple[int, ...]:
        """The output shape of a binary elementwise op at run time: the batch of whichever operand
        carries one (a constant or a broadcast operand of lower rank has none), then out_image."""
        a_is_batched = len(a.shape) == len(self.inputs[0].shape) and self.inputs[0].data is None
        b_is_batched = len(b.shape) == len(self.inputs[1].shape) and self.inputs[1].data is None
        if a_is_batched and b_is_batched and a.shape[0] != b.shape[0]:
            raise self.error(f"inputs carry batches of {a.shape[0]} and {b.shape[0]}, expected the same")
        return (a.shape[0] if a_is_batched else b.shape[0],) + tuple(out_image)

    def batch_aligned(self, xs) -> list:
        """The inputs of a joining op (CONCATENATION, PACK) on one batch: constants, stored with a
        batch of 1, are broadcast to the activations' batch."""
        batches = {x.shape[0] for x, t in zip(xs, self.inputs) if t.data is None}
        if len(batches) != 1:
            raise self.error(f"inputs carry batches of {sorted(batches)}, expected one batch size")
        n = batches.pop()
        return [
            np.broadcast_to(x, (n,) + x.shape[1:]) if t.data is not None else x
            for x, t in zip(xs, self.inputs)
        ]

    def require_bias(self, b: Tensor | None, channels: int):
        """An optional int32/int64 constant bias with one value per output channel."""
        if b is None:
            return
        self.require_constant(b, "bias")
        if b.dtype not in (np.int32, np.int64) or b.data.size != channels:
            raise self.error(
                f"bias {b.name!r} is {np.dtype(b.dtype).name} {list(b.shape)}, expected int32 [{channels}]"
            )

    def macs(self) -> int:
        """Multiply-accumulates per image (for inspect and the cost model)."""
        return 0

    def workspace_bytes(self, n: int) -> int:
        """Bytes of the largest temporary array that Eval allocates besides its output, for a batch
        of n (the interpreter refuses a batch whose tensors or workspaces exceed the allocation limit)."""
        return 0

    def __call__(self, *inputs: np.ndarray):
        raise NotImplementedError


class WeightMemo:
    """The prepared form of an op's weights (packed filters, output-stage parameters), rebuilt only
    when they change. Compared by content, not identity: a trainer may edit weights in place. Worth
    it for the model's own constants (a MobileNetV2 run re-prepared 52 layers each call); grouped
    ZO weights, new every step, skip it."""

    def __init__(self):
        self._key = None
        self._value = None

    def get(self, tag, w: np.ndarray, b, build):
        key = self._key
        if key is not None and key[0] == tag and _same(key[1], w) and _same(key[2], b):
            return self._value
        self._value = build()
        self._key = (tag, w.copy(), None if b is None else np.array(b, copy=True))
        return self._value


def _same(a, b) -> bool:
    """Equal bit for bit, as bytes (one memcmp of two copies): YOLOv8n's 64 filters and biases,
    3 MB, took 0.73 ms a run with np.array_equal on 8-byte words (a temporary mask and a reduction
    per array), 0.31 ms so."""
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
