"""A zeroth-order training step priced on the STM32N6 next to one back-propagation step that trains
the same tensors (`zo cost`), from npusim's device model (npusim.npu: placement, latency, the NPU
compiler's memory layout), the same model `npusim inspect --target stm32n6` and the trainer's
device_seconds use."""

from __future__ import annotations

from npusim.npu import CostModel, plan_device, plan_fusion, plan_memory
from npusim.npu.arena import tensor_bytes, tensor_elements
from npusim.npu.cost import M55_CYCLES_PER_ELEMENT, M55_MACS_PER_CYCLE
from npusim.npu.report import kib

from .errors import ZoError


def trainable_suffix_start(interp, trainable: set) -> int:
    """Execution position of the first op that reads a trainable tensor."""
    for pos, k in enumerate(interp.kernels):
        if trainable & set(k.op.inputs):
            return pos
    raise ZoError("no op reads any of the trainable tensors")


def _arena_bytes(interp, units: list, resident_images: int) -> int:
    """The activation arena of resident_images images, laid out as the N6 view does (the units too,
    so that it holds the convolutions' suboff copies)."""
    arena = plan_memory(interp, plan_fusion(interp, units), scale=resident_images, units=units)
    return arena.internal_bytes + arena.external_bytes


def zo_step_report(
    interp,
    trainable_tensor_indices,
    q: int,
    batch: int,
    cost: CostModel | None = None,
    optimizer_states: int = 2,
    seed_bytes: int = 8,
    resident_images: int = 1,
    master: str = "float",
) -> dict:
    """Device memory and time of one ZO step (2q forward passes over a batch) next to one
    back-propagation step that trains the same tensors.

    The device runs one image at a time (as latency_s assumes); `resident_images` is how many
    images' activations are held at once (1: losses and gradients are accumulated image by image;
    pass `batch` to model a device that holds the whole batch).
    ZO memory: inference activations (the NPU compiler's layout over the N6 RAM banks, internal plus
    external, for `resident_images` images) + model weights + per probe one seed (`seed_bytes`;
    perturbations are regenerated from it, never stored) and one float32 directional derivative +
    float32 master copies and momentum of the trainable tensors (neither with master="none": updates
    go to the int8 codes by stochastic rounding); the perturbed int8 weights are written in place.
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
        raise ZoError(
            f"q, batch and resident_images must be at least 1, got q={q}, batch={batch}, "
            f"resident_images={resident_images}"
        )
    float_bytes = {"float": 4, "none": 0}[master]  # per parameter: master copy, and momentum
    for t in sorted(trainable):
        if not 0 <= t < len(graph.tensors) or not graph.tensors[t].is_constant:
            raise ZoError(f"tensor {t} is not a constant tensor of the model, so it cannot be trained")
    cost = cost or CostModel()
    dev = plan_device(interp, cost)
    arena_bytes = _arena_bytes(interp, [o.unit for o in dev.ops], resident_images)
    start = trainable_suffix_start(interp, trainable)
    params = sum(tensor_elements(graph.tensors[t]) for t in trainable)

    def is_activation(t):
        return t >= 0 and not graph.tensors[t].is_constant

    suffix = interp.kernels[start:]
    stored = {t for k in suffix for t in list(k.op.inputs) + list(k.op.outputs) if is_activation(t)}
    stored_bytes = sum(tensor_bytes(graph.tensors[t]) for t in stored) * resident_images
    largest = max(
        max(
            [
                tensor_elements(graph.tensors[t])
                for t in list(k.op.inputs) + list(k.op.outputs)
                if is_activation(t)
            ]
            or [0]
        )
        for k in suffix
    )
    grad_act_bytes = 2 * 4 * largest * resident_images
    produced_in_suffix = {t for k in suffix for t in k.op.outputs}
    boundary = {t for k in suffix for t in k.op.inputs if is_activation(t) and t not in produced_in_suffix}
    zo = {
        "arena_bytes": arena_bytes,
        "weight_bytes": dev.weight_bytes,
        "seed_bytes": q * (seed_bytes + 4),
        "master_bytes": float_bytes * params,
        "momentum_bytes": float_bytes * params,
    }
    zo["total_bytes"] = sum(zo.values())
    bp = {
        "weight_bytes": dev.weight_bytes,
        "activation_bytes": max(arena_bytes, stored_bytes + grad_act_bytes),
        "stored_activation_bytes": stored_bytes,
        "activation_gradient_bytes": grad_act_bytes,
        "master_bytes": 4 * params,
        "gradient_bytes": 4 * params,
        "optimizer_bytes": 4 * params * optimizer_states,
    }
    bp["total_bytes"] = (
        bp["weight_bytes"]
        + bp["activation_bytes"]
        + bp["master_bytes"]
        + bp["gradient_bytes"]
        + bp["optimizer_bytes"]
    )
    forward = dev.latency_s(1)
    suffix_forward = dev.latency_s(1, first=start)
    suffix_macs = sum(o.macs for o in dev.ops[start:])
    return {
        "q": q,
        "batch": batch,
        "resident_images": resident_images,
        "trainable_tensors": sorted(trainable),
        "trainable_params": params,
        "suffix_first_op": interp.kernels[start].op.index,
        "suffix_ops": len(suffix),
        "forward_passes": 2 * q,  # over the batch
        "image_passes": 2 * q * batch,
        "forward_s": forward,  # one image
        "zo_seconds": 2 * q * batch * forward,
        "zo_seconds_suffix_cached": batch * (forward + 2 * q * suffix_forward),
        "suffix_cache_bytes": batch * sum(tensor_bytes(graph.tensors[t]) for t in boundary),
        "bp_seconds": batch * (forward + 2 * suffix_macs / (cost.m55_macs_per_cycle * cost.m55_clock_hz)),
        "zo_memory": zo,
        "bp_memory": bp,
        "optimizer_states": optimizer_states,
        "master": master,
        "cost_model": cost.describe(),
    }


def format_zo_step_report(r: dict, tail=None) -> str:
    """tail: the run's ExactTail (zo/tail.py), whose extra memory gets its own line."""
    zo, bp = r["zo_memory"], r["bp_memory"]
    tail_line = (
        []
        if tail is None
        else [
            f"exact tail ({', '.join(f.inputs[1].name for f in tail.layers)}): "
            f"{kib(tail.memory_bytes(r['batch']))} "
            f"more for the batch (their int8 inputs, the clamp masks, one float32 gradient buffer); "
            f"{tail.macs_per_image * r['batch']:,} weight-gradient multiply-adds a step on the M55"
        ]
    )
    return "\n".join(
        tail_line
        + [
            f"ZO step on STM32N6: q={r['q']}, batch={r['batch']} ({r['resident_images']} image(s) resident), "
            f"{r['trainable_params']:,} trainable parameters in {len(r['trainable_tensors'])} tensors "
            f"(suffix from op {r['suffix_first_op']}, {r['suffix_ops']} ops)",
            f"cost model: {r['cost_model']}",
            f"memory, ZO: {kib(zo['total_bytes'])} = arena {kib(zo['arena_bytes'])} + weights "
            f"{kib(zo['weight_bytes'])} + seeds {kib(zo['seed_bytes'])} + float32 masters "
            f"{kib(zo['master_bytes'])} + float32 momentum {kib(zo['momentum_bytes'])} "
            f"(--master {r['master']})",
            f"memory, back-propagation ({r['optimizer_states']} optimizer states): {kib(bp['total_bytes'])} "
            f"= weights {kib(bp['weight_bytes'])} + activations {kib(bp['activation_bytes'])} (stored "
            f"suffix {kib(bp['stored_activation_bytes'])}, gradients "
            f"{kib(bp['activation_gradient_bytes'])}) + masters {kib(bp['master_bytes'])} + gradients "
            f"{kib(bp['gradient_bytes'])} + optimizer {kib(bp['optimizer_bytes'])}",
            f"time per step: ZO {r['zo_seconds'] * 1e3:.2f} ms ({r['forward_passes']} forward passes x "
            f"{r['batch']} images x {r['forward_s'] * 1e3:.3f} ms), "
            f"{r['zo_seconds_suffix_cached'] * 1e3:.2f} ms with the frozen prefix run once (caching "
            f"{kib(r['suffix_cache_bytes'])}); back-propagation (backward on the M55) "
            f"{r['bp_seconds'] * 1e3:.2f} ms",
        ]
    )


