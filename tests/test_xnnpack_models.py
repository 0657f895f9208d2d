"""--profile xnnpack against LiteRT's default CPU interpreter (OpResolverType.AUTO) end to end:
every int8 .tflite model under the shared models folder, on real images, every output element of
every output equal.

Images: CIFAR-10 test images where the model takes 32x32 inputs, EuroSAT-64 test images resized
(bilinear) to the model's input otherwise, mapped to the input as `zo train` does (zo.inputs). LiteRT
invokes the batch-1 model once per image, single-threaded. On a difference the message names the
first op whose output differs while its inputs agree (every op output made a graph output).
"""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest
from ai_edge_litert import schema_py_generated as schema

from npusim import Interpreter, load_model
from zo.inputs import prepare_inputs

from shared_paths import SHARED, need

MODELS = SHARED / "models"
# Images per model: a budget of input pixels (16 at 256 x 256, 256 at 32 x 32), so that small
# models see many images and a run stays near a minute.
PIXELS, MIN_IMAGES, MAX_IMAGES = 1 << 20, 16, 256


def int8_models() -> list:
    """Every .tflite under the models folder with int8 tensors (float models are not npusim's)."""
    if not MODELS.exists():
        return [pytest.param(None, id="shared-models-missing")]
    found = []
    for path in sorted(MODELS.rglob("*.tflite")):
        name = path.relative_to(MODELS).as_posix()
        if not any(np.dtype(t.dtype) == np.int8 for t in load_model(str(path)).tensors):
            continue
        found.append(pytest.param(name, id=name))
    return found


def real_images(graph) -> np.ndarray:
    shape = graph.input().shape
    n = int(np.clip(PIXELS // (shape[1] * shape[2]), MIN_IMAGES, MAX_IMAGES))
    data = (
        SHARED / "data" / ("cifar10_subset.npz" if tuple(shape[1:3]) == (32, 32) else "eurosat64_subset.npz")
    )
    x = np.load(need(data))["x_test"][:n]
    return np.ascontiguousarray(prepare_inputs(x, graph))


def litert_outputs(model: bytes, x: np.ndarray) -> dict:
    """{tensor index: LiteRT AUTO's value over the batch} for every graph output, image by image."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    it = LiteRT(model_content=model, num_threads=1)
    it.allocate_tensors()
    index = it.get_input_details()[0]["index"]
    outs = it.get_output_details()
    got: dict = {}
    for i in range(len(x)):
        it.set_tensor(index, x[i : i + 1])
        it.invoke()
        for o in outs:
            got.setdefault(o["index"], []).append(it.get_tensor(o["index"]).copy())
    return {k: np.concatenate(v) for k, v in got.items()}


def every_output(model: bytes) -> bytes:
    """The model with every op's output made a graph output, so that LiteRT returns each."""
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    sg = m.subgraphs[0]
    outputs = [int(t) for t in sg.outputs]
    outputs += [int(t) for op in sg.operators for t in op.outputs if int(t) not in outputs]
    sg.outputs = outputs
    builder = flatbuffers.Builder(1024)
    builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def first_parting_op(model: bytes, graph, values: dict, x: np.ndarray) -> str:
    """The first op (file order) whose output differs from LiteRT's while its inputs agree."""
    expected = litert_outputs(every_output(model), x)
    differs: set = set()
    for op in graph.ops:
        inputs_agree = not any(t in differs for t in op.inputs)
        for t in op.outputs:
            count = int(np.sum(expected[t] != values[t]))
            if count:
                differs.add(t)
                if inputs_agree:
                    name = graph.tensors[t].name
                    return f"op {op.index} {op.kind}: {count} of {expected[t].size} elements of {name!r}"
    return "no single op (the whole-model outputs differ only)"


@pytest.mark.parametrize("name", int8_models())
def test_model_equals_litert(name):
    if name is None:
        need(MODELS)
    path = MODELS / name
    model = path.read_bytes()
    graph = load_model(model)
    x = real_images(graph)
    values = Interpreter(graph, profile="xnnpack").evaluate({graph.inputs[0]: x})
    expected = litert_outputs(model, x)
    differing = {
        graph.tensors[t].name: int(np.sum(expected[t] != values[t]))
        for t in graph.outputs
        if not np.array_equal(expected[t], values[t])
    }
    assert set(expected) == set(graph.outputs)
    if differing:
        where = first_parting_op(model, graph, values, x)
        pytest.fail(f"{name}: outputs differ from LiteRT AUTO {differing}; first at {where}")
