"""The one-op .tflite writer of the test oracles (oracle.py): flatbuffers with the schema that
ai-edge-litert ships (object API), so the test models are made in the tests themselves and no model
file lives in the repository."""

from __future__ import annotations

from typing import Sequence

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from ..registry import REGISTRY

_TENSOR_TYPES = {
    np.dtype(np.float32): schema.TensorType.FLOAT32,
    np.dtype(np.float16): schema.TensorType.FLOAT16,
    np.dtype(np.int32): schema.TensorType.INT32,
    np.dtype(np.uint8): schema.TensorType.UINT8,
    np.dtype(np.int64): schema.TensorType.INT64,
    np.dtype(np.int8): schema.TensorType.INT8,
    np.dtype(np.int16): schema.TensorType.INT16,
}

_TYPE_DTYPES = {v: k for k, v in _TENSOR_TYPES.items()}

_PADDING = {"SAME": schema.Padding.SAME, "VALID": schema.Padding.VALID}

_ACTIVATION = {
    "NONE": schema.ActivationFunctionType.NONE,
    "RELU": schema.ActivationFunctionType.RELU,
    "RELU6": schema.ActivationFunctionType.RELU6,
    "RELU_N1_TO_1": schema.ActivationFunctionType.RELU_N1_TO_1,
}

# Operator versions a converter would write for int8 (TFLM ignores them, LiteRT accepts any
# registered version): the registry's (npusim/registry.py).
_OP_VERSIONS = {kind: spec.version for kind, spec in REGISTRY.items()}


def _as_list(v):
    return [int(a) for a in np.atleast_1d(v)]


