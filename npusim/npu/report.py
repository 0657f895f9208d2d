"""The text of the STM32N6 view (`npusim inspect --target stm32n6`)."""

from __future__ import annotations

from .cost import M55, NPU, CostModel, DeviceReport, plan_device

# ----------------------------------------------------------------------------------------------
# Text


def _kib(n: int) -> str:
    return f"{n:,} B ({n / 1024:.1f} KiB)"


def _table(rows: list, right: set) -> list:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in rows
    ]


def format_report(dev: DeviceReport, title: str = "") -> str:
    lines = [
        f"STM32N6 Neural-ART view{': ' + title if title else ''}",
        f"cost model: {dev.cost.describe()}",
        "",
    ]
    rows = [("#", "op", "unit", "epoch", "MACs", "weights B", "est. us", "note")]
    for o in dev.ops:
        rows.append(
            (
                str(o.op_index),
                o.kind,
                o.unit,
                str(o.epoch),
                f"{o.macs:,}",
                f"{o.weight_bytes:,}",
                f"{o.seconds * 1e6:.2f}",
                o.reason,
            )
        )
    lines += _table(rows, {0, 3, 4, 5, 6})
    lines += ["", "epochs (consecutive ops on one unit):"]
    rows = [("epoch", "unit", "ops", "n", "MACs", "weights B", "est. us")]
    for e in dev.epochs:
        rows.append(
            (
                str(e.index),
                e.unit,
                e.op_range,
                str(len(e.ops)),
                f"{e.macs:,}",
                f"{e.weight_bytes:,}",
                f"{e.seconds * 1e6:.2f}",
            )
        )
    lines += _table(rows, {0, 3, 4, 5, 6})
    npu, m55 = dev.npu_ops, dev.m55_ops
    npu_macs = sum(o.macs for o in npu)
    n_npu_epochs = sum(1 for e in dev.epochs if e.unit == NPU)
    a = dev.arena
    lat = dev.latency_s(1)
    lines += [
        "",
        f"ops: {len(npu)} on NPU, {len(m55)} on M55 ({', '.join(sorted({o.kind for o in m55})) or 'none'})",
        f"epochs: {len(dev.epochs)} ({n_npu_epochs} NPU, {len(dev.epochs) - n_npu_epochs} M55 software)",
        f"MACs: {dev.total_macs:,} per image, {npu_macs:,} on NPU "
        f"({100.0 * npu_macs / max(dev.total_macs, 1):.2f} %)",
        f"weight memory: {_kib(dev.weight_bytes)} (constant tensors)",
        f"activation arena: peak {_kib(a.peak_bytes)} (greedy first-fit by lifetime), naive sum "
        f"{_kib(a.naive_bytes)}, largest tensor {_kib(a.largest_tensor_bytes)}",
        f"estimated latency: {lat * 1e3:.3f} ms per image (NPU {dev.unit_seconds(NPU) * 1e3:.3f} ms, "
        f"M55 {dev.unit_seconds(M55) * 1e3:.3f} ms, {len(dev.epochs)} epoch overheads included), "
        f"{1.0 / lat if lat > 0 else float('inf'):.0f} images/s",
    ]
    return "\n".join(lines)


def report(interp, cost: CostModel | None = None, title: str = "") -> str:
    """The text `npusim inspect --target stm32n6` prints."""
    return format_report(plan_device(interp, cost), title)
