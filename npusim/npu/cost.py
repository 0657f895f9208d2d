"""The STM32N6 placement of a plan's ops and its latency estimate.

Operator placement (which unit runs an op). Source: ST Edge AI Core documentation, "ST Neural-ART
NPU - Supported operators and limitations" (stedgeai-dc.st.com/assets/embedded-docs/
stneuralart_operator_support.html, Core 2.2/3.0): the NPU takes int8 models in the "8b/8b, ss/sa
per-channel" scheme; layers left in float run on the CPU. Convolutions (standard, depthwise,
pointwise, dense), element-wise add, average/max pooling (global pooling included, which is what a
MEAN over H and W maps to), padding, reshape, concatenation and (limited) transpose are hardware
operators; RELU/RELU6 are fused into the producing layer. SOFTMAX, QUANTIZE and DEQUANTIZE run as
software epochs on the Cortex-M55 in ST's toolchain; this matches what users report from
`stedgeai validate` on an STM32N6570-DK (a quantized ResNet-8: 16 epochs of which 2 software,
Softmax and DequantizeLinear; ST community thread "Why are some layers executed in software with
X-CUBE-AI on STM32N6570-DK"). The per-operator shape limits of the ST table are not modelled
(assumption: the layers of the models used here are all within them); TRANSPOSE is placed on the
NPU up to rank 4 only, and any op not named above, or with a float operand, goes to the M55.
NPU_KIND_SOURCES and M55_KIND_SOURCES give the source of every placement, op by op; the ones
marked ASSUMPTION were not checked against ST's table.

Epochs. ST's compiler emits one hardware epoch per (fused) layer and a software epoch per CPU
operator; here consecutive ops on the same unit are grouped into one epoch (an "epoch block" in
ST's runtime terms), which is what decides the NPU/CPU hand-overs and their cost.

Cost model (all numbers are module-level constants, collected into a CostModel that a caller or
the CLI can override). Published figures: Neural-ART 14 in the STM32N6, 600 GOPS peak at about
1 GHz, i.e. 300 GMAC/s from 4 convolution accelerators (75 MAC/cycle each); Cortex-M55 at 800 MHz.
Peak is not what a small network gets: weights stream from flash, layers are small and every epoch
is programmed and synchronised. ASSUMPTION (easy to change: NPU_EFFICIENCY, or
`npusim inspect --target stm32n6 --npu-efficiency`): the NPU sustains 5 % of peak on convolution
MACs. The figure is anchored on one third-party measurement, MoveNet Lightning 192 int8 (242 MMAC)
at 22 ms on an STM32N6570-DK (about 11 GMAC/s, 4 % of peak, including software epochs), and is
only good to a factor of 2-3. Non-convolution layers on the NPU (add, pooling, padding, movement)
are bound by the stream engines' memory traffic rather than by the accelerators: they cost
max(MACs, elements of their largest activation operand) / NPU_ELEMENTS_PER_CYCLE NPU cycles, without
the efficiency factor. Software epochs on the M55 cost max(MACs / M55_MACS_PER_CYCLE, elements x cycles per
element of the op) cycles at 800 MHz (CMSIS-NN with Helium: about 2 int8 MAC per cycle sustained is
assumed). Every epoch adds EPOCH_OVERHEAD_S (interrupt, cache maintenance, reprogramming).
Images of a batch run one after the other (the device runs batch 1), so time scales with batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import NpusimError
from ..ops import MAC_OPS
from .arena import ArenaPlan, plan_arena, tensor_bytes, tensor_elements

# -- published device figures -------------------------------------------------------------------
NPU_CLOCK_HZ = 1.0e9  # Neural-ART 14 on STM32N6, "up to 1 GHz"
NPU_CONV_ACCELERATORS = 4  # CONVACC units
NPU_MACS_PER_CYCLE_PER_CA = 75  # 600 GOPS = 300 GMAC/s at 1 GHz over 4 accelerators
M55_CLOCK_HZ = 800e6  # Cortex-M55 of the STM32N6

# -- assumptions (see the module docstring) -----------------------------------------------------
NPU_EFFICIENCY = 0.05  # fraction of the conv accelerators' peak sustained on real layers
NPU_ELEMENTS_PER_CYCLE = 8  # non-convolution NPU layers: int8 elements per cycle (one 64-bit AXI beat)
M55_MACS_PER_CYCLE = 2.0  # int8 MAC per cycle in software (CMSIS-NN, Helium)
M55_CYCLES_PER_ELEMENT = {"SOFTMAX": 20.0, "QUANTIZE": 2.0, "DEQUANTIZE": 2.0}
M55_DEFAULT_CYCLES_PER_ELEMENT = 1.0
EPOCH_OVERHEAD_S = 5e-6  # per epoch: start, end-of-epoch interrupt, cache clean/invalidate

NPU = "NPU"
M55 = "M55"

# Hardware operators of the Neural-ART, each with the source of its placement. "ST table": the ST
# Edge AI Core page cited in the module docstring. "ASSUMPTION": not checked against that table in
# this code base (its operator rows were not at hand when the op was added); the placement follows
# the Neural-ART's hardware units (convolution accelerators, arithmetic and activation units,
# stream-engine data movement) and is the first thing to correct from a `stedgeai analyze` report.
NPU_KIND_SOURCES = {
    "CONV_2D": "ST table (convolution)",
    "DEPTHWISE_CONV_2D": "ST table (depthwise convolution)",
    "FULLY_CONNECTED": "ST table (dense)",
    "ADD": "ST table (element-wise add)",
    "AVERAGE_POOL_2D": "ST table (pooling)",
    "MAX_POOL_2D": "ST table (pooling)",
    "MEAN": "ST table (global average pooling; H and W only, see placement())",
    "PAD": "ST table (padding)",
    "PADV2": "ST table (padding)",
    "RESHAPE": "ST table (reshape)",
    "CONCATENATION": "ST table (concatenation)",
    "TRANSPOSE": "ST table (limited transpose; rank <= 4, see placement())",
    "SQUEEZE": "as RESHAPE (ST table): a reshape of the same bytes",
    "EXPAND_DIMS": "as RESHAPE (ST table): a reshape of the same bytes",
    "SUB": "ASSUMPTION: element-wise arithmetic unit, as ADD",
    "MUL": "ASSUMPTION: element-wise arithmetic unit, as ADD",
    "MAXIMUM": "ASSUMPTION: element-wise arithmetic unit, as ADD",
    "MINIMUM": "ASSUMPTION: element-wise arithmetic unit, as ADD",
    "LOGISTIC": "ASSUMPTION: activation unit (as the fused RELU family)",
    "TANH": "ASSUMPTION: activation unit",
    "HARD_SWISH": "ASSUMPTION: activation unit",
    "LEAKY_RELU": "ASSUMPTION: activation unit",
    "PRELU": "ASSUMPTION: activation unit",
    "STRIDED_SLICE": "ASSUMPTION: stream-engine data movement (as CONCATENATION)",
    "SLICE": "ASSUMPTION: stream-engine data movement (as CONCATENATION)",
    "SPLIT": "ASSUMPTION: stream-engine data movement (as CONCATENATION)",
    "SPLIT_V": "ASSUMPTION: stream-engine data movement (as CONCATENATION)",
    "PACK": "ASSUMPTION: stream-engine data movement (as CONCATENATION)",
    "UNPACK": "ASSUMPTION: stream-engine data movement (as CONCATENATION)",
    "RESIZE_NEAREST_NEIGHBOR": "ASSUMPTION: stream-engine data movement (pixel copies)",
    "TRANSPOSE_CONV": "ASSUMPTION: convolution accelerators (a strided scatter convolution)",
}
# Ops the simulator runs that are placed on the Cortex-M55 on purpose, and why.
M55_KIND_SOURCES = {
    "SOFTMAX": "ST validate report (software epoch; see the docstring)",
    "QUANTIZE": "ST toolchain (software epoch, see the docstring)",
    "DEQUANTIZE": "ST validate report (DequantizeLinear software epoch)",
    # ST Edge AI Core 2.1 reports of MoveNet Lightning on the STM32N6 list its Resize bilinear layers
    # as software epochs (Politecnico di Milano STM32N6 case studies,
    # giacomocolosio02.github.io/stm32n6-docs/casestudies_page.html).
    "RESIZE_BILINEAR": "software epoch in ST Edge AI Core reports (MoveNet's Resize bilinear)",
    "GATHER": "ASSUMPTION: index-driven gather, no NPU unit for it",
    "TILE": "ASSUMPTION: software epoch",
    "SHAPE": "int32 output: the NPU runs int8 only",
    "SUM": "ASSUMPTION: reduction other than global pooling",
    "REDUCE_MAX": "ASSUMPTION: reduction other than global pooling",
    "BATCH_MATMUL": "ASSUMPTION: a product of two activations, not a convolution with constant weights",
}
CONV_ACCELERATOR_KINDS = frozenset(MAC_OPS) | {"TRANSPOSE_CONV"}
NPU_KINDS = frozenset(NPU_KIND_SOURCES)
# Activations the NPU fuses into the producing layer.
NPU_FUSED_ACTIVATIONS = frozenset({"NONE", "RELU", "RELU6", "RELU_N1_TO_1"})


@dataclass
class CostModel:
    """Throughputs and overheads of the estimate. Defaults are read from the module constants when
    the object is made, so changing npusim.npu.cost.NPU_EFFICIENCY changes every later estimate."""

    npu_clock_hz: float = field(default_factory=lambda: NPU_CLOCK_HZ)
    npu_conv_accelerators: int = field(default_factory=lambda: NPU_CONV_ACCELERATORS)
    npu_macs_per_cycle_per_ca: float = field(default_factory=lambda: NPU_MACS_PER_CYCLE_PER_CA)
    npu_efficiency: float = field(default_factory=lambda: NPU_EFFICIENCY)
    npu_elements_per_cycle: float = field(default_factory=lambda: NPU_ELEMENTS_PER_CYCLE)
    m55_clock_hz: float = field(default_factory=lambda: M55_CLOCK_HZ)
    m55_macs_per_cycle: float = field(default_factory=lambda: M55_MACS_PER_CYCLE)
    m55_cycles_per_element: dict = field(default_factory=lambda: dict(M55_CYCLES_PER_ELEMENT))
    m55_default_cycles_per_element: float = field(default_factory=lambda: M55_DEFAULT_CYCLES_PER_ELEMENT)
    epoch_overhead_s: float = field(default_factory=lambda: EPOCH_OVERHEAD_S)

    def __post_init__(self):
        for name in (
            "npu_clock_hz",
            "npu_macs_per_cycle_per_ca",
            "npu_elements_per_cycle",
            "m55_clock_hz",
            "m55_macs_per_cycle",
        ):
            if not getattr(self, name) > 0:
                raise NpusimError(f"cost model: {name} must be positive, got {getattr(self, name)}")
        if not 0 < self.npu_efficiency <= 1:
            raise NpusimError(f"cost model: npu_efficiency must be in (0, 1], got {self.npu_efficiency}")
        if self.npu_conv_accelerators < 1 or self.epoch_overhead_s < 0:
            raise NpusimError("cost model: npu_conv_accelerators must be >= 1 and epoch_overhead_s >= 0")

    @property
    def npu_peak_macs_per_s(self) -> float:
        return self.npu_clock_hz * self.npu_conv_accelerators * self.npu_macs_per_cycle_per_ca

    def describe(self) -> str:
        return (
            f"NPU {self.npu_peak_macs_per_s / 1e9:g} GMAC/s peak ({self.npu_conv_accelerators} conv "
            f"accelerators at {self.npu_clock_hz / 1e9:g} GHz) x {self.npu_efficiency:g} efficiency, other "
            f"NPU layers {self.npu_elements_per_cycle:g} elements/cycle; M55 {self.m55_clock_hz / 1e6:g} MHz "
            f"x {self.m55_macs_per_cycle:g} MAC/cycle; {self.epoch_overhead_s * 1e6:g} us per epoch"
        )


# ----------------------------------------------------------------------------------------------
# Placement


def placement(kernel) -> tuple[str, str]:
    """(unit, reason) for one prepared kernel: NPU or M55, and why when it is the M55."""
    kind = kernel.op.kind
    acts = [t for t in kernel.inputs if t is not None and not t.is_constant] + list(kernel.outputs)
    if kind not in NPU_KINDS:
        if kind in M55_KIND_SOURCES:
            return M55, f"{kind} on the M55: {M55_KIND_SOURCES[kind]}"
        return M55, f"{kind} is not a Neural-ART operator (software epoch)"
    bad = [t for t in acts if np.dtype(t.dtype) != np.int8]
    if bad:
        return M55, f"tensor {bad[0].name[:40]!r} is {np.dtype(bad[0].dtype).name}, the NPU runs int8 only"
    act = kernel.op.options.get("fused_activation_function", "NONE")
    if act not in NPU_FUSED_ACTIVATIONS:
        return M55, f"fused activation {act} is not supported by the NPU"
    if kind == "TRANSPOSE" and len(kernel.inputs[0].shape) > 4:
        return M55, "TRANSPOSE above rank 4 is outside the NPU's limited transpose support"
    if kind == "MEAN":
        x, axes_t = kernel.inputs[0], kernel.inputs[1]
        rank = len(x.shape)
        axes = (
            sorted({int(a) % rank for a in np.asarray(axes_t.data).ravel()})
            if axes_t is not None and axes_t.data is not None
            else []
        )
        if rank != 4 or axes != [1, 2]:
            return M55, "MEAN maps to the NPU only as global pooling over H and W of a 4-D tensor"
    return NPU, ""


# ----------------------------------------------------------------------------------------------
# Per-op cost and the device report


@dataclass
class OpCost:
    position: int  # in execution order
    op_index: int  # in the file
    kind: str
    unit: str  # NPU or M55
    reason: str  # why the M55, empty on the NPU
    macs: int  # per image, kernel.macs()
    elements: int  # largest activation operand, elements per image
    weight_bytes: int  # constant operands of this op (a shared constant counts for its first reader only)
    seconds: float  # per image, excluding epoch overhead
    epoch: int = 0


@dataclass
class Epoch:
    index: int
    unit: str
    ops: list  # list[OpCost]
    overhead_s: float

    @property
    def macs(self) -> int:
        return sum(o.macs for o in self.ops)

    @property
    def weight_bytes(self) -> int:
        return sum(o.weight_bytes for o in self.ops)

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.ops) + self.overhead_s

    @property
    def op_range(self) -> str:
        a, b = self.ops[0].op_index, self.ops[-1].op_index
        return f"{a}" if a == b else f"{a}-{b}"


def op_seconds(kernel, unit: str, cost: CostModel) -> float:
    macs = int(kernel.macs())
    elements = max(
        [
            tensor_elements(t)
            for t in list(kernel.inputs) + list(kernel.outputs)
            if t is not None and not t.is_constant
        ]
        or [0]
    )
    kind = kernel.op.kind
    if unit == NPU:
        if kind in CONV_ACCELERATOR_KINDS:
            return macs / (cost.npu_peak_macs_per_s * cost.npu_efficiency)
        return max(macs, elements) / (cost.npu_clock_hz * cost.npu_elements_per_cycle)
    per_element = cost.m55_cycles_per_element.get(kind, cost.m55_default_cycles_per_element)
    cycles = max(macs / cost.m55_macs_per_cycle, elements * per_element)
    return cycles / cost.m55_clock_hz


@dataclass
class DeviceReport:
    ops: list  # list[OpCost] in execution order
    epochs: list  # list[Epoch]
    arena: ArenaPlan  # batch 1
    weight_bytes: int  # bytes of all constant tensors the ops read, each counted once
    total_macs: int
    cost: CostModel

    @property
    def npu_ops(self) -> list:
        return [o for o in self.ops if o.unit == NPU]

    @property
    def m55_ops(self) -> list:
        return [o for o in self.ops if o.unit == M55]

    def unit_seconds(self, unit: str, first: int = 0) -> float:
        """Per image: time on one unit from execution position `first` on, epoch overheads included."""
        total = 0.0
        for e in self.epochs:
            ops = [o for o in e.ops if o.position >= first]
            if e.unit == unit and ops:
                total += sum(o.seconds for o in ops) + e.overhead_s
        return total

    def latency_s(self, batch: int = 1, first: int = 0) -> float:
        """Estimated seconds for `batch` images (run one after the other) from execution position
        `first` to the end; first=0 is a whole forward pass."""
        return batch * (self.unit_seconds(NPU, first) + self.unit_seconds(M55, first))

    def to_dict(self) -> dict:
        return {
            "ops": [asdict(o) for o in self.ops],
            "epochs": [
                {
                    "index": e.index,
                    "unit": e.unit,
                    "ops": [o.op_index for o in e.ops],
                    "macs": e.macs,
                    "weight_bytes": e.weight_bytes,
                    "seconds": e.seconds,
                }
                for e in self.epochs
            ],
            "weight_bytes": self.weight_bytes,
            "total_macs": self.total_macs,
            "arena_peak_bytes": self.arena.peak_bytes,
            "arena_naive_bytes": self.arena.naive_bytes,
            "arena_max_live_bytes": self.arena.max_live_bytes,
            "largest_tensor_bytes": self.arena.largest_tensor_bytes,
            "latency_s": self.latency_s(1),
            "npu_s": self.unit_seconds(NPU),
            "m55_s": self.unit_seconds(M55),
            "cost_model": asdict(self.cost),
        }

    def format(self, title: str = "") -> str:
        from .report import format_report  # the text is report.py's; it reads this class

        return format_report(self, title)


def plan_device(interp, cost: CostModel | None = None) -> DeviceReport:
    """The STM32N6 placement, epochs, memory and latency estimate of a prepared Interpreter."""
    cost = cost or CostModel()
    graph = interp.graph
    ops: list = []
    constants: set = set()
    for pos, k in enumerate(interp.kernels):
        unit, reason = placement(k)
        consts = [
            t
            for t in dict.fromkeys(k.op.inputs)
            if t >= 0 and graph.tensors[t].is_constant and t not in constants
        ]
        constants.update(consts)
        acts = [t for t in list(k.inputs) + list(k.outputs) if t is not None and not t.is_constant]
        ops.append(
            OpCost(
                position=pos,
                op_index=k.op.index,
                kind=k.op.kind,
                unit=unit,
                reason=reason,
                macs=int(k.macs()),
                elements=max([tensor_elements(t) for t in acts] or [0]),
                weight_bytes=sum(tensor_bytes(graph.tensors[t]) for t in consts),
                seconds=op_seconds(k, unit, cost),
            )
        )
    epochs: list = []
    for o in ops:
        if not epochs or epochs[-1].unit != o.unit:
            epochs.append(Epoch(index=len(epochs), unit=o.unit, ops=[], overhead_s=cost.epoch_overhead_s))
        o.epoch = epochs[-1].index
        epochs[-1].ops.append(o)
    return DeviceReport(
        ops=ops,
        epochs=epochs,
        arena=plan_arena(interp, 1),
        weight_bytes=sum(tensor_bytes(graph.tensors[t]) for t in constants),
        total_macs=sum(o.macs for o in ops),
        cost=cost,
    )
