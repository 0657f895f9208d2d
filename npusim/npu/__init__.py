"""The STM32N6 view of a plan: which ops run on the Neural-ART NPU and which fall back to the
Cortex-M55 as software epochs, with MACs, memory and an estimated latency.

Everything here is computed from the prepared plan (the kernels' tensors, shapes and macs()),
never from the values the kernels produce, so it costs nothing to evaluate and another package
(the zo trainer) can import it to price a forward pass or a training step on the device (zo.cost
prices a ZO step against back-propagation from it):

    dev = plan_device(interp)            # DeviceReport
    dev.latency_s(batch=8)               # estimated seconds for 8 images, one after the other
    dev.arena.peak_bytes, dev.weight_bytes

Three modules: cost.py (which unit runs each op, epochs, the latency estimate and its constants),
arena.py (the activation memory plan), report.py (the text of `npusim inspect --target stm32n6`).
Everything is re-exported here.
"""

from .arena import ARENA_ALIGNMENT, ArenaPlan, Buffer, activation_lifetimes, greedy_first_fit, plan_arena
from .cost import (
    CONV_ACCELERATOR_KINDS,
    EPOCH_OVERHEAD_S,
    M55,
    M55_CLOCK_HZ,
    M55_CYCLES_PER_ELEMENT,
    M55_DEFAULT_CYCLES_PER_ELEMENT,
    M55_MACS_PER_CYCLE,
    NPU,
    NPU_CLOCK_HZ,
    NPU_CONV_ACCELERATORS,
    NPU_EFFICIENCY,
    NPU_ELEMENTS_PER_CYCLE,
    NPU_FUSED_ACTIVATIONS,
    NPU_KINDS,
    NPU_MACS_PER_CYCLE_PER_CA,
    CostModel,
    DeviceReport,
    Epoch,
    OpCost,
    op_seconds,
    placement,
    plan_device,
)
from .report import format_report, report

__all__ = [
    "ARENA_ALIGNMENT",
    "CONV_ACCELERATOR_KINDS",
    "EPOCH_OVERHEAD_S",
    "M55",
    "M55_CLOCK_HZ",
    "M55_CYCLES_PER_ELEMENT",
    "M55_DEFAULT_CYCLES_PER_ELEMENT",
    "M55_MACS_PER_CYCLE",
    "NPU",
    "NPU_CLOCK_HZ",
    "NPU_CONV_ACCELERATORS",
    "NPU_EFFICIENCY",
    "NPU_ELEMENTS_PER_CYCLE",
    "NPU_FUSED_ACTIVATIONS",
    "NPU_KINDS",
    "NPU_MACS_PER_CYCLE_PER_CA",
    "ArenaPlan",
    "Buffer",
    "CostModel",
    "DeviceReport",
    "Epoch",
    "OpCost",
    "activation_lifetimes",
    "format_report",
    "greedy_first_fit",
    "op_seconds",
    "placement",
    "plan_arena",
    "plan_device",
    "report",
]
