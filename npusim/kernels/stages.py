"""The output-stage kinds: what the compiled kernels branch on (profiles.Profile.stage and
integer_stage take these values). Plain integers, here in kernels/ because the machine code of the
kernels depends on them (the Numba cache is keyed by this folder alone, kernels/jit.py); the
profiles package re-exports them, and importing this module imports nothing.

DOUBLE_ROUNDING: TFLM's MultiplyByQuantizedMultiplier. SINGLE_ROUNDING: TFLITE_SINGLE_ROUNDING
(CMSIS-NN). FP32: XNNPACK's fp32 requantization (ONNX Runtime's MlasRequantizeOutput is the same).
The values are the ids of the three profiles that define them (tflm, single, xnnpack)."""

DOUBLE_ROUNDING, SINGLE_ROUNDING, FP32 = 0, 1, 2