# A step's work on the Cortex-M55 besides its forward passes (--budget-ms). Cycle counts per element
# of a Helium (MVE) implementation; none is measured on a board.
CYCLES_PER_DIRECTION_COORDINATE = 1.0  # ASSUMPTION: a counter-based generator's 32-bit word gives 32
#   Rademacher signs; expanding and scaling them is about one cycle per coordinate
CYCLES_PER_PERTURBED_CODE = 0.25  # ASSUMPTION: int8 add, saturate and store, 16 lanes per beat pair
CYCLES_PER_UPDATED_PARAMETER = 4.0  # ASSUMPTION: float32 master += step, round, clamp, store the code
CYCLES_PER_LOGIT = M55_CYCLES_PER_ELEMENT["SOFTMAX"]  # the loss: a softmax per logit (npusim.npu.cost)


def step_overhead_seconds(
    q: int, batches: int, dims: int, perturbed: int, params: int, passes: int, logits: int, head_macs: int,
    cost: CostModel | None = None,
) -> float:  # fmt: skip
    """Device seconds of one step's fixed work on the M55, beside its forward passes:
    - the q directions over the block's `dims` coordinates, generated twice (for the probes, and again
      from their seeds to form the update: never stored);
    - each probe pair writes the `perturbed` codes three times per mini-batch (w + d, w - d, w);
    - the write-back of all `params` trainable values after the update;
    - the loss of every pass's `logits` (batch x classes), and the exact head's outer product
      (`head_macs` multiply-adds, zo/head_grad.py).
    What does not grow with q (the write-back, the head) is what a larger q amortises."""
    cost = cost or CostModel()
    cycles = (
        2 * q * dims * CYCLES_PER_DIRECTION_COORDINATE
        + 3 * q * batches * perturbed * CYCLES_PER_PERTURBED_CODE
        + params * CYCLES_PER_UPDATED_PARAMETER
        + passes * logits * CYCLES_PER_LOGIT
        + head_macs / cost.m55_macs_per_cycle
    )
    return cycles / cost.m55_clock_hz


