"""The STM32N6 view of a plan: which ops run on the Neural-ART NPU and which fall back to the
Cortex-M55 as software epochs, with MACs, memory and an estimated latency.

Everything here is computed from the prepared plan (the kernels' tensors, shapes and macs()),
never from the values the kernels produce, so it costs nothing to evaluate and another package
(the zo trainer) can import it to price a forward pass or a training step on the device:

    dev = plan_device(interp)            # DeviceReport
    dev.latency_s(batch=8)               # estimated seconds for 8 images, one after the other
    dev.arena.peak_bytes, dev.weight_bytes
    zo_step_report(interp, trainable_tensor_indices, q=4, batch=8)   # ZO step vs back-propagation

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

Activation memory is planned like TFLM's GreedyMemoryPlanner: each activation tensor lives from
the op that produces it (graph inputs from the start) to its last reader (graph outputs to the
end); tensors are placed largest first at the lowest offset that does not overlap, in memory, any
already placed tensor whose lifetime overlaps (first fit), at ARENA_ALIGNMENT bytes. The arena
peak is the highest end offset; the naive sum gives every tensor its own buffer. Kernel scratch
buffers, which TFLM also places in its arena, and ST's own buffer placement across the N6 memory
banks are not modelled. Weight memory is the bytes of every constant tensor the ops read (int8
weights, int32 biases, shape operands), each counted once.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import NpusimError
from .ops import MAC_OPS

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
ARENA_ALIGNMENT = 16  # bytes, as TFLM aligns arena buffers

NPU = "NPU"
M55 = "M55"

# Hardware operators of the Neural-ART (see the docstring for the source).
CONV_ACCELERATOR_KINDS = frozenset(MAC_OPS)
NPU_KINDS = CONV_ACCELERATOR_KINDS | frozenset({
    "ADD", "AVERAGE_POOL_2D", "MAX_POOL_2D", "PAD", "PADV2", "RESHAPE", "CONCATENATION", "TRANSPOSE", "MEAN"})
# Activations the NPU fuses into the producing layer.
NPU_FUSED_ACTIVATIONS = frozenset({"NONE", "RELU", "RELU6", "RELU_N1_TO_1"})


@dataclass
class CostModel:
    """Throughputs and overheads of the estimate. Defaults are read from the module constants when
    the object is made, so changing npusim.npu.NPU_EFFICIENCY changes every later estimate."""

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
        for name in ("npu_clock_hz", "npu_macs_per_cycle_per_ca", "npu_elements_per_cycle", "m55_clock_hz", "m55_macs_per_cycle"):
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
        return (f"NPU {self.npu_peak_macs_per_s / 1e9:g} GMAC/s peak ({self.npu_conv_accelerators} conv accelerators at "
                f"{self.npu_clock_hz / 1e9:g} GHz) x {self.npu_efficiency:g} efficiency, other NPU layers "
                f"{self.npu_elements_per_cycle:g} elements/cycle; "
                f"M55 {self.m55_clock_hz / 1e6:g} MHz x {self.m55_macs_per_cycle:g} MAC/cycle; "
                f"{self.epoch_overhead_s * 1e6:g} us per epoch")


# ----------------------------------------------------------------------------------------------
# Placement


def _elements(t) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) if t is not None else 0


def _nbytes(t) -> int:
    return _elements(t) * np.dtype(t.dtype).itemsize


def placement(kernel) -> tuple[str, str]:
    """(unit, reason) for one prepared kernel: NPU or M55, and why when it is the M55."""
    kind = kernel.op.kind
    acts = [t for t in kernel.inputs if t is not None and not t.is_constant] + list(kernel.outputs)
    if kind not in NPU_KINDS:
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
        axes = sorted({int(a) % rank for a in np.asarray(axes_t.data).ravel()}) if axes_t is not None and axes_t.data is not None else []
        if rank != 4 or axes != [1, 2]:
            return M55, "MEAN maps to the NPU only as global pooling over H and W of a 4-D tensor"
    return NPU, ""


# ----------------------------------------------------------------------------------------------
# Arena plan


@dataclass
class Buffer:
    tensor: int  # tensor index
    size: int  # bytes for the planned batch, aligned
    first: int  # execution position of the producer (-1: graph input, live from the start)
    last: int  # execution position of the last reader
    offset: int = 0


@dataclass
class ArenaPlan:
    buffers: list  # list[Buffer], in placement order
    peak_bytes: int  # greedy plan: highest end offset
    naive_bytes: int  # every activation tensor in its own buffer
    max_live_bytes: int  # lower bound: largest sum of simultaneously live tensors
    largest_tensor_bytes: int
    batch: int = 1

    def offsets(self) -> dict:
        return {b.tensor: b.offset for b in self.buffers}


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def activation_lifetimes(interp) -> dict:
    """{tensor index: (first, last)} execution positions of every activation tensor of the plan."""
    graph = interp.graph
    n_ops = len(interp.kernels)
    life: dict = {}
    for t in graph.inputs:
        life[t] = [-1, -1]
    for pos, k in enumerate(interp.kernels):
        for t in k.op.inputs:
            if t >= 0 and not graph.tensors[t].is_constant:
                life.setdefault(t, [pos, pos])[1] = pos
        for t in k.op.outputs:
            life.setdefault(t, [pos, pos])
    for t in graph.outputs:
        if t in life:
            life[t][1] = n_ops  # read by the caller after the last op
    return {t: (a, b) for t, (a, b) in life.items()}


def greedy_first_fit(buffers: list) -> int:
    """Place buffers (largest first, ties by first use) at the lowest non-conflicting offset, as
    TFLM's GreedyMemoryPlanner does; set each .offset and return the arena peak."""
    order = sorted(buffers, key=lambda b: (-b.size, b.first, b.tensor))
    placed: list = []
    peak = 0
    for b in order:
        conflicts = sorted((p for p in placed if p.first <= b.last and b.first <= p.last), key=lambda p: p.offset)
        offset = 0
        for p in conflicts:
            if p.offset - offset >= b.size:
                break
            offset = max(offset, p.offset + p.size)
        b.offset = offset
        placed.append(b)
        peak = max(peak, offset + b.size)
    buffers[:] = order
    return peak


