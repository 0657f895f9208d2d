"""Every compiled thing of npusim; the operators that call it (npusim/ops/) compile nothing. jit.py
(Numba compilation and its cache, keyed by this folder's sources alone), host.py (CPU features,
detected lazily), tuning.py (opt-in process tuning), the rounding (rounding.py, stages.py), and the
engines: the AMX, VNNI, AVX2 and BLAS engines of CONV_2D and FULLY_CONNECTED behind one interface
(backend.py), their shared direct-convolution micro-kernel (microkernel.py), the vector output
stage (output_stage.py), 64-byte aligned buffers (aligned.py), the padded copy of activations
(padding.py), the 16x8 forms (int16.py), and the other operators' loops (elementwise.py,
pair_tables.py, fixed_point.py, reduce.py, movement.py, lookup.py). An op module prepares plain data
once (ConvGeometry from geometry.py, OutputStage from requant.py) and its Eval hands it to a
kernel. Nothing here imports npusim.ops: kernels never depend on the operators.
"""
