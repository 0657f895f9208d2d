"""Test configuration: hypothesis profiles and the tests directory on sys.path (for cases,
shared_paths, kernel_paths; the oracles are npusim.testing.oracle).

HYPOTHESIS_PROFILE=npusim (default): derandomized, no example database written into the repo, so
`make test` is reproducible. HYPOTHESIS_PROFILE=random: fresh random examples on every run.
NPUSIM_TEST_SCALE=k multiplies the number of examples of the op tests (e.g. 10 for a deeper run).
--fuzz-examples N sets the number of hostile-model cases of tests/test_fuzz.py (`make fuzz`: 20000).
"""

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))
# The `npusim` commands the tests start run in processes of their own, as each test expects, and
# leave no resident server behind (tests/test_resident.py starts its own, and stops them).
os.environ["NPUSIM_RESIDENT"] = "0"

_common = dict(
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("npusim", derandomize=True, **_common)
settings.register_profile("random", **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "npusim"))


def pytest_addoption(parser):
    # tests/test_fuzz.py: hostile-model cases in total (CI default; `make fuzz` runs 20000).
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=3000,
        metavar="N",
        help="number of fuzz cases of tests/test_fuzz.py (default 3000)",
    )


@pytest.fixture
def tiny(tmp_path):
    """zo's tests: a tiny .tflite classifier and a colour data set, as files (tests/zo_fixtures.py)."""
    import numpy as np

    from zo_fixtures import color_dataset, tiny_classifier

    model = tmp_path / "tiny.tflite"
    model.write_bytes(tiny_classifier())
    data = tmp_path / "colors.npz"
    np.savez(data, **color_dataset())
    return model, data


@pytest.fixture(autouse=True)
def _signal_dispositions_restored():
    """A test that runs a command in-process may leave SIGINT/SIGTERM/SIGHUP ignored (the one-line
    interrupt path ignores further signals): the children later tests start would inherit SIG_IGN and
    never be interrupted. Each test gets the dispositions it found."""
    import signal

    names = ("SIGINT", "SIGTERM", "SIGHUP")
    saved = {n: signal.getsignal(getattr(signal, n)) for n in names if hasattr(signal, n)}
    yield
    for n, handler in saved.items():
        if handler is not None:
            signal.signal(getattr(signal, n), handler)
