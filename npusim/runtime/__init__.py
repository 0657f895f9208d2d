"""The runtime: a graph's plan and its run (interpreter.py; chains.py, elementwise chains run as one
lookup), and the float reference (reference.py, with LiteRT's hybrid kernels in hybrid.py)."""
