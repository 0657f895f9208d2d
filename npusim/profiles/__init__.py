"""The rounding profiles, one object each, plain data: the command lines offer them without importing
the kernels or Numba (of kernels/ only stages.py, which imports nothing: the output-stage kinds).

A Profile is an int (its id, what a Numba or LLVM kernel receives) that carries what tells the
profiles apart, so that a kernel branches on these fields, never on a profile's name:

- stage: the output stage of the MAC ops (CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ...):
  DOUBLE_ROUNDING (TFLM's MultiplyByQuantizedMultiplier), SINGLE_ROUNDING (TFLITE_SINGLE_ROUNDING,
  CMSIS-NN) or FP32 (XNNPACK's fp32 requantization; ONNX Runtime's MlasRequantizeOutput is the
  same, quant.mac_profile). The kinds are the ids of the three profiles that define them, so the
  kernels' switches over them are unchanged.
- integer_stage: the rounding of the integer rescales of the elementwise ops (ADD, SUB):
  SINGLE_ROUNDING or DOUBLE_ROUNDING.
- bounds: how a fused activation's real bounds become integers (quant.activation_range):
  "round-away" (TFLM's zero_point + round_half_away(f / scale)), "rint-float-zp" (XNNPACK:
  rint(f / scale + zero_point) in float32), "rint-then-zp" (MLAS QuantizeLinear: rint(f / scale)
  + zero_point, saturated).
- xnnpack_delegate: LiteRT's XNNPACK delegate takes the ops it accepts (its arithmetic where it
  differs from TFLM's, its refusals falling back to LiteRT's builtin kernels).
- ort_qlinear: the 8-bit elementwise ops are ONNX Runtime's (QuantizeLinear, QLinearAdd,
  QLinearMul, QLinearSigmoid, QLinearLeakyRelu; profiles/onnxruntime.py).
- kernels: the profile's kernel table, "module:Class" (imported when a model is planned): a
  Kernels subclass made once per graph (Profile.table) whose kernel_for(kernel_class, op, **extra)
  the Interpreter asks once per op. The default, Kernels below, is each op's own kernel class
  prepared for the profile; onnxruntime's (profiles/ort_kernels.OrtKernels: ORT's arithmetic, or
  the float op then QuantizeLinear) and neural-art's (npu/neural_art_run.NeuralArtKernels: the
  Neural-ART unit chains) override it per op kind and fall back to it.
- baseline: the profile whose kernels run the ops this one does not take as its own (neural-art:
  tflm), or None; `npusim validate` runs it beside this one (its tflm_propagated column).
- int16: the profile runs the 16x8 paths (int16 activations, int8 weights), as TFLM does.
- uint8: the profile runs TFLite's legacy uint8 models (LiteRT does; TFLM has no uint8 kernels;
  npusim/runtime/uint8.py shifts such a graph to int8 for it).
- zo: zo trains on the profile (`zo train --profile` offers it, zo_profiles()): its kernels run a
  .tflite graph's prefix and suffix as they are, with no options of their own (onnxruntime's
  single roundings belong to imported ONNX graphs, neural-art runs with its --n6-* options).

Adding a profile is one entry in PROFILES, and, with kernels of its own, their module: a Kernels
subclass named by the entry's `kernels` (docs/layout.md, "Adding a profile").
"""

from __future__ import annotations

from importlib import import_module

# The output-stage kinds (Profile.stage, Profile.integer_stage): integers the compiled kernels branch
# on, defined beside them (kernels/stages.py, a module that imports nothing).
from ..kernels.stages import DOUBLE_ROUNDING, FP32, SINGLE_ROUNDING  # noqa: F401 - re-exported

# The builtin kernel table: every op's own kernel class (Kernels below).
BUILTIN = "npusim.profiles:Kernels"


