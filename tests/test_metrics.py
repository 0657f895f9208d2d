"""npusim.app.metrics against a direct numpy computation of each definition (docs/validate.md), and
the degenerate cases it defines."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from npusim.app.metrics import NAMES, error_metrics, json_ready


def direct(ref, got) -> dict:
    """The issue's definitions, written out with numpy, e = ref - got."""
    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    e = r - g
    return {
        "rmse": np.sqrt(np.mean(e**2)),
        "mae": np.mean(np.abs(e)),
        "l2r": np.linalg.norm(e) / np.linalg.norm(r),
        "cos": np.dot(r, g) / (np.linalg.norm(r) * np.linalg.norm(g)),
        "nse": 1 - np.mean(e**2) / np.var(r, ddof=1),
        "sqnr_db": 10 * np.log10(np.sum(r**2) / np.sum(e**2)),
        "max_abs": np.max(np.abs(e)),
        "mean_error": np.mean(e),
        "std_error": np.std(e, ddof=1),
    }


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("shape", [(7,), (3, 10), (2, 4, 4, 3)])
def test_metrics_equal_their_definitions(seed, shape):
    rng = np.random.default_rng(seed)
    ref = rng.normal(rng.uniform(-2, 2), rng.uniform(0.1, 5), shape).astype(np.float32)
    got = (ref + rng.normal(rng.uniform(-0.1, 0.1), rng.uniform(0.001, 1), shape)).astype(np.float32)
    m, d = error_metrics(ref, got), direct(ref, got)
    assert tuple(m) == NAMES
    for k in NAMES:
        assert m[k] == pytest.approx(float(d[k]), rel=1e-12, abs=1e-15), k


def test_no_error():
    ref = np.array([1.0, -2.0, 3.0], np.float32)
    m = error_metrics(ref, ref.copy())
    assert m["sqnr_db"] == math.inf
    assert (m["rmse"], m["mae"], m["l2r"], m["max_abs"], m["mean_error"], m["std_error"]) == (0,) * 6
    assert m["cos"] == 1.0 and m["nse"] == 1.0


def test_zero_reference():
    zero = np.zeros(4, np.float32)
    m = error_metrics(zero, np.array([0, 1, 0, 0], np.float32))
    assert m["sqnr_db"] == -math.inf and m["l2r"] == math.inf
    assert m["cos"] == 0.0 and m["nse"] == -math.inf
    exact = error_metrics(zero, zero)
    assert exact["sqnr_db"] == math.inf and exact["l2r"] == 0.0
    assert exact["cos"] == 1.0 and exact["nse"] == 1.0


def test_one_element_and_constant_reference():
    m = error_metrics(np.array([2.0]), np.array([1.5]))
    assert m["std_error"] == 0.0 and m["nse"] == -math.inf and m["max_abs"] == 0.5
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(4 / 0.25))
    c = error_metrics(np.full(5, 3.0), np.full(5, 3.0))
    assert c["nse"] == 1.0


def test_no_nan_ever():
    for ref, got in [(np.zeros(3), np.zeros(3)), (np.zeros(3), np.ones(3)), (np.ones(3), np.zeros(3))]:
        m = error_metrics(ref, got)
        assert not any(math.isnan(v) for v in m.values()), m


def test_json_writes_infinities_as_null():
    m = error_metrics(np.ones(3), np.ones(3))
    text = json.dumps(json_ready({"local": m, "rows": [m]}), allow_nan=False)
    back = json.loads(text)
    assert back["local"]["sqnr_db"] is None and back["rows"][0]["sqnr_db"] is None
    assert back["local"]["cos"] == 1.0


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="3 elements, the result 4"):
        error_metrics(np.zeros(3), np.zeros(4))


def test_chunks_accumulate_to_the_whole():
    from npusim.app.metrics import ErrorStats

    rng = np.random.default_rng(9)
    ref = rng.normal(3, 2, 1000)
    got = ref + rng.normal(0.1, 0.3, 1000)
    stats = ErrorStats()
    for lo, hi in ((0, 1), (1, 400), (400, 1000)):
        stats.add(ref[lo:hi], got[lo:hi])
    whole = error_metrics(ref, got)
    for k, v in stats.result().items():
        assert v == pytest.approx(whole[k], rel=1e-12), k
