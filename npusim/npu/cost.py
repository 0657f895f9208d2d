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
The registry (npusim/registry.py) gives the source of every placement, op by op; the ones marked
ASSUMPTION were not checked against ST's table.

Epochs. ST's compiler emits a hardware epoch per (fused) layer and a software epoch per CPU operator.
fusion.py decides which ops are layers, which are chained into the previous layer's epoch and which
are views that move nothing; consecutive ops on one unit form an "epoch block" (ST's runtime term),
which is what `epochs` lists.

The latency model (a roofline per layer, its constants in one table, fitted on board measurements) is
the subject of docs/stm32n6.md; in short, per NPU layer

    seconds = max(MACs / (peak x efficiency x u(depth)),
                  weight bytes / external-flash bandwidth + activation bytes / their RAM bank's bandwidth)
              + one epoch overhead

where u(depth) = depth / (depth + CA_HALF_DEPTH) is the busy fraction of a convolution accelerator for
a layer whose outputs each sum `depth` products (depthwise 3x3: 9, a pointwise layer: its input
channels, a 3x3 convolution: 9 x input channels). A software epoch on the Cortex-M55 costs
max(MACs / M55_MACS_PER_CYCLE, elements x cycles per element of its op class) cycles plus one epoch
overhead. COST_CONSTANTS lists every constant with its source; NPU_EFFICIENCY and EPOCH_OVERHEAD_S are
fitted on ST's published board figures (npusim/npu/calibration.py), the others come from ST documents.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import NpusimError
from ..registry import M55, NPU, REGISTRY, kinds
from ..runtime.interpreter import batch_plan, macs_per_image
from .arena import ArenaPlan, constant_bytes, plan_arena, tensor_bytes, tensor_elements
from .fusion import EPILOGUE, LAYER, VIEW, FusionPlan, plan_fusion
from .memory import MemoryLayout, plan_memory

# -- the constants of the latency model ----------------------------------------------------------
# Clocks: NPU 1 GHz and Cortex-M55 800 MHz, the overdrive clocks ST's STM32N6570-DK application
# examples run at (as third-party descriptions of the board report; ST's model-zoo tables do not state
# the clocks of their "NPU/MCU" figures, so this is an ASSUMPTION about them).
NPU_CLOCK_HZ = 1.0e9
M55_CLOCK_HZ = 800e6
NPU_CONV_ACCELERATORS = 4  # CONVACC units of the Neural-ART 14
NPU_MACS_PER_CYCLE_PER_CA = 75  # 600 GOPS at 1 GHz = 300 GMAC/s over the 4 accelerators
# External octo-SPI flash holding the weights (STM32N6570-DK: octal flash on XSPI2 in DTR mode, assumed
# at 200 MHz): 8 bits x 2 edges x 200 MHz = 400 MB/s, streamed by the NPU while it computes. ST's memory-
# pool file rates the octoFlash at byteWidth 1 / freqRatio 6 (167 MB/s at 1 GHz); with that figure the
# four calibration models fit worse (MobileNetV2 +28 %, docs/stm32n6.md).
WEIGHT_BYTES_PER_S = 400e6
# Busy fraction of a convolution accelerator: depth / (depth + CA_HALF_DEPTH), depth = products summed
# per output, so a depthwise 3x3 layer (depth 9) runs at 1/7 of a deep 3x3 convolution's rate and a
# pointwise layer with 54 input channels at half of it. Chosen (one global value from 9, 18, 27, 36, 54,
# 72) on the four calibration models with the two constants below refitted at each value
# (experiments/tables/stm32n6.py; the third fitted constant).
CA_HALF_DEPTH = 54.0
# Fitted on ST's published figures (published.csv; npusim/npu/calibration.py, docs/stm32n6.md).
NPU_EFFICIENCY = 0.1653  # fraction of the accelerators' peak a deep convolution sustains
EPOCH_OVERHEAD_S = 38.32e-6  # per hardware or software epoch: program, start, end interrupt, cache upkeep
# Software epochs: CMSIS-NN int8 kernels with Helium (about 2 MAC per cycle sustained), and cycles per
# element for the element-wise and conversion kernels. ASSUMPTIONS, not fitted (2 to 12 % of the four
# calibration models' estimates, YOLOv8n's DFL SOFTMAX the largest part).
M55_MACS_PER_CYCLE = 2.0
M55_CYCLES_PER_ELEMENT = {"SOFTMAX": 20.0, "QUANTIZE": 2.0, "DEQUANTIZE": 2.0}
M55_DEFAULT_CYCLES_PER_ELEMENT = 1.0

# Every constant of CostModel with its value's source (docs/stm32n6.md repeats this table).
COST_CONSTANTS = {
    "npu_clock_hz": "ASSUMPTION: the DK's overdrive NPU clock (1 GHz) for ST's model-zoo figures",
    "m55_clock_hz": "ASSUMPTION: the DK's overdrive CPU clock (800 MHz) for ST's model-zoo figures",
    "npu_conv_accelerators": "ST Edge AI Core, Neural-ART concepts: Neural-ART 14 has four CAs",
    "npu_macs_per_cycle_per_ca": "ST: 600 GOPS at 1 GHz over 4 CAs",
    "weight_bytes_per_s": "octo-SPI flash, 8 lines DTR at 200 MHz (ASSUMPTION on the clock)",
    "pools": "ST Edge AI Core memory pools of the STM32N6570-DK (byteWidth / freqRatio per bank)",
    "ca_half_depth": "chosen on the calibration models (grid of 6 values)",
    "npu_efficiency": "fitted on published.csv",
    "epoch_overhead_s": "fitted on published.csv",
    "m55_macs_per_cycle": "ASSUMPTION (CMSIS-NN with Helium)",
    "m55_cycles_per_element": "ASSUMPTION",
    "m55_default_cycles_per_element": "ASSUMPTION",
}

# Every placement and its source, op by op, is in the registry (npusim/registry.py; docs/stm32n6.md
# lists them): the ops ST's compiler puts on the NPU, and the ones it leaves to the Cortex-M55.
NPU_KIND_SOURCES = {k: s.placement for k, s in REGISTRY.items() if s.unit == NPU}
M55_KIND_SOURCES = {k: s.placement for k, s in REGISTRY.items() if s.unit == M55}
CONV_ACCELERATOR_KINDS = kinds(conv_accelerator=True)
NPU_KINDS = frozenset(NPU_KIND_SOURCES)
# Activations the NPU fuses into the producing layer.
NPU_FUSED_ACTIVATIONS = frozenset({"NONE", "RELU", "RELU6", "RELU_N1_TO_1"})


@dataclass
class CostModel:
    """The constants of the latency estimate (COST_CONSTANTS gives each one's source). Defaults are read
    from the module constants when the object is made, so changing npusim.npu.cost.NPU_EFFICIENCY
    changes every later estimate; calibration.fit_cost_model() returns a refitted copy."""

    npu_clock_hz: float = field(default_factory=lambda: NPU_CLOCK_HZ)
    npu_conv_accelerators: int = field(default_factory=lambda: NPU_CONV_ACCELERATORS)
    npu_macs_per_cycle_per_ca: float = field(default_factory=lambda: NPU_MACS_PER_CYCLE_PER_CA)
    npu_efficiency: float = field(default_factory=lambda: NPU_EFFICIENCY)
    ca_half_depth: float = field(default_factory=lambda: CA_HALF_DEPTH)
    weight_bytes_per_s: float = field(default_factory=lambda: WEIGHT_BYTES_PER_S)
    m55_clock_hz: float = field(default_factory=lambda: M55_CLOCK_HZ)
    m55_macs_per_cycle: float = field(default_factory=lambda: M55_MACS_PER_CYCLE)
    m55_cycles_per_element: dict = field(default_factory=lambda: dict(M55_CYCLES_PER_ELEMENT))
    m55_default_cycles_per_element: float = field(default_factory=lambda: M55_DEFAULT_CYCLES_PER_ELEMENT)
    epoch_overhead_s: float = field(default_factory=lambda: EPOCH_OVERHEAD_S)

    def __post_init__(self):
        for name in (
            "npu_clock_hz",
            "npu_macs_per_cycle_per_ca",
            "weight_bytes_per_s",
            "m55_clock_hz",
            "m55_macs_per_cycle",
        ):
            if not getattr(self, name) > 0:
                raise NpusimError(f"cost model: {name} must be positive, got {getattr(self, name)}")
        if not 0 < self.npu_efficiency <= 1:
            raise NpusimError(f"cost model: npu_efficiency must be in (0, 1], got {self.npu_efficiency}")
        if self.npu_conv_accelerators < 1 or self.epoch_overhead_s < 0 or self.ca_half_depth < 0:
            raise NpusimError(
                "cost model: npu_conv_accelerators must be >= 1, epoch_overhead_s and ca_half_depth >= 0"
            )

    @property
    def npu_peak_macs_per_s(self) -> float:
        return self.npu_clock_hz * self.npu_conv_accelerators * self.npu_macs_per_cycle_per_ca

    def ca_utilisation(self, depth: float) -> float:
        """Busy fraction of the accelerators on a layer whose outputs each sum `depth` products."""
        return depth / (depth + self.ca_half_depth) if depth > 0 else 1.0

    def bank_bytes_per_s(self, pool) -> float:
        return pool.bytes_per_npu_cycle * self.npu_clock_hz

    def describe(self) -> str:
        return (
            f"NPU {self.npu_peak_macs_per_s / 1e9:g} GMAC/s peak ({self.npu_conv_accelerators} conv "
            f"accelerators at {self.npu_clock_hz / 1e9:g} GHz) x {self.npu_efficiency:.3g} efficiency x "
            f"depth/(depth+{self.ca_half_depth:g}); weights from flash at "
            f"{self.weight_bytes_per_s / 1e6:g} MB/s; M55 {self.m55_clock_hz / 1e6:g} MHz x "
            f"{self.m55_macs_per_cycle:g} MAC/cycle; {self.epoch_overhead_s * 1e6:.3g} us per epoch"
        )


# ----------------------------------------------------------------------------------------------
# Placement


def imported_requantization(kernel) -> bool:
    """A QUANTIZE int8 -> int8 of an ONNX import: a QuantizeLinear whose scale differs from what the
    op before it wrote (after a Sigmoid or Softmax, whose int8 kernels fix their output at 1/256, in
    front of a Concat, ...). The N6 compiler, given the QDQ graph, folds it into the layer that
    writes the tensor (the NPU's output stage requantizes): not a software epoch of the M55."""
    graph = getattr(kernel, "graph", None)  # None for a kernel built without a graph (tests' stubs)
    if kernel.op.kind != "QUANTIZE" or graph is None or graph.source.format != "onnx":
        return False
    x, y = kernel.inputs[0], kernel.outputs[0]
    return np.dtype(x.dtype) == np.int8 and np.dtype(y.dtype) == np.int8


def placement(kernel) -> tuple[str, str]:
    """(unit, reason) for one prepared kernel: NPU or M55, and why when it is the M55."""
    kind = kernel.op.kind
    acts = [t for t in kernel.inputs if t is not None and not t.is_constant] + list(kernel.outputs)
    if imported_requantization(kernel) or (
        kind == "QUANTIZE"
        and np.dtype(kernel.inputs[0].dtype).kind in "iu"
        and kernel.outputs[0].dtype == np.int8
    ):
        # integer to int8 (a uint8 input, a requantization): one scalar ARITH on the NPU. ST's compile
        # of YOLOX-nano 480 (../shared/models/stm32n6/st_compiler: default_blob_trace.c, epoch 2,
        # node Quantize_5) runs its uint8 input's QUANTIZE so; only the float boundary is SW_FLOAT.
        return NPU, ""
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
    if kind in ("MEAN", "REDUCE_MAX"):
        x, axes_t = kernel.inputs[0], kernel.inputs[1]
        rank = len(x.shape)
        axes = (
            sorted({int(a) % rank for a in np.asarray(axes_t.data).ravel()})
            if axes_t is not None and axes_t.data is not None
            else []
        )
        if rank != 4 or axes != [1, 2]:
            return M55, f"{kind} maps to the NPU only as global pooling over H and W of a 4-D tensor"
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
    role: str  # fusion.LAYER (an epoch of its own), EPILOGUE (chained) or VIEW (moves nothing)
    macs: int  # per image, kernel.macs()
    elements: int  # largest activation operand, elements per image
    weight_bytes: int  # constant operands of this op (a shared constant counts for its first reader only)
    activation_bytes: int  # activation bytes it reads and writes in memory (streamed ones excluded)
    compute_s: float  # MACs (or elements on the M55) at the unit's rate
    memory_s: float  # bytes at the bandwidth of the memories they sit in
    overhead_s: float  # its epoch's overhead (layers only)
    seconds: float  # per image: max(compute_s, memory_s) + overhead_s
    epoch: int = 0  # epoch block

    @property
    def bound(self) -> str:
        if self.role != LAYER:
            return ""
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass
class Epoch:
    """An epoch block: consecutive ops on one unit."""

    index: int
    unit: str
    ops: list  # list[OpCost]

    @property
    def macs(self) -> int:
        return sum(o.macs for o in self.ops)

    @property
    def weight_bytes(self) -> int:
        return sum(o.weight_bytes for o in self.ops)

    @property
    def hardware_epochs(self) -> int:
        return sum(1 for o in self.ops if o.role == LAYER)

    @property
    def overhead_s(self) -> float:
        return sum(o.overhead_s for o in self.ops)

    @property
    def seconds(self) -> float:
        return sum(o.seconds for o in self.ops)

    @property
    def op_range(self) -> str:
        a, b = self.ops[0].op_index, self.ops[-1].op_index
        return f"{a}" if a == b else f"{a}-{b}"


@dataclass
class DeviceStructure:
    """What the estimate needs that does not depend on the cost constants: placement, fusion, memory
    layout and the per-op quantities. plan_device() builds it; calibration reuses it across a fit."""

    ops: list  # list[dict] of OpCost fields without the times
    fusion: FusionPlan
    memory: MemoryLayout
    arena: ArenaPlan
    weight_bytes: int
    depth: list  # per op: products summed per output (0 when no MACs)
    bank_bytes: list  # per op: [(pool, bytes)] of its activation traffic


def _activation_traffic(kernel, pos: int, memory: MemoryLayout, graph, scale: float) -> list:
    """(pool, bytes) for every activation operand of a kernel that sits in memory: an input a suboff
    copied for this kernel read from the copy, and an output's suboff copies written with it (the
    suboff runs in the producer's epoch; memory.py)."""
    traffic = []
    outputs = set(kernel.op.outputs)
    for t in dict.fromkeys(list(kernel.op.inputs) + list(kernel.op.outputs)):
        if t < 0 or graph.tensors[t].is_constant:
            continue
        size = int(tensor_bytes(graph.tensors[t]) * scale)
        if t in outputs:
            traffic += [(memory.pool_for_key(k), size) for k in memory.copies_of(t)]
        if t not in memory.streamed:
            traffic.append((memory.pool_for(t, None if t in outputs else pos), size))
    return [(p, b) for p, b in traffic if p is not None]


def _epoch_layer(ops: list) -> int | None:
    """The position of the NPU layer whose epoch the last op of `ops` runs in (None: none)."""
    for op in reversed(ops[:-1]):
        if op["unit"] != NPU:
            return None
        if op["role"] == LAYER:
            return op["position"]
    return None


def device_structure(interp, area_scale: float = 1.0) -> DeviceStructure:
    """Placement, fusion and memory layout of a prepared Interpreter, and each op's MACs, bytes and depth.

    area_scale: the same graph at another input resolution, every activation and every op's MACs
    multiplied by it (weights unchanged): exact for a fully convolutional graph whose spatial sizes all
    scale by the same factor, as YOLOv8n at any multiple of 32 (experiments/tables/stm32n6.py)."""
    graph = interp.graph
    batch = batch_plan(graph, interp.kernels)
    units = [placement(k) for k in interp.kernels]
    fusion = plan_fusion(interp, [u for u, _ in units])
    memory = plan_memory(interp, fusion, scale=area_scale, units=[u for u, _ in units])
    constants: set = set()
    ops, depth, traffic = [], [], []
    for pos, (k, (unit, reason)) in enumerate(zip(interp.kernels, units)):
        consts = [
            t
            for t in dict.fromkeys(k.op.inputs)
            if t >= 0 and graph.tensors[t].is_constant and t not in constants
        ]
        constants.update(consts)
        acts = [t for t in list(k.inputs) + list(k.outputs) if t is not None and not t.is_constant]
        macs = macs_per_image(graph, batch, k)  # a tensor's axis 0 may hold rows (interpreter.py)
        out_elements = sum(tensor_elements(t) for t in k.outputs)
        bank = _activation_traffic(k, pos, memory, graph, area_scale)
        ops.append(
            dict(
                position=pos,
                op_index=k.op.index,
                kind=k.op.kind,
                unit=unit,
                reason=reason,
                role=fusion.roles[pos] if unit == NPU else LAYER,
                macs=int(macs * area_scale),
                elements=int(max([tensor_elements(t) for t in acts] or [0]) * area_scale),
                weight_bytes=sum(constant_bytes(graph, t) for t in consts),
                activation_bytes=sum(b for _, b in bank),
            )
        )
        depth.append(macs / out_elements if macs and out_elements else 0.0)
        traffic.append(bank)
        layer = _epoch_layer(ops)
        if ops[-1]["role"] == EPILOGUE and layer is not None:  # its bytes move in its layer's epoch
            traffic[layer] += bank
            ops[layer]["activation_bytes"] += ops[-1]["activation_bytes"]
            traffic[-1], ops[-1]["activation_bytes"] = [], 0
    return DeviceStructure(
        ops=ops,
        fusion=fusion,
        memory=memory,
        arena=plan_arena(interp, 1),
        weight_bytes=sum(constant_bytes(graph, t) for t in constants),
        depth=depth,
        bank_bytes=traffic,
    )


def op_times(op: dict, depth: float, bank_bytes: list, cost: CostModel) -> tuple:
    """(compute_s, memory_s, overhead_s) of one op; see the module docstring."""
    if op["role"] == VIEW:
        return 0.0, 0.0, 0.0
    if op["unit"] == M55:
        per_element = cost.m55_cycles_per_element.get(op["kind"], cost.m55_default_cycles_per_element)
        cycles = max(op["macs"] / cost.m55_macs_per_cycle, op["elements"] * per_element)
        return cycles / cost.m55_clock_hz, 0.0, cost.epoch_overhead_s
    if op["role"] == EPILOGUE:  # chained behind its layer on the stream switch: no time of its own
        return 0.0, 0.0, 0.0
    compute = 0.0
    if op["kind"] in CONV_ACCELERATOR_KINDS and op["macs"]:
        rate = cost.npu_peak_macs_per_s * cost.npu_efficiency * cost.ca_utilisation(depth)
        compute = op["macs"] / rate
    memory = op["weight_bytes"] / cost.weight_bytes_per_s + sum(
        b / cost.bank_bytes_per_s(pool) for pool, b in bank_bytes
    )
    return compute, memory, cost.epoch_overhead_s


@dataclass
class DeviceReport:
    ops: list  # list[OpCost] in execution order
    epochs: list  # list[Epoch] (epoch blocks)
    arena: ArenaPlan  # TFLM-style greedy plan, batch 1 (what a TFLM build on the M55 would need)
    memory: MemoryLayout  # ST-style layout over the N6 RAM banks
    weight_bytes: int  # bytes of all constant tensors the ops read, each counted once
    total_macs: int
    cost: CostModel

    @property
    def npu_ops(self) -> list:
        return [o for o in self.ops if o.unit == NPU]

    @property
    def m55_ops(self) -> list:
        return [o for o in self.ops if o.unit == M55]

    @property
    def hardware_epochs(self) -> int:
        return sum(1 for o in self.ops if o.role == LAYER and o.unit == NPU)

    @property
    def software_epochs(self) -> int:
        return sum(1 for o in self.ops if o.unit == M55)

    def unit_seconds(self, unit: str, first: int = 0) -> float:
        """Per image: time on one unit from execution position `first` on, epoch overheads included."""
        return sum(o.seconds for o in self.ops if o.unit == unit and o.position >= first)

    def latency_s(self, batch: int = 1, first: int = 0) -> float:
        """Estimated seconds for `batch` images (run one after the other) from execution position
        `first` to the end; first=0 is a whole forward pass."""
        return batch * (self.unit_seconds(NPU, first) + self.unit_seconds(M55, first))

    def to_dict(self) -> dict:
        return {
            "ops": [dict(asdict(o), bound=o.bound) for o in self.ops],
            "epochs": [
                {
                    "index": e.index,
                    "unit": e.unit,
                    "ops": [o.op_index for o in e.ops],
                    "hardware_epochs": e.hardware_epochs,
                    "macs": e.macs,
                    "weight_bytes": e.weight_bytes,
                    "seconds": e.seconds,
                }
                for e in self.epochs
            ],
            "weight_bytes": self.weight_bytes,
            "total_macs": self.total_macs,
            "npu_hardware_epochs": self.hardware_epochs,
            "m55_software_epochs": self.software_epochs,
            "internal_ram_bytes": self.memory.internal_bytes,
            "external_ram_bytes": self.memory.external_bytes,
            "memory_pools": self.memory.to_dict()["pools"],
            "arena_peak_bytes": self.arena.peak_bytes,
            "arena_naive_bytes": self.arena.naive_bytes,
            "arena_max_live_bytes": self.arena.max_live_bytes,
            "largest_tensor_bytes": self.arena.largest_tensor_bytes,
            "latency_s": self.latency_s(1),
            "npu_s": self.unit_seconds(NPU),
            "m55_s": self.unit_seconds(M55),
            "cost_model": asdict(self.cost),
        }


def plan_device(
    interp, cost: CostModel | None = None, structure: DeviceStructure | None = None, area_scale: float = 1.0
) -> DeviceReport:
    """The STM32N6 placement, epochs, memory and latency estimate of a prepared Interpreter.
    `structure` (from device_structure()) skips the cost-independent part, as a fit does."""
    cost = cost or CostModel()
    s = structure or device_structure(interp, area_scale)
    ops = []
    for op, depth, bank in zip(s.ops, s.depth, s.bank_bytes):
        compute, memory, overhead = op_times(op, depth, bank, cost)
        ops.append(
            OpCost(
                **op,
                compute_s=compute,
                memory_s=memory,
                overhead_s=overhead,
                seconds=max(compute, memory) + overhead,
            )
        )
    epochs: list = []
    for o in ops:
        if not epochs or epochs[-1].unit != o.unit:
            epochs.append(Epoch(index=len(epochs), unit=o.unit, ops=[]))
        o.epoch = epochs[-1].index
        epochs[-1].ops.append(o)
    return DeviceReport(
        ops=ops,
        epochs=epochs,
        arena=s.arena,
        memory=s.memory,
        weight_bytes=s.weight_bytes,
        total_macs=sum(o.macs for o in ops),
        cost=cost,
    )
