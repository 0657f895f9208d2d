"""The limits every format's reader and the interpreter hold a model to, whatever its file format.

Read them as `limits.MAX_TENSOR_BYTES` at the point of use (not imported by name): tests lower
the limit for a run by setting it here.
"""

# Refuse any single tensor larger than this before allocating it (hostile files declare absurd shapes).
# The same limit bounds the constant data of a whole model and, in the interpreter, every activation
# and kernel workspace at the batch size of a run.
MAX_TENSOR_BYTES = 1 << 30
# More axes than any TFLite kernel takes (TFLM's reference kernels stop at 5 or 6).
MAX_RANK = 8
