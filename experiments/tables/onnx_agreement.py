"""npusim against ONNX Runtime on ST's ONNX QDQ models: the share of output elements within one
output step between ORT's optimized and unoptimized runs, and between npusim and each, with cosines.

    python -m experiments.tables.onnx_agreement --shared ../shared --images 8 [--profile tflm]

Images: the shared EuroSAT-64 test images, resized (bilinear) to the model input, pixels on [0, 1].
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def agreement(model: Path, shared: Path, images: int, profile: str) -> dict:
    import npusim
    from npusim.testing import onnx_oracle as oo
    from zo.data import resize_images

    graph = npusim.load_model(model)
    d = np.load(shared / "data" / "eurosat64_subset.npz")
    x = resize_images(d["x_test"][:images], graph.input().shape[2]).astype(np.float32) / 255.0
    x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    data = model.read_bytes()
    y_opt, y_lit = (
        oo.run_ort(data, x, optimize=True, threads=2),
        oo.run_ort(data, x, optimize=False, threads=2),
    )
    y_sim = npusim.Interpreter(graph, profile=profile).run(x)
    t = graph.tensors[graph.ops[-1].inputs[0]]  # the int8 output the final DEQUANTIZE reads
    codes = [np.rint(np.asarray(y, np.float64) / t.scale).astype(np.int64) for y in (y_opt, y_lit, y_sim)]
    return {
        "ort_opt_vs_unopt": oo.within_one_step(codes[0], codes[1]),
        f"{profile}_vs_unopt": oo.within_one_step(codes[2], codes[1]),
        f"{profile}_vs_opt": oo.within_one_step(codes[2], codes[0]),
        "cos_ort_opt_vs_unopt": oo.cosine(y_opt, y_lit),
        f"cos_{profile}_vs_unopt": oo.cosine(y_sim, y_lit),
        f"cos_{profile}_vs_opt": oo.cosine(y_sim, y_opt),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--profile", default="tflm")
    args = p.parse_args()
    for model in sorted((args.shared / "models" / "onnx").glob("*.onnx")):
        row = agreement(model, args.shared, args.images, args.profile)
        print(model.name, " ".join(f"{k}={v:.5f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
