"""The study's report, generated from the run directories: CSV, Markdown table and PNG plots."""

from __future__ import annotations

import csv
import datetime
import json
import platform
from pathlib import Path

import numpy as np


def read_run(run_dir: Path, device_ms: bool = False) -> dict:
    """A run's evaluations against its clock: forward passes, or with device_ms the estimated STM32N6
    milliseconds it had spent (a cell budgeted in device time, --budget-ms)."""
    evals, qs = [], []
    with open(run_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row["test_accuracy"]:
                clock = 1e3 * float(row["device_seconds"]) if device_ms else int(row["forward_passes"])
                evals.append((clock, float(row["test_accuracy"])))
            if row["train_loss"]:
                qs.append((int(row["forward_passes"]), int(row["q"])))
    result = json.loads((run_dir / "result.json").read_text())
    return {"evals": np.array(evals, dtype=np.float64), "q": np.array(qs, dtype=np.float64), **result}


def passes_to_reach(evals: np.ndarray, target: float) -> float:
    hit = np.nonzero(evals[:, 1] >= target)[0]
    return float(evals[hit[0], 0]) if hit.size else float("nan")


def area_under_curve(evals: np.ndarray, budget: int) -> float:
    """Mean test accuracy over the budget (trapezoids on the evaluation points, normalized)."""
    x, y = evals[:, 0], evals[:, 1]
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / budget)


