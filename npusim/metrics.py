"""How far an int8 result is from its float reference: the error metrics of `npusim validate`.

With e = ref - int8 (the int8 result dequantized), over all elements (definitions in
docs/validate.md; ST Edge AI's ai_checker and TFLite's QuantizationDebugger use the same ones):
rmse, mae, l2r = ||e|| / ||ref||, cos, nse = 1 - mean(e^2) / var(ref, ddof=1),
sqnr_db = 10 log10(sum ref^2 / sum e^2), max_abs, mean_error (mean of e), std_error (ddof=1).

Degenerate cases are defined, never NaN: no error gives sqnr_db +inf, l2r 0, nse 1 and cos 1
whatever the reference; an error against an all-zero reference gives sqnr_db -inf and l2r +inf; a
reference without variance (constant, or one element) gives nse 1 without error and -inf with one;
a zero vector on one side only gives cos 0; one element gives std_error 0.
"""

from __future__ import annotations

import math

import numpy as np

NAMES = ("rmse", "mae", "l2r", "cos", "nse", "sqnr_db", "max_abs", "mean_error", "std_error")


def _ratio(num: float, den: float) -> float:
    """num / den with 0 / 0 = 0 and x / 0 = inf (num, den >= 0)."""
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def error_metrics(ref: np.ndarray, got: np.ndarray) -> dict:
    """The metrics of `got` (the int8 result, dequantized) against `ref`, in float64."""
    r = np.asarray(ref, np.float64).ravel()
    g = np.asarray(got, np.float64).ravel()
    if r.shape != g.shape:
        raise ValueError(f"reference has {r.size} elements, the result {g.size}")
    e = r - g
    n = e.size
    sum_e2, sum_r2, sum_g2 = float(e @ e), float(r @ r), float(g @ g)
    mse = sum_e2 / n
    var_ref = float(np.var(r, ddof=1)) if n > 1 else 0.0
    if sum_e2 == 0:
        cos = 1.0
    elif sum_r2 == 0 or sum_g2 == 0:
        cos = 0.0
    else:
        cos = float(r @ g) / math.sqrt(sum_r2 * sum_g2)
    if sum_e2 == 0:
        sqnr = math.inf
    elif sum_r2 == 0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(sum_r2 / sum_e2)
    return {
        "rmse": math.sqrt(mse),
        "mae": float(np.mean(np.abs(e))),
        "l2r": math.sqrt(_ratio(sum_e2, sum_r2)),
        "cos": cos,
        "nse": 1.0 - _ratio(mse, var_ref),
        "sqnr_db": sqnr,
        "max_abs": float(np.max(np.abs(e))),
        "mean_error": float(np.mean(e)),
        "std_error": float(np.std(e, ddof=1)) if n > 1 else 0.0,
    }


def json_ready(value):
    """Strict JSON has no infinity: a non-finite metric is written as null (docs/validate.md)."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