class ModelBuilder:
    """Builds a single-subgraph .tflite model. Tensor and op indices follow insertion order."""

    def __init__(self, description: str = "npusim test model"):
        self.description = description
        self.buffers = [schema.BufferT()]  # buffer 0: the empty buffer every model starts with
        self.tensors: list = []
        self.opcodes: list = []
        self._opcode_index: dict = {}
        self.operators: list = []

    # -- tensors --------------------------------------------------------------------------------
    def add_tensor(
        self, shape, dtype=np.int8, scale=None, zero_point=None, data=None, axis=0, name=None
    ) -> int:
        """Add a tensor; `data` makes it a constant. scale/zero_point: scalar (per-tensor) or
        sequence (per-channel along `axis`). Returns the tensor index."""
        dtype = np.dtype(dtype)
        t = schema.TensorT()
        t.shape = [int(d) for d in shape]
        t.type = _TENSOR_TYPES[dtype]
        t.name = name or f"t{len(self.tensors)}"
        if scale is not None:
            q = schema.QuantizationParametersT()
            q.scale = [float(np.float32(s)) for s in np.atleast_1d(scale)]
            zp = np.zeros(len(q.scale), np.int64) if zero_point is None else np.atleast_1d(zero_point)
            if zp.size == 1 and len(q.scale) > 1:
                zp = np.repeat(zp, len(q.scale))
            q.zeroPoint = [int(z) for z in zp]
            q.quantizedDimension = int(axis)
            t.quantization = q
        if data is not None:
            arr = np.ascontiguousarray(np.asarray(data, dtype=dtype))
            if tuple(arr.shape) != tuple(t.shape) and arr.size != int(np.prod(t.shape, dtype=np.int64)):
                raise ValueError(f"constant data shape {arr.shape} does not match {t.shape}")
            buf = schema.BufferT()
            buf.data = np.frombuffer(arr.tobytes(), dtype=np.uint8)
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        else:
            t.buffer = 0
        self.tensors.append(t)
        return len(self.tensors) - 1

    def add_const(self, data, dtype=None, scale=None, zero_point=None, axis=0, name=None) -> int:
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
        return self.add_tensor(arr.shape, arr.dtype, scale, zero_point, data=arr, axis=axis, name=name)

    def shape(self, t: int) -> tuple:
        return tuple(self.tensors[t].shape)

    # -- operators ------------------------------------------------------------------------------
    def add_op(
        self,
        kind: str,
        inputs: Sequence[int],
        outputs: Sequence[int],
        options=None,
        version: int | None = None,
    ) -> int:
        """kind: builtin operator name ("CONV_2D"); options: a schema *OptionsT object or None."""
        code = getattr(schema.BuiltinOperator, kind)
        if version is None and kind not in _OP_VERSIONS:
            raise ValueError(f"{kind} is not in npusim's registry: give its operator version")
        version = version if version is not None else _OP_VERSIONS[kind]
        key = (code, version)
        if key not in self._opcode_index:
            oc = schema.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, schema.BuiltinOperator.PLACEHOLDER_FOR_GREATER_OP_CODES)
            oc.version = version
            self.opcodes.append(oc)
            self._opcode_index[key] = len(self.opcodes) - 1
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode_index[key]
        op.inputs = [int(i) for i in inputs]
        op.outputs = [int(o) for o in outputs]
        if options is not None:
            op.builtinOptionsType = getattr(schema.BuiltinOptions, type(options).__name__[:-1])
            op.builtinOptions = options
        self.operators.append(op)
        return len(self.operators) - 1

    # -- output ---------------------------------------------------------------------------------
    def build(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        sg = schema.SubGraphT()
        sg.tensors = self.tensors
        sg.inputs = [int(i) for i in inputs]
        sg.outputs = [int(o) for o in outputs]
        sg.operators = self.operators
        sg.name = "main"
        model = schema.ModelT()
        model.version = 3
        model.operatorCodes = self.opcodes
        model.subgraphs = [sg]
        model.buffers = self.buffers
        model.description = self.description
        builder = flatbuffers.Builder(0)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def float_model(model_bytes: bytes) -> bytes:
    """The float32 twin of a quantized model: every quantized integer tensor becomes FLOAT32
    without quantization, its constant data dequantized (scale * (q - zero point), per channel
    along the quantized axis); index tensors (shapes, axes) stay as they are. The ops and options
    are unchanged, so every int8 one-op builder here also builds the float one-op model, whose
    LiteRT float kernels are the oracle of npusim's float forms."""
    m = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    for t in m.subgraphs[0].tensors:
        q = t.quantization
        if q is None or q.scale is None or len(q.scale) == 0 or t.type == schema.TensorType.FLOAT32:
            continue
        dtype = _TYPE_DTYPES[t.type]
        if t.buffer and m.buffers[t.buffer].data is not None and len(m.buffers[t.buffer].data):
            raw = np.frombuffer(np.asarray(m.buffers[t.buffer].data, np.uint8).tobytes(), dtype)
            data = raw.reshape(t.shape).astype(np.float64)
            scale, zp = np.asarray(q.scale, np.float64), np.asarray(q.zeroPoint, np.float64)
            if scale.size > 1:
                shape = [1] * data.ndim
                shape[q.quantizedDimension] = scale.size
                scale, zp = scale.reshape(shape), zp.reshape(shape)
            real = (scale * (data - zp)).astype(np.float32)
            m.buffers[t.buffer].data = np.frombuffer(real.tobytes(), np.uint8)
        t.type = schema.TensorType.FLOAT32
        t.quantization = None
    for op in m.subgraphs[0].operators:  # float kernels take the options' default int8-only fields
        if op.builtinOptions is not None and hasattr(op.builtinOptions, "quantizedBiasType"):
            op.builtinOptions.quantizedBiasType = 0
    builder = flatbuffers.Builder(0)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def model_inputs(model_bytes: bytes) -> list[tuple[tuple, np.dtype]]:
    """(shape, dtype) of each graph input, read back from the flatbuffer."""
    m = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    sg = m.subgraphs[0]
    return [(tuple(int(d) for d in sg.tensors[i].shape), _TYPE_DTYPES[sg.tensors[i].type]) for i in sg.inputs]


def f32(x):
    return np.asarray(x, dtype=np.float32)


def bias_scale(in_scale, w_scale) -> np.ndarray:
    """float32(double(in_scale) * double(w_scale[c])), as the converter stores it (LiteRT checks it)."""
    return (np.float64(np.float32(in_scale)) * f32(w_scale).astype(np.float64)).astype(np.float32)


def conv_out_size(n: int, k: int, stride: int, dilation: int, padding: str) -> int:
    if padding == "SAME":
        return -(-n // stride)
    return (n - (k - 1) * dilation - 1) // stride + 1


HYBRID_OPS = (
    schema.BuiltinOperator.FULLY_CONNECTED,
    schema.BuiltinOperator.CONV_2D,
    schema.BuiltinOperator.DEPTHWISE_CONV_2D,
)


def hybrid_model(model_bytes: bytes, asymmetric: bool = True) -> bytes:
    """The dynamic-range ("hybrid") twin of a quantized model, as the converter's dynamic-range
    quantization writes it: float32 activations and biases, the MAC ops' weights kept int8 with
    their (symmetric) scales. asymmetric: the FULLY_CONNECTED / CONV_2D / DEPTHWISE_CONV_2D
    option asymmetric_quantize_inputs (per-batch asymmetric input quantization in LiteRT's hybrid
    kernels, else symmetric)."""
    m = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    g = m.subgraphs[0]
    keep = {op.inputs[1] for op in g.operators if m.operatorCodes[op.opcodeIndex].builtinCode in HYBRID_OPS}
    saved = {t: (g.tensors[t].type, g.tensors[t].quantization) for t in keep}
    m = schema.ModelT.InitFromPackedBuf(float_model(model_bytes), 0)
    g = m.subgraphs[0]
    for t, (kind, q) in saved.items():  # the weights back to their int8 codes and scales
        old = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
        g.tensors[t].type, g.tensors[t].quantization = kind, q
        m.buffers[g.tensors[t].buffer].data = old.buffers[old.subgraphs[0].tensors[t].buffer].data
    for op in g.operators:
        if m.operatorCodes[op.opcodeIndex].builtinCode in HYBRID_OPS and hasattr(
            op.builtinOptions, "asymmetricQuantizeInputs"
        ):
            op.builtinOptions.asymmetricQuantizeInputs = bool(asymmetric)
    builder = flatbuffers.Builder(0)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())