def paired_interval(diffs: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences (one per seed) with its two-sided t confidence interval."""
    from scipy import stats

    diffs = np.asarray(diffs, dtype=np.float64)
    mean = float(diffs.mean())
    if diffs.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, diffs.size - 1) * diffs.std(ddof=1) / np.sqrt(diffs.size))
    return mean, mean - half, mean + half


def run_dir(runs_dir: Path, cell, scheduler: str, seed: int) -> Path:
    return runs_dir / cell.folder / scheduler.replace(":", "-") / f"seed{seed}"


def complete(grid, runs_dir: Path):
    """(the grid reduced to its cells whose runs have all finished, [(cell, runs done, runs)] of the rest):
    a sweep still running, or resumed across sessions, reports what it has and names what it lacks."""
    from dataclasses import replace

    done, pending = [], []
    for cell in grid.cells:
        n = sum(
            (run_dir(runs_dir, cell, s, seed) / "result.json").exists()
            for s in grid.schedulers
            for seed in grid.seeds
        )
        total = len(grid.schedulers) * len(grid.seeds)
        (done.append(cell) if n == total else pending.append((cell, n, total)))
    return replace(grid, cells=tuple(done)), pending


FLAT_POINTS = 1.0  # a budget is long enough when the best fixed q gains less than this over its last third


def late_gain(runs: list[dict], budget: int) -> float:
    """The seeds' mean test accuracy at the end minus at two thirds of the budget (the evaluation
    nearest it): how much the curve still rises over the last third."""
    gains = []
    for r in runs:
        x, y = r["evals"][:, 0], r["evals"][:, 1]
        gains.append(y[-1] - y[np.argmin(np.abs(x - 2 * budget / 3))])
    return float(np.mean(gains))


def is_constant_q(scheduler: str) -> bool:
    return scheduler.startswith("fixed:") and "@" not in scheduler


def summarize(grid, runs_dir: Path) -> list[dict]:
    """One row per (cell, scheduler). Every scheduler of a cell ran on the same seeds, and a seed fixes
    the mini-batch and the directions of each step (zo.trainer), so differences are paired by seed:
    gap_to_best_fixed is the mean over seeds of (this scheduler - the best fixed q in hindsight)."""
    rows = []
    for cell in grid.cells:
        device = getattr(cell, "budget_ms", None) is not None
        budget = cell.budget_ms if device else cell.budget
        runs = {
            s: [read_run(run_dir(runs_dir, cell, s, seed), device) for seed in grid.seeds]
            for s in grid.schedulers
        }
        finals = {s: np.array([r["test_accuracy"] for r in rs]) for s, rs in runs.items()}
        aucs = {s: np.array([area_under_curve(r["evals"], budget) for r in rs]) for s, rs in runs.items()}
        # constant q at the default lr; "fixed:Q@VARIANT" runs are baselines (study.variant_options)
        fixed = [s for s in grid.schedulers if is_constant_q(s)] or list(grid.schedulers)
        best_fixed = max(fixed, key=lambda s: finals[s].mean())
        worst_fixed = min(fixed, key=lambda s: finals[s].mean())
        best = max(v.mean() for v in finals.values())
        start = float(np.mean([r["evals"][0, 1] for rs in runs.values() for r in rs]))
        # The study's second criterion: every constant q more than 1 point below the cell's best run.
        constants_behind = all(finals[f].mean() < best - 0.01 for f in fixed if is_constant_q(f))
        for s, rs in runs.items():
            reach = np.array([passes_to_reach(r["evals"], 0.95 * best) for r in rs])
            gap, gap_lo, gap_hi = paired_interval(finals[s] - finals[best_fixed])
            rows.append(
                {
                    "cell": cell.name,
                    "role": cell.role,
                    "scheduler": s,
                    "final_accuracy_mean": finals[s].mean(),
                    "final_accuracy_std": finals[s].std(),
                    "best_fixed": best_fixed,
                    "start_accuracy": start,
                    "best_run_accuracy": best,
                    "constants_behind": constants_behind,
                    "gap_to_best_fixed": gap,
                    "gap_ci_low": gap_lo,
                    "gap_ci_high": gap_hi,
                    "fixed_spread": finals[best_fixed].mean() - finals[worst_fixed].mean(),
                    "best_fixed_late_gain": late_gain(runs[best_fixed], budget),
                    "passes_to_95pct_best_mean": float(np.nanmean(reach))
                    if np.isfinite(reach).any()
                    else float("nan"),
                    "seeds_reaching_95pct": int(np.isfinite(reach).sum()),
                    "seeds": len(rs),
                    "auc": float(aucs[s].mean()),
                    "auc_best_fixed": float(aucs[best_fixed].mean()),
                    "mean_q": float(
                        np.mean(
                            [
                                np.sum(r["q"][:, 1] * 2 * r["q"][:, 1]) / max(np.sum(2 * r["q"][:, 1]), 1)
                                for r in rs
                            ]
                        )
                    ),
                    "budget": budget,
                    "wall_seconds_mean": float(np.mean([r["wall_seconds"] for r in rs])),
                }
            )
    return rows


ROLES = ("design", "evaluation")
ROLE_TITLES = {
    "design": "Design cells (the rule and its defaults were chosen on these)",
    "evaluation": "Evaluation cells (the claim is judged on these only)",
}
ADAPTIVE_Q_PLOTTED = ("qscheduler", "slope", "coupled", "snr", "efficiency")


def below_head(bound: dict) -> str:
    """What the bound reaches with the layers below the head restricted (study.backprop_bounds)."""
    if "tail" in bound:  # v5: the exact tail alone (experiments/study/v5_bounds.py)
        frozen, tail = (fmt_pct(bound[k]["int8_test_accuracy"]) for k in ("frozen", "tail"))
        return (
            f" Int8, the head alone: {frozen}%; the exact tail alone (the layers below it frozen): {tail}%."
        )
    if "subspace" not in bound:
        return ""
    frozen, subspace = (fmt_pct(bound[k]["int8_test_accuracy"]) for k in ("frozen", "subspace"))
    return (
        f" Int8, the head alone (the layers below frozen): {frozen}%;"
        f" the layers below moved only along ZO's subspace: {subspace}%."
    )


def budget_text(cell) -> str:
    ms = getattr(cell, "budget_ms", None)
    if ms is None:
        return f"{cell.budget} passes"
    return f"{ms:g} ms of estimated STM32N6 time (--budget-ms; 'passes to 95%' in ms too)"


def cell_table(cell, rows: list[dict], bound: dict | None) -> list[str]:
    first = rows[0]
    lines = [
        f"### {cell.name}",
        "",
        f"{cell.model} on {cell.data}, trainable `{cell.trainable}` ({cell.describe_settings()}), "
        f"batch {cell.batch}, budget {budget_text(cell)}. Best fixed q in hindsight: "
        f"{first['best_fixed']}; spread between the best and the worst fixed q: "
        f"{100 * first['fixed_spread']:.1f} points. The best fixed q gains "
        f"{100 * first['best_fixed_late_gain']:+.1f} points over the last third of the budget: "
        + ("flattened" if first["best_fixed_late_gain"] < FLAT_POINTS / 100 else "NOT flattened")
        + f" (criterion: under {FLAT_POINTS:g} point)."
        + f" Forward-only start (the fitted head, first evaluation): {fmt_pct(first['start_accuracy'])}%;"
        + f" best run {fmt_pct(first['best_run_accuracy'])}%; every constant q more than 1 point below it: "
        + ("yes" if first["constants_behind"] else "no")
        + "."
        + (
            " Back-propagation bound (same layers, float): "
            f"{fmt_pct(bound['float_test_accuracy'])}%, written back to int8 with the fixed scales: "
            f"{fmt_pct(bound['int8_test_accuracy'])}%." + below_head(bound)
            if bound
            else ""
        ),
        "",
        "| scheduler | final accuracy | gap to best fixed [95% CI] | AUC (mean acc) | passes to 95% of "
        "best | seeds reaching | mean q | s / run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scheduler']} | {fmt_pct(r['final_accuracy_mean'])} "
            f"± {100 * r['final_accuracy_std']:.1f} | "
            f"{fmt_gap(r)} | {fmt_pct(r['auc'])} | {fmt_passes(r['passes_to_95pct_best_mean'])} | "
            f"{r['seeds_reaching_95pct']}/{r['seeds']} | {r['mean_q']:.1f} | {r['wall_seconds_mean']:.0f} |"
        )
    return lines + [""]


def fmt_gap(r: dict) -> str:
    if r["scheduler"] == r["best_fixed"]:
        return "0 (best)"
    ci = (
        f" [{100 * r['gap_ci_low']:+.1f}, {100 * r['gap_ci_high']:+.1f}]"
        if np.isfinite(r["gap_ci_low"])
        else ""
    )
    return f"{100 * r['gap_to_best_fixed']:+.1f}{ci}"


def verdict(grid, rows: list[dict]) -> list[str]:
    """Per role: every adaptive rule against the best fixed q in hindsight over the cells, then the
    claim for the headline scheduler: its mean final accuracy within 1 point of the best fixed q in
    every cell, and its AUC at least the best fixed q's in most cells."""
    lines = []
    adaptive = [s for s in grid.schedulers if not is_constant_q(s)]
    for role in ROLES:
        cells = [c.name for c in grid.cells if c.role == role]
        if not cells or not adaptive:
            continue
        lines += [
            f"## Verdict: {role} cells ({len(cells)})",
            "",
            "| scheduler | mean gap to best fixed | cells within 1 point | of those with a fixed-q spread "
            ">= 5 points | cells with AUC >= best fixed |",
            "|---|---|---|---|---|",
        ]
        for s in adaptive:
            mine = [r for r in rows if r["cell"] in cells and r["scheduler"] == s]
            within = [r["gap_to_best_fixed"] >= -0.01 for r in mine]
            wide = [w for w, r in zip(within, mine) if r["fixed_spread"] >= 0.05]
            gap = 100 * np.mean([r["gap_to_best_fixed"] for r in mine])
            auc = sum(r["auc"] >= r["auc_best_fixed"] for r in mine)
            lines.append(
                f"| {s} | {gap:+.1f} | {sum(within)}/{len(mine)} | {sum(wide)}/{len(wide)} | "
                f"{auc}/{len(mine)} |"
            )
        mine = [r for r in rows if r["cell"] in cells and r["scheduler"] == grid.headline]
        if mine:
            met = all(r["gap_to_best_fixed"] >= -0.01 for r in mine)
            auc = sum(r["auc"] >= r["auc_best_fixed"] for r in mine)
            if grid.auc_goal:
                goal = "within 1 point of the best fixed q in every cell, AUC at least the best fixed q's "
                goal += "in most"
                met = met and 2 * auc > len(mine)
            else:
                goal = "within 1 point of the best constant q in every cell"
            lines += ["", f"Goal for `{grid.headline}` ({goal}): {'met' if met else 'not met'}."]
            lines += [
                f"- {r['cell']}: {fmt_pct(r['final_accuracy_mean'])}% vs {r['best_fixed']} "
                f"{fmt_pct(r['final_accuracy_mean'] - r['gap_to_best_fixed'])}%, gap {fmt_gap(r)}; AUC "
                f"{fmt_pct(r['auc'])} vs {fmt_pct(r['auc_best_fixed'])}; fixed-q spread "
                f"{100 * r['fixed_spread']:.1f} points."
                for r in mine
            ]
            behind = [r["cell"] for r in mine if r["constants_behind"]]
            lines.append(
                f"- Cells where every constant q is more than 1 point below the cell's best run: "
                f"{', '.join(behind) if behind else 'none'}."
            )
        lines.append("")
    return lines