# -- a step of the hybrid trainer on the device, part by part (--budget-ms, `zo cost`) ---------------
# Cortex-M55 MAC rates. Peak, per cycle, of Helium's dual-beat datapath (64 bits a cycle, a 128-bit
# vector in two beats): 8 int8, 4 int16, 2 int32, 4 fp16 and 2 fp32 multiply-accumulates (Elettronica
# Plus, "Embedded 90", November 2023, p. 37, on the Cortex-M85's Helium, the same dual-beat MVE as the
# Cortex-M55's; Arm's Cortex-M55 product page describes the M55's MVE as dual-beat too).
M55_PEAK_MACS_PER_CYCLE = {"int8": 8.0, "fp32": 2.0}
# What a kernel sustains of that peak: npusim.npu.cost's CMSIS-NN int8 figure (2 MACs a cycle, itself
# an ASSUMPTION) over the int8 peak, 0.25; ASSUMPTION: the same fraction for fp32 (loads of the
# operands and the accumulator's spills bound both alike), 0.5 fp32 MACs a cycle.
M55_SUSTAINED_FRACTION = M55_MACS_PER_CYCLE / M55_PEAK_MACS_PER_CYCLE["int8"]
# ASSUMPTION: one Gaussian (or Rademacher) value of an activity direction, drawn from a counter-based
# generator and scaled, about as costly as a weight direction's coordinate.
CYCLES_PER_ACTIVITY_ELEMENT = CYCLES_PER_DIRECTION_COORDINATE


