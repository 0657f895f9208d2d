"""Prepare once, evaluate many times: the plan of a graph and its execution on a batch.

The plan is the graph's ops in execution order, each with its prepared kernel. Running it is a
walk over the kernels with a dict of tensor values; constants come from the model unless a caller
overrides them (the trainer's perturbed weights).
"""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..formats import limits
from ..formats.model_io import load_model
from ..graph import Graph, computes_in_float, legacy_uint8
from ..kernels import backend as _backend
from ..kernels.jit import both_forms
from ..kernels.lookup import lookup
from ..ops import KERNELS, MAC_OPS
from ..profiles import PROFILES, Profile
from ..quant import profile_id
from . import uint8
from .chains import find_chains
from .uint8 import UINT8_PROFILE
from .walker import Walker


def execution_order(graph: Graph) -> list:
    """The ops in file order, checked to be a valid schedule: every input is a constant, a graph input
    or produced by an earlier op (which also rules out cycles)."""
    ready = {i for i, t in enumerate(graph.tensors) if t.is_constant} | set(graph.inputs)
    for op in graph.ops:
        for t in op.inputs:
            if t >= 0 and t not in ready:
                raise NpusimError(
                    f"op {op.index} ({op.kind}): input tensor {t} "
                    f"({graph.tensors[t].name!r}) is read before any op produces it"
                )
        for t in op.outputs:
            if t in ready:
                raise NpusimError(
                    f"op {op.index} ({op.kind}): output tensor {t} "
                    f"({graph.tensors[t].name!r}) is written twice or is a constant"
                )
            ready.add(t)
    for t in graph.outputs:
        if t not in ready:
            raise NpusimError(f"graph output tensor {t} ({graph.tensors[t].name!r}) is never produced")
    return list(graph.ops)


def unsupported_error(op) -> NpusimError:
    return NpusimError(f"op {op.index} ({op.kind}): operator is not supported")


def uint8_model(graph: Graph, legacy) -> str:
    """The head of a refusal of a legacy uint8 model; legacy: legacy_uint8(graph)."""
    op, t = legacy
    return (
        f"{graph.origin}: a uint8 model (TFLite's legacy quantization: op {op.index} ({op.kind}) "
        f"computes on uint8 {t.name!r})"
    )


def check_int8(graph: Graph, profile: str | None = None, plan_only: bool = False):
    """Refuse, naming the file and what to do, the kinds of model npusim does not run: a float
    model, a legacy uint8 one under a profile other than xnnpack (npusim/runtime/uint8.py), and a
    uint8 one with an op not proven in uint8 (uint8.unproven). plan_only (inspect): a uint8 model
    is planned whatever the profile, its unproven ops listed as not run."""
    if graph.ops and computes_in_float(graph):
        raise NpusimError(
            f"{graph.origin}: a float model: npusim runs int8 models; quantize it to int8, or give it to "
            "`npusim validate --float` as the reference of its int8 model"
        )
    legacy = legacy_uint8(graph)
    if legacy is None or plan_only:
        return
    if not (profile in PROFILES and PROFILES[profile].uint8):
        if profile:
            why = f"profile {profile} has no uint8 kernels"
            what = f"run it with --profile {UINT8_PROFILE} (LiteRT's arithmetic), or quantize it to int8"
        else:
            why = f"this command takes int8 models (`npusim run --profile {UINT8_PROFILE}` runs uint8 ones)"
            what = "quantize it again to int8"
        raise NpusimError(f"{uint8_model(graph, legacy)}: {why}; {what}")
    unproven = uint8.unproven(graph)
    if unproven:
        raise NpusimError(f"{graph.origin}: {uint8.unproven_reason(unproven[0])}")


