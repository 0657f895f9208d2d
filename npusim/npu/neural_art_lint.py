"""`npusim inspect --target stm32n6 --lint`: the layers where the Neural-ART datapath, as ST's
compiler configures it (npu/neural_art.py), loses precision that TFLM keeps, each with its reason
and the size of the error it predicts, in output steps (LSB of the layer's int8 output) on top of
the half step every int8 output rounds to.

* ADD: the coefficients A and B normalised to 16 bits and the constant C; the error is measured by
  running the ARITH over all 256 x 256 input pairs under the chosen options (--n6-rounding,
  --n6-add-products) against the exact real result: exact, not a bound.
* CONV_2D / DEPTHWISE_CONV_2D: the 16-bit CONVACC output saturating before the layer's int8 output
  range ends (the accumulator its calibrated range needs, over 32767 * 2^S), the rounding step of
  that output (2^S accumulator units, M * 2^S output steps), and a per-channel scale spread that
  leaves a channel's A with few bits (A = M[c] * 2^T, T set by the largest M; the error is A's
  relative error times the output steps the channel can reach). Near-dead channels (weights that
  move the output by under half a step: a constant output) are said as such, with no error, and
  left out of the three. Each warning says its remedy.
"""

from __future__ import annotations

import numpy as np

from ..kernels import neural_art as units
from .neural_art import N6Options, graph_stages

DEFAULT = N6Options()
THRESHOLD = 0.5  # output steps of predicted error beyond the final rounding that make a warning


def add_error(stage: dict, sx, zx, sy, zy, so, zo, options: N6Options = DEFAULT) -> dict:
    """The ADD's ARITH over every pair of int8 inputs against the exact real sum, in output steps:
    {"max": worst |error|, "rms": ..., "excess": max - 0.5 (what the datapath adds to rounding)}."""
    grid = np.arange(-128, 128, dtype=np.int8)
    x = np.repeat(grid, 256)
    y = np.tile(grid, 256)
    lo, hi = -128, 127
    out = units.arith_add(
        x,
        y,
        np.int64(stage["A_scalar"]),
        np.int64(stage["B_scalar"]),
        np.int64(stage["C_scalar"]),
        stage["Ax_shift"],
        stage["By_shift"],
        stage["C_shift"],
        stage["shift_o"],
        units.ROUNDING_IDS[options.rounding],
        options.add_products == "rounded",
        lo,
        hi,
        np.empty(x.size, np.int64),
    )
    exact = (sx * (x.astype(np.float64) - zx) + sy * (y.astype(np.float64) - zy)) / so + zo
    inside = (exact >= lo - 0.5) & (exact <= hi + 0.5)  # saturation is TFLM's too
    err = np.abs(out - exact)[inside]
    worst = float(err.max()) if err.size else 0.0
    rms = float(np.sqrt(np.mean(err**2))) if err.size else 0.0
    worst, rms = round(worst, 9), round(rms, 9)  # float noise of the exact sum
    return {"max": worst, "rms": rms, "excess": round(worst - 0.5, 9)}


def _add_findings(graph, op, stage, options) -> list[dict]:
    t = graph.tensors
    x, y, o = t[op.inputs[0]], t[op.inputs[1]], t[op.outputs[0]]
    e = add_error(stage, x.scale, x.zero_point, y.scale, y.zero_point, o.scale, o.zero_point, options)
    if e["excess"] < THRESHOLD:
        return []
    ratio = max(x.scale, y.scale) / min(x.scale, y.scale)
    small = "B" if y.scale < x.scale else "A"
    how = f"(add products {options.add_products}, rounding {options.rounding})"
    why = (
        f"ADD of inputs {ratio:.3g}x apart in scale: the smaller input's term (coefficient {small}) "
        f"loses precision in the ARITH {how}"
        if ratio >= 2
        else f"ADD: the ARITH's rounding {how}"
    )
    return [
        {
            "reason": why,
            "predicted_error_steps": round(e["max"], 3),
            "rms_error_steps": round(e["rms"], 3),
        }
    ]


