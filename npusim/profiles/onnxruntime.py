"""ONNX Runtime's CPU arithmetic (x86, MLAS) for the onnxruntime profile (quant.ONNXRUNTIME), as the
tables that the one- and two-input int8 ops evaluate.

The MAC ops need nothing here: QLinearConv, QLinearMatMul and QGemm sum exactly in int32 and
requantize with MlasRequantizeOutput, which is the engines' fp32 output stage (quant.mac_profile).

What differs, and is built here at prepare:
- QuantizeLinear (mlas/lib/quantize.cpp, MlasQuantizeLinear): x / scale (a true float32 division),
  clamped in float to [qmin - zp, qmax - zp], rounded half to even (cvtps2dq), + zp.
- QLinearSigmoid and QLinearLeakyRelu (contrib_ops/cpu/quantization/qlinear_activations.cc,
  qlinear_lookup_table.cc): a 256-entry table, each code dequantized in float32
  (x_scale * (code - x_zp)), the float function applied (MlasComputeLogistic; v >= 0 ? v :
  alpha * v), then MlasQuantizeLinear. ORT's float Sigmoid and LeakyRelu run the same functions,
  so the table is also the literal DequantizeLinear -> op -> QuantizeLinear of a QDQ model.
- QLinearAdd, AVX2 kernel (mlas/lib/intrinsics/avx2/qladd_avx2.cpp): with rA = sa / sc and
  rB = sb / sc (float32), c = fma(a, rA, fma(b, rB, zc - fma(rA, za, rB * zb))), rounded half to
  even and saturated (packs). Its float steps see the stored codes: a uint8 model's, which the
  graph holds shifted to int8 (Quantization.offset).
- QLinearMul (mlas/lib/qlmul.cpp): the integer product of the centred codes, times float32
  sa * sb / sc, plus zc in float32, rounded half to even (the order measured against ORT 1.32).
"""

from __future__ import annotations

import numpy as np

from ..ops.pairwise import every_pair

_F32 = np.float32


def _fma32(a, b, c):
    """float32 fused multiply-add: a * b + c rounded once. The product of two float32 values is exact
    in float64 and the sum is exact there too unless the exponents are far apart (then the float32
    rounding of the float64 sum can differ from a true FMA only on a double-rounding tie)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


def quantize_linear(v, scale, zero_point, qmin: int = -128, qmax: int = 127) -> np.ndarray:
    """MlasQuantizeLinear on float32 values v, to int64 codes in [qmin, qmax]. NaN gives qmin
    (MAXPS returns its second operand, the lower bound, for a NaN)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.asarray(v, dtype=np.float32) / _F32(scale)
    q = np.where(np.isnan(q), _F32(qmin - zero_point), q)
    q = np.clip(q, _F32(qmin - zero_point), _F32(qmax - zero_point))
    return np.rint(q).astype(np.int64) + zero_point


def _codes() -> np.ndarray:
    """The 256 int8 codes in the order of their bytes (the index of a lookup table)."""
    return np.arange(256, dtype=np.uint8).view(np.int8).astype(np.int64)


def _dequantized_codes(scale, zero_point) -> np.ndarray:
    """X_scale * (code - X_zero_point) in float32 for every code (qlinear_lookup_table.cc)."""
    return _F32(scale) * (_codes() - zero_point).astype(np.float32)


# MlasLogisticConstants (mlas/lib/logistic.cpp): Eigen's rational approximation.
_LOGISTIC_RANGE = 18.0
_ALPHA = (
    4.37031012579801e-11,
    1.15627324459942e-07,
    6.08574864600143e-05,
    8.51377133304701e-03,
    2.48287947061529e-01,
)
_BETA = (
    6.10247389755681e-13,
    5.76102136993427e-09,
    6.29106785017040e-06,
    1.70198817374094e-03,
    1.16817656904453e-01,
    9.93151921023180e-01,
)


