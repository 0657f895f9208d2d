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
- kernels: where the Interpreter gets an op's kernel: "builtin" (the op's own kernel class),
  "onnxruntime" (profiles/ort_kernels.kernel_for: ORT's arithmetic, or the float op then
  QuantizeLinear), "object" (a profile object passed to the Interpreter, which holds its own
  kernel_for: npu/neural_art_run.NeuralArtProfile).
- int16: the profile runs the 16x8 paths (int16 activations, int8 weights), as TFLM does.
- uint8: the profile runs TFLite's legacy uint8 models (LiteRT does; TFLM has no uint8 kernels;
  npusim/runtime/uint8.py shifts such a graph to int8 for it).

Adding a profile is one entry in PROFILES (and, with its own kernels, their module).
"""

from __future__ import annotations

# The output-stage kinds (Profile.stage, Profile.integer_stage): integers the compiled kernels branch
# on, defined beside them (kernels/stages.py, a module that imports nothing).
from ..kernels.stages import DOUBLE_ROUNDING, FP32, SINGLE_ROUNDING  # noqa: F401 - re-exported


class Profile(int):
    """A rounding profile: its id, with its name and the fields of the module's docstring."""

    def __new__(
        cls, pid: int, name: str, *, stage=DOUBLE_ROUNDING, integer_stage=DOUBLE_ROUNDING,
        bounds="round-away", xnnpack_delegate=False, ort_qlinear=False, kernels="builtin",
        int16=False, uint8=False,
    ):  # fmt: skip
        # keyword-only fields: a misspelt one is a TypeError, never a silent default
        self = int.__new__(cls, pid)
        self.name = name
        self.stage, self.integer_stage, self.bounds = stage, integer_stage, bounds
        self.xnnpack_delegate, self.ort_qlinear, self.kernels = xnnpack_delegate, ort_qlinear, kernels
        self.int16, self.uint8 = int16, uint8
        return self

    def fields(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "name"}

    def __reduce__(self):
        return (_rebuild, (int(self), self.name, self.fields()))


def _rebuild(pid, name, fields):
    return Profile(pid, name, **fields)


# The ids: what the kernels receive (a Profile is its id) and what the tests name profiles by.
TFLM, SINGLE, XNNPACK, ONNXRUNTIME, NEURAL_ART = 0, 1, 2, 3, 4
PROFILES = {
    "tflm": Profile(TFLM, "tflm", int16=True),
    "single": Profile(SINGLE, "single", stage=SINGLE_ROUNDING, integer_stage=SINGLE_ROUNDING),
    "xnnpack": Profile(
        XNNPACK, "xnnpack", stage=FP32, bounds="rint-float-zp", xnnpack_delegate=True, uint8=True
    ),
    "onnxruntime": Profile(
        ONNXRUNTIME, "onnxruntime", stage=FP32, bounds="rint-then-zp", ort_qlinear=True, kernels="onnxruntime"
    ),
    # The STM32N6's Neural-ART datapath: a profile object (npu/neural_art_run.NeuralArtProfile)
    # that the Interpreter takes as its profile, holding the ops' kernels (docs/neural-art.md); the
    # ops it does not take run TFLM's.
    "neural-art": Profile(NEURAL_ART, "neural-art", kernels="object"),
}
BY_ID = {int(p): p for p in PROFILES.values()}


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
