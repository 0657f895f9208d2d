"""The layout rules of docs/layout.md, checked on the sources of npusim/, zo/ and experiments/: no
file over 700 lines, no function over 120, no import cycle between modules (imports inside
functions count: a cycle hidden in a function is still a cycle), and the kernels never import the
operators. Static (ast), so nothing is imported or compiled."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("npusim", "zo", "experiments")
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120
MAX_TOP_LEVEL_MODULES = 8  # npusim/'s own modules beside its packages (docs/layout.md)


def _sources() -> dict[str, Path]:
    """module name -> file, for every source file of the packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


SOURCES = _sources()


def _trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in SOURCES.items()}


@pytest.fixture(scope="module")
def trees():
    return _trees()


def test_no_source_file_over_the_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in SOURCES.values()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_the_limit(trees):
    long = {}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # from `def` (a CLI's option decorators aside)
                if n > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _package_of(name: str) -> str:
    return name if SOURCES[name].name == "__init__.py" else name.rpartition(".")[0]


def _imported(name: str, tree: ast.Module) -> set[str]:
    """The modules of the packages that `name` imports, anywhere in its source."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(name).split(".")
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            # `from package import module` imports the module; `from module import name` the module
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in SOURCES:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph(trees) -> dict[str, set[str]]:
    return {name: _imported(name, tree) for name, tree in trees.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle between modules, or None. A package's __init__ importing its own
    submodules is not a cycle by itself; a submodule importing its package's __init__ is an edge
    like any other."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if m.startswith(n + ".") and SOURCES[n].name == "__init__.py":
                continue  # the package re-exporting its own modules
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycles(trees):
    cycle = _cycle(_graph(trees))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    tree = ast.parse("def f():\n    from npusim.npu import report\n")
    assert "npusim.npu.report" in _imported("npusim.npu.cost", tree)


def test_the_kernels_do_not_import_the_operators(trees):
    bad = {
        name: sorted(m for m in _imported(name, tree) if m == "npusim.ops" or m.startswith("npusim.ops."))
        for name, tree in trees.items()
        if name.startswith("npusim.kernels")
    }
    assert not {k: v for k, v in bad.items() if v}, bad


PROFILE_BRANCH = re.compile(
    r"\bprofile\w*\s*[!=]=|[!=]=\s*(TFLM|SINGLE|XNNPACK|ONNXRUNTIME|NEURAL_ART)\b"
    r"|\b(TFLM|SINGLE|XNNPACK|ONNXRUNTIME|NEURAL_ART)\s*[!=]="
)
# Lines allowed to compare a profile outside npusim/profiles/__init__.py: none yet; at most two, each
# named here with why.
PROFILE_BRANCHES_ALLOWED: dict[str, str] = {}


def test_kernels_branch_on_the_profile_fields_not_on_profile_names():
    """A profile is one object (npusim/profiles/__init__.py): code outside it reads its fields (stage,
    bounds, xnnpack_delegate, ort_qlinear, kernels, int16, uint8), never `profile == X`."""
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for name, path in SOURCES.items()
        if name.startswith(("npusim", "zo")) and name != "npusim.profiles"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PROFILE_BRANCH.search(line.split("#")[0])
    ]
    extra = [f for f in found if f.split(":")[0] not in PROFILE_BRANCHES_ALLOWED]
    assert len(PROFILE_BRANCHES_ALLOWED) <= 2 and not extra, f"profile branches: {extra}"


def test_the_profile_branch_check_finds_a_branch():
    assert PROFILE_BRANCH.search("        if profile == XNNPACK:")
    assert PROFILE_BRANCH.search("and self.profile != ONNXRUNTIME")
    assert not PROFILE_BRANCH.search("        if profile_of(profile).xnnpack_delegate:")


def _compiles(name: str, tree: ast.Module) -> bool:
    """Whether a module compiles code: it imports kernels/jit.py, numba or llvmlite."""
    modules = {
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    return "npusim.kernels.jit" in _imported(name, tree) or any(
        m and m.split(".")[0] in ("numba", "llvmlite") for m in modules
    )


def test_no_compiled_code_in_the_operators(trees):
    """ops/ keeps Prepare, OpData and float forms; every Numba and LLVM function is in kernels/
    (whose sources alone key the Numba cache, kernels/jit.py)."""
    compiling = sorted(
        name for name, tree in trees.items() if name.startswith("npusim.ops.") and _compiles(name, tree)
    )
    assert not compiling, f"compiled code in ops/: {compiling}"


def test_the_compiled_code_check_finds_compiled_code():
    assert _compiles("npusim.ops.add", ast.parse("import numba as nb\n"))
    assert _compiles("npusim.ops.add", ast.parse("def f():\n    from llvmlite import ir\n"))
    assert _compiles("npusim.ops.add", ast.parse("from ..kernels.jit import njit\n"))
    assert not _compiles("npusim.ops.add", ast.parse("from ..kernels.elementwise import add_vector\n"))


def test_few_top_level_modules():
    """npusim/'s top level is the core (graph, quant, errors, registry); the rest lives in its packages
    (profiles, kernels, runtime, formats, app, ops, npu, testing). experiments/ keeps make run's module
    only; the bench, the study and the tables are packages."""
    top = sorted(p.name for p in (ROOT / "npusim").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules in npusim/: {top}"
    flat = sorted(p.name for p in (ROOT / "experiments").glob("*.py"))
    assert flat == ["__init__.py", "run_default.py"], flat
