"""Writing an imported graph back to .onnx: the file's own ModelProto with each weight and bias
initializer replaced by the graph's current codes (a trainer's updated weights), laid out back in the
file's order (OIHW, [O, 1, kh, kw], [K, N]), shifted back by the file's zero point and stored in the
file's element type (int4 / uint4 packed two per byte again). Scales, zero points, every other
node and initializer are written as read.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError

_TYPES = {
    "int8": (np.int8, -128, 127),
    "uint8": (np.uint8, 0, 255),
    "int4": (np.int8, -8, 7),
    "uint4": (np.uint8, 0, 15),
    "int32": (np.int32, -(2**31), 2**31 - 1),
}


def file_layout(kind: str, data: np.ndarray) -> np.ndarray:
    """The graph's layout of a weight (lower_conv.py) back to the file's."""
    if kind == "conv":  # OHWI -> OIHW
        return data.transpose(0, 3, 1, 2)
    if kind == "depthwise":  # [1, kh, kw, O] -> [O, 1, kh, kw]
        return data[0].transpose(2, 0, 1)[:, None]
    if kind == "dense_kn":  # [N, K] -> [K, N]
        return data.T
    return data  # dense_nk, bias


def write_onnx(graph) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    src = graph.source
    if len(graph.ops) != src.op_count or len(graph.tensors) != src.tensor_count:
        raise NpusimError(
            "the graph has ops or tensors added after import (a new head); writing them into the ONNX "
            "graph is not supported, expected the imported graph with updated weights"
        )
    for index, data in src.rebuilt.items():
        if not np.array_equal(graph.tensors[index].data, data):
            raise NpusimError(
                f"weight {graph.tensors[index].name!r} was rebuilt at import (a folded BatchNormalization, "
                "a filter scale widened for its bias, a split group or Gemm's alpha): its trained codes "
                "cannot be written back into the file's initializer"
            )
    model = type(src.model)()
    model.CopyFrom(src.model)
    inits = {t.name: t for t in model.graph.initializer}
    for index, where in src.weights.items():
        data = graph.tensors[index].data
        init = inits.get(where["init"])
        if init is None or data is None:
            continue
        codes = file_layout(where["kind"], np.asarray(data)).astype(np.int64)
        zp = np.asarray(where["zero_point"], np.int64).reshape(-1)
        if zp.size > 1:
            shape = [1] * codes.ndim
            shape[where["axis"]] = -1
            zp = zp.reshape(shape)
        codes = codes + (zp if zp.size > 1 else int(zp[0]) if zp.size else 0)
        storage = where["storage"]
        dtype, lo, hi = _TYPES[storage]
        if codes.shape != tuple(where["shape"]) or codes.size and (codes.min() < lo or codes.max() > hi):
            raise NpusimError(
                f"initializer {where['init']!r}: trained codes do not fit {storage} {list(where['shape'])}"
            )
        if storage in ("int4", "uint4"):
            new = helper.make_tensor(
                init.name, getattr(TensorProto, storage.upper()), codes.shape, codes.ravel().tolist()
            )
        else:
            new = numpy_helper.from_array(codes.astype(dtype), init.name)
        init.CopyFrom(new)
    return model.SerializeToString()