def plan_arena(interp, batch: int = 1, alignment: int = ARENA_ALIGNMENT) -> ArenaPlan:
    """Liveness-based offset plan of the activation tensors for `batch` images held at once."""
    if batch < 1:
        raise NpusimError(f"batch must be at least 1, got {batch}")
    tensors = interp.graph.tensors
    buffers = [Buffer(t, _align(_nbytes(tensors[t]) * batch, alignment), a, b)
               for t, (a, b) in activation_lifetimes(interp).items()]
    peak = greedy_first_fit(buffers)
    positions = sorted({b.first for b in buffers} | {b.last for b in buffers})
    max_live = max((sum(b.size for b in buffers if b.first <= p <= b.last) for p in positions), default=0)
    return ArenaPlan(buffers=buffers, peak_bytes=peak, naive_bytes=sum(b.size for b in buffers), max_live_bytes=max_live,
                     largest_tensor_bytes=max((b.size for b in buffers), default=0), batch=batch)


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
    elements = max([_elements(t) for t in list(kernel.inputs) + list(kernel.outputs) if t is not None and not t.is_constant] or [0])
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
            "epochs": [{"index": e.index, "unit": e.unit, "ops": [o.op_index for o in e.ops], "macs": e.macs,
                        "weight_bytes": e.weight_bytes, "seconds": e.seconds} for e in self.epochs],
            "weight_bytes": self.weight_bytes, "total_macs": self.total_macs,
            "arena_peak_bytes": self.arena.peak_bytes, "arena_naive_bytes": self.arena.naive_bytes,
            "arena_max_live_bytes": self.arena.max_live_bytes, "largest_tensor_bytes": self.arena.largest_tensor_bytes,
            "latency_s": self.latency_s(1), "npu_s": self.unit_seconds(NPU), "m55_s": self.unit_seconds(M55),
            "cost_model": asdict(self.cost),
        }

    def format(self, title: str = "") -> str:
        return format_report(self, title)


