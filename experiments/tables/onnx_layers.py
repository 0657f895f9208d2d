"""Layer by layer, npusim against ONNX Runtime's literal QDQ run (ORT_DISABLE_ALL) on an ONNX QDQ
model: every QuantizeLinear output of the file is exposed as an ORT graph output and compared, in
codes, with the Graph tensor the importer made of it (Source.values).

    python -m experiments.tables.onnx_layers MODEL.onnx --shared ../shared --images 4 [--profile tflm]
        [--substitute 488,497] [--prefix 100,200,300]

Prints (1) the local disagreement of each lowered layer: the share of its codes that differ from
ORT's when every input is ORT's own (the error the layer adds), grouped by ONNX op type and Graph
kind; (2) the share of final output elements within one step of ORT: npusim alone, with ORT's tensor
substituted at the given op indices, and with ORT's tensors substituted at every layer before each
prefix index (where in depth the output's disagreement comes from).
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--shared", type=Path, default=Path("../shared"))
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--profile", default="tflm")
    p.add_argument("--substitute", default="")
    p.add_argument("--prefix", default="")
    args = p.parse_args()

    import npusim
    from npusim.testing import onnx_oracle as oo
    from zo.data import resize_images

    graph = npusim.load_model(args.model)
    d = np.load(args.shared / "data" / "eurosat64_subset.npz")
    x = resize_images(d["x_test"][: args.images], graph.input().shape[2]).astype(np.float32) / 255.0
    x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    layers = oo.literal_layer_codes(args.model.read_bytes(), x)
    ref = oo.graph_layer_codes(graph, layers)
    producer = {o: n for n in graph.source.model.graph.node for o in n.output}
    op_type = {}
    for name in layers:
        if name in graph.source.values:
            q = producer[name]  # the QuantizeLinear; its input's producer is the layer
            layer = producer.get(q.input[0])
            op_type[graph.source.values[name][0]] = layer.op_type if layer is not None else "(input)"
    it = npusim.Interpreter(graph, profile=args.profile)
    out_t = graph.ops[-1].inputs[0] if graph.ops[-1].kind == "DEQUANTIZE" else graph.outputs[0]

    def run(substitute):
        values = {graph.inputs[0]: it.check_input(x)}
        for k in it.kernels:
            it.evaluate(values, kernels=[k])
            o = k.op.outputs[0]
            if o in ref and o != out_t and substitute(k.op.index):
                values[o] = ref[o]
        diff = np.abs(values[out_t].astype(np.int64) - ref[out_t])
        return float(np.mean(diff <= 1))

    output_of = {k.op.index: k.op.outputs[0] for k in it.kernels}
    local = collections.defaultdict(lambda: [0.0, 0, 0])  # codes off, codes, layers
    for index, kind, _, share in oo.layer_by_layer(it, x, ref):
        o = output_of[index]
        group = local[(op_type[o], kind)]
        group[0] += share * ref[o].size
        group[1] += ref[o].size
        group[2] += 1
    print("local disagreement per layer kind (ORT's inputs), share of codes off:")
    for (onnx_op, kind), (off, n, count) in sorted(local.items(), key=lambda r: -r[1][0] / r[1][1]):
        print(f"  {onnx_op:12s} {kind:24s} layers={count:3d} off={off / n:.4f}")
    print(f"final output within one step: npusim {run(lambda i: False):.4f}")
    if args.substitute:
        idx = {int(s) for s in args.substitute.split(",")}
        print(f"  ORT's tensors at ops {sorted(idx)}: {run(lambda i: i in idx):.4f}")
    for n in (int(s) for s in args.prefix.split(",") if s):
        print(f"  ORT's tensors before op {n}: {run(lambda i, n=n: i < n):.4f}")


if __name__ == "__main__":
    main()
