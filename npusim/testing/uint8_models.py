"""Legacy uint8 test models made from the int8 one-op models: every quantized int8 tensor becomes
uint8 (codes + 128, zero point + 128), and each constant filter (input 1 of a convolution,
FULLY_CONNECTED or TRANSPOSE_CONV) gets an asymmetric zero point, as TFLite's old uint8 converter
wrote them (per-tensor, zero point anywhere in [0, 255])."""

from __future__ import annotations

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema


def as_uint8(model_bytes: bytes, seed: int = 0, filter_zp_spread: int = 40) -> bytes:
    """The uint8 twin of an int8 model (module doc); a filter's zero point is 128 plus a seeded
    offset in [-filter_zp_spread, filter_zp_spread]. Per-channel tensors keep their first scale."""
    rng = np.random.default_rng(seed)
    model = schema.ModelT.InitFromPackedBuf(bytearray(model_bytes), 0)
    sg = model.subgraphs[0]
    filters = set()
    for op in sg.operators:
        code = model.operatorCodes[op.opcodeIndex]
        kind = max(code.builtinCode, code.deprecatedBuiltinCode)
        if kind in (
            schema.BuiltinOperator.CONV_2D,
            schema.BuiltinOperator.DEPTHWISE_CONV_2D,
            schema.BuiltinOperator.FULLY_CONNECTED,
            schema.BuiltinOperator.TRANSPOSE_CONV,
        ):
            filters.add(op.inputs[1])
    for i, t in enumerate(sg.tensors):
        q = t.quantization
        if t.type == schema.TensorType.INT32 and q is not None and q.scale is not None and len(q.scale) > 1:
            q.scale, q.zeroPoint, q.quantizedDimension = [float(q.scale[0])], [0], 0  # a per-tensor bias
        if t.type != schema.TensorType.INT8 or q is None or q.scale is None or not len(q.scale):
            continue
        t.type = schema.TensorType.UINT8
        q.scale = [float(q.scale[0])]
        zp = int(q.zeroPoint[0]) + 128
        if i in filters:
            zp = 128 + int(rng.integers(-filter_zp_spread, filter_zp_spread + 1))
        q.zeroPoint = [zp]
        q.quantizedDimension = 0
        buf = model.buffers[t.buffer] if t.buffer else None
        if buf is not None and buf.data is not None and len(buf.data):
            buf.data = np.asarray(buf.data, np.uint8) ^ np.uint8(0x80)
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def as_uint8_input(x: np.ndarray) -> np.ndarray:
    """An int8 batch as the uint8 codes of the twin model's input (code + 128)."""
    return np.ascontiguousarray(x).view(np.uint8) ^ np.uint8(0x80)
