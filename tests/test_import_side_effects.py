"""Importing npusim leaves its host process as it was; npusim.tune_process() is the opt-in.

Each check runs in a fresh interpreter: the C library functions that would change the process
(mallopt, and syscall for the AMX permission) are watched through ctypes, through which npusim
reaches them."""

from __future__ import annotations

import json
import subprocess
import sys

WATCH = """
import ctypes, json, os, sys
import numba
called = []
class WatchedCDLL(ctypes.CDLL):
    def __getattr__(self, name):
        if name in ("mallopt", "syscall"):
            called.append(name)
        return super().__getattr__(name)
ctypes.CDLL = WatchedCDLL
env_before, layer_before = dict(os.environ), numba.config.THREADING_LAYER
import npusim, npusim.app.cli
from npusim.kernels import aligned
{action}
print(json.dumps({{"env_same": dict(os.environ) == env_before,
                   "layer_same": numba.config.THREADING_LAYER == layer_before,
                   "added": sorted(set(os.environ) - set(env_before)),
                   "called": called, "pooling": aligned._pooling}}))
"""


def _child(action: str = "", env=None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", WATCH.format(action=action)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _printed(code: str):
    """What a fresh interpreter running code printed last, as JSON."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_changes_nothing():
    seen = _child()
    assert seen["env_same"], f"import npusim set environment variables {seen['added']}"
    assert seen["layer_same"], "import npusim changed numba.config.THREADING_LAYER"
    assert seen["called"] == [], f"import npusim called {seen['called']} of the C library"
    assert not seen["pooling"], "import npusim turned on the pool of freed mappings"


def test_an_interpreter_run_changes_nothing():
    """Building and running an interpreter is not an opt-in either (the AMX permission and the
    pool stay off)."""
    action = (
        "import numpy as np\n"
        "from npusim.testing import oracle as O\n"
        "m = O.conv2d_model((1, 4, 4, 8), np.ones((8, 1, 1, 8), np.int8), None, 0.1, 0, 0.01, 0.2, 0)\n"
        "O.run_npusim(m, np.zeros((2, 4, 4, 8), np.int8))"
    )
    seen = _child(action)
    assert seen["env_same"] and seen["layer_same"] and not seen["pooling"], seen
    assert "mallopt" not in seen["called"], seen


def test_tune_process_is_the_opt_in():
    seen = _child("npusim.tune_process()")
    assert seen["pooling"], "tune_process did not turn on the pool of freed mappings"
    assert "mallopt" in seen["called"], "tune_process did not tune malloc"


def test_the_command_line_loads_no_kernel_until_a_command_runs_a_model():
    """`npusim --help`, a command's help and a usage error answer without Numba or the kernels
    (start-up is most of a one-shot call; see docs/performance.md)."""
    code = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from npusim.app.cli import main\n"
        "codes = [CliRunner().invoke(main, a).exit_code for a in (['--help'], ['run', '--help'], ['run'])]\n"
        "heavy = sorted(m for m in ('numba', 'npusim.runtime.interpreter', 'npusim.quant') if m in "
        "sys.modules)\n"
        "print(json.dumps([codes, heavy]))"
    )
    codes, heavy = _printed(code)
    assert codes == [0, 0, 2] and heavy == [], (codes, heavy)


def test_a_run_imports_no_scipy_linalg_and_numba_still_finds_blas():
    """jit.set_up_target gives Numba's BLAS check the extension module alone: a run leaves
    scipy.linalg unimported and no stray entry in sys.modules, and Numba still sees BLAS, so the
    caller's own compiled np.dot works."""
    code = (
        "import json, sys\n"
        "import numba, numpy as np\n"
        "from npusim.testing import oracle as O\n"
        "m = O.conv2d_model((1, 4, 4, 8), np.ones((8, 1, 1, 8), np.int8), None, 0.1, 0, 0.01, 0.2, 0)\n"
        "O.run_npusim(m, np.zeros((2, 4, 4, 8), np.int8))\n"
        "left = sorted(k for k in ('scipy.linalg', 'scipy.linalg.cython_blas') if k in sys.modules)\n"
        "import numba.np.arraymath as am\n"
        "dot = numba.njit(lambda a, b: np.dot(a, b))\n"
        "a = np.arange(6.0).reshape(2, 3)\n"
        "print(json.dumps([left, am._HAVE_BLAS, bool(np.allclose(dot(a, a.T), a @ a.T))]))"
    )
    left, have_blas, dot_ok = _printed(code)
    assert left == [] and have_blas and dot_ok, (left, have_blas, dot_ok)


def test_a_run_on_a_warm_cache_imports_none_of_numbas_compiler_registries():
    """Machine code loaded from the cache needs Numba's runtime alone (jit._FunctionCache): once the
    kernels are cached, a fresh process that runs a model, serial and threaded, sets up none of the
    lowering registries that compiling needs (about 0.4 s of a one-shot run's CPU)."""
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "from npusim.testing import oracle as O\n"
        "m = O.conv2d_model((1, 4, 4, 8), np.ones((8, 1, 1, 8), np.int8), None, 0.1, 0, 0.01, 0.2, 0)\n"
        "for n in (2, 2048):\n"  # 2048 images reach jit.PARALLEL_MIN_WORK: the threaded kernels
        "    O.run_npusim(m, np.zeros((n, 4, 4, 8), np.int8))\n"
        "names = ('numba.np.arraymath', 'numba.np.linalg', 'numba.np.npyimpl', 'numba.typed.dictimpl')\n"
        "print(json.dumps(sorted(k for k in names if k in sys.modules)))"
    )
    _printed(code)  # the first process may compile (and so set the target up): the cache is warm after
    assert _printed(code) == []
