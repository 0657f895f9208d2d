"""npusim's Numba cache (npusim/jit.py): one directory per digest of the package's sources, so
that an edit anywhere (kernels inline code from other modules, which Numba's own check does not
see) starts a fresh cache, nothing is ever deleted (concurrent workers keep their files), and a
read-only package caches in the user's directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import npusim.ops.activations
import npusim.quant
from npusim import jit


def test_digest_follows_every_source(tmp_path):
    digest = jit.digest_of
    (tmp_path / "kernels.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rounding.py").write_text("y = 1\n")
    first = digest(tmp_path)
    assert digest(tmp_path) == first
    (tmp_path / "sub" / "rounding.py").write_text("y = 2\n")  # an edit in another module
    assert digest(tmp_path) != first


def _cache_path(py_func) -> str:
    return jit._CacheImpl(py_func).locator.get_cache_path()


def test_cache_directory_is_keyed_by_the_digest(monkeypatch):
    monkeypatch.setattr(jit.config, "CACHE_DIR", "")
    path = _cache_path(npusim.quant.requantize_one.py_func)
    assert path == str(jit.PACKAGE / "__pycache__" / f"numba-{jit.sources_digest()}" / ".")
    path = _cache_path(npusim.ops.activations.one_minus_x_over_one_plus_x_for_x_in_0_1.py_func)
    assert path == str(jit.PACKAGE / "__pycache__" / f"numba-{jit.sources_digest()}" / "ops")


def test_read_only_package_caches_in_the_user_directory(tmp_path, monkeypatch):
    # As root, permissions do not stop a write: a package root below a plain file cannot be created.
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(jit.config, "CACHE_DIR", "")
    monkeypatch.setattr(jit._PackageLocator, "root", classmethod(lambda cls: tmp_path / "file" / "pycache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    path = _cache_path(npusim.quant.requantize_one.py_func)
    assert path.startswith(str(tmp_path / "user" / "npusim" / f"numba-{jit.sources_digest()}"))


def test_numba_cache_dir_takes_precedence(tmp_path, monkeypatch):
    monkeypatch.setattr(jit.config, "CACHE_DIR", str(tmp_path))
    assert _cache_path(npusim.quant.requantize_one.py_func).startswith(str(tmp_path / "npusim" / "numba-"))


CHILD = """
import json, sys
import numpy as np
from npusim.engines.padding import pad_input
x = np.arange(2 * 3 * 3 * 4, dtype=np.int8).reshape(2, 3, 3, 4)
pad_input(x, 1, 1, np.int8(-5), np.empty((2, 5, 5, 4), np.int8))
stats = pad_input.serial.stats
print(json.dumps({"hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}))
"""


def test_a_second_process_loads_and_deletes_nothing(tmp_path):
    """Two processes in turn on one cache directory: the first compiles and writes, the second
    loads; files of another digest (another version's workers) are left alone."""
    other = tmp_path / "npusim" / "numba-0123456789abcdef0123" / "engines"
    other.mkdir(parents=True)
    (other / "padding.pad_input-1.py311.nbi").write_bytes(b"another version's index")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))

    def run():
        done = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    fresh = tmp_path / "npusim" / f"numba-{jit.sources_digest()}" / "engines"
    written = sorted(fresh.glob("padding.pad_input-*"))
    assert written, "the first process wrote no cache entry"
    second = run()
    assert second["hits"] >= 1 and second["misses"] == 0, (first, second)
    assert (other / "padding.pad_input-1.py311.nbi").exists()
