"""`npusim validate --report DIR`: index.html with the tables and PNG plots beside it.

Plots (matplotlib, imported here only, on its Agg canvas without pyplot, so the host process's
backend and figures are left alone): sqnr.png, the local and propagated SQNR of every layer along
the depth of the network; error_<k>.png, the histogram of output k's error ref - int8; worst.png,
the int8 output of the layer with the worst local SQNR against its float form.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np

from ..errors import NpusimError
from .atomic import replacing, write_text
from .metrics import NAMES
from .validate import Validation, _num, _sat, worst_layers

SCATTER_POINTS = 20000  # a scatter of more points says nothing more and makes a heavy PNG


def _figure(width=7.0, height=3.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _plain(text: str) -> str:
    """A name from the model file as matplotlib draws it: literally. Its mathtext would read
    `$...$` as a formula (and raise on one it cannot parse, leaving the report half-written)."""
    return text.replace("$", r"\$")


def _save(fig, path: Path):
    with replacing(path) as f:  # whole or not at all (npusim/app/atomic.py)
        fig.savefig(f, format="png")


def _finite(values, cap: float) -> np.ndarray:
    """SQNR values for plotting: +inf (an exact layer) drawn at the cap, None as NaN (a gap)."""
    v = np.array([np.nan if x is None else x for x in values], dtype=np.float64)
    return np.where(np.isposinf(v), cap, v)


def plot_sqnr(result: Validation, path: Path):
    local = [r["local"]["sqnr_db"] for r in result.layers]
    prop = [r["propagated"]["sqnr_db"] if r["propagated"] else None for r in result.layers]
    finite = [v for v in local + prop if v is not None and math.isfinite(v)]
    cap = (max(finite) if finite else 0.0) + 10.0
    fig = _figure(9.0, 4.0)
    ax = fig.add_subplot()
    x = np.arange(len(result.layers))
    ax.plot(x, _finite(local, cap), "o-", ms=4, label="local (the layer's own error)")
    ax.plot(x, _finite(prop, cap), "s--", ms=4, label="propagated (against the reference)")
    ax.axhline(cap, color="0.8", lw=0.8)
    ax.text(0, cap, " exact (inf)", va="bottom", fontsize=7, color="0.5")
    ax.set_xticks(x)
    ax.set_xticklabels([f"{r['op']} {r['kind']}" for r in result.layers], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("SQNR (dB)")
    ax.set_title("SQNR along the depth of the network")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)


def plot_error(k: int, name: str, ref: np.ndarray, got: np.ndarray, path: Path):
    fig = _figure()
    ax = fig.add_subplot()
    ax.hist(ref - got, bins=60, color="C0")
    ax.set_xlabel("error ref - int8")
    ax.set_ylabel("elements")
    ax.set_title(f"output {k} ({_plain(name[:50])}): error histogram", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def plot_worst(record: dict, float_out: np.ndarray, int8_out: np.ndarray, path: Path):
    step = max(1, float_out.size // SCATTER_POINTS)
    f, q = float_out[::step], int8_out[::step]
    fig = _figure(5.0, 5.0)
    ax = fig.add_subplot()
    ax.scatter(f, q, s=3, alpha=0.4)
    lo, hi = float(min(f.min(), q.min())), float(max(f.max(), q.max()))
    ax.plot([lo, hi], [lo, hi], color="C1", lw=1)
    ax.set_xlabel("float form on the int8 inputs")
    ax.set_ylabel("int8 output, dequantized")
    ax.set_title(
        f"worst layer: op {record['op']} {record['kind']}, local SQNR {_num(record['local']['sqnr_db'])} dB",
        fontsize=9,
    )
    fig.tight_layout()
    _save(fig, path)


def _html_table(head: list, rows: list) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def report_directory(directory) -> Path:
    """DIR, created; checked before the run so that a bad --report fails before the work."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NpusimError(f"--report {directory}: cannot create ({e.strerror}: {e.filename})") from None
    return d


