"""npusim's Numba cache (npusim/kernels/jit.py): one directory per digest of the kernels' sources (the
modules that compile kernels and what they import), so that an edit there (kernels inline code from
other modules, which Numba's own check does not see) starts a fresh cache and an edit elsewhere (a
command line, a test helper) recompiles nothing; a directory of other sources is pruned only when
no process holds it and nobody used it for a day; a read-only package caches in the user's
directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

import npusim.ops.activations
import npusim.quant
from npusim.kernels import jit


def _package(root, files: dict):
    pkg = root / "pkg"
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_digest_follows_the_kernel_sources_only(tmp_path):
    """A module that compiles kernels (it imports jit.py) and what it imports, transitively, relative
    or absolute, in a function or at the top, count; a module no kernel module imports does not."""
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "jit.py": "def njit(f): return f\n",
            "kernels.py": "from .jit import njit\nfrom . import rounding\n",
            "sub/__init__.py": "",
            "sub/rounding.py": "y = 1\n",
            "rounding.py": "def f():\n    from pkg.sub import rounding\n",
            "cli.py": "from . import kernels\n",
        },
    )
    digest = jit.digest_of
    first = digest(pkg)
    names = {str(p.relative_to(pkg)) for p in jit.kernel_sources(pkg)}
    assert names == {"jit.py", "kernels.py", "rounding.py", "sub/rounding.py"}, names
    (pkg / "cli.py").write_text("from . import kernels  # a new message\n")
    jit.imports_of.cache_clear()
    assert digest(pkg) == first  # the command line: nothing to recompile
    (pkg / "sub" / "rounding.py").write_text("y = 2\n")  # an edit two imports away
    jit.imports_of.cache_clear()
    assert digest(pkg) != first


def test_digest_memo_is_read_back_until_a_source_changes(tmp_path, monkeypatch):
    """The digest is parsed once and read back from the package's __pycache__ while no source file
    changes (path, size, modification time); any edit, a kernel source's or not, parses again."""
    pkg = _package(
        tmp_path,
        {"__init__.py": "", "jit.py": "def njit(f): return f\n", "kernels.py": "from .jit import njit\n"},
    )
    parse = jit.digest_of
    parsed = []
    monkeypatch.setattr(jit, "digest_of", lambda p: parsed.append(p) or parse(p))
    first = jit.memoized_digest(pkg)
    assert parsed == [pkg] and (pkg / "__pycache__" / "npusim-sources.json").is_file()
    assert jit.memoized_digest(pkg) == first and parsed == [pkg]  # read back, not parsed
    (pkg / "kernels.py").write_text("from .jit import njit\nX = 1\n")
    jit.imports_of.cache_clear()
    second = jit.memoized_digest(pkg)
    assert len(parsed) == 2 and second != first
    (pkg / "cli.py").write_text("from . import kernels\n")  # no kernel source: parsed, same digest
    assert jit.memoized_digest(pkg) == second and len(parsed) == 3


def test_digest_memo_goes_to_the_user_cache_where_the_package_takes_none(tmp_path, monkeypatch):
    pkg = _package(tmp_path, {"__init__.py": "", "jit.py": "", "kernels.py": "from .jit import njit\n"})
    (pkg / "__pycache__").write_text("")  # a file, not a folder: nothing can be written under it
    monkeypatch.setattr(jit, "user_cache_dir", lambda: tmp_path / "user")
    digest = jit.memoized_digest(pkg)
    memo = json.loads((tmp_path / "user" / "sources.json").read_text())
    assert memo["digest"] == digest == jit.digest_of(pkg)
    assert memo["stamp"] == jit.tree_stamp(pkg)


def test_the_command_lines_and_oracles_are_no_kernel_sources():
    names = {str(p.relative_to(jit.PACKAGE)) for p in jit.kernel_sources()}
    assert {"quant.py", "kernels/output_stage.py", "ops/add.py", "kernels/depthwise.py"} <= names
    assert (
        not {"app/cli.py", "runtime/interpreter.py", "testing/oracle.py", "npu/cost.py", "registry.py"}
        & names
    )


