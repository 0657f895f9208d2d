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


def _merge(n: int, mean: float, m2: float, x: np.ndarray) -> tuple[float, float]:
    """The mean and the sum of squared deviations of n values (mean, m2) and the values x together
    (Chan, Golub and LeVeque's pairwise update: no cancellation, whatever the chunking)."""
    k = x.size
    mx = float(x.mean())
    d = x - mx
    m2x = float(d @ d)
    delta, total = mx - mean, n + k
    return mean + delta * k / total, m2 + m2x + delta * delta * n * k / total


class ErrorStats:
    """The metrics of an int8 result against its reference, accumulated chunk by chunk in float64,
    so that a large batch is validated in pieces with the result of the whole."""

    def __init__(self):
        self.n = 0
        self.sum_e2 = self.sum_r2 = self.sum_g2 = self.sum_rg = self.sum_abs = self.max_abs = 0.0
        self.mean_e = self.m2_e = self.mean_r = self.m2_r = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> ErrorStats:
        r = np.asarray(ref, np.float64).ravel()
        g = np.asarray(got, np.float64).ravel()
        if r.shape != g.shape:
            raise ValueError(f"reference has {r.size} elements, the result {g.size}")
        if r.size == 0:
            return self
        e = r - g
        self.sum_e2 += float(e @ e)
        self.sum_r2 += float(r @ r)
        self.sum_g2 += float(g @ g)
        self.sum_rg += float(r @ g)
        abs_e = np.abs(e)
        self.sum_abs += float(abs_e.sum())
        self.max_abs = max(self.max_abs, float(abs_e.max()))
        self.mean_e, self.m2_e = _merge(self.n, self.mean_e, self.m2_e, e)
        self.mean_r, self.m2_r = _merge(self.n, self.mean_r, self.m2_r, r)
        self.n += e.size
        return self

    def result(self) -> dict:
        n = self.n
        if n == 0:
            raise ValueError("no elements to compare")
        sum_e2, sum_r2, sum_g2 = self.sum_e2, self.sum_r2, self.sum_g2
        mse = sum_e2 / n
        var_ref = self.m2_r / (n - 1) if n > 1 else 0.0
        if sum_e2 == 0:
            cos = 1.0
        elif sum_r2 == 0 or sum_g2 == 0:
            cos = 0.0
        else:
            cos = self.sum_rg / math.sqrt(sum_r2 * sum_g2)
        if sum_e2 == 0:
            sqnr = math.inf
        elif sum_r2 == 0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(sum_r2 / sum_e2)
        return {
            "rmse": math.sqrt(mse),
            "mae": self.sum_abs / n,
            "l2r": math.sqrt(_ratio(sum_e2, sum_r2)),
            "cos": cos,
            "nse": 1.0 - _ratio(mse, var_ref),
            "sqnr_db": sqnr,
            "max_abs": self.max_abs,
            "mean_error": self.mean_e,
            "std_error": math.sqrt(self.m2_e / (n - 1)) if n > 1 else 0.0,
        }


def error_metrics(ref: np.ndarray, got: np.ndarray) -> dict:
    """The metrics of `got` (the int8 result, dequantized) against `ref`, in float64."""
    return ErrorStats().add(ref, got).result()


def json_ready(value):
    """Strict JSON has no infinity: a non-finite metric is written as null (docs/validate.md)."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
