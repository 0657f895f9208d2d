"""The rounding profiles by name, plain data: the command lines offer them without importing the
kernels (quant.py, which decides the rounding, and Numba)."""

# Integers so that Numba kernels can branch on them.
TFLM, SINGLE, XNNPACK, ONNXRUNTIME = 0, 1, 2, 3
PROFILES = {"tflm": TFLM, "single": SINGLE, "xnnpack": XNNPACK, "onnxruntime": ONNXRUNTIME}
