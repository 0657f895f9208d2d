"""The STM32N6 view of a plan: which ops run on the Neural-ART NPU and which fall back to the
Cortex-M55 as software epochs, with MACs, memory and an estimated latency.

Everything here is computed from the prepared plan (the kernels' tensors, shapes and macs()),
never from the values the kernels produce, so it costs nothing to evaluate and another package
(the zo trainer) can import it to price a forward pass or a training step on the device (zo.cost
prices a ZO step against back-propagation from it):

    dev = plan_device(interp)            # DeviceReport
    dev.latency_s(batch=8)               # estimated seconds for 8 images, one after the other
    dev.arena.peak_bytes, dev.weight_bytes

Modules: cost.py (which unit runs each op, the latency roofline and its constants), fusion.py (how ST's
compiler folds ops into epochs: layers, chained epilogues, views), memory.py (the activation buffers
over the N6 RAM banks, ST's "internal RAM"), arena.py (the TFLM-style greedy plan), calibration.py
(fitting the cost constants on board measurements, the published.csv format), report.py (the text and
JSON of `npusim inspect --target stm32n6`). Everything is re-exported here; docs/stm32n6.md has the
model, its constants and their sources.
"""

from .arena import ARENA_ALIGNMENT, ArenaPlan, Buffer, activation_lifetimes, greedy_first_fit, plan_arena
from .calibration import Calibration, Measurement, fit_cost_model, read_calibration_csv
from .cost import (
    CA_HALF_DEPTH,
    CONV_ACCELERATOR_KINDS,
    COST_CONSTANTS,
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
    NPU_FUSED_ACTIVATIONS,
    NPU_KINDS,
    NPU_MACS_PER_CYCLE_PER_CA,
    WEIGHT_BYTES_PER_S,
    CostModel,
    DeviceReport,
    DeviceStructure,
    Epoch,
    OpCost,
    device_structure,
    op_times,
    placement,
    plan_device,
)
from .fusion import FusionPlan, plan_fusion
from .memory import MEMORY_POOLS, MemoryLayout, MemoryPool, plan_memory
from .neural_art import N6Options
from .neural_art_run import NeuralArtProfile, profile_object
from .report import format_report, report, report_dict

__all__ = [
    "ARENA_ALIGNMENT",
    "CA_HALF_DEPTH",
    "CONV_ACCELERATOR_KINDS",
    "COST_CONSTANTS",
    "EPOCH_OVERHEAD_S",
    "M55",
    "M55_CLOCK_HZ",
    "M55_CYCLES_PER_ELEMENT",
    "M55_DEFAULT_CYCLES_PER_ELEMENT",
    "M55_MACS_PER_CYCLE",
    "MEMORY_POOLS",
    "NPU",
    "NPU_CLOCK_HZ",
    "NPU_CONV_ACCELERATORS",
    "NPU_EFFICIENCY",
    "NPU_FUSED_ACTIVATIONS",
    "NPU_KINDS",
    "NPU_MACS_PER_CYCLE_PER_CA",
    "WEIGHT_BYTES_PER_S",
    "ArenaPlan",
    "Buffer",
    "Calibration",
    "CostModel",
    "DeviceReport",
    "DeviceStructure",
    "Epoch",
    "FusionPlan",
    "Measurement",
    "MemoryLayout",
    "MemoryPool",
    "N6Options",
    "NeuralArtProfile",
    "OpCost",
    "activation_lifetimes",
    "device_structure",
    "fit_cost_model",
    "format_report",
    "greedy_first_fit",
    "op_times",
    "placement",
    "plan_arena",
    "plan_device",
    "plan_fusion",
    "plan_memory",
    "profile_object",
    "read_calibration_csv",
    "report",
    "report_dict",
]