def plan_device(interp, cost: CostModel | None = None) -> DeviceReport:
    """The STM32N6 placement, epochs, memory and latency estimate of a prepared Interpreter."""
    cost = cost or CostModel()
    graph = interp.graph
    ops: list = []
    constants: set = set()
    for pos, k in enumerate(interp.kernels):
        unit, reason = placement(k)
        consts = [t for t in dict.fromkeys(k.op.inputs) if t >= 0 and graph.tensors[t].is_constant and t not in constants]
        constants.update(consts)
        acts = [t for t in list(k.inputs) + list(k.outputs) if t is not None and not t.is_constant]
        ops.append(OpCost(position=pos, op_index=k.op.index, kind=k.op.kind, unit=unit, reason=reason, macs=int(k.macs()),
                          elements=max([_elements(t) for t in acts] or [0]),
                          weight_bytes=sum(_nbytes(graph.tensors[t]) for t in consts),
                          seconds=op_seconds(k, unit, cost)))
    epochs: list = []
    for o in ops:
        if not epochs or epochs[-1].unit != o.unit:
            epochs.append(Epoch(index=len(epochs), unit=o.unit, ops=[], overhead_s=cost.epoch_overhead_s))
        o.epoch = epochs[-1].index
        epochs[-1].ops.append(o)
    return DeviceReport(ops=ops, epochs=epochs, arena=plan_arena(interp, 1),
                        weight_bytes=sum(_nbytes(graph.tensors[t]) for t in constants),
                        total_macs=sum(o.macs for o in ops), cost=cost)


# ----------------------------------------------------------------------------------------------
# Text


def _kib(n: int) -> str:
    return f"{n:,} B ({n / 1024:.1f} KiB)"


def _table(rows: list, right: set) -> list:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def format_report(dev: DeviceReport, title: str = "") -> str:
    lines = [f"STM32N6 Neural-ART view{': ' + title if title else ''}", f"cost model: {dev.cost.describe()}", ""]
    rows = [("#", "op", "unit", "epoch", "MACs", "weights B", "est. us", "note")]
    for o in dev.ops:
        rows.append((str(o.op_index), o.kind, o.unit, str(o.epoch), f"{o.macs:,}", f"{o.weight_bytes:,}", f"{o.seconds * 1e6:.2f}", o.reason))
    lines += _table(rows, {0, 3, 4, 5, 6})
    lines += ["", "epochs (consecutive ops on one unit):"]
    rows = [("epoch", "unit", "ops", "n", "MACs", "weights B", "est. us")]
    for e in dev.epochs:
        rows.append((str(e.index), e.unit, e.op_range, str(len(e.ops)), f"{e.macs:,}", f"{e.weight_bytes:,}", f"{e.seconds * 1e6:.2f}"))
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
        f"MACs: {dev.total_macs:,} per image, {npu_macs:,} on NPU ({100.0 * npu_macs / max(dev.total_macs, 1):.2f} %)",
        f"weight memory: {_kib(dev.weight_bytes)} (constant tensors)",
        f"activation arena: peak {_kib(a.peak_bytes)} (greedy first-fit by lifetime), naive sum {_kib(a.naive_bytes)}, "
        f"largest tensor {_kib(a.largest_tensor_bytes)}",
        f"estimated latency: {lat * 1e3:.3f} ms per image (NPU {dev.unit_seconds(NPU) * 1e3:.3f} ms, "
        f"M55 {dev.unit_seconds(M55) * 1e3:.3f} ms, {len(dev.epochs)} epoch overheads included), "
        f"{1.0 / lat if lat > 0 else float('inf'):.0f} images/s",
    ]
    return "\n".join(lines)


