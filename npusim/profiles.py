"""The rounding profiles by name, plain data: the command lines offer them without importing the
kernels (quant.py, which decides the rounding, and Numba)."""

# Integers so that Numba kernels can branch on them.
TFLM, SINGLE, XNNPACK, ONNXRUNTIME, NEURAL_ART = 0, 1, 2, 3, 4
PROFILES = {
    "tflm": TFLM,
    "single": SINGLE,
    "xnnpack": XNNPACK,
    "onnxruntime": ONNXRUNTIME,
    # The STM32N6's Neural-ART datapath: a profile object (npu/neural_art_run.NeuralArtProfile)
    # that the Interpreter takes as its profile, holding the ops' kernels (docs/neural-art.md).
    "neural-art": NEURAL_ART,
}

# The unknowns of the Neural-ART datapath (--n6-* options, docs/neural-art.md): choices, the first
# the default. Plain data here so that the command lines offer them without importing npusim.npu.
N6_CHOICES = {
    "rounding": ("half-up", "half-even", "truncate"),
    "add_products": ("exact", "rounded"),
    "shift_a": ("ignore", "products"),
    "input_offset": ("subtract", "fold"),
    "compiler": ("3.0", "2.2", "2.1"),  # ST Edge AI versions, newest first (npu/n6_compiler.py)
}