def mlas_logistic(v) -> np.ndarray:
    """MlasComputeLogistic on float32 values, as its x86 FMA3 kernel computes it: clamp to [-18, 18],
    p = x * polynomial(x^2) and q = polynomial(x^2) by fused multiply-adds, p / q + 0.5, clamped to
    [0, 1]."""
    x = np.clip(np.asarray(v, dtype=np.float32), _F32(-_LOGISTIC_RANGE), _F32(_LOGISTIC_RANGE))
    x2 = (x * x).astype(np.float32)
    p = _fma32(x2, _F32(_ALPHA[0]), _F32(_ALPHA[1]))
    for a in _ALPHA[2:]:
        p = _fma32(p, x2, _F32(a))
    p = (p * x).astype(np.float32)
    q = _fma32(x2, _F32(_BETA[0]), _F32(_BETA[1]))
    for b in _BETA[2:]:
        q = _fma32(q, x2, _F32(b))
    return np.clip((p / q).astype(np.float32) + _F32(0.5), _F32(0.0), _F32(1.0)).astype(np.float32)


def sigmoid_table(x_scale, x_zp, y_scale, y_zp) -> np.ndarray:
    """QLinearSigmoid's table (int8 [256], indexed by the input byte)."""
    return quantize_linear(mlas_logistic(_dequantized_codes(x_scale, x_zp)), y_scale, y_zp).astype(np.int8)


def leaky_relu_table(x_scale, x_zp, y_scale, y_zp, alpha) -> np.ndarray:
    """QLinearLeakyRelu's table: v >= 0 ? v : alpha * v in float32, then MlasQuantizeLinear."""
    v = _dequantized_codes(x_scale, x_zp)
    out = np.where(v >= 0, v, (_F32(alpha) * v).astype(np.float32))
    return quantize_linear(out, y_scale, y_zp).astype(np.int8)


def _stored(t):
    """(scale, zero point, offset) of a tensor as the file stores it: ORT's float steps see the stored
    codes, graph code + offset (128 for uint8, see graph.Quantization.offset)."""
    offset = int(getattr(t.quant, "offset", 0))
    return float(t.quant.scale[0]), t.zero_point + offset, offset


def add_table(a_t, b_t, y_t) -> np.ndarray:
    """QLinearAdd's result for every pair of int8 codes of tensors a_t, b_t (int8 [65536],
    pairwise.every_pair order), output y_t, computed on the stored codes."""
    (sa, za, oa), (sb, zb, ob), (sc, zc, oc) = _stored(a_t), _stored(b_t), _stored(y_t)
    ra, rb = _F32(_F32(sa) / _F32(sc)), _F32(_F32(sb) / _F32(sc))
    # ORT's build contracts rA * za + rB * zb into one fused multiply-add (measured against ORT 1.32
    # on every pair of 24 uint8 models, whose large zero points show it; two roundings miss 2 pairs).
    fixed = _F32(_F32(zc) - _fma32(ra, _F32(za), _F32(rb * _F32(zb))))
    a, b = every_pair()
    c = _fma32((a + oa).astype(np.float32), ra, _fma32((b + ob).astype(np.float32), rb, fixed))
    with np.errstate(invalid="ignore"):
        return (np.clip(np.rint(c), -128 + oc, 127 + oc) - oc).astype(np.int8)


def mul_table(a_t, b_t, y_t) -> np.ndarray:
    """QLinearMul's result for every pair of int8 codes, as ORT 1.32 computes it on x86 (measured
    against it on every pair: the zero point is added in float32 before the rounding):
    rint(float32(float32((a - za) * (b - zb)) * (sa * sb / sc)) + zc), saturated."""
    sa, sb, (sc, zc, oc) = a_t.scale, b_t.scale, _stored(y_t)  # the centred codes need no offset
    ratio = _F32(_F32(_F32(sa) * _F32(sb)) / _F32(sc))
    a, b = every_pair()
    product = ((a - a_t.zero_point) * (b - b_t.zero_point)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        c = (product * ratio).astype(np.float32) + _F32(zc)
        return (np.clip(np.rint(c), -128 + oc, 127 + oc) - oc).astype(np.int8)