def _conv_findings(graph, op, stages) -> list[dict]:
    t = graph.tensors
    x, w, o = t[op.inputs[0]], t[op.inputs[1]], t[op.outputs[0]]
    convacc, requant = stages[1], stages[2:]
    # the per-channel A is the first requantizing ARITH's (3.0's off_bias, 2.x's mul_scale); the
    # later ones (2.x's off_bias: one A2 for every channel) scale all channels alike
    a = np.asarray(requant[0]["A_vector"], np.float64)
    total = convacc["shift_o"] + sum(st["shift_o"] for st in requant)
    for st in requant[1:]:
        total -= np.log2(np.asarray(st["A_vector"], np.float64))
    m = np.float64(x.scale) * np.asarray(w.quant.scale, np.float64) / np.float64(o.scale)
    m = np.broadcast_to(m, a.shape)
    found = []
    # 1. the 16-bit CONVACC output saturates inside the layer's calibrated output range
    b = (
        np.zeros(a.size)
        if len(op.inputs) < 3 or op.inputs[2] < 0
        else t[op.inputs[2]].data.astype(np.float64)
    )
    need = np.maximum(np.abs((-128 - o.zero_point) / m - b), np.abs((127 - o.zero_point) / m - b))
    data = np.asarray(w.data, np.int64)
    per = (
        data.reshape(-1, data.shape[-1]).T
        if op.kind == "DEPTHWISE_CONV_2D"
        else data.reshape(data.shape[0], -1)
    )
    reach = 255.0 * np.maximum(np.maximum(per, 0).sum(1), -np.minimum(per, 0).sum(1))
    # a near-dead channel: its weights can move its output by less than half a step, whatever the
    # input (a weight scale of 1e-8 next to 1e-3): its output is its bias, constant, on the NPU as
    # in TFLM; no warning below is about it
    live = reach * m >= 0.5
    dead = np.flatnonzero(~live)
    if dead.size:
        found.append(
            {
                "reason": f"{dead.size} of {a.size} channels near-dead (channel {int(dead[0])}"
                f"{', ...' if dead.size > 1 else ''}): their weights move the output by at most "
                f"{float((reach * m)[dead].max()):.2g} steps, so it is constant (the bias); nothing the "
                "datapath loses. Remedy, if unintended: retrain or prune them",
                "predicted_error_steps": 0.0,
                "near_dead_channels": [int(c) for c in dead],
            }
        )
    cap = 32767.0 * 2.0 ** convacc["shift_o"]
    lost = np.where(live, (np.minimum(need, reach) - cap) * m, 0.0)
    if lost.max() >= THRESHOLD:
        c = int(lost.argmax())
        found.append(
            {
                "reason": f"the 16-bit CONVACC output (shift {convacc['shift_o']}) can saturate inside the "
                f"layer's output range: channel {c} can need {np.minimum(need, reach)[c]:.0f} accumulator "
                f"units (worst case of its weights and output range), 16 bits hold {cap:.0f}. Remedy: "
                "kernels whose weights cancel less (the compiler sizes the shift for |sum of weights| "
                "x 256), a narrower output range, or this layer on the M55",
                "predicted_error_steps": round(float(lost.max()), 3),
            }
        )
    # 2. the CONVACC output's rounding step, in output steps
    step = np.where(live, 0.5 * 2.0 ** convacc["shift_o"] * m, 0.0)
    if step.max() >= THRESHOLD:
        found.append(
            {
                "reason": f"the CONVACC rounds the accumulator to 2^{convacc['shift_o']} units before "
                f"the scale: up to {step.max():.3g} output steps (channel {int(step.argmax())}). Remedy: "
                "a larger output scale for this layer, smaller weight sums, or this layer on the M55",
                "predicted_error_steps": round(float(step.max()), 3),
            }
        )
    # 3. a per-channel scale spread a 16-bit A cannot hold: the multiplier's error over the
    # accumulator the channel can reach inside its output range
    rel = np.abs(a / 2.0**total - m) / np.maximum(m, 1e-30)
    coarse = np.where(live, rel * np.minimum(need, reach) * m, 0.0)
    if coarse.max() >= THRESHOLD:
        c = int(coarse.argmax())
        found.append(
            {
                "reason": f"per-channel scale spread {m[live].max() / max(m[live].min(), 1e-30):.3g}x: "
                f"channel {c}'s A = {int(a[c])} keeps {max(int(a[c]), 1).bit_length()} bits at the shift "
                "the largest scale sets. Remedy: weight scales within a narrower range (per-channel "
                "quantization with a floor on the scale), or this layer on the M55",
                "predicted_error_steps": round(float(coarse.max()), 3),
            }
        )
    return found


def lint(graph, options: N6Options = DEFAULT, npu_ops: set | None = None) -> list[dict]:
    """Warnings, each {"op", "kind", "reason", "predicted_error_steps", ...}, in op order. npu_ops:
    the op indices the N6 places on its NPU (default: every op with a derived chain)."""
    out = []
    for index, stages in graph_stages(graph, options).items():
        if npu_ops is not None and index not in npu_ops:
            continue
        op = graph.ops[index]
        if op.kind == "ADD":
            found = _add_findings(graph, op, stages[0], options)
        elif op.kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            found = _conv_findings(graph, op, stages)
        else:
            found = []
        out += [{"op": index, "kind": op.kind, **f} for f in found]
    return out


def lint_lines(findings: list) -> list[str]:
    if not findings:
        return ["Neural-ART precision lint: no layer predicted to lose more than half an output step"]
    lines = [f"Neural-ART precision lint: {len(findings)} warning(s), error in output steps (LSB)"]
    for f in findings:
        lines.append(
            f"  op {f['op']} ({f['kind']}): {f['reason']}; predicted error up to {f['predicted_error_steps']}"
        )
    return lines
