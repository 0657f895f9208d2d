"""The STM32N6 view against ST's published board figures: the fit of the latency model's constants, the
estimated vs published latency and internal RAM of the calibration models, leave-one-out errors, and
the unseen YOLOv8n input sizes.

    python -m experiments.tables.stm32n6 [--shared DIR] [--readme] [--docs]

Writes experiments/results/stm32n6.md and .json; --readme puts a one-sentence summary into README.md,
--docs the full report into docs/stm32n6.md (between their stm32n6 markers). The fit:
  1. CA_HALF_DEPTH from a grid of six values, each with NPU_EFFICIENCY and EPOCH_OVERHEAD_S refitted
     (npusim.npu.calibration.fit_cost_model); the value with the smallest squared log error wins;
  2. leave-one-out: each model estimated with the constants fitted on the other three, both with
     CA_HALF_DEPTH fixed at the chosen value and nested (the grid re-run without the held-out model);
  3. YOLOv8n detection at 192, 320 and 416 pixels (ST publishes them; their files are not here):
     the 256 graph with every activation and MAC scaled by the area (exact for this fully
     convolutional graph at multiples of 32), against ST's figures; never used in the fit.
The module constants in npusim/npu/cost.py must equal the fitted ones; the script says so when not.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FITTED = ("npu_efficiency", "epoch_overhead_s", "ca_half_depth")
HALF_DEPTH_GRID = (9.0, 18.0, 27.0, 36.0, 54.0, 72.0)
TOLERANCE = 0.25  # the goal: estimates within +-25 % of the published figure

# Figures ST (and one third party) publish for STM32N6570-DK models whose files are not in the shared
# data: a user with the file can check the estimate with `npusim inspect --target stm32n6`.
# (model, file, resolution, ms, internal RAM KiB, ST Edge AI version, source)
ZOO = "STMicroelectronics/stm32ai-modelzoo"
UNSEEN = (
    (
        "YOLOv8n det COCO-person",
        "yolov8n_192_quant_pc_uf_od_coco-person.tflite",
        192,
        16.33,
        270.0,
        "4.0.0",
        f"{ZOO}@e9fc1c2f6c980643a3ad0fcd5650da3580864580:object_detection/yolov8n/README.md",
    ),
    (
        "YOLOv8n det COCO-person",
        "yolov8n_320_quant_pc_uf_od_coco-person.tflite",
        320,
        29.93,
        758.31,
        "4.0.0",
        f"{ZOO}@e9fc1c2f6c980643a3ad0fcd5650da3580864580:object_detection/yolov8n/README.md",
    ),
    (
        "YOLOv8n det COCO-person",
        "yolov8n_416_quant_pc_uf_od_coco-person.tflite",
        416,
        54.67,
        2067.88,
        "4.0.0",
        f"{ZOO}@e9fc1c2f6c980643a3ad0fcd5650da3580864580:object_detection/yolov8n/README.md",
    ),
    (
        "YOLO11n det COCO-person",
        "yolo11n_256_quant_pc_uf_od_coco-person-st.tflite",
        256,
        26.37,
        656.0,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:object_detection/yolov11n/README.md",
    ),
    (
        "YOLO11n pose",
        "yolo11n_256_quant_pc_uf_pose_coco-st.tflite",
        256,
        34.32,
        740.25,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:pose_estimation/yolov11n_pose/README.md",
    ),
    (
        "YOLO11n pose",
        "yolo11n_320_quant_pc_uf_pose_coco-st.tflite",
        320,
        56.15,
        1840.85,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:pose_estimation/yolov11n_pose/README.md",
    ),
    (
        "OSNet 0.25 ReID",
        "osnet_a025_256_128_tfs_int8.tflite",
        "256x128",
        3.53,
        480.0,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:re_identification/osnet/README.md",
    ),
    (
        "OSNet 1.0 ReID",
        "osnet_a100_256_128_tfs_int8.tflite",
        "256x128",
        13.44,
        1440.0,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:re_identification/osnet/README.md",
    ),
    (
        "MobileNetV2 0.35 ReID",
        "mobilenetv2_a035_256_128_fft_int8.tflite",
        "256x128",
        4.15,
        480.0,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:re_identification/mobilenetv2/README.md",
    ),
    (
        "Hand landmarks full",
        "handlandmarks_full_224_int8.tflite",
        224,
        20.75,
        1739.5,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:pose_estimation/handlandmarks/README.md",
    ),
    (
        "st_yoloxn d033_w025 person",
        "st_yoloxn_d033_w025_192_int8.tflite",
        192,
        6.63,
        333.0,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:object_detection/st_yoloxn/README.md",
    ),
    (
        "st_yoloxn d033_w025 person",
        "st_yoloxn_d033_w025_256_int8.tflite",
        256,
        9.42,
        624.0,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:object_detection/st_yoloxn/README.md",
    ),
    (
        "st_yoloxn d033_w025 person",
        "st_yoloxn_d033_w025_320_int8.tflite",
        320,
        13.29,
        1125.0,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:object_detection/st_yoloxn/README.md",
    ),
    (
        "st_yoloxn d033_w025 person",
        "st_yoloxn_d033_w025_416_int8.tflite",
        416,
        21.3,
        2676.12,
        "3.0.0",
        f"{ZOO}@7f3764d58ef8c7bca36116c4d6c12434d2682af7:object_detection/st_yoloxn/README.md",
    ),
    (
        "MoveNet Lightning heatmaps (third party, ST Edge AI 2.1)",
        "st_movenet_lightning_heatmaps_192_int8_pc",
        192,
        22.0,
        1674.0,
        "2.1.0",
        "giacomocolosio02.github.io/stm32n6-docs/casestudies_page.html",
    ),
)
# The unseen figures this script can estimate without the file: the same graph at another size.
AREA_SCALED = {"yolov8n_256_quant_pc_uf_od_coco-person.tflite": (192, 320, 416)}


def fit_all(measurements, structures, half_depth_grid=HALF_DEPTH_GRID):
    """(best Calibration, {half depth: Calibration}) over the grid."""
    from npusim.npu import CostModel, fit_cost_model

    fits = {}
    for d in half_depth_grid:
        fits[d] = fit_cost_model(measurements, CostModel(ca_half_depth=d), structures=structures)

    def sse(cal):
        return sum(math.log(r) ** 2 for r in cal.ratios)

    best = min(fits.values(), key=sse)
    return best, fits, sse


def held_out(measurements, structures, half_depth: float, nested: bool) -> dict:
    """file -> (its estimated ms with the constants fitted on the other models, that fit's half-depth);
    nested: the half-depth re-chosen on the others too (fit_all), else kept at half_depth."""
    from npusim.npu import CostModel, fit_cost_model
    from npusim.npu.calibration import leave_one_out

    def fit(rest, structures):
        if nested:
            return fit_all(rest, structures)[0]
        return fit_cost_model(rest, CostModel(ca_half_depth=half_depth), structures=structures)

    out = leave_one_out(measurements, structures=structures, fit=fit)
    return {held.file: (ms, cal.cost.ca_half_depth) for held, ms, cal in out}


def short_name(row: dict) -> str:
    return (row["model"] or row["file"]).split(" (")[0]


def pct(estimate: float, published: float) -> str:
    return f"{100 * (estimate / published - 1):+.0f} %"


def model_rows(best, loo: dict, nested: dict) -> list[dict]:
    """One row per calibration model: published and estimated latency and RAM, leave-one-out."""
    rows = []
    for m, est, ram in zip(best.measurements, best.estimated_ms, best.internal_ram_kib):
        rows.append(
            {
                "file": m.file,
                "model": m.model,
                "published_ms": m.npu_ms,
                "estimated_ms": est,
                "loo_ms": loo[m.file][0],
                "nested_loo_ms": nested[m.file][0],
                "nested_half_depth": nested[m.file][1],
                "published_internal_ram_kib": m.internal_ram_kib,
                "estimated_internal_ram_kib": ram,
                "stedgeai_version": m.stedgeai_version,
                "source": m.source,
            }
        )
    return rows


def area_scaled_rows(interps: dict, measurements, cost) -> list[dict]:
    """The unseen input sizes of a calibration model (AREA_SCALED), estimated by area, against
    their published figures."""
    from npusim.npu import device_structure
    from npusim.npu.calibration import estimate_ms, measurement_cost

    scaled = []
    for f, sizes in AREA_SCALED.items():
        if f not in interps:
            continue
        base_size = 256
        for size in sizes:
            pub = next(u for u in UNSEEN if u[2] == size and u[0].startswith("YOLOv8n det"))
            s = device_structure(interps[f], (size / base_size) ** 2)
            m = next(x for x in measurements if x.file == f)
            scaled.append(
                {
                    "model": f"{pub[0]} {size} (area-scaled from {f})",
                    "published_ms": pub[3],
                    "estimated_ms": estimate_ms(s, measurement_cost(cost, m)),
                    "published_internal_ram_kib": pub[4],
                    "estimated_internal_ram_kib": s.memory.internal_bytes / 1024,
                    "stedgeai_version": pub[5],
                    "source": pub[6],
                }
            )

    return scaled


def readme_summary(rows: list[dict], scaled: list[dict]) -> str:
    """README's sentence: the largest relative errors, fitted, leave-one-out, unseen and memory."""

    def worst(pairs) -> str:
        return f"{max(abs(e / p - 1) for e, p in pairs) * 100:.0f}%"

    ram = [(r["estimated_internal_ram_kib"], r["published_internal_ram_kib"]) for r in rows + scaled]
    return (
        f"Latency within {worst((r['estimated_ms'], r['published_ms']) for r in rows)} on the "
        f"{len(rows)} models the 3 constants were fitted on (leave-one-out within "
        f"{worst((r['loo_ms'], r['published_ms']) for r in rows)}), within "
        f"{worst((r['estimated_ms'], r['published_ms']) for r in scaled)} on {len(scaled)} unseen input "
        f"sizes; internal RAM within {worst(ram)} (`make stm32n6`, the table: docs/stm32n6.md).\n"
    )


def short_report(rows: list[dict], scaled: list[dict], cost, today: str) -> tuple[list[str], list[str]]:
    """(the short table with its fit summary, the table alone): README's and docs' block."""
    command = "python -m experiments.tables.stm32n6 --shared ../shared --readme --docs"
    short = [
        f"Generated by `{command}` (or `make stm32n6`) on {today}.",
        "",
        "| model | fitted on | unseen | latency est. / published (ms) | leave-one-out "
        "| internal RAM est. / published (KiB) |",
        "|---|---|---|---|---|---|",
    ]
    # "fitted on": the constants saw this model's published latency; "unseen": neither the fit nor
    # the choice of the memory rewrites did (the area-scaled sizes of a calibration model's graph).
    for r in rows:
        short.append(
            f"| {r['model'] or r['file']} | yes | no | {r['estimated_ms']:.1f} / {r['published_ms']:.2f} "
            f"({pct(r['estimated_ms'], r['published_ms'])}) | {pct(r['loo_ms'], r['published_ms'])} | "
            f"{r['estimated_internal_ram_kib']:.0f} / {r['published_internal_ram_kib']:.0f} "
            f"({pct(r['estimated_internal_ram_kib'], r['published_internal_ram_kib'])}) |"
        )
    for r in scaled:
        short.append(
            f"| {r['model'].split(' (')[0]} | no | yes (area-scaled from 256) | {r['estimated_ms']:.1f} / "
            f"{r['published_ms']:.2f} ({pct(r['estimated_ms'], r['published_ms'])}) | not fitted | "
            f"{r['estimated_internal_ram_kib']:.0f} / {r['published_internal_ram_kib']:.0f} "
            f"({pct(r['estimated_internal_ram_kib'], r['published_internal_ram_kib'])}) |"
        )
    versions = sorted({r["stedgeai_version"] for r in rows + scaled})
    newest = f"Published figures: ST Edge AI {', '.join(versions)} (the newest ST gives for each model)."
    short += ["", newest]
    table = list(short)
    short += [
        "",
        f"Fitted on these {len(rows)} models (ST's newest figures in published.csv): NPU efficiency "
        f"{cost.npu_efficiency:.3f} and epoch overhead {cost.epoch_overhead_s * 1e6:.1f} us by least "
        "squares on "
        f"log(estimate / published), accelerator half-depth {cost.ca_half_depth:g} from a grid of "
        f"{len(HALF_DEPTH_GRID)}: 3 fitted constants, {len(rows) - 3} degree of freedom left; every other "
        "constant comes from ST documents (docs/stm32n6.md). Leave-one-out: the model's latency with the "
        "constants fitted on the other models (half-depth kept); nested, with the half-depth re-chosen "
        "too: "
        + ", ".join(f"{short_name(r)} {pct(r['nested_loo_ms'], r['published_ms'])}" for r in rows)
        + ". Internal RAM is not fitted.",
    ]
    return short, table


def full_report(short: list[str], rows, fits: dict, best, sse, measurements, checks: list, cost) -> list[str]:
    """docs/stm32n6.md's calibration section: the short report, the fit step by step, leave-one-out,
    the constants and the published figures the fit never saw."""
    from npusim.npu import COST_CONSTANTS

    full = [
        "## Calibration (generated)",
        "",
        *short,
        "",
        "### The fit, step by step",
        "",
        "| CA half-depth | NPU efficiency | epoch overhead (us) | squared log error | "
        + " | ".join(f"{(m.model or m.file).split(' (')[0]}" for m in measurements)
        + " |",
        "|---|---|---|---|" + "---|" * len(measurements),
    ]
    for d, cal in fits.items():
        mark = " (chosen)" if cal is best else ""
        full.append(
            f"| {d:g}{mark} | {cal.cost.npu_efficiency:.3f} | {cal.cost.epoch_overhead_s * 1e6:.1f} | "
            f"{sse(cal):.4f} | " + " | ".join(f"{r:.2f}" for r in cal.ratios) + " |"
        )
    full += [
        "",
        "Leave-one-out, two ways (estimate / published): with the half-depth fixed at the chosen value "
        "(it saw all models), and nested (the grid re-run on the other models, so the held-out model "
        "informed nothing):",
        "",
        "| model | fixed half-depth | nested | nested half-depth |",
        "|---|---|---|---|",
    ]
    for r in rows:
        full.append(
            f"| {r['file']} | {r['loo_ms'] / r['published_ms']:.2f} | "
            f"{r['nested_loo_ms'] / r['published_ms']:.2f} "
            f"| {r['nested_half_depth']:g} |"
        )
    full += [
        "",
        f"Unseen sizes (never in the fit): {sum(checks)} of {len(checks)} estimates within "
        f"+-{100 * TOLERANCE:.0f} % (latency and internal RAM).",
        "",
        "### The constants",
        "",
        "| constant | value | source |",
        "|---|---|---|",
    ]
    for k, src in COST_CONSTANTS.items():
        v = getattr(cost, k, None)
        if k == "pools":
            from npusim.npu import MEMORY_POOLS

            v = ", ".join(
                f"{p.name} {p.size // 1024} KiB at {p.bytes_per_npu_cycle:g} B/cycle" for p in MEMORY_POOLS
            )
        elif isinstance(v, float):
            v = f"{v:.4g}"
        full.append(f"| `{k}` | {v} | {src} |")
    full += [
        "",
        "### Published figures of models the fit never saw",
        "",
        "| model | file | input | ms | internal RAM (KiB) | ST Edge AI | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for u in UNSEEN:
        full.append(f"| {u[0]} | `{u[1]}` | {u[2]} | {u[3]} | {u[4]} | {u[5]} | {u[6]} |")
    return full


def write_outputs(a, full, table, rows, scaled, fits, sse, cost, today: str) -> None:
    """results/stm32n6.md and .json, and with --readme / --docs the blocks of README.md and
    docs/stm32n6.md."""
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / "stm32n6.md").write_text("# STM32N6 calibration\n\n" + "\n".join(full[2:]) + "\n")
    (a.results / "stm32n6.json").write_text(
        json.dumps(
            {
                "date": today,
                "cost_model": {
                    k: getattr(cost, k) for k in ("npu_efficiency", "epoch_overhead_s", "ca_half_depth")
                },
                "models": rows,
                "area_scaled": scaled,
                "grid": {str(d): {"sse": sse(c), "ratios": c.ratios} for d, c in fits.items()},
            },
            indent=1,
        )
    )
    print("\n".join(full))
    if a.readme:
        from ..study.report import update_readme

        tmp = a.results / "stm32n6_readme.md"
        tmp.write_text(readme_summary(rows, scaled))
        update_readme(ROOT / "README.md", tmp, "<!-- stm32n6:begin -->", "<!-- stm32n6:end -->")
        tmp.unlink()
    if a.docs:
        from ..study.report import update_readme

        body = a.results / "stm32n6_full.md"
        body.write_text("\n".join(full[2:]) + "\n")
        update_readme(ROOT / "docs" / "stm32n6.md", body, "<!-- stm32n6:begin -->", "<!-- stm32n6:end -->")
        body.unlink()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    p.add_argument(
        "--calibration", type=Path, default=None, help="default: SHARED/models/stm32n6/published.csv"
    )
    p.add_argument("--results", type=Path, default=ROOT / "experiments" / "results")
    p.add_argument("--readme", action="store_true", help="put the one-sentence summary into README.md")
    p.add_argument("--docs", action="store_true", help="put the full report into docs/stm32n6.md")
    a = p.parse_args(argv)

    from npusim import Interpreter
    from npusim.npu import CostModel, device_structure, read_calibration_csv

    csv_path = a.calibration or a.shared / "models" / "stm32n6" / "published.csv"
    measurements = read_calibration_csv(csv_path)
    interps = {m.file: Interpreter(str(m.path), warm=False) for m in measurements}
    structures = {f: device_structure(it) for f, it in interps.items()}
    best, fits, sse = fit_all(measurements, structures)
    cost = best.cost
    loo = held_out(measurements, structures, cost.ca_half_depth, nested=False)
    nested = held_out(measurements, structures, cost.ca_half_depth, nested=True)
    default = CostModel()
    stale = [
        f"{k} = {getattr(default, k):.4g} in npusim/npu/cost.py, fitted {getattr(cost, k):.4g}"
        for k in ("npu_efficiency", "epoch_overhead_s", "ca_half_depth")
        if not math.isclose(getattr(default, k), getattr(cost, k), rel_tol=0.02)
    ]
    rows = model_rows(best, loo, nested)
    scaled = area_scaled_rows(interps, measurements, cost)

    def within(e, p):
        return abs(e / p - 1) <= TOLERANCE

    checks = [within(r["estimated_ms"], r["published_ms"]) for r in scaled] + [
        within(r["estimated_internal_ram_kib"], r["published_internal_ram_kib"]) for r in scaled
    ]
    today = date.today().isoformat()
    short, table = short_report(rows, scaled, cost, today)
    full = full_report(short, rows, fits, best, sse, measurements, checks, cost)
    write_outputs(a, full, table, rows, scaled, fits, sse, cost, today)
    for s in stale:
        print(f"warning: {s}; update the module constants", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
