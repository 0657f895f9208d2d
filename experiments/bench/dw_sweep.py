"""Cost structure of DEPTHWISE_CONV_2D: median time of one-op models 28x28xC, kxk, stride 1, SAME,
at one batch, over channels C and kernel sizes k, per output pixel and per pixel-block (64
channels, the vector kernel's unit). The slope over k gives the cost of the taps, the intercept
the per-pixel cost (output stage, loop overhead). Run it as
NUMBA_NUM_THREADS=1 python -m experiments.bench.dw_sweep [--profile tflm] from a checkout's root."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="tflm")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--channels", default="64,96,128")
    p.add_argument("--kernels", default="1,3,5")
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    try:
        channels = [int(v) for v in args.channels.split(",")]
        kernels = [int(v) for v in args.kernels.split(",")]
    except ValueError:
        p.error("--channels and --kernels take comma-separated integers")
    if args.batch < 1 or args.reps < 1 or min(channels + kernels) < 1:
        p.error("--batch, --reps, --channels and --kernels must be positive")

    import npusim

    from .workloads import depthwise_model

    rng = np.random.default_rng(1)
    for c in channels:
        for k in kernels:
            model = depthwise_model(rng, c, k)
            x = rng.integers(-128, 128, (args.batch, 28, 28, c), dtype=np.int8)
            try:
                sim = npusim.Interpreter(model, profile=args.profile)
            except npusim.NpusimError as e:  # a bad --profile, before any case is timed
                p.error(f"--profile {args.profile}: {e}")
            sim.run(x)
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                sim.run(x)
                times.append(time.perf_counter() - t0)
            t = statistics.median(times)
            pixels = args.batch * 28 * 28
            print(
                f"C={c} k={k}: {t * 1e3:.3f} ms, {t / pixels * 1e9:.1f} ns/pixel, "
                f"{t / pixels / ((c + 63) // 64) * 1e9:.1f} ns/pixel-block, "
                f"{sim.macs() * args.batch / t / 1e9:.1f} GMAC/s ({sim.kernels[0].variant} form)",
                flush=True,
            )


if __name__ == "__main__":
    main()