def test_stale_directories_are_pruned_unless_held_or_recent(tmp_path):
    """Removed: another digest's directory that nobody holds and nobody used for STALE_AFTER_S.
    Kept: one a running process holds (its shared lock), one used recently, and our own."""
    import fcntl

    now = 1e9
    old = now - 2 * jit.STALE_AFTER_S
    dirs = {}
    for name in ("numba-ours", "numba-stale", "numba-held", "numba-recent"):
        d = dirs[name] = tmp_path / name
        d.mkdir()
        (d / "f.nbi").write_bytes(b"entry")
        (d / jit._LOCK).write_bytes(b"")
        stamp = now - 60 if name == "numba-recent" else old
        for p in (d / jit._LOCK, d):
            os.utime(p, (stamp, stamp))
    fd = os.open(dirs["numba-held"] / jit._LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_SH)  # another worker of those sources, still running
    try:
        removed = jit.prune(tmp_path, "numba-ours", now=now)
    finally:
        os.close(fd)
    assert removed == [dirs["numba-stale"]]
    assert not dirs["numba-stale"].exists()
    assert all(dirs[n].exists() for n in ("numba-ours", "numba-held", "numba-recent"))


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
from npusim.kernels.padding import pad_input
x = np.arange(2 * 3 * 3 * 4, dtype=np.int8).reshape(2, 3, 3, 4)
pad_input(x, 1, 1, np.int8(-5), np.int8(0), np.empty((2, 5, 5, 4), np.int8))
stats = pad_input.serial.stats
print(json.dumps({"hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}))
"""


def test_a_second_process_loads_and_deletes_nothing(tmp_path):
    """Two processes in turn on one cache directory: the first compiles and writes, the second
    loads; files of another digest used recently (another version's workers) are left alone."""
    other = tmp_path / "npusim" / "numba-0123456789abcdef0123" / "kernels"
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
    fresh = tmp_path / "npusim" / f"numba-{jit.sources_digest()}" / "kernels"
    written = sorted(fresh.glob("padding.pad_input-*"))
    assert written, "the first process wrote no cache entry"
    second = run()
    assert second["hits"] >= 1 and second["misses"] == 0, (first, second)
    assert (other / "padding.pad_input-1.py311.nbi").exists()


LINK_CHILD = """
import json
import sys
import numba, numpy as np
from npusim.kernels import jit
from npusim import quant
if sys.argv[1:] == ["another numba"]:
    jit._CR_FIELDS = ()  # as if Numba's CompileResult had other fields: Numba's own load
x = np.arange(-300, 300, dtype=np.int64) * 9973
direct = quant.mbqm_array(x, 1518500250, -3)  # the second process loads it from the cache
library = quant.mbqm_array.overloads[quant.mbqm_array.signatures[0]].library
parsed_before = getattr(library, "_parsed", None) is not None
# A function that no cache holds, calling it: compiling it links the loaded library's module.
caller = numba.njit(lambda x, m, shift: quant.mbqm_array(x, m, shift) + 1)
linked = caller(x, 1518500250, -3) - 1
parsed_after = getattr(library, "_parsed", None) is not None
hits = quant.mbqm_array.stats.cache_hits.get(quant.mbqm_array.signatures[0], 0)
print(json.dumps({"loaded": type(library).__name__, "parsed_before": parsed_before,
                  "parsed_after": parsed_after, "equal": bool((linked == direct).all()), "hits": hits}))
"""


def test_a_loaded_kernel_parses_its_linking_module_only_when_linked(tmp_path):
    """A kernel loaded from the cache leaves its LLVM bitcode unparsed (jit._LoadedLibrary: most of a
    load's time) until a compile links it into a new function, which then computes what it does."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))

    def run(*args):
        done = subprocess.run(
            [sys.executable, "-c", LINK_CHILD, *args], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert first["equal"]
    second = run()
    assert second["hits"] == 1 and second["loaded"] == "_LoadedLibrary", second
    assert not second["parsed_before"] and second["parsed_after"] and second["equal"], second
    other = run("another numba")  # the same entry, loaded as Numba itself does
    assert other["hits"] == 1 and other["loaded"] == "JITCodeLibrary" and other["equal"], other


WARM_CHILD = """
import json, sys
import numpy as np
from npusim import Interpreter
from npusim.kernels import jit
from npusim.testing import oracle as O
# A convolution, and ADD and MUL with a constant of one image's shape (YOLO's box decoding): at one
# image the constant needs no broadcast, at a batch it is copied, and Numba types a read-only array
# apart from a writable one.
const = np.arange(128, dtype=np.int8).reshape(1, 4, 4, 8)
models = [
    O.conv2d_model((1, 4, 4, 8), np.ones((8, 1, 1, 8), np.int8), None, 0.1, 0, 0.01, 0.2, 0),
    *(
        O.binary_model(k, (1, 4, 4, 8), (1, 4, 4, 8), 0.1, 0, 0.1, 0, 0.2, 0, const2=const)
        for k in ("ADD", "MUL")
    ),
]
its = [Interpreter(m, warm=sys.argv[1] == "warm") for m in models]
loads, load = [], jit._FunctionCache.load_overload
jit._FunctionCache.load_overload = lambda self, sig, ctx: loads.append(self._name) or load(self, sig, ctx)
for n in (1, 2048):  # 2048 images reach jit.PARALLEL_MIN_WORK: the threaded kernels
    for it in its:
        it.run(np.zeros((n, 4, 4, 8), np.int8))
print(json.dumps(loads))
"""


def test_the_first_runs_after_prepare_load_no_kernel():
    """Interpreter's warm-up loads the kernels that run() calls, serial and threaded, when it is
    built: its first runs, of one image and of a batch that takes the threaded kernels, load none,
    also where a constant operand is broadcast at a batch and not at one image.
    Built with warm=False, the same runs load them (what the warm-up takes off the first call)."""

    def loads(mode):
        done = subprocess.run(
            [sys.executable, "-c", WARM_CHILD, mode], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert loads("warm") == []
    assert loads("cold") != []


PRELOAD_CHILD = """
import json, sys
import numba, numpy as np
from npusim.kernels import jit
from npusim import quant
x = np.arange(-300, 300, dtype=np.int64) * 9973
key, sig = "npusim.quant:mbqm_array", (numba.typeof(x), numba.int64, numba.int64)
if sys.argv[1] == "compile":
    quant.mbqm_array(x, 1518500250, -3)
    print(json.dumps([[k, str(s)] for k, s in jit.loaded_serial_kernels()]))
else:
    other = (numba.typeof(x.astype(np.int32)), numba.int64, numba.int64)  # never compiled
    loaded = jit.load_serial_kernel(key, sig)
    before_call = len(quant.mbqm_array.overloads)
    y = quant.mbqm_array(x, 1518500250, -3)
    print(json.dumps({"loaded": loaded, "other": jit.load_serial_kernel(key, other),
                      "overloads": before_call, "after_call": len(quant.mbqm_array.overloads),
                      "misses": sum(quant.mbqm_array.stats.cache_misses.values()),
                      "y": int(y.sum())}))
"""


def test_a_serial_kernel_preloads_from_the_cache_and_never_compiles(tmp_path):
    # What the resident server does before it forks for a call (npusim/app/resident.py): load the serial
    # kernels its calls loaded, from the cache only; a signature the cache lacks is left to the call.
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))

    def child(mode):
        done = subprocess.run(
            [sys.executable, "-c", PRELOAD_CHILD, mode], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    assert any(k == "npusim.quant:mbqm_array" for k, _ in child("compile"))  # listed once loaded
    got = child("preload")
    assert got["loaded"] and got["overloads"] == 1 and got["after_call"] == 1  # the call found it loaded
    assert got["other"] is False and got["misses"] == 0  # not compiled for the signature it lacked
    x = np.arange(-300, 300, dtype=np.int64) * 9973
    assert got["y"] == int(npusim.quant.mbqm_array(x, 1518500250, -3).sum())
