"""How ST's Neural-ART compiler folds a TFLite graph into hardware epochs, as far as the cost and memory
models need it: which ops are layers of their own, which ride along in a layer's epoch, and which move
no data at all.

Every op gets one role:
- "layer": a hardware epoch of its own on the NPU (a convolution, pooling, an element-wise op that reads
  a buffer from memory, ...) or a software epoch's op on the Cortex-M55;
- "epilogue": an element-wise NPU op whose activation inputs all come from the current epoch's chain
  (YOLO's SiLU, x * sigmoid(x), after a convolution): the stream switch chains the activation and
  arithmetic units behind the convolution accelerators, so the op adds no epoch and its inputs are
  never written to memory; a residual ADD of the chain's output and a tensor in memory likewise (it
  reads that tensor; its bytes count in the epoch's layer, npu/cost.py);
- "view": no data moves. RESHAPE, SQUEEZE and EXPAND_DIMS keep the bytes; STRIDED_SLICE, SLICE, SPLIT
  and SPLIT_V are read in place with strides ("slice"); the inputs of a CONCATENATION are written by
  their producers straight into the concatenation's buffer, so the CONCATENATION itself copies nothing
  ("concat"). Optionally ("pad", off by default) a spatial PAD whose only reader is a convolution is
  taken over by the convolution's own padding, and ("add", off by default) an ADD with one input
  from the current epoch's chain and the other from memory is an epilogue that reads memory.
The chaining, the strided views and the in-place concatenation are ASSUMPTIONS about ST's compiler (its
documentation describes epochs, the stream switch and chaining, not these rewrites one by one). The
default set is the one whose memory plan comes closest to ST's published internal-RAM figures of the
four calibration models (the ablation is in docs/stm32n6.md); a separate padded tensor is what those
figures show (taking the PAD over leaves YOLOv8n at 0.62 of its published RAM).

`aliases` maps a tensor that shares another tensor's memory to that tensor (its root), and
`streamed` holds the tensors that live only on the stream switch (never in memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..registry import CHAIN, CONCAT, PAD_TAKEN, RESHAPE, STRIDED_READ, kinds

LAYER, EPILOGUE, VIEW = "layer", "epilogue", "view"

# Each op's fusion class is in the registry (npusim/registry.py).
RESHAPE_KINDS = kinds(fusion=RESHAPE)
STRIDED_READ_KINDS = kinds(fusion=STRIDED_READ)
CHAINABLE_KINDS = kinds(fusion=CHAIN)
PAD_KINDS = kinds(fusion=PAD_TAKEN)
CONCAT_KINDS = kinds(fusion=CONCAT)
PAD_TAKERS = (["CONV_2D"], ["DEPTHWISE_CONV_2D"])  # a PAD's only reader that can take its padding over


@dataclass
class FusionPlan:
    roles: list  # per execution position: LAYER, EPILOGUE or VIEW
    aliases: dict = field(default_factory=dict)  # tensor -> tensor whose memory it shares
    streamed: set = field(default_factory=set)  # tensors that never reach memory

    def root(self, t: int) -> int:
        while t in self.aliases:
            t = self.aliases[t]
        return t


def _activations(graph, tensors) -> list:
    return [t for t in tensors if t >= 0 and not graph.tensors[t].is_constant]


def _spatial_pad(kernel) -> bool:
    pads = kernel.inputs[1]
    if pads is None or pads.data is None:
        return False
    p = np.asarray(pads.data).reshape(-1, 2)
    return p.shape[0] == 4 and not p[0].any() and not p[3].any()


REWRITES = frozenset({"slice", "concat", "chain"})
# "add": an ADD one of whose inputs the current epoch's chain produces, the other read from memory,
# runs in that epoch (ST's two compiles of YOLOX-nano 480, ../shared/models/stm32n6/st_compiler: in
# the 2.1 blobs each of the 21 ADD ARITHs is configured in the epoch of a conv, 19 with one conv and
# 2 with two; in the 3.0 c_info.json each residual ADD's output buffer starts in the epoch of the
# conv before it, e.g. Add_164_out_0 and Conv2D_160 in epoch 34).
ADD_KINDS = frozenset({"ADD"})


def plan_fusion(interp, units: list, rewrites=REWRITES) -> FusionPlan:
    """Roles, aliases and streamed tensors of a prepared Interpreter whose ops are placed on `units`
    (NPU or M55 per execution position). `rewrites` switches the compiler rewrites above on or off
    (pad, slice, concat, chain), for the ablations in docs/stm32n6.md."""
    graph = interp.graph
    kernels = interp.kernels
    readers: dict = {}
    for pos, k in enumerate(kernels):
        for t in _activations(graph, k.op.inputs):
            readers.setdefault(t, []).append(pos)
    outputs = set(graph.outputs)
    roles = [LAYER] * len(kernels)
    plan = FusionPlan(roles)
    chain: set = set()  # tensors produced by the current NPU epoch's chain
    concat_owner: dict = {}  # concatenation input -> the concatenation output it is written into
    for pos, k in enumerate(kernels):
        kind = k.op.kind
        acts = _activations(graph, k.op.inputs)
        on_npu = units[pos] == "NPU"
        if on_npu and (kind in RESHAPE_KINDS or k.op.options.get("onnx_layout")):
            # onnx_layout: a TRANSPOSE the ONNX importer added between the declared NCHW and the
            # kernels' NHWC (npusim/formats/onnx/context.py); the NHWC twin of the model has none, so it
            # moves no data here either.
            roles[pos] = VIEW
            plan.aliases[k.op.outputs[0]] = acts[0]
        elif (
            on_npu
            and "pad" in rewrites
            and kind in PAD_KINDS
            and _spatial_pad(k)
            and [kernels[r].op.kind for r in readers.get(k.op.outputs[0], [])] in PAD_TAKERS
        ):
            roles[pos] = VIEW
            plan.aliases[k.op.outputs[0]] = acts[0]
        elif on_npu and "slice" in rewrites and kind in STRIDED_READ_KINDS:
            roles[pos] = VIEW
            for t in k.op.outputs:
                plan.aliases[t] = acts[0]
        elif on_npu and "concat" in rewrites and kind in CONCAT_KINDS:
            roles[pos] = VIEW
            for t in acts:
                # an input already written into another concatenation, or a graph input, stays put
                if t not in concat_owner and t not in graph.inputs and t not in plan.aliases:
                    concat_owner[t] = k.op.outputs[0]
                    plan.aliases[t] = k.op.outputs[0]
        elif (
            on_npu
            and "chain" in rewrites
            and (kind in CHAINABLE_KINDS or kind == "QUANTIZE")  # QUANTIZE on the NPU: an ONNX
            and acts  # import's requantization, folded into the output stage of the layer before it
            and all(t in chain for t in acts)
        ):
            roles[pos] = EPILOGUE
        elif on_npu and "add" in rewrites and kind in ADD_KINDS and any(t in chain for t in acts):
            # a residual ADD of the layer just computed and a tensor in memory: in that layer's epoch
            roles[pos] = EPILOGUE
        if not on_npu or roles[pos] == LAYER:
            chain = set()
        if on_npu and roles[pos] != VIEW:
            chain |= set(k.op.outputs)
    # A tensor produced in a chain and read only by that chain's epilogues never reaches memory.
    epoch_of = []
    epoch = -1
    for pos, role in enumerate(roles):
        if role == LAYER or units[pos] != "NPU":
            epoch += 1
        epoch_of.append(epoch)
    for pos, k in enumerate(kernels):
        if roles[pos] == VIEW or units[pos] != "NPU":
            continue
        for t in k.op.outputs:
            rs = readers.get(t, [])
            if (
                rs
                and t not in outputs
                and t not in plan.aliases
                and all(roles[r] == EPILOGUE and epoch_of[r] == epoch_of[pos] for r in rs)
            ):
                plan.streamed.add(t)
    return plan