def m55_mac_seconds(macs: float, dtype: str, cost: CostModel | None = None) -> float:
    """Seconds of `macs` multiply-adds on the M55 in int8 or fp32 at the sustained rate above."""
    cost = cost or CostModel()
    rate = M55_PEAK_MACS_PER_CYCLE[dtype] * M55_SUSTAINED_FRACTION
    return macs / rate / cost.m55_clock_hz


def trainable_ops(interp, trainable: set) -> list:
    """(execution position, kernel) of every op that reads a trainable tensor, in execution order."""
    return [(pos, k) for pos, k in enumerate(interp.kernels) if trainable & set(k.op.inputs)]


def exact_tail_positions(interp, ops: list, head_pos: int | None) -> set:
    """Positions of the trainable MAC ops whose gradient the head's error gives exactly: the layers
    zo/tail.py's walk finds (the trainer's own rule: only parameter-free ops between them and the
    head), so that `zo cost` prices the step the trainer runs. No FULLY_CONNECTED head, no tail. The
    head itself is not counted."""
    if head_pos is None:
        return set()
    from .tail import find_tail_ops

    position = {id(k.op): pos for pos, k in ops}
    head = interp.kernels[head_pos].op
    _, layers = find_tail_ops(interp.kernels[: head_pos + 1], head, lambda op: id(op) in position)
    return {position[id(op)] for op in layers}


def step_parts(
    interp, trainable_tensor_indices, q: int, batch: int, cost: CostModel | None = None,
    grad_dtype: str = "fp32", layer: int | None = None, estimated: bool = True,
) -> dict:  # fmt: skip
    """Device seconds of one step of the hybrid trainer with activity perturbation, part by part,
    averaged over the round robin of the layers below the exact tail (one of them is perturbed a step),
    or with `layer` (the execution position of one of them) the figures of a step that perturbs it:

    - `head_pass`: one pass of the trainable suffix over the batch, the one whose features and softmax
      error give the head's exact gradient and the tail's (npusim's N6 latency from the first op that
      reads a trainable tensor; the frozen prefix's outputs are cached);
    - `probe_passes`: per direction 2 passes of what follows the step's perturbed layer;
    - `directions`: the q directions drawn twice (probes, then the update, from their seeds) over the
      perturbed layer's output for the whole batch;
    - `local_gradients`: the exact tail's layers and the step's perturbed layer form their weight
      gradients from their cached inputs and their output gradients: as many multiply-adds as their
      forward passes, per image, on the M55 (`grad_dtype`: fp32, the output gradient being a float;
      int8 for a device that quantizes it);
    - `head_outer`: the head's (p - y)' x, classes x features multiply-adds per image, on the M55;
    - `write_back`: the step's updated values (head, tail, the perturbed layer) rounded, clamped, stored;
    - `loss`: a softmax per logit of every pass.
    `fixed_s` (what a step pays whatever q is) + q x `per_direction_s` = `total_s`. With estimated False:
    a step that moves the exact head and tail only (the rate rule's skip, zo/schedulers.ProgressRate):
    no layer below the tail is perturbed, gets a local gradient or is written back."""
    if q < 1 or batch < 1:
        raise ZoError(f"q and batch must be at least 1, got q={q}, batch={batch}")
    cost = cost or CostModel()
    graph = interp.graph
    trainable = {int(t) for t in trainable_tensor_indices}
    dev = plan_device(interp, cost)
    ops = trainable_ops(interp, trainable)
    if not ops:
        raise ZoError("no op reads any of the trainable tensors")
    head_pos = ops[-1][0] if ops[-1][1].op.kind == "FULLY_CONNECTED" else None
    tail = exact_tail_positions(interp, ops, head_pos)
    perturbed = [pos for pos, _ in ops if pos != head_pos and pos not in tail]
    suffix_pass = dev.latency_s(batch, first=ops[0][0])
    classes = graph.tensors[interp.kernels[-1].op.outputs[0]].shape[-1]

    def values(positions):
        return sum(
            tensor_elements(graph.tensors[t])
            for p in positions
            for t in interp.kernels[p].op.inputs
            if t in trainable
        )

    if layer is not None and layer not in perturbed:
        raise ZoError(f"op position {layer} is not a trainable layer below the exact tail")

    def mean(f):  # over the round robin of the perturbed layers (nothing when there is none)
        if not estimated:
            return 0.0
        if layer is not None:
            return f(layer)
        return sum(f(p) for p in perturbed) / len(perturbed) if perturbed else 0.0

    exact_macs = batch * sum(dev.ops[p].macs for p in tail)
    local_macs = exact_macs + batch * mean(lambda p: dev.ops[p].macs)
    head_macs = batch * dev.ops[head_pos].macs if head_pos is not None else 0
    per_direction = {
        "probe_passes": 2 * mean(lambda p: dev.latency_s(batch, first=p + 1)),
        "directions": 2 * batch * CYCLES_PER_ACTIVITY_ELEMENT / cost.m55_clock_hz
        * mean(lambda p: tensor_elements(graph.tensors[interp.kernels[p].op.outputs[0]])),
        "loss": 2 * batch * classes * CYCLES_PER_LOGIT / cost.m55_clock_hz if perturbed else 0.0,
    }  # fmt: skip
    updated = values([head_pos] if head_pos is not None else []) + values(tail) + mean(lambda p: values([p]))
    fixed = {
        "head_pass": suffix_pass,
        "local_gradients": m55_mac_seconds(local_macs, grad_dtype, cost),
        "head_outer": m55_mac_seconds(head_macs, grad_dtype, cost),
        "write_back": updated * CYCLES_PER_UPDATED_PARAMETER / cost.m55_clock_hz,
        "loss": batch * classes * CYCLES_PER_LOGIT / cost.m55_clock_hz,
    }
    fixed_s, per_direction_s = sum(fixed.values()), sum(per_direction.values())
    return {
        "q": q,
        "batch": batch,
        "suffix_pass_s": suffix_pass,
        "fixed": fixed,
        "per_direction": per_direction,
        "fixed_s": fixed_s,
        "per_direction_s": per_direction_s,
        "total_s": fixed_s + q * per_direction_s,
        "local_gradient_macs": int(round(local_macs)),
        "exact_tail_macs": exact_macs,
        "head_outer_macs": head_macs,
        "tail_layers": len(tail),
        "perturbed_layers": len(perturbed),
        "grad_dtype": grad_dtype,
        # q* of the rule is sqrt(noise / signal x fixed / per direction): docs/zo.md
        "fixed_per_direction": fixed_s / per_direction_s if per_direction_s else float("inf"),
    }


