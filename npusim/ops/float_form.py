"""What every op's float form provides: the op's real-valued meaning, prepared once from (op, graph).

Each kernel class names its float form in `float_form`. The form prepares on a float32 graph (the
float model a converter started from) and on a quantized graph (the int8 model's own meaning, as
TFLite's QuantizationDebugger evaluates it): its __call__ takes float32 arrays in op.inputs order
(activations with the batch on axis 0, constants as real values: a float graph's own data, a
quantized graph's constants dequantized, index operands such as shapes and axes as stored) and
returns float32 arrays, a tuple when the op has several outputs. It computes in the precision of
its inputs: float32 from the float interpreter (reference.py), float64 in zo's gradient checks
(zo/float_ops.py runs these same forms and adds the backward passes).

A fused activation is the float clamp LiteRT's float kernels apply (kernels/internal/
reference/*.h: ActivationFunctionWithMinMax). What a float form never does is clamp to the range an
int8 tensor can hold, or round: that is the quantization error `npusim validate` measures.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..graph import Graph, Op, Tensor
from .base import broadcast_crossing

# tflite kernel_util.h CalculateActivationRange: the real bounds of each fused activation.
ACTIVATION_BOUNDS = {
    "NONE": (None, None),
    "RELU": (0.0, None),
    "RELU6": (0.0, 6.0),
    "RELU_N1_TO_1": (-1.0, 1.0),
}


def real_value(tensor: Tensor, data: np.ndarray | None = None) -> np.ndarray:
    """A tensor's values as real numbers: scale * (q - zero_point) (per channel along the
    quantized axis) for a quantized integer tensor, float32 for a float tensor; an integer tensor
    without quantization (shapes, axes, indices) is returned as stored."""
    q = tensor.data if data is None else data
    q = np.asarray(q)
    if q.dtype.kind == "f":
        return q.astype(np.float32, copy=False)
    if tensor.quant is None or q.dtype.kind not in "iu":
        return q
    scale = tensor.quant.scale.astype(np.float64)
    zp = tensor.quant.zero_point.astype(np.float64)
    if tensor.quant.per_channel:
        # The quantized axis counts from the front of the stored tensor; a batched activation has
        # the same rank, so the axis is the same.
        shape = [1] * q.ndim
        shape[tensor.quant.axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (scale * (q.astype(np.float64) - zp)).astype(np.float32)


def mac_bias(bias: Tensor, x: Tensor, w: Tensor) -> np.ndarray:
    """A MAC op's integer bias as its integer kernel adds it: in units of input scale times weight
    scale, since TFLM (reference_integer_ops/conv.h, fully_connected.h) adds the int32 bias to the
    accumulator and never reads the bias tensor's own scale. The converter writes that scale as
    float32(double(s_in) * double(s_w)), so the two agree on a well-formed model; where an edited
    scale makes them disagree, this is what the int8 layer computes."""
    s_w = w.quant.scale.astype(np.float64)
    scale = (np.float64(x.quant.scale[0]) * s_w).astype(np.float32).astype(np.float64)
    b = bias.data.astype(np.float64)
    return (b * (scale if scale.size == b.shape[-1] else scale[0])).astype(np.float32)


def real(x) -> np.ndarray:
    """An array of real values in its own float precision (an integer array becomes float32)."""
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float32)


class FloatForm:
    """Prepare in __init__ (geometry, axes, the fused activation), evaluate in __call__."""

    kind = ""
    # As Kernel.crosses_batch: set by a form whose op is valid at the declared shapes only, so the
    # float reference runs the model image by image as the integer Interpreter does.
    crosses_batch: str | None = None
    # MAC ops: the positions of (input, weights, bias) in op.inputs, for constant().
    mac_inputs: tuple | None = None

    def __init__(self, op: Op, graph: Graph):
        self.op = op
        self.graph = graph
        self.kind = op.kind
        self.inputs: list[Tensor | None] = [graph.tensors[i] if i >= 0 else None for i in op.inputs]
        self.outputs: list[Tensor] = [graph.tensors[i] for i in op.outputs]
        activation = op.options.get("fused_activation_function", "NONE")
        if activation not in ACTIVATION_BOUNDS:
            raise self.error(f"fused activation {activation} has no float form")
        self.lo, self.hi = ACTIVATION_BOUNDS[activation]

    def error(self, message: str) -> NpusimError:
        return NpusimError(f"op {self.op.index} ({self.op.kind}): {message}")

    def constant(self, k: int) -> np.ndarray:
        """The real value of constant input k: real_value, except a quantized MAC op's integer bias,
        which is worth what the integer kernel adds (mac_bias), whether or not the bias tensor
        carries quantization of its own (an ONNX model's int32 bias has none: its scale is implied)."""
        t = self.inputs[k]
        if self.mac_inputs is not None and k == self.mac_inputs[2]:
            x, w = (self.inputs[i] for i in self.mac_inputs[:2])
            quantized = all(u is not None and u.quant is not None for u in (x, w))
            if quantized and np.dtype(t.dtype).kind == "i":
                return mac_bias(t, x, w)
        return real_value(t)

    def activate(self, y: np.ndarray) -> np.ndarray:
        """The fused activation as a float clamp."""
        y = real(y)
        if self.lo is not None or self.hi is not None:
            y = np.clip(y, self.lo, self.hi)
        return y

    def __call__(self, *inputs: np.ndarray):
        raise NotImplementedError


class Identity(FloatForm):
    """QUANTIZE and DEQUANTIZE: a change of representation, so the identity on real values."""

    def __call__(self, x):
        return real(x)


class Movement(FloatForm):
    """Ops that only move values (RESHAPE, TRANSPOSE, SLICE, SPLIT, ...): their integer kernel is
    indifferent to the element type, so the float form prepares that same kernel on the graph (its
    checks hold for float32 tensors too) and runs it on real values."""

    kernel_class = None  # the integer kernel class, bound by MovementForm

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.kernel = self.kernel_class(op, graph, 0)
        self.crosses_batch = self.kernel.crosses_batch

    def __call__(self, *inputs):
        return self.kernel(*inputs)


class MovementForm:
    """`float_form = MovementForm()` in a data-movement kernel's class body: Movement bound to that
    kernel class when the class is made, so the form needs no kernel table (and the kernel sources
    that key the Numba cache stay free of the registry)."""

    def __set_name__(self, owner, name):
        self.form = type(f"{owner.__name__}Float", (Movement,), {"kernel_class": owner})

    def __get__(self, instance, owner=None):
        return self.form


class Elementwise(FloatForm):
    """A binary elementwise op (numpy broadcasting, as TFLite's BroadcastBinaryFunction) followed
    by the fused activation; subclasses name the function."""

    function = staticmethod(np.add)

    def __init__(self, op: Op, graph: Graph):
        super().__init__(op, graph)
        self.crosses_batch = broadcast_crossing(self.inputs[:2], self.outputs[0])

    def __call__(self, a, b):
        return self.activate(self.function(real(a), real(b)))


class Unary(FloatForm):
    """An elementwise function of one input; subclasses name it (computed in float64, returned in
    the input's precision, so the only difference from LiteRT's float32 kernel is its rounding)."""

    def function(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, x):
        x = real(x)
        return self.activate(self.function(x.astype(np.float64)).astype(x.dtype))


# ----------------------------------------------------------------------------------------------
# Sliding windows (CONV_2D, DEPTHWISE_CONV_2D, the pools): padded input and the taps' views


def pad_spatial(x: np.ndarray, geometry, value: float = 0.0) -> np.ndarray:
    """x [N, H, W, C] padded so that every window tap of the geometry lies inside the array (the
    padding is a real zero for a convolution, as padding with the zero point is in int8)."""
    g = geometry
    (sh, sw), (dh, dw), (top, left) = g.stride, g.dilation, g.pad
    _, h, w, _ = x.shape
    bottom = max((g.out_h - 1) * sh + (g.kh - 1) * dh + 1 - h - top, 0)
    right = max((g.out_w - 1) * sw + (g.kw - 1) * dw + 1 - w - left, 0)
    if top == left == bottom == right == 0:
        return x
    return np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=value)


def tap(xp: np.ndarray, geometry, ky: int, kx: int) -> np.ndarray:
    """The view of padded input xp that tap (ky, kx) of every output window reads: [N, out_h, out_w, C]."""
    g = geometry
    (sh, sw), (dh, dw) = g.stride, g.dilation
    y0, x0 = ky * dh, kx * dw
    return xp[:, y0 : y0 + (g.out_h - 1) * sh + 1 : sh, x0 : x0 + (g.out_w - 1) * sw + 1 : sw, :]


def columns(x: np.ndarray, geometry) -> np.ndarray:
    """im2col: [N * out_h * out_w, kh * kw * C], the taps in the filter's (ky, kx, c) order."""
    g = geometry
    if g.pointwise:
        return x.reshape(-1, x.shape[3])
    xp = pad_spatial(x, g)
    cols = np.empty((x.shape[0], g.out_h, g.out_w, g.kh, g.kw, x.shape[3]), dtype=x.dtype)
    for ky in range(g.kh):
        for kx in range(g.kw):
            cols[:, :, :, ky, kx, :] = tap(xp, g, ky, kx)
    return cols.reshape(-1, g.kh * g.kw * x.shape[3])