def write_report(result: Validation, directory) -> Path:
    """Write DIR/index.html and its PNGs; returns the index path."""
    d = report_directory(directory)
    try:
        plot_sqnr(result, d / "sqnr.png")
        for k, ((ref, got), o) in enumerate(zip(result.output_pairs, result.outputs)):
            plot_error(k, o["name"], ref, got, d / f"error_{k}.png")
        if result.worst_pair is not None:
            plot_worst(*result.worst_pair, d / "worst.png")
        page = _page(result)
        write_text(d / "index.html", page)
    except OSError as e:
        raise NpusimError(f"--report {directory}: cannot write ({e.strerror}: {e.filename})") from None
    return d / "index.html"


def _page(result: Validation) -> str:
    outputs = _html_table(
        ["index", "name", *NAMES],
        [[o["index"], o["name"], *(_num(o[k]) for k in NAMES)] for o in result.outputs],
    )
    beside = any("tflm_propagated" in r for r in result.layers)  # --profile neural-art
    layer_rows = []
    for r in result.layers:
        p, t, steps = r["propagated"], r.get("tflm_propagated"), r.get("propagated_steps")
        span = r.get("range")
        layer_rows.append(
            [r["op"], r["kind"], r["tensor"]]
            + [_num(r["local"][k]) for k in ("sqnr_db", "cos", "max_abs", "mean_error", "std_error")]
            + [_num(p[k]) if p else "-" for k in ("sqnr_db", "cos", "max_abs")]
            + ([_num(t["sqnr_db"]) if t else "-"] if beside else [])
            + [_num(steps["rmse"]) if steps else "-", _num(r.get("scale"))]
            + [f"[{_num(span[0])}, {_num(span[1])}]" if span else "-", _sat(r)]
        )
    layers = _html_table(
        [
            "op",
            "kind",
            "tensor",
            "local sqnr_db",
            "local cos",
            "local max_abs",
            "local mean_error",
            "local std_error",
            "propagated sqnr_db",
            "propagated cos",
            "propagated max_abs",
            *(["tflm propagated sqnr_db"] if beside else []),
            "propagated rmse (output steps)",
            "scale",
            "range seen",
            "saturated",
        ],
        layer_rows,
    )
    worst = ", ".join(
        f"op {r['op']} {r['kind']} ({_num(r['local']['sqnr_db'])} dB)" for r in worst_layers(result, 5)
    )
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>npusim validate</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}img{max-width:100%}</style>",
        "</head><body>",
        "<h1>npusim validate</h1>",
        f"<p>{result.samples} samples; reference: {html.escape(result.reference)}. "
        f"Worst layers by local SQNR: {html.escape(worst)}.</p>",
    ]
    if result.accuracy is not None:
        a = result.accuracy
        parts.append(
            f"<p>Top-1 accuracy: int8 {a['int8']:.4f}, reference {a['reference']:.4f}, "
            f"agreement {a['agreement']:.4f}.</p>"
        )
    b = result.breaks_first
    if b is not None:
        parts.append(
            f"<p>Breaks first: op {b['op']} ({html.escape(b['kind'])}, {html.escape(b['tensor'])}), where "
            f"the propagated SQNR drops most: {_num(b['sqnr_db_before'])} dB into it, "
            f"{_num(b['sqnr_db'])} dB out (-{_num(b['drop_db'])} dB).</p>"
        )
    if result.agreement is not None:
        parts.append(f"<p>Top-1 agreement of int8 and reference on output 0: {result.agreement:.4f}.</p>")
    parts += [f"<p>Note: {html.escape(n)}</p>" for n in result.notes + result.warnings]
    parts += ["<h2>Outputs</h2>", outputs]
    parts += [
        f"<h3>Output {k}</h3><img src='error_{k}.png' alt='output {k} error histogram'>"
        for k in range(len(result.outputs))
    ]
    parts += ["<h2>SQNR along the depth</h2><img src='sqnr.png' alt='SQNR along the depth'>"]
    if result.worst_pair is not None:
        parts.append("<h2>Worst layer</h2><img src='worst.png' alt='worst layer: int8 against float'>")
    if result.unmatched_float:
        listed = ", ".join(f"{i} ({k})" for i, k in result.unmatched_float)
        parts.append(f"<p>Float model ops matched to no int8 op: {html.escape(listed)}</p>")
    parts += ["<h2>Layers</h2>", layers, "</body></html>"]
    return "\n".join(parts) + "\n"
