"""`--profile neural-art`: the model as the STM32N6 computes it. Each op the N6 maps to its NPU and
whose unit chain npu/neural_art.py derives (CONV_2D, DEPTHWISE_CONV_2D, ADD, an int8 QUANTIZE) runs
as that chain of integer units (kernels/neural_art.py); every other op keeps TFLM's arithmetic:
the ops placed on the Cortex-M55 (ST's runtime runs them as TFLM-style int8 kernels), and the NPU's
data movement and max pooling, which compute no new value (docs/neural-art.md).

NeuralArtProfile is the profile's table entry (profiles.PROFILES["neural-art"]) with its options;
its kernel table, NeuralArtKernels, answers the Interpreter for each op, instead of a branch per
profile inside the op modules.
"""

from __future__ import annotations

import numpy as np

from ..errors import NpusimError
from ..kernels import neural_art as units
from ..ops.base import Kernel
from ..profiles import PROFILES, TFLM, Kernels, Profile
from .cost import NPU, placement
from .neural_art import N6Options, op_stages

WIDE = (-(2**62), 2**62)


def _bc(stage: dict) -> int:
    """combinebc's 32-bit BC from B_scalar and C_scalar."""
    return (int(stage["B_scalar"]) << 16) + (int(stage["C_scalar"]) & 0xFFFF)


def _range(stage: dict) -> tuple[int, int]:
    lo, hi = (-128, 127) if stage["outbytes_o"] == 1 else (-32768, 32767)
    if stage.get("clipout"):
        lo, hi = max(lo, stage["clipmin"]), min(hi, stage["clipmax"])
    return lo, hi


class Chain(Kernel):
    """An op run as its Neural-ART unit chain; `tflm` is the op's TFLM kernel, whose plan (shapes,
    MACs, geometry) it shares."""

    required_inputs, max_inputs, num_outputs = 1, None, 1

    def __init__(self, tflm: Kernel, stages: list, options: N6Options):
        self.kind = tflm.kind
        super().__init__(tflm.op, tflm.graph, TFLM)
        self.tflm, self.stages, self.options = tflm, stages, options
        self.mode = units.ROUNDING_IDS[options.rounding]

    def macs(self) -> int:
        return self.tflm.macs()

    def workspace_bytes(self, n: int) -> int:
        return self.tflm.workspace_bytes(n)