def report(interp, cost: CostModel | None = None, title: str = "") -> str:
    """The text `npusim inspect --target stm32n6` prints."""
    return format_report(plan_device(interp, cost), title)


# ----------------------------------------------------------------------------------------------
# A zeroth-order training step against back-propagation, on the device


def trainable_suffix_start(interp, trainable: set) -> int:
    """Execution position of the first op that reads a trainable tensor."""
    for pos, k in enumerate(interp.kernels):
        if trainable & set(k.op.inputs):
            return pos
    raise NpusimError("no op reads any of the trainable tensors")


def zo_step_report(interp, trainable_tensor_indices, q: int, batch: int, cost: CostModel | None = None,
                   optimizer_states: int = 2, seed_bytes: int = 8, resident_images: int = 1) -> dict:
    """Device memory and time of one ZO step (2q forward passes over a batch) next to one
    back-propagation step that trains the same tensors.

    The device runs one image at a time (as latency_s assumes); `resident_images` is how many
    images' activations are held at once (1: losses and gradients are accumulated image by image;
    pass `batch` to model a device that holds the whole batch).
    ZO memory: inference arena + model weights + per probe one seed (`seed_bytes`; perturbations are
    regenerated from it, never stored) and one float32 directional derivative + float32 master copies
    of the trainable tensors; the perturbed int8 weights are written in place.
    Back-propagation memory: model weights + max(inference arena, activations of the trainable suffix
    kept for the backward pass + two float32 activation-gradient buffers of the largest suffix op)
    + float32 master copies, float32 gradients and `optimizer_states` float32 states per trainable
    parameter (Adam: 2).
    Time: ZO runs 2q whole forward passes of every image (`zo_seconds`, the count the tables report);
    `zo_seconds_suffix_cached` runs the frozen prefix once per image and only the trainable suffix 2q
    times, at the cost of keeping the suffix's input activations for the batch (`suffix_cache_bytes`).
    Back-propagation time, a path the NPU cannot run, is one forward pass plus a backward pass of the
    suffix on the M55 at twice the suffix's MACs, per image.
    Returns a plain dict; format_zo_step_report() turns it into text.
    """
    trainable = {int(t) for t in trainable_tensor_indices}
    graph = interp.graph
    if q < 1 or batch < 1 or resident_images < 1:
        raise NpusimError(f"q, batch and resident_images must be at least 1, got q={q}, batch={batch}, resident_images={resident_images}")
    for t in sorted(trainable):
        if not 0 <= t < len(graph.tensors) or not graph.tensors[t].is_constant:
            raise NpusimError(f"tensor {t} is not a constant tensor of the model, so it cannot be trained")
    cost = cost or CostModel()
    dev = plan_device(interp, cost)
    arena = plan_arena(interp, resident_images)
    start = trainable_suffix_start(interp, trainable)
    params = sum(_elements(graph.tensors[t]) for t in trainable)

    def is_activation(t):
        return t >= 0 and not graph.tensors[t].is_constant

    suffix = interp.kernels[start:]
    stored = {t for k in suffix for t in list(k.op.inputs) + list(k.op.outputs) if is_activation(t)}
    stored_bytes = sum(_nbytes(graph.tensors[t]) for t in stored) * resident_images
    largest = max(max([_elements(graph.tensors[t]) for t in list(k.op.inputs) + list(k.op.outputs) if is_activation(t)] or [0]) for k in suffix)
    grad_act_bytes = 2 * 4 * largest * resident_images
    produced_in_suffix = {t for k in suffix for t in k.op.outputs}
    boundary = {t for k in suffix for t in k.op.inputs if is_activation(t) and t not in produced_in_suffix}
    zo = {
        "arena_bytes": arena.peak_bytes,
        "weight_bytes": dev.weight_bytes,
        "seed_bytes": q * (seed_bytes + 4),
        "master_bytes": 4 * params,
    }
    zo["total_bytes"] = sum(zo.values())
    bp = {
        "weight_bytes": dev.weight_bytes,
        "activation_bytes": max(arena.peak_bytes, stored_bytes + grad_act_bytes),
        "stored_activation_bytes": stored_bytes,
        "activation_gradient_bytes": grad_act_bytes,
        "master_bytes": 4 * params,
        "gradient_bytes": 4 * params,
        "optimizer_bytes": 4 * params * optimizer_states,
    }
    bp["total_bytes"] = bp["weight_bytes"] + bp["activation_bytes"] + bp["master_bytes"] + bp["gradient_bytes"] + bp["optimizer_bytes"]
    forward = dev.latency_s(1)
    suffix_forward = dev.latency_s(1, first=start)
    suffix_macs = sum(o.macs for o in dev.ops[start:])
    return {
        "q": q, "batch": batch, "resident_images": resident_images,
        "trainable_tensors": sorted(trainable), "trainable_params": params,
        "suffix_first_op": interp.kernels[start].op.index, "suffix_ops": len(suffix),
        "forward_passes": 2 * q,  # over the batch
        "image_passes": 2 * q * batch,
        "forward_s": forward,  # one image
        "zo_seconds": 2 * q * batch * forward,
        "zo_seconds_suffix_cached": batch * (forward + 2 * q * suffix_forward),
        "suffix_cache_bytes": batch * sum(_nbytes(graph.tensors[t]) for t in boundary),
        "bp_seconds": batch * (forward + 2 * suffix_macs / (cost.m55_macs_per_cycle * cost.m55_clock_hz)),
        "zo_memory": zo, "bp_memory": bp,
        "optimizer_states": optimizer_states,
        "cost_model": cost.describe(),
    }


