"""The text and the JSON of the STM32N6 view (`npusim inspect --target stm32n6 [--format json]`)."""

from __future__ import annotations

from .cost import M55, NPU, CostModel, DeviceReport, plan_device

# ----------------------------------------------------------------------------------------------
# Text


def kib(n: int) -> str:
    """A byte count as the reports print it: exact bytes and KiB."""
    return f"{n:,} B ({n / 1024:.1f} KiB)"


def _table(rows: list, right: set) -> list:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]


def format_report(dev: DeviceReport, title: str = "", calibration=None) -> str:
    lines = [
        f"STM32N6 Neural-ART view{': ' + title if title else ''}",
        f"cost model: {dev.cost.describe()}",
    ]
    if calibration is not None:
        lines.append(calibration.summary())
    lines.append("")
    rows = [("#", "op", "unit", "epoch", "fused", "MACs", "weights B", "est. us", "bound", "note")]
    for o in dev.ops:
        rows.append(
            (
                str(o.op_index),
                o.kind,
                o.unit,
                str(o.epoch),
                "" if o.role == "layer" else o.role,
                f"{o.macs:,}",
                f"{o.weight_bytes:,}",
                f"{o.seconds * 1e6:.2f}",
                o.bound,
                o.reason,
            )
        )
    lines += _table(rows, {0, 3, 5, 6, 7})
    lines += ["", "epoch blocks (consecutive ops on one unit):"]
    rows = [("block", "unit", "ops", "n", "epochs", "MACs", "weights B", "est. us")]
    for e in dev.epochs:
        rows.append(
            (
                str(e.index),
                e.unit,
                e.op_range,
                str(len(e.ops)),
                str(e.hardware_epochs),
                f"{e.macs:,}",
                f"{e.weight_bytes:,}",
                f"{e.seconds * 1e6:.2f}",
            )
        )
    lines += _table(rows, {0, 3, 4, 5, 6, 7})
    npu, m55 = dev.npu_ops, dev.m55_ops
    npu_macs = sum(o.macs for o in npu)
    a, mem = dev.arena, dev.memory
    pools = ", ".join(
        f"{p.pool.name} {p.used / 1024:.1f}" for p in mem.pools if p.used and not p.pool.virtual
    )
    spanned = [p for p in mem.pools if p.used and p.pool.virtual]
    if spanned:  # buffers no single bank holds, in ST's virtual pool over the contiguous banks
        pools += f"; of which in the virtual pool {spanned[0].pool.name} {spanned[0].used / 1024:.1f}"
    lat = dev.latency_s(1)
    lines += [
        "",
        f"ops: {len(npu)} on NPU, {len(m55)} on M55 ({', '.join(sorted({o.kind for o in m55})) or 'none'})",
        f"epochs: {dev.hardware_epochs} NPU hardware epochs, {dev.software_epochs} M55 software epochs, "
        f"in {len(dev.epochs)} blocks",
        f"MACs: {dev.total_macs:,} per image, {npu_macs:,} on NPU "
        f"({100.0 * npu_macs / max(dev.total_macs, 1):.2f} %)",
        f"weight memory: {kib(dev.weight_bytes)} (constant tensors, in external flash)",
        f"internal RAM: {kib(mem.internal_bytes)} (NPU compiler layout over the RAM banks: {pools} KiB)"
        + (f", external RAM {kib(mem.external_bytes)}" if mem.external_bytes else ""),
        f"activation arena: peak {kib(a.peak_bytes)} (TFLM greedy first-fit by lifetime), naive sum "
        f"{kib(a.naive_bytes)}, largest tensor {kib(a.largest_tensor_bytes)}",
        f"estimated latency: {lat * 1e3:.3f} ms per image (NPU {dev.unit_seconds(NPU) * 1e3:.3f} ms, "
        f"M55 {dev.unit_seconds(M55) * 1e3:.3f} ms, epoch overheads included), "
        f"{1.0 / lat if lat > 0 else float('inf'):.0f} images/s",
    ]
    return "\n".join(lines)


def report_dict(dev: DeviceReport, title: str = "", calibration=None) -> dict:
    """What `--format json` prints: the report's content as plain data."""
    d = {"model": title, "target": "stm32n6"}
    d.update(dev.to_dict())
    d["cost_description"] = dev.cost.describe()
    if calibration is not None:
        d["calibration"] = calibration.to_dict()
    return d


def neural_art_ops(data: dict, graph, options=None) -> dict:
    """Give each op of report_dict's "ops" its Neural-ART unit chain, "neural_art": {"stages": [...]},
    each stage {"unit": "CONVACC" | "ARITH" | "POOL", <ll_aton field>: value, ...} as
    npu/neural_art.py derives it (docs/neural-art.md). An op on the M55 has no stage and says so; an
    NPU op whose configuration npusim does not derive has none either."""
    from .neural_art import N6Options, graph_stages

    chains = graph_stages(graph, options or N6Options())
    for o in data["ops"]:
        if o["unit"] != NPU:
            o["neural_art"] = {"stages": [], "note": "on the Cortex-M55: TFLM's arithmetic"}
        elif o["op_index"] in chains:
            o["neural_art"] = {"stages": chains[o["op_index"]]}
        else:
            o["neural_art"] = {"stages": [], "note": "NPU op whose unit configuration npusim does not derive"}
    return data


def report(interp, cost: CostModel | None = None, title: str = "") -> str:
    """The text `npusim inspect --target stm32n6` prints."""
    return format_report(plan_device(interp, cost), title)
