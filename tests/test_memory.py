"""Memory: repeated runs do not grow the process, and a run holds only its live activations.

The peak resident memory of a batch-256 run of each shared model is reported by `make bench`
(section "Memory of a model run"); here the properties behind it are held.
"""

import gc
import os
from pathlib import Path

import numpy as np
import pytest

import npusim
from npusim.testing import oracle as O

from shared_paths import RESNET, need

GROWTH_LIMIT_MB = 8.0  # allocator noise; a per-call leak of a batch's activations is far larger


def rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def conv_model() -> bytes:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (32, 3, 3, 16), dtype=np.int8)
    return O.conv2d_model(
        (1, 32, 32, 16),
        w,
        rng.integers(-500, 500, 32).astype(np.int32),
        0.05,
        -3,
        np.full(32, 0.004, np.float32),
        0.4,
        5,
        stride=(1, 1),
        padding="SAME",
        dilation=(1, 1),
        activation="RELU",
    )


def assert_flat(sim: npusim.Interpreter, x: np.ndarray, calls: int = 30):
    for _ in range(3):
        sim.run(x)
    gc.collect()
    before = rss_mb()
    for _ in range(calls):
        sim.run(x)
    gc.collect()
    grown = rss_mb() - before
    # One leaked output per call would be calls * output bytes.
    leak = calls * sim.run(x).nbytes / 2**20
    assert grown < GROWTH_LIMIT_MB, (
        f"resident memory grew {grown:.1f} MB over {calls} runs (a leaked output per run: {leak:.1f} MB)"
    )


@pytest.mark.skipif(
    not Path("/proc/self/statm").exists(), reason="needs Linux /proc to read the resident set size"
)
def test_repeated_conv_runs_do_not_grow_memory():
    sim = npusim.Interpreter(conv_model())
    assert_flat(sim, np.random.default_rng(1).integers(-128, 128, (64, 32, 32, 16), dtype=np.int8))


@pytest.mark.skipif(
    not Path("/proc/self/statm").exists(), reason="needs Linux /proc to read the resident set size"
)
def test_repeated_model_runs_do_not_grow_memory():
    sim = npusim.Interpreter(Path(need(RESNET)).read_bytes())
    assert_flat(sim, np.random.default_rng(2).integers(-128, 128, (64, 32, 32, 3), dtype=np.int8))


def test_run_drops_activations_after_their_last_reader():
    sim = npusim.Interpreter(Path(need(RESNET)).read_bytes())
    x = np.random.default_rng(3).integers(-128, 128, (4, 32, 32, 3), dtype=np.int8)
    out = sim.graph.outputs[0]
    values = sim.evaluate({sim.graph.inputs[0]: x}, keep={out})
    assert set(values) == {out}
    np.testing.assert_array_equal(values[out], sim.run_all(x)[out])


def test_the_convolutions_of_a_run_share_one_padded_input_buffer():
    """Kernels run one at a time, so the padded input copies of all CONV_2D ops live in one buffer,
    the size of the largest: ResNet-8 held 20 MB at batch 256 with one per kernel. The shared buffer
    is rewritten by each conv (TFLM's outputs on the real model: test_models)."""
    sim = npusim.Interpreter(Path(need(RESNET)).read_bytes())
    x = np.random.default_rng(4).integers(-128, 128, (64, 32, 32, 3), dtype=np.int8)
    convs = [k for k in sim.kernels if k.kind == "CONV_2D"]
    assert len(convs) > 1
    sim.run(x)
    assert len({id(k.workspace) for k in convs}) == 1
    # A 3x3 or 1x1 conv's padded copy has at most 2 more rows and columns than its input, in int8
    # (vnni, amx) or int16 (the avx2 path), with a few bytes of slack.
    largest = max(2 * 64 * (h + 2) * (w + 2) * c + 4 for h, w, c in (k.in_image_shape for k in convs))
    assert convs[0].workspace._raw.nbytes <= largest


FIRST_RUN_CHILD = """
import json, resource, sys
import numpy as np
import npusim
sys.path.insert(0, sys.argv[1])
from test_memory import conv_model
npusim.tune_process()
n = 64
sim = npusim.Interpreter(conv_model(), batch=n if sys.argv[2] == "batch" else None)
x = np.ones((n, 32, 32, 16), np.int8)
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    sim.run(x)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def test_an_interpreter_told_its_batch_faults_in_the_memory_of_its_first_run():
    """Interpreter(..., batch=n): the warm-up runs a batch of n once, so that the first run of a tuned
    process reuses memory already faulted in, as later runs do (page faults counted, not time)."""
    import json
    import subprocess
    import sys

    def faults(kind):
        done = subprocess.run(
            [sys.executable, "-c", FIRST_RUN_CHILD, str(Path(__file__).parent), kind],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    told, untold = faults("batch"), faults("one image")
    # A batch of 64 writes 4 MB of activations: a thousand 4 KB pages the first time round.
    assert untold[0] > 500 and untold[0] > 4 * untold[1], untold
    assert told[0] < max(4 * told[1], 100) and told[0] * 4 < untold[0], (told, untold)


@pytest.mark.parametrize("batch", [0, -2, 2.5, True, "8"])
def test_a_batch_that_is_no_positive_integer_is_refused(batch):
    with pytest.raises(npusim.NpusimError, match="batch: expected a positive integer"):
        npusim.Interpreter(conv_model(), batch=batch)


def test_a_batch_beyond_the_allocation_limit_is_refused():
    with pytest.raises(npusim.NpusimError, match=r"batch 100000000: .* needs \d+ bytes, more than the limit"):
        npusim.Interpreter(conv_model(), batch=100_000_000)