def format_step_parts(r: dict) -> str:
    ms = lambda s: f"{s * 1e3:.3f} ms"  # noqa: E731
    f, p = r["fixed"], r["per_direction"]
    return "\n".join(
        [
            f"step of the hybrid trainer (activity perturbation), q={r['q']}, batch={r['batch']}: "
            f"{ms(r['total_s'])} = fixed {ms(r['fixed_s'])} + {r['q']} x {ms(r['per_direction_s'])} "
            "a direction",
            f"  fixed: head pass {ms(f['head_pass'])} (NPU, suffix), local weight gradients "
            f"{ms(f['local_gradients'])} ({r['local_gradient_macs']:,} {r['grad_dtype']} MACs on the M55: "
            f"{r['tail_layers']} exact-tail layer(s) and the step's perturbed one), "
            f"head outer product {ms(f['head_outer'])} ({r['head_outer_macs']:,} MACs), write-back "
            f"{ms(f['write_back'])}, loss {ms(f['loss'])}",
            f"  per direction: 2 passes after the perturbed layer {ms(p['probe_passes'])} (NPU), directions "
            f"{ms(p['directions'])} (one of {r['perturbed_layers']} layers a step, round robin), "
            f"loss {ms(p['loss'])}",
            f"  fixed / per direction = {r['fixed_per_direction']:.2f} (the ratio the q rule weighs, "
            "docs/zo.md); averages over the round robin of the layers below the tail",
        ]
    )
