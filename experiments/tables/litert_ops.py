"""Op by op, npusim's profile against LiteRT's default interpreter (AUTO: XNNPACK where it takes the
op) on a .tflite model: each op is cut out as a one-op model and run in LiteRT on npusim's own values
of its inputs, so every disagreement is the op's own (none is inherited from an earlier op).

    python -m experiments.tables.litert_ops MODEL.tflite [MODEL ...] [--images 4] [--profile xnnpack]

Prints, per model and per (op kind, taken by XNNPACK), the ops and output elements that differ.
The inputs are random codes (or uniform [0, 1) floats for a float input): exactness needs no images.
"""

from __future__ import annotations

import argparse
import collections
import copy
from pathlib import Path

import numpy as np


def one_op_model(model, index: int) -> tuple[bytes, list[int]]:
    """The model's op `index` alone (all tensors and buffers kept), its graph inputs the op's inputs
    that are not constants; returns the bytes and those input tensor indices."""
    import flatbuffers

    m = copy.deepcopy(model)
    sg = m.subgraphs[0]
    op = sg.operators[index]

    def constant(t: int) -> bool:
        b = sg.tensors[t].buffer
        return b > 0 and m.buffers[b].data is not None and len(m.buffers[b].data) > 0

    inputs = [t for t in op.inputs if t >= 0 and not constant(t)]
    sg.operators, sg.inputs, sg.outputs = [op], inputs, list(op.outputs)
    b = flatbuffers.Builder(0)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output()), inputs


def litert_one_op(model_bytes: bytes, xs: list) -> tuple[bool, np.ndarray]:
    """(whether XNNPACK took the op, LiteRT AUTO's output 0 image by image)."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model_bytes, num_threads=1)
    it.allocate_tensors()
    ins, out = it.get_input_details(), it.get_output_details()[0]["index"]
    delegated = any(d["op_name"] == "DELEGATE" for d in it._get_ops_details())
    ys = []
    for i in range(xs[0].shape[0]):
        for d, x in zip(ins, xs):
            it.set_tensor(d["index"], np.ascontiguousarray(x[i : i + 1]))
        it.invoke()
        ys.append(np.array(it.get_tensor(out), copy=True))
    return delegated, np.concatenate(ys)


def compare(path: Path, images: int, profile: str) -> dict:
    from ai_edge_litert import schema_py_generated as schema

    import npusim
    from npusim.testing import oracle as O

    data = path.read_bytes()
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    graph = npusim.load_model(data)
    (shape, dtype), *_ = O.model_inputs(data)
    rng = np.random.default_rng(0)
    if np.dtype(dtype) == np.float32:
        x = rng.uniform(0.0, 1.0, (images, *shape[1:])).astype(np.float32)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, (images, *shape[1:])).astype(dtype)
    values = npusim.Interpreter(graph, profile=profile).evaluate({graph.inputs[0]: x})
    stats = collections.defaultdict(lambda: [0, 0, 0])  # ops, ops differing, elements differing
    for index, op in enumerate(graph.ops):
        one, inputs = one_op_model(model, index)
        delegated, expected = litert_one_op(one, [values[t] for t in inputs])
        got = values[model.subgraphs[0].operators[index].outputs[0]].reshape(expected.shape)
        differing = int((expected != got).sum())
        row = stats[(op.kind, delegated)]
        row[0] += 1
        row[1] += differing > 0
        row[2] += differing
    return stats


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--profile", default="xnnpack")
    a = p.parse_args()
    for path in a.models:
        print(f"{path.name} (profile {a.profile}, {a.images} random inputs)")
        for (kind, delegated), (ops, bad, elements) in sorted(compare(path, a.images, a.profile).items()):
            where = "XNNPACK" if delegated else "builtin"
            print(f"  {kind:24s} {where:8s} {ops:4d} ops, {bad:3d} differ, {elements} elements")


if __name__ == "__main__":
    main()
