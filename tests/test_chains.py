"""Elementwise chains over one 8-bit tensor run as one lookup in Interpreter.run (npusim/runtime/chains.py):
the result equals TFLM's and the unfused walk's, and a chain is taken only where nothing else needs
its intermediates."""

import numpy as np
import pytest

from npusim import Interpreter
from npusim.testing.oracle import silu_chain_model
from npusim.testing.runners import assert_same, run_tflm_outputs

CASES = [  # variant, x's shape in the model (batch 1), the chains' lengths run() takes
    ("silu", (1, 5, 6, 8), [2]),
    ("swapped", (1, 4, 4, 16), [2]),
    ("long", (1, 3, 7, 5), [4]),
    ("exposed", (1, 4, 5, 3), []),
    ("uint8", (1, 6, 6, 3), [3]),
    ("silu", (1, 1, 1, 3), [2]),  # fewer elements per image than codes: the table takes several images
]
IMAGES = 3


def inputs(model: Interpreter, n: int, seed: int = 0) -> np.ndarray:
    t = model.graph.tensors[model.graph.inputs[0]]
    codes = np.random.default_rng(seed).integers(0, 256, (n, *t.shape[1:]), dtype=np.uint8)
    return codes.view(t.dtype)


@pytest.mark.parametrize("profile", ["tflm", "xnnpack", "single"])
@pytest.mark.parametrize("variant, shape, lengths", CASES)
def test_chain_runs_as_one_lookup_and_equals_the_unfused_walk(variant, shape, lengths, profile):
    model = Interpreter(silu_chain_model(shape, variant), profile=profile)
    assert sorted(len(c.kernels) for c in model._chains.values()) == lengths
    x = inputs(model, IMAGES)
    fused = model.run(x)
    walked = model.run_all(x)
    for got, t in zip(fused if isinstance(fused, list) else [fused], model.graph.outputs):
        assert_same(walked[t], got, f"{variant} {profile}")


@pytest.mark.parametrize("variant, shape, lengths", CASES)
def test_chain_equals_tflm(variant, shape, lengths):
    data = silu_chain_model(shape, variant)
    model = Interpreter(data)
    x = inputs(model, IMAGES, seed=1)
    got = model.run(x)
    expected = run_tflm_outputs(data, x)
    for e, g in zip(expected, got if isinstance(got, list) else [got]):
        assert_same(e, g, variant)


def test_every_code_of_the_root_is_looked_up_as_computed():
    """All 256 input codes, each in many positions: the table holds each code's own result."""
    data = silu_chain_model((1, 16, 16, 1), "uint8")
    model = Interpreter(data)
    x = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    x = np.concatenate([x, x[:, ::-1]])
    assert_same(run_tflm_outputs(data, x)[0], model.run(x), "every code")


def test_a_run_that_overrides_a_chain_constant_walks_unfolded():
    """The table holds the model's constants: run(x, overrides) with another scalar in the chain
    computes with that scalar, as run_all does, not with the table."""
    model = Interpreter(silu_chain_model((1, 3, 7, 5), "long"))
    k = next(t for t, v in enumerate(model.graph.tensors) if v.data is not None and v.data.size == 1)
    x = inputs(model, IMAGES, seed=2)
    other = {k: np.array([-90], np.int8)}
    got = model.run(x, overrides=other)
    assert_same(model.run_all(x, overrides=other)[model.graph.outputs[0]], got, "overridden")
    assert not np.array_equal(got, model.run(x))


def test_byte_lookup_equals_indexing_at_every_tail():
    """kernels/lookup.py: 64 bytes per VPERMI2B step where the host has AVX-512 VBMI, then a masked
    tail; 32 bytes per 16 VPSHUFB with AVX2 alone, then a scalar tail (tests/test_avx2_cpu.py runs
    it compiled for Haswell); the scalar loop elsewhere (test_generic_cpu.py): against numpy's
    indexing for sizes around the vector and the parallel task boundaries."""
    from npusim.kernels import lookup as L

    rng = np.random.default_rng(3)
    for dtype in (np.int8, np.uint8):
        table = rng.integers(0, 256, 256).astype(dtype)
        for n in (1, 31, 32, 33, 63, 64, 65, 127, 200, L.CHUNK - 1, L.CHUNK, L.CHUNK + 65, 3 * L.CHUNK + 5):
            x = rng.integers(0, 256, n, dtype=np.uint8)
            out = L.lookup(table, x, np.empty(n, dtype))
            assert out.dtype == dtype and np.array_equal(out, table[x]), (dtype, n)