def check_activations(graph: Graph):
    """What every kernel relies on: axis 0 of an activation is the batch, so it has one, and no axis
    is empty; graph inputs are fed and graph outputs computed, so neither is a constant; an op that
    reads only constants would compute a batch of one whatever the batch (converters fold them)."""
    for which, indices in (("input", graph.inputs), ("output", graph.outputs)):
        for t in indices:
            if graph.tensors[t].is_constant:
                raise NpusimError(
                    f"graph {which} tensor {t} ({graph.tensors[t].name!r}) "
                    "is a constant, expected an activation"
                )
    active = set(graph.inputs)
    for op in graph.ops:
        ins = [t for t in op.inputs if t >= 0 and not graph.tensors[t].is_constant]
        if not ins:
            raise NpusimError(
                f"op {op.index} ({op.kind}): reads only constants, expected at least one activation input"
            )
        active.update(ins)
        active.update(op.outputs)
    for t in sorted(active):
        tensor = graph.tensors[t]
        if not tensor.shape or 0 in tensor.shape:
            raise NpusimError(
                f"tensor {t} ({tensor.name!r}): activation of shape {list(tensor.shape)}, "
                "expected a batch axis and no empty axis"
            )


class BatchPlan:
    """How a run treats the batch, decided once from the graph at prepare time. A model whose ops
    keep axis 0 the batch runs the user's whole batch at once; one with an op that moves elements
    across axis 0 (a RESHAPE [1, 2, 64, 32] -> [2, 64, 32]) is valid at its declared shapes only,
    so it runs image by image (chunks of the declared batch), the batch axis kept outside the
    graph, as TFLM runs it."""

    def __init__(self, declared: int, why: str | None):
        self.declared = declared
        self.why = why
        self.by_image = why is not None

    def as_dict(self) -> dict:
        runs = "image by image" if self.by_image else "whole batch"
        return {"declared": self.declared, "runs": runs, **({"why": self.why} if self.why else {})}


def batch_plan(graph: Graph, kernels) -> BatchPlan:
    """The BatchPlan of a prepared graph: the first op that crosses axis 0 says why, if any."""
    first = next((k for k in kernels if k.crosses_batch), None)
    declared = int(graph.input(0).shape[0]) if graph.inputs and graph.input(0).shape else 1
    why = None if first is None else f"op {first.op.index} ({first.op.kind}) {first.crosses_batch}"
    return BatchPlan(declared, why)


def rows_per_image(graph: Graph, batch: BatchPlan, t: int) -> float:
    """Rows of tensor t's axis 0 per image of the user's batch: 1, but in a model run image by
    image, where a tensor's axis 0 need not be the batch (a [2, 64, 32] of a batch-1 model: 2)."""
    return graph.tensors[t].shape[0] / batch.declared if batch.by_image else 1.0


def macs_per_image(graph: Graph, batch: BatchPlan, kernel) -> int:
    """The MACs of one op per image (Kernel.macs() counts them per row of axis 0)."""
    return int(round(kernel.macs() * rows_per_image(graph, batch, kernel.op.outputs[0])))


