"""Where do two numerics part? Per-op differences between two runs of one model on one batch.

Either two rounding profiles of the simulator (tflm against xnnpack, ...) or the simulator against a
directory of reference tensors, one .npy per tensor, as `npusim run --dump` writes them
(<index>_<name>.npy, see cli.tensor_file_name) or named <name>.npy with the name sanitised the same
way (what a script dumping TFLM's preserved intermediates would write).

Differences are reported per op output in execution order: how many elements differ, the largest
absolute difference in LSB of the tensor and in real units (scale * LSB), and the first op where
the two part, then a summary per graph output (every output of the model). For two profiles, an
"isolated" count also feeds B's kernel with A's inputs, which tells an op that rounds differently
itself from one that only inherits a difference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import NpusimError
from ..formats.model_io import load_model
from ..graph import Graph
from ..runtime.interpreter import Interpreter
from .display import shown


def sanitize_name(name: str) -> str:
    """The file-name form of a tensor name, as cli.tensor_file_name writes it (without the index)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:80]


def array_difference(a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    """(number of differing elements, largest absolute difference) of two same-shape arrays.
    Integers are compared exactly in int64, floats in float64 (NaN against NaN counts as equal)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        d = np.abs(a.astype(np.int64) - b.astype(np.int64))
        return int(np.count_nonzero(d)), float(d.max(initial=0))
    fa, fb = a.astype(np.float64), b.astype(np.float64)
    same = (fa == fb) | (np.isnan(fa) & np.isnan(fb))
    d = np.where(same, 0.0, np.abs(fa - fb))
    d = np.where(np.isnan(d), np.inf, d)
    return int(np.count_nonzero(~same)), float(d.max(initial=0.0))


@dataclass
class TensorDiff:
    position: int  # execution position of the producing op, -1 for a graph input
    op_index: int | None  # op index in the file, None for a graph input
    kind: str  # op kind, or "input"
    tensor: int
    name: str
    elements: int
    mismatches: int | None = None  # None: nothing to compare against
    max_lsb: float | None = None  # largest |difference| in the tensor's integer steps (quantized tensors)
    max_real: float | None = None  # scale * LSB, or the raw difference of float tensors
    isolated: int | None = None  # mismatches when B's op is fed A's inputs (profile comparisons)
    note: str = ""

    @property
    def differs(self) -> bool:
        return bool(self.mismatches)


@dataclass
class Comparison:
    label_a: str
    label_b: str
    batch: int
    rows: list  # list[TensorDiff] in execution order
    ignored_files: list = field(default_factory=list)  # reference files that match no tensor
    outputs: list = field(default_factory=list)  # graph output tensor indices, in the graph's order

    @property
    def output_rows(self) -> list:
        """(k, TensorDiff or None) for every graph output k: its row in `rows`."""
        by_tensor = {r.tensor: r for r in self.rows}
        return [(k, by_tensor.get(t)) for k, t in enumerate(self.outputs)]

    @property
    def first(self) -> TensorDiff | None:
        return next((r for r in self.rows if r.differs), None)

    @property
    def compared(self) -> int:
        return sum(1 for r in self.rows if r.mismatches is not None)


def _tensor_diff(row: TensorDiff, tensor, a: np.ndarray, b: np.ndarray) -> TensorDiff:
    a, b = np.asarray(a), np.asarray(b)
    notes = []
    if a.dtype != b.dtype:
        notes.append(f"dtype {b.dtype.name} against {a.dtype.name}")
    count, largest = array_difference(a, b)
    row.mismatches = count
    if a.dtype.kind in "iu":
        row.max_lsb = largest
        row.max_real = largest * tensor.scale if tensor.quant is not None else None
    else:
        row.max_real = largest
    row.note = "; ".join(notes)
    return row


def _rows(interp: Interpreter) -> list:
    """(position, op_index, kind, tensor) of every graph input and op output, in execution order."""
    out = [(-1, None, "input", t) for t in interp.graph.inputs]
    for pos, k in enumerate(interp.kernels):
        out += [(pos, k.op.index, k.op.kind, t) for t in k.op.outputs]
    return out


def _elements(values: dict, t: int, tensor) -> int:
    if t in values:
        return int(np.asarray(values[t]).size)
    return int(np.prod(tensor.shape, dtype=np.int64))


def compare_profiles(model, x: np.ndarray, a: str = "tflm", b: str = "xnnpack", n6=None) -> Comparison:
    """Run the model under profiles a and b on x and diff every op output. n6: the N6Options of
    --profile neural-art both sides share (default: their defaults); a side given as a spec,
    "neural-art:rounding=truncate", has its own over them (parse_profile_spec)."""
    from ..npu.neural_art_run import profile_object

    graph = model if isinstance(model, Graph) else load_model(model)
    ia, ib = (Interpreter(graph, profile=profile_object(p, n6), warm=False) for p in (a, b))  # one run each
    va, vb = ia.run_all(x), ib.run_all(x)
    tensors = ia.graph.tensors
    rows = []
    for pos, op_index, kind, t in _rows(ia):
        row = TensorDiff(pos, op_index, kind, t, tensors[t].name, _elements(va, t, tensors[t]))
        _tensor_diff(row, tensors[t], va[t], vb[t])
        if pos >= 0:
            kernel = ib.kernels[pos]
            local = {i: va[i] for i in kernel.op.inputs if i in va}
            ib.evaluate(local, kernels=[kernel])
            row.isolated = array_difference(va[t], local[t])[0]
        rows.append(row)
    return Comparison(a, b, int(x.shape[0]), rows, outputs=list(graph.outputs))


def reference_files(directory: Path, graph) -> tuple[dict, list]:
    """Map reference .npy files to tensor indices: <index>_<name>.npy when the index exists and its
    sanitised name agrees, else <name>.npy when exactly one activation tensor has that sanitised name.
    Returns ({tensor index: path}, [ignored file names])."""
    if not directory.is_dir():
        raise NpusimError(f"--reference {directory}: not a directory")
    by_name: dict = {}
    for i, t in enumerate(graph.tensors):
        if not t.is_constant:  # only activations are compared; a bias may share a truncated name
            by_name.setdefault(sanitize_name(t.name), []).append(i)
    found: dict = {}
    ignored = []
    for path in sorted(directory.glob("*.npy")):
        stem = path.name[:-4]
        index = None
        m = re.match(r"^(\d+)_(.*)$", stem)
        if (
            m
            and int(m.group(1)) < len(graph.tensors)
            and sanitize_name(graph.tensors[int(m.group(1))].name) == m.group(2)
        ):
            index = int(m.group(1))
        elif len(by_name.get(stem, [])) == 1:
            index = by_name[stem][0]
        if index is None or index in found:
            ignored.append(path.name)
            continue
        found[index] = path
    return found, ignored


def compare_reference(model, x: np.ndarray, directory, profile: str = "tflm", n6=None) -> Comparison:
    """Run the model under `profile` (a name or a neural-art spec, with n6: its N6Options) on x and
    diff every op output against the reference files."""
    directory = Path(directory)
    from ..npu.neural_art_run import profile_object

    interp = Interpreter(model, profile=profile_object(profile, n6), warm=False)  # one run
    files, ignored = reference_files(directory, interp.graph)
    if not files:
        raise NpusimError(
            f"--reference {directory}: no .npy file matches a tensor of the model "
            f"(expected <index>_<name>.npy as --dump writes, or <name>.npy)"
        )
    values = interp.run_all(x)
    tensors = interp.graph.tensors
    rows = []
    for pos, op_index, kind, t in _rows(interp):
        row = TensorDiff(pos, op_index, kind, t, tensors[t].name, _elements(values, t, tensors[t]))
        if t in files:
            try:
                ref = np.load(files[t], allow_pickle=False)
            except (OSError, ValueError, EOFError) as e:
                raise NpusimError(
                    f"--reference {files[t]}: cannot read as .npy "
                    f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                ) from None
            if not isinstance(ref, np.ndarray) or ref.dtype.kind not in "iubf":
                raise NpusimError(f"--reference {files[t]}: expected a numeric .npy array")
            if values[t].shape[0] == 1 and ref.shape == values[t].shape[1:]:
                ref = ref[None]  # one image without its batch axis, as TFLM's tensors hold it
            if ref.shape != values[t].shape:  # another batch or another model: no diff would mean anything
                raise NpusimError(
                    f"--reference {files[t]}: shape {list(ref.shape)}, this run's tensor {t} "
                    f"({tensors[t].name!r}) is {list(values[t].shape)}: expected the dump of the same "
                    "model on the same --input"
                )
            _tensor_diff(row, tensors[t], values[t], ref)
        else:
            row.note = "no reference file"
        rows.append(row)
    return Comparison(
        f"npusim ({profile})",
        f"reference {directory}",
        int(x.shape[0]),
        rows,
        ignored_files=ignored,
        outputs=list(interp.graph.outputs),
    )


def _fmt(v: float | None, digits: int = 4) -> str:
    if v is None:
        return "-"
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.{digits}g}"


def _size_text(r: TensorDiff) -> str:
    if r.max_lsb is not None:
        return f"up to {_fmt(r.max_lsb)} LSB ({_fmt(r.max_real)} real)"
    return f"up to {_fmt(r.max_real)}"


def format_outputs(c: Comparison, name_width: int = 40) -> list:
    """One line per graph output: whether A and B differ there, and by how much."""
    if not c.outputs:
        return []
    rows = c.output_rows
    differ = sum(1 for _, r in rows if r is not None and r.differs)
    compared = sum(1 for _, r in rows if r is not None and r.mismatches is not None)
    lines = [f"graph outputs: {differ} of {len(rows)} differ ({compared} compared)"]
    for k, r in rows:
        if r is None:  # an output that is no activation of the run (not expected in practice)
            lines.append(f"  output {k}: tensor {c.outputs[k]}, not compared")
            continue
        name = r.name if len(r.name) <= name_width else r.name[: name_width - 3] + "..."
        where = "graph input" if r.op_index is None else f"op {r.op_index} ({r.kind})"
        head = f"  output {k}: tensor {r.tensor} {name!r} from {where}: "
        if r.mismatches is None:
            lines.append(head + (r.note or "not compared"))
        elif r.differs:
            note = f"; {r.note}" if r.note else ""
            lines.append(head + f"{r.mismatches:,} of {r.elements:,} elements differ, {_size_text(r)}{note}")
        else:
            lines.append(head + "no difference")
    return lines


def format_comparison(c: Comparison, name_width: int = 40) -> str:
    iso = any(r.isolated is not None for r in c.rows)
    head = (
        ["#", "op", "tensor", "elements", "differ"]
        + (["isolated"] if iso else [])
        + ["max LSB", "max real", "note"]
    )
    rows = [tuple(head)]
    for r in c.rows:
        name = shown(r.name if len(r.name) <= name_width else r.name[: name_width - 3] + "...")
        cells = [
            "-" if r.op_index is None else str(r.op_index),
            r.kind,
            f"{r.tensor} {name}",
            f"{r.elements:,}",
            "-" if r.mismatches is None else f"{r.mismatches:,}",
        ]
        if iso:
            cells.append("-" if r.isolated is None else f"{r.isolated:,}")
        cells += [_fmt(r.max_lsb), _fmt(r.max_real), r.note]
        rows.append(tuple(cells))
    right = {0, 3, 4, 5, 6} | ({7} if iso else set())
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"A = {c.label_a}, B = {c.label_b}, batch of {c.batch}"]
    lines += [
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]
    differing = [r for r in c.rows if r.differs]
    f = c.first
    if f is None:
        lines.append(f"no difference: A and B agree on all {c.compared} compared tensors")
    else:
        where = "graph input" if f.op_index is None else f"op {f.op_index} ({f.kind})"
        size = _size_text(f)
        name = f.name if len(f.name) <= 80 else f.name[:77] + "..."
        lines.append(
            f"first difference: {where}, tensor {f.tensor} {name!r}: {f.mismatches:,} of {f.elements:,} "
            f"elements differ, {size}{'; ' + f.note if f.note else ''}"
        )
        lines.append(f"{len(differing)} of {c.compared} compared tensors differ")
    lines += format_outputs(c, name_width)
    if c.ignored_files:
        ignored = ", ".join(c.ignored_files[:5]) + (", ..." if len(c.ignored_files) > 5 else "")
        lines.append(
            f"ignored {len(c.ignored_files)} reference file(s) that match no tensor (or several): {ignored}"
        )
    return "\n".join(lines)