def format_zo_step_report(r: dict) -> str:
    zo, bp = r["zo_memory"], r["bp_memory"]
    return "\n".join([
        f"ZO step on STM32N6: q={r['q']}, batch={r['batch']} ({r['resident_images']} image(s) resident), "
        f"{r['trainable_params']:,} trainable parameters in "
        f"{len(r['trainable_tensors'])} tensors (suffix from op {r['suffix_first_op']}, {r['suffix_ops']} ops)",
        f"cost model: {r['cost_model']}",
        f"memory, ZO: {_kib(zo['total_bytes'])} = arena {_kib(zo['arena_bytes'])} + weights {_kib(zo['weight_bytes'])} "
        f"+ seeds {_kib(zo['seed_bytes'])} + float32 masters {_kib(zo['master_bytes'])}",
        f"memory, back-propagation ({r['optimizer_states']} optimizer states): {_kib(bp['total_bytes'])} = weights {_kib(bp['weight_bytes'])} "
        f"+ activations {_kib(bp['activation_bytes'])} (stored suffix {_kib(bp['stored_activation_bytes'])}, "
        f"gradients {_kib(bp['activation_gradient_bytes'])}) + masters {_kib(bp['master_bytes'])} "
        f"+ gradients {_kib(bp['gradient_bytes'])} + optimizer {_kib(bp['optimizer_bytes'])}",
        f"time per step: ZO {r['zo_seconds'] * 1e3:.2f} ms ({r['forward_passes']} forward passes x {r['batch']} images "
        f"x {r['forward_s'] * 1e3:.3f} ms), {r['zo_seconds_suffix_cached'] * 1e3:.2f} ms with the frozen prefix run once "
        f"(caching {_kib(r['suffix_cache_bytes'])}); "
        f"back-propagation (backward on the M55) {r['bp_seconds'] * 1e3:.2f} ms",
    ])