def _channel_coeffs(st: dict, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """(A[c], BC[c]) of a requantizing ARITH, per-channel or scalar (A_scalar for every channel):
    combinebc's BC from C_vector or the scalars, else C."""
    if st["A_vector"] is None:
        a = np.full(channels, st["A_scalar"], np.int64)
    else:
        a = np.asarray(st["A_vector"], np.int64)
    c = st["C_vector"]
    if c is None:
        return a, np.full(a.size, _bc(st), np.int64)
    if st.get("combinebc", 1):
        return a, np.asarray(c, np.int64)
    return a, np.asarray(c, np.int64) << max(st.get("C_shift", 0), 0)


class ConvChain(Chain):
    """suboff ARITH -> CONVACC (accumulate, shift, round, saturate to 16 bits) -> the requantizing
    ARITHs, each rounded and saturated to its width (3.0: off_bias; 2.x: mul_scale then off_bias)."""

    def __init__(self, tflm, stages, options):
        super().__init__(tflm, stages, options)
        self.suboff, self.convacc, *self.requant = stages
        self.dense = tflm.kind == "FULLY_CONNECTED"  # a matrix product
        self.geometry = None if self.dense else tflm.geometry
        self.depthwise = tflm.kind == "DEPTHWISE_CONV_2D"
        x = self.inputs[0]
        sub = self.suboff
        # the feature value the CONVACC sees for a real zero, used for the padding taps
        self.fill = units.shift_round(
            np.int64(sub["A_scalar"]) * x.zero_point + _bc(sub), sub["shift_o"], units.TRUNCATE
        )
        self.coeffs = [_channel_coeffs(st, self.outputs[0].shape[-1]) for st in self.requant]
        ca = self.convacc
        self.shift = ca["shift_o"]
        if options.shift_a == "products":  # the accumulator shifted left by shift_a before shift_o
            self.shift -= ca["shift_a"]
        self.bits = 8 * ca["outbytes_o"]

    def __call__(self, x, w, b=None):
        sub = self.suboff
        feature = units.arith_affine(
            np.ascontiguousarray(x).ravel(),
            np.int64(sub["A_scalar"]),
            np.int64(_bc(sub)),
            sub["shift_o"],
            units.TRUNCATE,
            *WIDE,
            np.empty(x.size, np.int64),
        ).reshape(x.shape)
        if self.geometry is None:
            acc = units.dense_accumulate(feature, np.asarray(w), (x.shape[0], *self.outputs[0].shape[1:]))
        else:
            acc = units.accumulate(feature, np.asarray(w), self.geometry, int(self.fill), self.depthwise)
        y = units.convacc_output(acc, self.shift, self.mode, self.bits, np.empty_like(acc))
        rows = y.reshape(-1, y.shape[-1])
        for st, (a, bc) in zip(self.requant, self.coeffs):
            lo, hi = _range(st)
            out = np.empty(rows.shape, np.int64)
            rows = units.arith_channel(rows, a, bc, st["shift_o"], self.mode, lo, hi, out)
        return rows.astype(np.int8).reshape(y.shape)


class AddChain(Chain):
    """One two-input ARITH."""

    def __call__(self, x, y):
        st = self.stages[0]
        xb, yb = np.broadcast_arrays(x, y)
        xb, yb = np.ascontiguousarray(xb).ravel(), np.ascontiguousarray(yb).ravel()
        lo, hi = _range(st)
        out = units.arith_add(
            xb,
            yb,
            np.int64(st["A_scalar"]),
            np.int64(st["B_scalar"]),
            np.int64(st["C_scalar"]),
            st["Ax_shift"],
            st["By_shift"],
            st["C_shift"],
            st["shift_o"],
            self.mode,
            self.options.add_products == "rounded",
            lo,
            hi,
            np.empty(xb.size, np.int64),
        )
        return out.astype(np.int8).reshape(np.broadcast_shapes(x.shape, y.shape))


class RequantizeChain(Chain):
    """An int8 QUANTIZE as one scalar ARITH."""

    def __call__(self, x):
        st = self.stages[0]
        lo, hi = _range(st)
        flat = np.ascontiguousarray(x).ravel()
        out = units.arith_affine(
            flat,
            np.int64(st["A_scalar"]),
            np.int64(_bc(st)),
            st["shift_o"],
            self.mode,
            lo,
            hi,
            np.empty(flat.size, np.int64),
        )
        return out.astype(np.int8).reshape(x.shape)


ConvKinds = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


class NeuralArtProfile(Profile):
    """--profile neural-art with its options (the --n6-* choices): the table entry
    PROFILES["neural-art"], whose kernel table (NeuralArtKernels) reads them."""

    name = "neural-art"

    def __new__(cls, options: N6Options | None = None):
        entry = PROFILES[cls.name]
        self = Profile.__new__(cls, int(entry), entry.name, **entry.fields())
        self.options = options or N6Options()
        self._programs = {}  # id(graph) -> its compiled program (options.compiled), read once
        return self

    def __reduce__(self):
        return (NeuralArtProfile, (self.options,))

    def _stages(self, graph, op):
        stages = op_stages(graph, op, self.options)
        if stages is None or self.options.compiled is None:
            return stages
        from .compiled import read_compiled, run_stages

        key = id(graph)
        if key not in self._programs:
            self._programs[key] = read_compiled(self.options.compiled, graph)
        program = self._programs[key]
        if op.index in program.singles:  # an ADD or QUANTIZE: its compiled ARITH as it is
            return [dict(program.singles[op.index].fields)]
        chain = program.mapped.get(op.index) if op.kind in ConvKinds else None
        return stages if chain is None else run_stages(stages, chain)

    @staticmethod
    def runs_as_chain(kernel) -> bool:
        return isinstance(kernel, Chain)


class NeuralArtKernels(Kernels):
    """The profile's kernel table (Profile.table): which kernel runs each op under --profile
    neural-art. An op the N6 places on the NPU with a unit chain runs as that chain; every other op
    runs TFLM's kernel."""

    chains = {
        "CONV_2D": ConvChain,
        "DEPTHWISE_CONV_2D": ConvChain,
        "FULLY_CONNECTED": ConvChain,
        "ADD": AddChain,
        "QUANTIZE": RequantizeChain,
    }

    def __init__(self, profile, graph):
        if not isinstance(profile, NeuralArtProfile):
            raise NpusimError(
                f"profile {profile.name}: pass npusim.npu.NeuralArtProfile() (its options) as the profile"
            )
        super().__init__(profile, graph)

    def kernel_for(self, kernel_class, op, **extra) -> Kernel:
        graph, profile = self.graph, self.profile
        tflm = kernel_class(op, graph, TFLM, **extra)
        chain = self.chains.get(op.kind)
        if chain is None or placement(tflm)[0] != NPU:
            return tflm
        stages = profile._stages(graph, op)
        if stages is None or getattr(tflm, "int16", None) is not None:
            return tflm
        return chain(tflm, stages, profile.options)


def profile_object(name: str, options: N6Options | None = None):
    """What the Interpreter takes for a profile name or spec (parse_profile_spec):
    NeuralArtProfile(options with the spec's own) for "neural-art[:...]", else the name itself."""
    name, options = parse_profile_spec(name, options)
    return NeuralArtProfile(options) if name == NeuralArtProfile.name else name


def parse_profile_spec(spec: str, options: N6Options | None = None) -> tuple[str, N6Options | None]:
    """ "neural-art:rounding=truncate,compiler=2.1" -> ("neural-art", options with those fields):
    one side's own --n6-* choices (keys as the options' names, `-` or `_`; compiled=FILE), over the
    ones both sides share. A plain profile name is itself. NpusimError (one line) for a bad spec."""
    from dataclasses import fields, replace

    from ..errors import NpusimError
    from ..profiles import N6_CHOICES

    name, _, rest = spec.partition(":")
    if not rest:
        return name, options
    if name != NeuralArtProfile.name:
        raise NpusimError(f"profile {spec!r}: options after ':' apply only to neural-art")
    known = {f.name for f in fields(N6Options)} & (set(N6_CHOICES) | {"compiled"})
    changes = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in known:
            raise NpusimError(
                f"profile {spec!r}: {item!r} is not KEY=VALUE with KEY one of "
                f"{', '.join(sorted(k.replace('_', '-') for k in known))}"
            )
        if key in N6_CHOICES and value not in N6_CHOICES[key]:
            raise NpusimError(
                f"profile {spec!r}: {key.replace('_', '-')} is one of {', '.join(N6_CHOICES[key])}"
            )
        changes[key] = value
    return name, replace(options or N6Options(), **changes)
