"""Every compiled thing of npusim, apart from the operators that call it (npusim/ops/): jit.py (Numba
compilation and its cache, keyed by the kernel sources), host.py (CPU features, detected lazily),
tuning.py (opt-in process tuning), and the engines: the AMX, VNNI, AVX2 and BLAS engines of CONV_2D
and FULLY_CONNECTED behind one interface (backend.py), their shared direct-convolution micro-kernel
(microkernel.py), the vector output stage (output_stage.py), 64-byte aligned buffers (aligned.py),
the padded copy of activations (padding.py) and the 16x8 forms (int16.py). An op module prepares
plain data once (ConvGeometry from geometry.py, OutputStage from requant.py) and its Eval hands it
to an engine. Nothing here imports npusim.ops: kernels never depend on the operators.
"""