def fmt_passes(v: float) -> str:
    return "n/a" if not np.isfinite(v) else str(int(v))


def fmt_pct(v: float) -> str:
    return "n/a" if not np.isfinite(v) else f"{100 * v:.1f}"


def write_report(
    grid,
    runs_dir: Path,
    results: Path,
    bounds=None,
    command: str = "",
    sweep_seconds: float | None = None,
):
    """bounds: None, or a function of the grid of finished cells giving each cell's back-propagation
    bound (study.backprop_bounds)."""
    results.mkdir(parents=True, exist_ok=True)
    grid, pending = complete(grid, runs_dir)
    if not grid.cells:
        print("no cell has finished all its runs yet: no report")
        return
    rows = summarize(grid, runs_dir)
    bounds = bounds(grid) if bounds else {}
    with open(results / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [
        f"# QScheduler study ({len(grid.cells)} cells, {len(grid.seeds)} seed(s) per configuration)",
        "",
        f"Generated by `{command}` on {datetime.date.today()} ({platform.machine()}, "
        f"{__import__('os').cpu_count()} cores)"
        + (f"; sweep wall time {sweep_seconds / 60:.1f} min" if sweep_seconds else "")
        + ".",
        "Accuracies in %, mean ± std over seeds; passes = forward passes of one mini-batch. Gap: the mean"
        " over seeds of (scheduler - best fixed q in hindsight), paired by seed (a seed fixes every step's"
        " mini-batch and directions), with a 95% t interval. AUC: mean test accuracy over the budget.",
        "",
    ]
    for role in ROLES:
        cells = [c for c in grid.cells if c.role == role]
        if cells:
            lines += [f"## {ROLE_TITLES[role]}", ""]
        for cell in cells:
            lines += cell_table(cell, [r for r in rows if r["cell"] == cell.name], bounds.get(cell.name))
    lines += verdict(grid, rows)
    if pending:
        lines += ["## Pending cells (not in the tables or the verdict)", ""] + [
            f"- {c.name} ({c.role}): {n} of {total} runs done; run the same command again to resume."
            for c, n, total in pending
        ]
    (results / "table.md").write_text("\n".join(lines))
    plot(grid, runs_dir, results)
    print("\n".join(lines))


def update_readme(readme: Path, table: Path, begin="<!-- study:begin -->", end="<!-- study:end -->"):
    """Put the generated table into a Markdown page (docs/study.md) between the markers (numbers are
    never typed by hand)."""
    text = readme.read_text()
    if begin not in text or end not in text:
        return
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    body = table.read_text().replace("\n## ", "\n### ")
    body = body.split("\n", 1)[1] if body.startswith("# ") else body
    readme.write_text(f"{head}{begin}\n{body.strip()}\n{end}{tail}")


def plot(grid, runs_dir: Path, results: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(grid.cells)
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), squeeze=False)
    fig_q, axes_q = plt.subplots(1, n, figsize=(5 * n, 3), squeeze=False)
    for ax, ax_q, cell in zip(axes[0], axes_q[0], grid.cells):
        for s in grid.schedulers:
            runs = [read_run(run_dir(runs_dir, cell, s, seed)) for seed in grid.seeds]
            length = min(len(r["evals"]) for r in runs)
            x = runs[0]["evals"][:length, 0]
            y = np.mean([r["evals"][:length, 1] for r in runs], axis=0)
            style = "-" if s.startswith("fixed") else "--"
            ax.plot(x, 100 * y, style, lw=2.5 if s == grid.headline else 1.2, label=s)
            if s in ADAPTIVE_Q_PLOTTED:  # the rules that decide from the run, seed by seed
                for r in runs:
                    ax_q.step(
                        r["q"][:, 0],
                        r["q"][:, 1],
                        where="post",
                        lw=1,
                        color=f"C{ADAPTIVE_Q_PLOTTED.index(s)}",
                        label=s if r is runs[0] else None,
                    )
        ax.set_title(cell.name)
        ax.set_xlabel("forward passes")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax_q.set_title(f"{cell.name}: q of the adaptive rules, every seed")
        ax_q.set_xlabel("forward passes")
        ax_q.set_ylabel("q")
        ax_q.set_yscale("log", base=2)
        ax_q.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    axes_q[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(results / "accuracy_vs_passes.png", dpi=90)
    fig_q.tight_layout()
    fig_q.savefig(results / "adaptive_q.png", dpi=90)
    plt.close("all")
