"""What the tests and the benchmark share: one-op .tflite models built in code and the oracle
runtimes (TFLM, LiteRT) that npusim is held to (oracle.py). Needs the test extras (tflite-micro)
for TFLM only."""
