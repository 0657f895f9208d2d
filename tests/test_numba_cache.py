"""npusim's Numba cache (npusim/kernels/jit.py): one directory per digest of the kernels' sources (the
files of npusim/kernels/, where all compiled code lives), so that an edit there (kernels inline code
from other modules, which Numba's own check does not see) starts a fresh cache and an edit elsewhere
(graph.py, an operator, a command line, a test helper) recompiles nothing; a directory of other
sources is pruned only when no process holds it and nobody used it for a day; a read-only package
caches in the user's directory."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import npusim.kernels.fixed_point
import npusim.kernels.rounding
import npusim.quant
from npusim.kernels import jit


def test_the_kernel_sources_are_the_kernels_folder():
    names = {str(p.relative_to(jit.PACKAGE)) for p in jit.kernel_sources()}
    expected = {str(p.relative_to(jit.PACKAGE)) for p in (jit.PACKAGE / "kernels").glob("*.py")}
    assert names == expected and {"kernels/rounding.py", "kernels/output_stage.py"} <= names, names
    assert jit.sources_digest() == jit.digest_of(jit.PACKAGE / "kernels")


def _names_in_compiled_code(folder: Path) -> list[str]:
    """The names imported from outside `folder` (npusim/kernels/) that compiled code can reach: the
    bodies of the functions given to njit, parallel_kernel, intrinsic or renamed (decorated or
    called), their LLVM code generation included, and everything of the folder that those refer to,
    transitively (top-level functions, classes and constants, across the folder's modules).
    Static (ast): nothing is imported."""
    mods = {p.stem: ast.parse(p.read_text()) for p in sorted(folder.glob("*.py"))}
    outside, inside, defs = {}, {}, {}
    for m, tree in mods.items():
        outside[m], inside[m], defs[m] = {}, {}, {}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    local = a.asname or a.name
                    if node.level == 1:  # from .module import name, or from . import module
                        inside[m][local] = (node.module, a.name) if node.module else (a.name, None)
                    elif node.level > 1 or (node.module or "").startswith("npusim"):
                        outside[m][local] = f"{'.' * node.level}{node.module or ''}:{a.name}"
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs[m][node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    defs[m].update((n.id, node) for n in ast.walk(t) if isinstance(n, ast.Name))

    def named(node):
        node = node.func if isinstance(node, ast.Call) else node
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)

    compilers = {"njit", "parallel_kernel", "intrinsic", "renamed", "ParallelKernel"}
    todo = []
    for m, tree in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(named(d) in compilers for d in node.decorator_list):
                todo.append((m, node.name))
            if isinstance(node, ast.Call) and named(node.func) in compilers:
                todo += [
                    (m, a.id)
                    for a in [*node.args, *(k.value for k in node.keywords)]
                    if isinstance(a, ast.Name)
                ]
    seen, found = set(), set()
    while todo:
        m, name = todo.pop()
        if (m, name) in seen:
            continue
        seen.add((m, name))
        if name in outside[m]:
            found.add(f"{m}.py: {outside[m][name]}")
        elif name in inside[m] and inside[m][name][1] is not None:
            todo.append(inside[m][name])
        elif name in defs[m]:
            for n in ast.walk(defs[m][name]):
                if isinstance(n, ast.Name):
                    todo.append((m, n.id))
                elif isinstance(n, ast.Attribute) and getattr(n.value, "id", None) in inside[m]:
                    module, attr = inside[m][n.value.id]
                    if attr is None:  # module.attribute of a module of the folder
                        todo.append((module, n.attr))
    return sorted(found)


def test_compiled_code_uses_nothing_from_outside_the_kernels_folder():
    """Why the digest of kernels/ alone keys the cache: what kernels/ imports from elsewhere (errors,
    graph, profiles, quant) serves the Python code that prepares parameters; no compiled body and
    no LLVM code generation reaches it."""
    assert _names_in_compiled_code(jit.PACKAGE / "kernels") == []


def test_the_compiled_code_check_finds_an_outside_name(tmp_path):
    files = {
        "jit.py": "def njit(*a, **k):\n    return lambda f: f\n",
        "a.py": "from ..quant import X\nfrom .jit import njit\nfrom .b import helper\n\n"
        "@njit()\ndef f():\n    return helper()\n",
        "b.py": "from ..quant import Y\nfrom ..graph import Tensor\n\nZ = Y + 1\n\n"
        "def helper():\n    return Z\n\ndef prepare(t: Tensor):\n    return t\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert _names_in_compiled_code(tmp_path) == ["b.py: ..quant:Y"]  # through helper and Z; not X, Tensor


def _copy_of_the_package(root: Path) -> Path:
    shutil.copytree(jit.PACKAGE, root / "npusim", ignore=shutil.ignore_patterns("__pycache__"))
    return root / "npusim"


CACHE_CHILD = """
import json
import numpy as np
from npusim.kernels import jit
from npusim.kernels.padding import pad_input
x = np.arange(2 * 3 * 3 * 4, dtype=np.int8).reshape(2, 3, 3, 4)
pad_input(x, 1, 1, np.int8(-5), np.int8(0), np.empty((2, 5, 5, 4), np.int8))
stats = pad_input.serial.stats
print(json.dumps({"hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values()),
                  "digest": jit.sources_digest(), "file": jit.__file__}))
"""


def test_an_edit_outside_kernels_reuses_the_cache_and_one_inside_does_not(tmp_path):
    """In a copy of the package: a process compiles a kernel; after edits of graph.py and an
    operator (ops/add.py) the next process loads it from the cache, compiling nothing; after an
    edit of a file of kernels/ (one the kernel does not even import) the next compiles it again."""
    package = _copy_of_the_package(tmp_path / "copy")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(package.parent))

    def run():
        done = subprocess.run(
            [sys.executable, "-c", CACHE_CHILD],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["file"].startswith(str(package)), got  # the copy runs, not the original
        return got

    first = run()
    assert first["misses"] >= 1 and first["digest"] == jit.sources_digest(), first
    for name in ("graph.py", "ops/add.py"):
        with open(package / name, "a") as f:
            f.write("\nEDITED = True  # an edit outside kernels/\n")
    outside = run()
    assert outside["hits"] >= 1 and outside["misses"] == 0 and outside["digest"] == first["digest"], outside
    with open(package / "kernels" / "lookup.py", "a") as f:
        f.write("\n# an edit inside kernels/\n")
    inside = run()
    assert inside["misses"] >= 1 and inside["hits"] == 0 and inside["digest"] != first["digest"], inside


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
    path = _cache_path(npusim.kernels.rounding.requantize_one.py_func)
    assert path == str(jit.PACKAGE / "__pycache__" / f"numba-{jit.sources_digest()}" / "kernels")
    path = _cache_path(npusim.kernels.fixed_point.one_minus_x_over_one_plus_x_for_x_in_0_1.py_func)
    assert path == str(jit.PACKAGE / "__pycache__" / f"numba-{jit.sources_digest()}" / "kernels")


def test_read_only_package_caches_in_the_user_directory(tmp_path, monkeypatch):
    # As root, permissions do not stop a write: a package root below a plain file cannot be created.
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(jit.config, "CACHE_DIR", "")
    monkeypatch.setattr(jit._PackageLocator, "root", classmethod(lambda cls: tmp_path / "file" / "pycache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    path = _cache_path(npusim.kernels.rounding.requantize_one.py_func)
    assert path.startswith(str(tmp_path / "user" / "npusim" / f"numba-{jit.sources_digest()}"))


def test_numba_cache_dir_takes_precedence(tmp_path, monkeypatch):
    monkeypatch.setattr(jit.config, "CACHE_DIR", str(tmp_path))
    assert _cache_path(npusim.kernels.rounding.requantize_one.py_func).startswith(
        str(tmp_path / "npusim" / "numba-")
    )


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
key, sig = "npusim.kernels.rounding:mbqm_array", (numba.typeof(x), numba.int64, numba.int64)
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

    assert any(k == "npusim.kernels.rounding:mbqm_array" for k, _ in child("compile"))  # listed once loaded
    got = child("preload")
    assert got["loaded"] and got["overloads"] == 1 and got["after_call"] == 1  # the call found it loaded
    assert got["other"] is False and got["misses"] == 0  # not compiled for the signature it lacked
    x = np.arange(-300, 300, dtype=np.int64) * 9973
    assert got["y"] == int(npusim.quant.mbqm_array(x, 1518500250, -3).sum())