def image_chunks(graph: Graph, values: dict) -> list[dict]:
    """values cut into the runs of a model run image by image: every given activation along axis 0
    into pieces of its declared size (the graph input's declared batch, or a [2, 64, 32] tensor's
    2 rows); constants as they are."""
    tensors = graph.tensors
    rows = {t: tensors[t].shape[0] for t in values if not tensors[t].is_constant}
    counts = {t: len(values[t]) // d for t, d in rows.items()}
    for t, d in rows.items():
        if len(values[t]) % d or counts[t] != next(iter(counts.values())):
            raise NpusimError(
                f"tensor {t} ({tensors[t].name!r}): {len(values[t])} rows, expected a multiple of its "
                f"declared {d} and the other inputs' number of runs (the model runs image by image)"
            )
    n = next(iter(counts.values()), 1)
    return [
        {t: v[c * rows[t] : (c + 1) * rows[t]] if t in rows else v for t, v in values.items()}
        for c in range(n)
    ]


def by_image(graph: Graph, values: dict, run) -> dict:
    """run(chunk) -> dict on each of image_chunks(values); the tensors computed are joined along
    axis 0 and added to values, which is returned."""
    return joined(values, [run(chunk) for chunk in image_chunks(graph, values)])


def joined(values: dict, runs: list) -> dict:
    """values with the tensors the runs computed (each a dict) added, joined along axis 0."""
    values.update({t: np.concatenate([r[t] for r in runs]) for t in runs[0] if t not in values})
    return values


def _last_reader(reads: list) -> dict:
    """{tensor index: position in the plan of the last kernel that reads it}, from each kernel's
    reads (None: a kernel that the walk skips)."""
    last = {}
    for position, tensors in enumerate(reads):
        for t in tensors or ():
            if t >= 0:
                last[t] = position
    return last


class Interpreter:
    """A prepared model. `run(x)` evaluates a batch: x has the model input's shape with N on axis 0.

    backend: the MAC engines of CONV_2D and FULLY_CONNECTED, and so the vector code of
    DEPTHWISE_CONV_2D, "auto" (the fastest this host runs) or an engine's name, "amx", "vnni" or
    "blas" (see kernels/backend.py); every choice gives the same bits.
    """

    def __init__(
        self,
        graph: Graph | str | bytes,
        profile: str = "tflm",
        backend: str = "auto",
        *,
        plan_only: bool = False,
        warm: bool = True,
        batch: int | None = None,
    ):
        """plan_only (what `npusim inspect` needs): ops npusim lacks are listed in self.unsupported and
        left out of self.kernels instead of refused; such an Interpreter plans but runs nothing.
        warm: load the compiled kernels now (warm_up()), so that the first run loads none; a caller
        that runs the model once gains nothing from it (the command lines).
        batch: the batch size the runs will have, when known. The warm-up then also runs zeros of that
        batch once, so that the first run finds its memory faulted in, as LiteRT's allocate_tensors
        does for its input's batch: in a process tuned by tune_process (freed memory kept for reuse),
        the first run then costs what a later one does. Without it, the first run of a batch faults
        in its activations (about 3 ms per MB on a fresh page in the VM of docs/performance.md)."""
        self.graph = graph if isinstance(graph, Graph) else load_model(graph)
        resolved = self._resolve_profile(profile, backend)
        if not (plan_only and self.graph.source.unlowered):
            # (an ONNX plan whose unlowered nodes stand in with float outputs is no float model)
            check_int8(self.graph, self.profile, plan_only)
        # plan_only: {op index: why npusim does not run it} (a uint8 model's unproven ops, kernels' refusals)
        self.refusals: dict = {op.index: uint8.unproven_reason(op) for op in uint8.unproven(self.graph)}
        self.legacy_uint8 = legacy_uint8(self.graph)  # (op, tensor) of a legacy uint8 model, run shifted
        self.graph = uint8.shifted(self.graph)
        ops = execution_order(self.graph)
        self.unsupported = [op for op in ops if op.kind not in KERNELS or op.index in self.refusals]
        if self.unsupported and not plan_only:
            raise unsupported_error(self.unsupported[0])
        check_activations(self.graph)
        self.kernels = self._create_kernels(ops, resolved, plan_only)
        self._share_scratch()
        self._fuse()
        self._plan_liveness()
        self.batch = batch_plan(self.graph, self.kernels)
        self._plan_limits(batch)
        self.warm_batch = batch
        if warm and not plan_only:
            self.warm_up()

    # -- the plan, step by step ------------------------------------------------------------------
    def _resolve_profile(self, profile, backend) -> Profile:
        """The Profile: a name's table entry (profiles.PROFILES), or a Profile given as it is (one
        with options of its own: npusim.npu.NeuralArtProfile(N6Options(...))); self.profile its
        name, self.backends the MAC engines."""
        if isinstance(profile, str):
            profile = profile_id(profile)
        elif not isinstance(profile, Profile):
            raise NpusimError(
                f"profile: expected a name ({', '.join(PROFILES)}) or a Profile, got {type(profile).__name__}"
            )
        self.profile = profile.name
        self.backends = _backend.select(backend)
        return profile

    def _create_kernels(self, ops, profile: Profile, plan_only) -> list:
        """Each supported op's prepared kernel, in plan order: what the profile's kernel table
        (Profile.table) answers for it. With plan_only, an op whose kernel refuses it joins
        self.unsupported, its message in self.refusals."""
        kernels = []
        table = profile.table(self.graph)
        left_out = {op.index for op in self.unsupported}
        for op in ops:
            if op.index in left_out:
                continue
            try:
                kernel_class = KERNELS[op.kind]
                extra = {"backends": self.backends} if kernel_class.takes_backends else {}
                kernels.append(table.kernel_for(kernel_class, op, **extra))
            except NpusimError as e:  # helpers shared by ops (padding, multipliers) do not know the op
                message = (
                    str(e) if str(e).startswith(f"op {op.index} ") else f"op {op.index} ({op.kind}): {e}"
                )
                if not plan_only:
                    raise NpusimError(message) from None
                # inspect lists an op npusim cannot prepare, with the line `run` stops at, as it
                # lists an op it lacks, instead of refusing the whole model
                self.unsupported.append(op)
                self.refusals[op.index] = message
        return kernels

    def _share_scratch(self) -> None:
        """Kernels run one at a time (one Interpreter per thread), so one scratch buffer, the padded
        input copy of the convolutions, serves them all: a buffer per kernel held 20 of ResNet-8's
        30 MB at batch 256 (and every fresh page costs a fault on the first run)."""
        scratch = [k for k in self.kernels if getattr(k, "workspace", None) is not None]
        for k in scratch:
            k.workspace = scratch[0].workspace

    def _fuse(self) -> None:
        """The two fusion passes of run(), and what each kernel of its walk reads then."""
        # PADs whose only reader is a convolution that takes their padding over (in run() only;
        # the other entry points compute every tensor): {PAD output tensor: PAD input tensor}.
        self._pad_sources = self._fused_pads()
        # Chains of elementwise ops over one 8-bit tensor (YOLO's SiLU: LOGISTIC, MUL) run as one
        # lookup, in run() only, like the PADs above (chains.py): {chain output tensor: Chain}.
        self._chains = {c.output: c for c in find_chains(self.graph, self.kernels)}
        inner = {k.op.outputs[0] for c in self._chains.values() for k in c.kernels[:-1]}
        # What each kernel of run()'s walk reads, or None where it is folded into a later one. The
        # folds were prepared with the model's constants: a run that overrides some walks unfolded.
        self._run_reads = []
        for k in self.kernels:
            out = k.op.outputs[0]
            if out in self._pad_sources or out in inner:
                self._run_reads.append(None)
            elif out in self._chains:
                self._run_reads.append((self._chains[out].root,))
            else:
                self._run_reads.append(tuple(self._pad_sources.get(t, t) for t in k.op.inputs))

    def _plan_liveness(self) -> None:
        """Each tensor's last reader, in run()'s folded walk and in the unfolded one."""
        self._last_readers = {
            True: _last_reader(self._run_reads),
            False: _last_reader([k.op.inputs for k in self.kernels]),
        }

    def _plan_limits(self, batch) -> None:
        """Each activation's bytes per image, and the allocation limit checked for one image and
        for the batch given."""
        tensors = self.graph.tensors
        self._activation_bytes = [
            (
                int(np.prod(tensors[t].shape, dtype=np.float64) / self.rows(t)) * tensors[t].dtype.itemsize,
                f"tensor {tensors[t].name!r}",
            )
            for t in sorted(set(self.graph.inputs) | {t for k in self.kernels for t in k.op.outputs})
        ]
        self._largest = {}  # {batch size: largest_allocation}
        need, what = self.largest_allocation(1)
        if need > limits.MAX_TENSOR_BYTES:
            raise NpusimError(
                f"{what} needs {need} bytes for one image, more than the limit of "
                f"{limits.MAX_TENSOR_BYTES}"
            )
        self._check_batch(batch)

    def _fused_pads(self) -> dict:
        """{PAD output tensor: PAD input tensor} for PADs that a convolution takes over."""
        sources = {}
        for k in self.kernels:
            if k.kind != "PAD" or k.op.outputs[0] in self.graph.outputs:
                continue
            t = k.op.outputs[0]
            reads = [(r, list(r.op.inputs).count(t)) for r in self.kernels if t in r.op.inputs]
            if (
                len(reads) == 1
                and reads[0][1] == 1
                and hasattr(reads[0][0], "fuse_pad")  # the convolutions, not the onnxruntime wrappers
                and reads[0][0].op.inputs[0] == t
                and reads[0][0].fuse_pad(k)
            ):
                sources[t] = k.op.inputs[0]
        return sources

    def _check_batch(self, batch) -> None:
        if batch is None:
            return
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise NpusimError(f"batch: expected a positive integer, got {batch!r}")
        need, what = self.largest_allocation(int(batch))
        if need > limits.MAX_TENSOR_BYTES:
            raise NpusimError(
                f"batch {batch}: {what} needs {need} bytes, more than the limit of "
                f"{limits.MAX_TENSOR_BYTES}"
            )

    def warm_up(self, batch: int | None = None) -> None:
        """Load every compiled kernel that run() calls, in its serial and its threaded form. Numba
        loads a kernel from its cache on the first call of each form and signature, 20-40 ms each:
        without this, a process's first batch paid them (the bench's first-call table, with and
        without it). The walk runs zeros of one image (a model run image by image: its declared
        shapes), each parallel kernel in both forms (jit.both_forms); its outputs are dropped. With
        a batch (by default the constructor's), zeros of that batch then run once, to fault in the
        memory its runs take; a model run image by image runs at its declared shapes whatever the
        batch, which the first walk already touched. An error it meets is left for a real run to
        report, on real data."""
        self._check_batch(batch)
        batch = self.warm_batch if batch is None else int(batch)
        tensors = self.graph.tensors

        def zeros(n):
            values = {}
            for t in self.graph.inputs:
                shape = tensors[t].shape
                if shape and not self.batch.by_image:
                    shape = (n, *shape[1:])
                values[t] = np.zeros(shape, tensors[t].dtype)
            return values

        try:
            with both_forms():
                self.evaluate(zeros(1), keep=set(self.graph.outputs))
            if batch is not None and batch > 1 and not self.batch.by_image:
                self.evaluate(zeros(batch), keep=set(self.graph.outputs))
        except NpusimError:
            pass

    def largest_allocation(self, n: int) -> tuple[int, str]:
        """The largest array a run on a batch of n allocates, an activation or a kernel's workspace,
        and what it is. check_input refuses a batch that would take more than the allocation limit.
        Kept per batch size: every run asks, and a model of 250 ops took 1 ms per run to work it out."""
        known = self._largest
        if n not in known:
            if len(known) > 64:  # many batch sizes: keep the memo small
                known.clear()
            known[n] = self._largest_allocation(n)
        return known[n]

    def _largest_allocation(self, n: int) -> tuple[int, str]:
        sizes = [(n * size, what) for size, what in self._activation_bytes]
        sizes += [
            (
                k.workspace_bytes(k.outputs[0].shape[0] if self.batch.by_image else n),
                f"the workspace of op {k.op.index} ({k.kind})",
            )
            for k in self.kernels
        ]
        return max(sizes)

    def rows(self, t: int) -> float:
        return rows_per_image(self.graph, self.batch, t)

    def op_macs(self, kernel) -> int:
        return macs_per_image(self.graph, self.batch, kernel)

    # -- inputs -------------------------------------------------------------------------------
    def check_input(self, x: np.ndarray, k: int = 0) -> np.ndarray:
        t = self.graph.input(k)
        if not isinstance(x, np.ndarray):
            raise NpusimError(f"input {k}: expected a numpy array, got {type(x).__name__}")
        if x.dtype != t.dtype and x.dtype.newbyteorder("=") == t.dtype:
            x = x.astype(
                t.dtype
            )  # the same type stored in the other byte order (an .npy from another machine)
        if x.dtype != t.dtype:
            raise NpusimError(f"input {k} ({t.name!r}): dtype {x.dtype.name}, expected {t.dtype.name}")
        if x.ndim != len(t.shape) or x.ndim == 0 or tuple(x.shape[1:]) != tuple(t.shape[1:]):
            expected = ["N"] + list(t.shape[1:])
            raise NpusimError(
                f"input {k} ({t.name!r}): shape {list(x.shape)}, expected {expected}".replace("'N'", "N")
            )
        if x.shape[0] == 0:
            raise NpusimError(f"input {k} ({t.name!r}): empty batch, expected at least one input")
        if self.batch.by_image and x.shape[0] % t.shape[0]:
            raise NpusimError(
                f"input {k} ({t.name!r}): a batch of {x.shape[0]}, expected a multiple of the model's "
                f"declared batch {t.shape[0]} (it runs image by image: {self.batch.why})"
            )
        need, what = self.largest_allocation(x.shape[0])
        if need > limits.MAX_TENSOR_BYTES:
            raise NpusimError(
                f"input {k} ({t.name!r}): a batch of {x.shape[0]} needs {need} bytes for {what}, "
                f"more than the limit of {limits.MAX_TENSOR_BYTES}; run smaller batches"
            )
        if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
            raise NpusimError(f"input {k} ({t.name!r}): holds NaN or infinite values")
        return np.ascontiguousarray(x)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(
        self,
        values: dict,
        kernels=None,
        overrides: dict | None = None,
        shared_batch: int | None = None,
        keep: set | None = None,
    ) -> dict:
        """Run kernels (default: all) on a dict {tensor index: array}, adding their outputs to it;
        returns that dict (the same object). Feeds a model with several inputs: give each graph
        input's index (graph.inputs) its batch.

        overrides maps constant tensor indices to replacement arrays. Weights of CONV_2D,
        DEPTHWISE_CONV_2D and FULLY_CONNECTED may carry a leading group axis G (see ops/conv.py):
        many weight versions in one call. With shared_batch=B, an activation of batch B is shared by
        all groups (computed once) and one of batch G*B holds one slice per group; an op meeting both
        sees the shared one repeated, and a grouped layer reading a shared input runs all groups as
        one wide GEMM.
        keep (with the whole plan only): drop every other activation after its last reader, so that a
        run holds only the live tensors (a batch of 256 through MobileNetV2 would otherwise hold them
        all, several hundred MB).
        """
        if self.unsupported:
            raise unsupported_error(self.unsupported[0])
        if self.batch.by_image:
            if shared_batch is not None:
                raise NpusimError("a model run image by image takes grouped weights through run_grouped()")
            return by_image(
                self.graph, values, lambda chunk: self._walk(chunk, kernels, overrides, None, keep)
            )
        return self._walk(values, kernels, overrides, shared_batch, keep)

    def _walk(self, values, kernels, overrides, shared_batch, keep) -> dict:
        """evaluate() on one chunk: the kernels in order on values."""
        plan = self.kernels if kernels is None else kernels
        return _RunWalk(self, kernels is None, overrides, shared_batch, keep).walk(plan, values)

    def run_grouped(self, values: dict, kernels, weights: dict, shared_batch: int) -> dict:
        """evaluate() with G versions of some constants in one call: weights maps constant tensor
        indices to [G, ...] arrays (a trainer's perturbed weights and biases), and values holds
        activations of batch shared_batch (B), shared by all groups. A MAC op that reads a grouped
        tensor gets its own weights grouped too (the frozen ones broadcast over the groups, as a
        grouped kernel takes grouped weights), so that an op whose bias alone varies runs grouped.
        Outputs computed after the first grouped op have batch G*B, group-major."""
        tensors = self.graph.tensors
        groups = next(iter(weights.values())).shape[0] if weights else 1
        if self.batch.by_image:  # one group after the other, each image by image
            runs = [
                self.evaluate(dict(values), kernels, {t: w[g] for t, w in weights.items()})
                for g in range(groups)
            ]
            return joined(values, runs)
        overrides = dict(weights)
        for kernel in kernels:
            w = kernel.op.inputs[1] if kernel.kind in MAC_OPS else None
            if w is not None and w not in overrides and any(t in overrides for t in kernel.op.inputs):
                overrides[w] = np.broadcast_to(tensors[w].data, (groups,) + tensors[w].data.shape)
        return self.evaluate(values, kernels, overrides, shared_batch=shared_batch)

    def run_all(self, x: np.ndarray, overrides: dict | None = None) -> dict:
        """Every tensor's value for the batch x: a dict {tensor index: array [N, ...]} holding the
        graph input, every intermediate and every output (graph.outputs lists the outputs' indices,
        graph.tensors[i].name names any). overrides: as in evaluate()."""
        if len(self.graph.inputs) != 1:
            raise NpusimError(
                f"model has {len(self.graph.inputs)} inputs, run feeds one; give them all to evaluate()"
            )
        values = {self.graph.inputs[0]: self.check_input(x)}
        return self.evaluate(values, overrides=overrides)

    def run(self, x: np.ndarray, overrides: dict | None = None):
        """The model's outputs for the batch x (the input's dtype and shape, N on axis 0).

        One output: its array [N, ...]. Several: a list of arrays in the graph's output order, as
        ONNX Runtime's InferenceSession.run and Keras's predict give them (LiteRT users: the order
        of get_output_details()). Only the outputs are kept while running; run_all() keeps every
        tensor."""
        if len(self.graph.inputs) != 1:
            raise NpusimError(
                f"model has {len(self.graph.inputs)} inputs, run feeds one; give them all to evaluate()"
            )
        outs = self.graph.outputs
        values = {self.graph.inputs[0]: self.check_input(x)}
        values = self.evaluate(values, overrides=overrides, keep=set(outs))
        return values[outs[0]] if len(outs) == 1 else [values[t] for t in outs]

    def macs(self) -> int:
        return sum(self.op_macs(k) for k in self.kernels)


class _RunWalk(Walker):
    """The Interpreter's walk (evaluate() on one chunk): overrides before the activations, the
    model's constants after them; on a whole run (keep given, the whole plan, no groups) the
    folded PADs and chains of the plan, and every activation but keep dropped after its last
    reader; grouped kernels with shared_batch."""

    def __init__(self, interp, whole_plan, overrides, shared_batch, keep):
        self.tensors = interp.graph.tensors
        self.whole_run = keep is not None and whole_plan and shared_batch is None
        self.folded = self.whole_run and not overrides
        self.last_reader = interp._last_readers[self.folded] if self.whole_run else {}
        self.run_reads = interp._run_reads
        self.chains = interp._chains if self.folded else {}
        self.sourced = () if overrides is None else (overrides,)
        self.shared_batch = shared_batch
        self.keep = keep

    def reads(self, position, kernel):
        return self.run_reads[position] if self.folded else kernel.op.inputs

    def sources(self, position, values):
        return (*self.sourced, values)

    def missing(self, kernel, t):
        data = self.tensors[t].data
        if data is not None:
            return data
        raise NpusimError(
            f"op {kernel.op.index} ({kernel.kind}): no value for tensor {t} "
            f"({self.tensors[t].name!r}); expected every graph input to be given"
        )

    def call(self, position, kernel, args):
        chain = self.chains.get(kernel.op.outputs[0]) if self.folded else None
        if chain is not None:
            x = np.ascontiguousarray(args[0]).view(np.uint8)
            return lookup(chain.table, x, np.empty(x.shape, chain.table.dtype))
        if self.shared_batch is None:
            return kernel(*args)
        return self.grouped(kernel, args, self.shared_batch)

    def output(self, kernel, t, result):
        out = self.tensors[t]
        # Cheap, and the kernels after this one index by the planned shape: a file whose
        # declared shapes lie stops here with a message instead of corrupting memory further on.
        if result.dtype != out.dtype or result.ndim != len(out.shape) or result.shape[1:] != out.shape[1:]:
            declared = ", ".join(["N", *map(str, out.shape[1:])])
            raise NpusimError(
                f"op {kernel.op.index} ({kernel.kind}): computed {result.dtype.name} "
                f"{list(result.shape)}, the model declares "
                f"{np.dtype(out.dtype).name} [{declared}] for {out.name!r}"
            )
        return result

    def after(self, position, kernel, reads, values):
        if self.whole_run:
            for t in reads:
                if self.last_reader.get(t) == position and t not in self.keep:
                    values.pop(t, None)

    def grouped(self, kernel, args, shared_batch):
        """A kernel on grouped weights or activations (run_grouped())."""
        tensors = self.tensors
        acts = [i for i, t in enumerate(kernel.op.inputs) if t >= 0 and not tensors[t].is_constant]
        if kernel.kind in MAC_OPS and args[1].ndim == len(tensors[kernel.op.inputs[1]].shape) + 1:
            return kernel(*args, shared=args[0].shape[0] == shared_batch)
        largest = max(args[i].shape[0] for i in acts)
        if largest != shared_batch:
            for i in acts:
                if args[i].shape[0] == shared_batch:
                    args[i] = np.concatenate([args[i]] * (largest // shared_batch))
        return kernel(*args)
