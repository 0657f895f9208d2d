"""One-op ONNX QOperator models (quantized by ORT's quantize_static) and their one-op .tflite twins:
the same int8 weights, bias, scales and zero points in TFLite's layout (NHWC; uint8 codes shifted
to int8 with zero point - 128), so that npusim's --profile onnxruntime is held to ORT's own QLinear*
kernels on every parameter the quantizer picks, independently of the ONNX importer.

ORT is fed the float values (code - zp) * scale, which its QuantizeLinear maps back to exactly those
codes, npusim the codes; outputs are compared as codes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.testing import onnx_oracle as oo
from npusim.testing import oracle as O
from npusim.testing import runners


@dataclass
class Case:
    desc: str
    onnx: bytes  # the quantized model
    tflite: bytes  # its twin
    codes: list  # per graph input: int8 codes in the twin's layout (N on axis 0)
    floats: list  # per graph input: float32 values for ORT, in the ONNX layout
    out_zp: int  # the ONNX output zero point (uint8 or int8)
    out_scale: float
    shift: int  # 128 for uint8 activations, else 0
    nchw: bool  # a 4-D output: ORT's is NCHW, the twin's NHWC

    def ort_codes(self, optimize: bool = True) -> np.ndarray:
        y = oo.run_ort(self.onnx, self.floats if len(self.floats) > 1 else self.floats[0], optimize)
        codes = oo.output_steps(y, self.out_scale, self.out_zp) - self.shift
        return np.transpose(codes, (0, 2, 3, 1)) if self.nchw else codes

    def npusim_onnx_codes(self, profile: str = "onnxruntime") -> np.ndarray:
        """npusim on the .onnx model itself (the importer's graph), fed ORT's float inputs."""
        import npusim

        graph = npusim.load_model(self.onnx)
        interp = npusim.Interpreter(graph, profile=profile)
        values = {graph.inputs[k]: x for k, x in enumerate(self.floats)}
        y = interp.evaluate(values)[graph.outputs[0]]
        codes = oo.output_steps(y, self.out_scale, self.out_zp) - self.shift
        return np.transpose(codes, (0, 2, 3, 1)) if self.nchw else codes

    def npusim_codes(self, profile: str = "onnxruntime") -> np.ndarray:
        xs = [c.astype(np.int8) for c in self.codes]
        return runners.run_npusim(self.tflite, xs if len(xs) > 1 else xs[0], profile).astype(np.int64)


def _parameters(model_bytes: bytes, op_type: str):
    import onnx
    from onnx import numpy_helper

    m = onnx.load_from_string(model_bytes)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    nodes = [n for n in m.graph.node if n.op_type == op_type]
    assert len(nodes) == 1, f"expected one {op_type} in {[n.op_type for n in m.graph.node]}"
    return inits, nodes[0]


def _quant(inits, scale_name, zp_name):
    """(float32 scales, zero points) of a QLinear operand."""
    return np.atleast_1d(inits[scale_name]).astype(np.float32), np.atleast_1d(inits[zp_name])


def _signed(zp, shift) -> int:
    return int(zp) - shift


def _codes(rng, shape, shift, n):
    return rng.integers(-128, 128, size=(n,) + tuple(shape[1:])) + shift  # ONNX-domain codes


def _floats(codes, scale, zp):
    return ((codes - int(zp)).astype(np.float32) * np.float32(scale)).astype(np.float32)


def _shift_of(activation: str) -> int:
    return 128 if activation == "uint8" else 0


def same_pads(size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite SAME padding (before, after) of one spatial axis, as ONNX pads."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


def conv_case(rng, x_shape, out_c, k, stride=1, dilation=1, padding="SAME", depthwise=False,
              per_channel=True, activation="int8", n=2, bias=True, reduce_range=False,
              qdq=False) -> Case:  # fmt: skip
    """qdq: the case's model is the QDQ form of the same quantization (its parameters are read
    from the QOperator form: quantize_static calibrates both alike)."""
    """Conv (or depthwise Conv, group = C) on x [1, C, H, W] with a k x k kernel."""
    _, c, h, w = x_shape
    out_c = c if depthwise else out_c
    wf = rng.standard_normal((out_c, 1 if depthwise else c, k, k)).astype(np.float32)
    wf *= rng.uniform(0.2, 2.0, size=(out_c, 1, 1, 1)).astype(np.float32)  # per-channel ranges differ
    bf = (rng.standard_normal(out_c) * 0.5).astype(np.float32) if bias else None
    if padding == "SAME":
        (t, b), (left, r) = same_pads(h, k, stride, dilation), same_pads(w, k, stride, dilation)
        pads = (t, left, b, r)
    else:
        pads = (0, 0, 0, 0)
    group = c if depthwise else 1
    model = oo.conv_model(x_shape, wf, bf, (stride, stride), pads, (dilation, dilation), group)
    seed = int(rng.integers(1 << 30))
    q = oo.quantize(model, "QOperator", per_channel, activation, seed=seed, reduce_range=reduce_range)
    inits, node = _parameters(q, "QLinearConv")
    if qdq:
        q = oo.quantize(model, "QDQ", per_channel, activation, seed=seed, reduce_range=reduce_range)
    xs, xz = _quant(inits, node.input[1], node.input[2])
    wq = inits[node.input[3]]
    ws, wz = _quant(inits, node.input[4], node.input[5])
    ys, yz = _quant(inits, node.input[6], node.input[7])
    assert wq.dtype == np.int8 and not np.any(wz), "twins need symmetric int8 weights"
    bq = inits[node.input[8]] if len(node.input) > 8 and node.input[8] else None
    shift = _shift_of(activation)
    args = (
        bq,
        float(xs[0]),
        _signed(xz[0], shift),
        ws if ws.size > 1 else float(ws[0]),
        float(ys[0]),
        _signed(yz[0], shift),
    )
    nhwc = (1, h, w, c)
    geometry = dict(stride=(stride, stride), padding=padding, dilation=(dilation, dilation))
    if depthwise:  # [C, 1, kh, kw] -> [1, kh, kw, C]
        twin = O.depthwise_model(nhwc, np.transpose(wq, (1, 2, 3, 0)), *args, **geometry)
    else:  # [O, C, kh, kw] -> [O, kh, kw, C]
        twin = O.conv2d_model(nhwc, np.transpose(wq, (0, 2, 3, 1)), *args, **geometry)
    codes = _codes(rng, x_shape, shift, n)
    desc = (
        f"{'depthwise' if depthwise else 'conv'} x{list(x_shape)} o{out_c} k{k} s{stride} d{dilation} "
        f"{padding} {'per-channel' if per_channel else 'per-tensor'} {activation}"
        f"{' reduce_range' if reduce_range else ''}"
    )
    return Case(
        desc, q, twin, [np.transpose(codes, (0, 2, 3, 1)) - shift], [_floats(codes, xs[0], xz[0])],
        int(yz[0]), float(ys[0]), shift, True,
    )  # fmt: skip


def gemm_case(rng, batch_k, units, kind="Gemm", per_channel=True, activation="int8", n=3, reduce_range=False,
              qdq=False) -> Case:  # fmt: skip
    """Gemm (transB, bias) or MatMul of x [1, K] with a constant weight: the twin is FULLY_CONNECTED."""
    k = batch_k
    wf = (rng.standard_normal((units, k)) * rng.uniform(0.2, 2.0, size=(units, 1))).astype(np.float32)
    if kind == "Gemm":
        model = oo.gemm_model((1, k), wf, (rng.standard_normal(units) * 0.5).astype(np.float32))
        op, w_index, bias_index, y_index = "QGemm", 3, 6, 7
    else:
        model = oo.matmul_model((1, k), wf.T.copy())
        op, w_index, bias_index, y_index = "QLinearMatMul", 3, None, 6
    seed = int(rng.integers(1 << 30))
    q = oo.quantize(model, "QOperator", per_channel, activation, seed=seed, reduce_range=reduce_range)
    inits, node = _parameters(q, op)
    if qdq:
        q = oo.quantize(model, "QDQ", per_channel, activation, seed=seed, reduce_range=reduce_range)
    xs, xz = _quant(inits, node.input[1], node.input[2])
    wq = inits[node.input[w_index]]
    ws, wz = _quant(inits, node.input[w_index + 1], node.input[w_index + 2])
    ys, yz = _quant(inits, node.input[y_index], node.input[y_index + 1])
    assert wq.dtype == np.int8 and not np.any(wz), "twins need symmetric int8 weights"
    wq = wq if kind == "Gemm" else wq.T  # QGemm keeps transB [U, K]; MatMul's B is [K, U]
    bq = inits[node.input[bias_index]] if bias_index is not None else None
    shift = _shift_of(activation)
    twin = O.fully_connected_model(
        (1, k), wq, bq, float(xs[0]), _signed(xz[0], shift), ws if ws.size > 1 else float(ws[0]),
        float(ys[0]), _signed(yz[0], shift),
    )  # fmt: skip
    codes = _codes(rng, (1, k), shift, n)
    desc = f"{kind} k{k} u{units} {'per-channel' if per_channel else 'per-tensor'} {activation}"
    return Case(
        desc, q, twin, [codes - shift], [_floats(codes, xs[0], xz[0])], int(yz[0]), float(ys[0]), shift, False
    )


def _calibration(model, rng, ranges, samples=8):
    """Calibration feeds whose inputs span different ranges (so that operand scales differ)."""
    shapes = oo.input_shapes(model)
    return [
        {name: (rng.uniform(-1, 1, size=shape) * r + rng.uniform(-0.3, 0.3) * r).astype(np.float32)
         for (name, shape), r in zip(shapes.items(), ranges)}
        for _ in range(samples)
    ]  # fmt: skip


def every_code_pair(shift) -> tuple[np.ndarray, np.ndarray]:
    """All 65,536 pairs of codes as two [1, 256, 256] arrays (a major), in the ONNX domain."""
    codes = np.arange(-128, 128) + shift
    a = np.repeat(codes, 256).reshape(1, 256, 256)
    b = np.tile(codes, 256).reshape(1, 256, 256)
    return a, b


def binary_case(rng, kind, activation="int8", qdq=False) -> Case:
    """QLinearAdd or QLinearMul on every pair of input codes; operand scales from different ranges."""
    shape = (1, 256, 256)
    model = oo.binary_model(kind, shape, shape)
    ranges = rng.uniform(0.05, 8.0, size=2)
    feeds = _calibration(model, rng, ranges)
    q = oo.quantize(model, "QOperator", False, activation, calibration=feeds)
    inits, node = _parameters(q, f"QLinear{kind}")
    if qdq:
        q = oo.quantize(model, "QDQ", False, activation, calibration=feeds)
    (sa, za), (sb, zb), (sc, zc) = (_quant(inits, node.input[i], node.input[i + 1]) for i in (1, 4, 6))
    shift = _shift_of(activation)
    twin = O.binary_model(
        kind.upper(), shape, shape, float(sa[0]), _signed(za[0], shift), float(sb[0]), _signed(zb[0], shift),
        float(sc[0]), _signed(zc[0], shift),
    )  # fmt: skip
    a, b = every_code_pair(shift)
    desc = f"{kind} every pair, ranges {ranges.round(3).tolist()} {activation}"
    return Case(
        desc, q, twin, [a - shift, b - shift], [_floats(a, sa[0], za[0]), _floats(b, sb[0], zb[0])],
        int(zc[0]), float(sc[0]), shift, False,
    )  # fmt: skip


def unary_case(rng, kind, activation="int8", fmt="QOperator", **attrs) -> Case:
    """QLinearSigmoid or QLinearLeakyRelu on every input code."""
    shape = (1, 256)
    model = oo.unary_model(kind, shape, **attrs)
    scale = float(rng.uniform(0.3, 12.0))
    q = oo.quantize(model, fmt, False, activation, calibration=_calibration(model, rng, [scale]))
    if fmt == "QOperator":
        inits, node = _parameters(q, f"QLinear{kind}")
        (xs, xz), (ys, yz) = (_quant(inits, node.input[i], node.input[i + 1]) for i in (1, 3))
    else:  # QuantizeLinear(x) -> DequantizeLinear -> op -> QuantizeLinear -> DequantizeLinear
        import onnx
        from onnx import numpy_helper

        m = onnx.load_from_string(q)
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        qs = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
        (xs, xz), (ys, yz) = (_quant(inits, n.input[1], n.input[2]) for n in qs)
    shift = _shift_of(activation)
    x_zp, y_zp = _signed(xz[0], shift), _signed(yz[0], shift)
    if kind == "Sigmoid":
        twin = O.logistic_model(shape, float(xs[0]), x_zp, float(ys[0]), y_zp)
    else:
        twin = O.leaky_relu_model(shape, float(xs[0]), x_zp, float(ys[0]), y_zp, attrs.get("alpha", 0.01))
    codes = (np.arange(-128, 128) + shift).reshape(1, 256)
    desc = f"{kind} every code, scale {scale:.3f} {attrs or ''} {activation} {fmt}"
    return Case(
        desc, q, twin, [codes - shift], [_floats(codes, xs[0], xz[0])], int(yz[0]), float(ys[0]), shift, False
    )


def _quant_of_qdq(model_bytes: bytes):
    """(x scale, x zp), (y scale, y zp) of a one-op QDQ or QOperator model: its first and last
    QuantizeLinear (the graph input's and the op output's)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load_from_string(model_bytes)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    qs = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
    dqs = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
    return _quant(inits, qs[0].input[1], qs[0].input[2]), _quant(inits, dqs[-1].input[1], dqs[-1].input[2])