class Profile(int):
    """A rounding profile: its id, with its name and the fields of the module's docstring."""

    FIELDS = (
        "stage", "integer_stage", "bounds", "xnnpack_delegate", "ort_qlinear", "kernels", "baseline",
        "int16", "uint8", "zo",
    )  # fmt: skip

    def __new__(
        cls, pid: int, name: str, *, stage=DOUBLE_ROUNDING, integer_stage=DOUBLE_ROUNDING,
        bounds="round-away", xnnpack_delegate=False, ort_qlinear=False, kernels=BUILTIN,
        baseline=None, int16=False, uint8=False, zo=False,
    ):  # fmt: skip
        # keyword-only fields: a misspelt one is a TypeError, never a silent default
        self = int.__new__(cls, pid)
        self.name = name
        self.stage, self.integer_stage, self.bounds = stage, integer_stage, bounds
        self.xnnpack_delegate, self.ort_qlinear, self.kernels = xnnpack_delegate, ort_qlinear, kernels
        self.baseline, self.int16, self.uint8, self.zo = baseline, int16, uint8, zo
        return self

    def fields(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    def table(self, graph) -> Kernels:
        """This profile's kernels for graph (made once per plan): its kernel_for(kernel_class, op,
        **extra) is the one question the Interpreter asks of a profile, once per op."""
        module, _, name = self.kernels.partition(":")
        return getattr(import_module(module), name)(self, graph)

    def __reduce__(self):
        return (_rebuild, (int(self), self.name, self.fields()))


def _rebuild(pid, name, fields):
    return Profile(pid, name, **fields)


class Kernels:
    """A profile's kernels for one graph (Profile.table): each op's own kernel class, prepared for
    the profile. A profile with kernels of its own subclasses this, overrides kernel_for for the op
    kinds it runs its own way and falls back to this one for the others (as TFLM's
    kernels/cmsis_nn/ beside kernels/, behind the same registration)."""

    def __init__(self, profile: Profile, graph):
        self.profile, self.graph = profile, graph

    def kernel_for(self, kernel_class, op, **extra):
        """The prepared kernel of op (kernel_class: its registered class, ops.KERNELS[op.kind];
        extra: what the class takes besides op, graph and profile, e.g. the MAC engines)."""
        return kernel_class(op, self.graph, self.profile, **extra)


# The ids: what the kernels receive (a Profile is its id) and what the tests name profiles by.
TFLM, SINGLE, XNNPACK, ONNXRUNTIME, NEURAL_ART = 0, 1, 2, 3, 4
PROFILES = {
    "tflm": Profile(TFLM, "tflm", int16=True, zo=True),
    "single": Profile(SINGLE, "single", stage=SINGLE_ROUNDING, integer_stage=SINGLE_ROUNDING, zo=True),
    "xnnpack": Profile(
        XNNPACK, "xnnpack", stage=FP32, bounds="rint-float-zp", xnnpack_delegate=True, uint8=True, zo=True
    ),
    "onnxruntime": Profile(
        ONNXRUNTIME,
        "onnxruntime",
        stage=FP32,
        bounds="rint-then-zp",
        ort_qlinear=True,
        kernels="npusim.profiles.ort_kernels:OrtKernels",
    ),
    # The STM32N6's Neural-ART datapath (docs/neural-art.md): its unit chains where the N6 maps an op
    # to them, TFLM's kernels for the other ops. It runs with its options (the --n6-* choices):
    # npu/neural_art_run.NeuralArtProfile(N6Options(...)) is this entry with them; its kernel table
    # refuses the entry alone.
    "neural-art": Profile(
        NEURAL_ART, "neural-art", kernels="npusim.npu.neural_art_run:NeuralArtKernels", baseline="tflm"
    ),
}
BY_ID = {int(p): p for p in PROFILES.values()}


def zo_profiles() -> list[str]:
    """The names of the profiles zo trains on (Profile.zo), in table order: `zo train --profile`."""
    return [name for name, profile in PROFILES.items() if profile.zo]


def profile_of(profile) -> Profile:
    """The Profile of an id (a Profile is its own), for a kernel handed a plain integer."""
    return profile if isinstance(profile, Profile) else BY_ID[int(profile)]


# The unknowns of the Neural-ART datapath (--n6-* options, docs/neural-art.md): choices, the first
# the default. Plain data here so that the command lines offer them without importing npusim.npu.
N6_CHOICES = {
    "rounding": ("half-up", "half-even", "truncate"),
    "add_products": ("exact", "rounded"),
    "shift_a": ("ignore", "products"),
    "input_offset": ("subtract", "fold"),
    "compiler": ("3.0", "2.2", "2.1"),  # ST Edge AI versions, newest first (npu/n6_compiler.py)
}