def pool_case(
    rng, kind, x_shape, kernel=(2, 2), stride=(2, 2), activation="int8", n=2, fmt="QOperator"
) -> Case:
    """AveragePool (VALID), GlobalAveragePool or Softmax (over the last axis of x [1, C]): twins
    AVERAGE_POOL_2D, MEAN over H and W, SOFTMAX. ORT runs QLinearAveragePool,
    QLinearGlobalAveragePool, QLinearSoftmax."""
    from npusim.testing.builder import ModelBuilder, schema

    if kind == "AveragePool":
        model = oo.pool_model(kind, x_shape, kernel, stride)
    elif kind == "Softmax":
        model = oo.unary_model(kind, x_shape, axis=-1)
    else:
        model = oo.unary_model(kind, x_shape)
    feeds = _calibration(model, rng, [float(rng.uniform(0.5, 6.0))])
    q = oo.quantize(model, fmt, False, activation, calibration=feeds, force_input=True)
    (xs, xz), (ys, yz) = _quant_of_qdq(q)
    shift = _shift_of(activation)
    b = ModelBuilder()
    nchw = len(x_shape) == 4
    in_shape = (1, x_shape[2], x_shape[3], x_shape[1]) if nchw else tuple(x_shape)
    x = b.add_tensor(in_shape, np.int8, float(xs[0]), _signed(xz[0], shift), name="input")
    if kind == "AveragePool":
        oh, ow = (in_shape[1] - kernel[0]) // stride[0] + 1, (in_shape[2] - kernel[1]) // stride[1] + 1
        y = b.add_tensor(
            (1, oh, ow, in_shape[3]), np.int8, float(ys[0]), _signed(yz[0], shift), name="output"
        )
        opt = schema.Pool2DOptionsT()
        opt.padding = schema.Padding.VALID
        opt.strideH, opt.strideW = stride
        opt.filterHeight, opt.filterWidth = kernel
        b.add_op("AVERAGE_POOL_2D", [x], [y], opt)
    elif kind == "GlobalAveragePool":
        y = b.add_tensor((1, 1, 1, in_shape[3]), np.int8, float(ys[0]), _signed(yz[0], shift), name="output")
        axes = b.add_const(np.array([1, 2], np.int32), name="axes")
        opt = schema.ReducerOptionsT()
        opt.keepDims = True
        b.add_op("MEAN", [x, axes], [y], opt)
    else:
        y = b.add_tensor(in_shape, np.int8, float(ys[0]), _signed(yz[0], shift), name="output")
        opt = schema.SoftmaxOptionsT()
        opt.beta = 1.0
        b.add_op("SOFTMAX", [x], [y], opt)
    twin = b.build([x], [y])
    codes = _codes(rng, x_shape, shift, n)
    twin_codes = np.transpose(codes, (0, 2, 3, 1)) if nchw else codes
    desc = f"{kind} x{list(x_shape)} {activation} {fmt}"
    return Case(
        desc,
        q,
        twin,
        [twin_codes - shift],
        [_floats(codes, xs[0], xz[0])],
        int(yz[0]),
        float(ys[0]),
        shift,
        nchw,
    )
