"""Golden vectors: record what a model computes on a batch, check later that it still does.

A golden file is an .npz written with np.savez_compressed and read with allow_pickle=False:

    meta        uint8 array: UTF-8 JSON (format, versions, model SHA-256, profile, tensor list, the
                number of graph outputs and their tensor indices in "output_tensors"; files
                written before that key was added still check)
    input_<k>   the k-th graph input, the whole batch
    output_<k>  the k-th graph output, for every output of the graph (k = 0, 1, ...)
    tensor_<i>  the value of activation tensor i, stored when it is at most `store_limit` bytes
                (and the running total allows); larger tensors keep only their hash

Every activation tensor (graph inputs and every op output, in execution order) has a hash in the
metadata: SHA-256 over dtype.str, b"|", the shape as comma-separated decimals, b"|", then the
C-order bytes of the whole batch (tensor_hash). A check re-runs the model with the recorded profile
on the recorded input and walks the tensors in execution order; the first tensor whose hash or
stored value differs names the first diverging op. Stored values give the count of mismatching
elements and the largest difference; for a hash-only tensor the op is still named. Every graph
output is checked against its output_<k> and its hash, and the result says which outputs differ.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import NpusimError
from ..formats.model_io import load_model
from ..profiles import PROFILES
from ..runtime.interpreter import Interpreter, check_int8
from ..runtime.uint8 import UINT8_PROFILE
from .atomic import WriteFailed, replacing
from .compare import array_difference

FORMAT = "npusim-golden"
FORMAT_VERSION = 1
DEFAULT_STORE_LIMIT = 1 << 20  # bytes per tensor (whole batch) stored in full
DEFAULT_STORE_TOTAL = 64 << 20  # bytes of stored intermediates per file, before compression
# What a golden file may hold once decompressed, all members together (its input batch, outputs and
# stored tensors): checked from the zip's and the arrays' headers before anything is decompressed.
MAX_GOLDEN_BYTES = 1 << 30
MAX_META_BYTES = 64 << 20


def tensor_hash(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    h = hashlib.sha256()
    h.update(a.dtype.str.encode("ascii"))
    h.update(b"|" + ",".join(str(d) for d in a.shape).encode("ascii") + b"|")
    h.update(a.tobytes())
    return h.hexdigest()


def file_sha256(path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise NpusimError(f"{path}: cannot read model file ({e.strerror})") from None
    return h.hexdigest()


def _execution_tensors(interp: Interpreter) -> list:
    """(tensor index, op index or None, op kind or None) for graph inputs then op outputs,
    in execution order."""
    out = [(t, None, None) for t in interp.graph.inputs]
    for k in interp.kernels:
        out += [(t, k.op.index, k.op.kind) for t in k.op.outputs]
    return out


# ----------------------------------------------------------------------------------------------
# Record


def record(
    model_path,
    x: np.ndarray,
    out_path,
    profile: str = "tflm",
    store_limit: int = DEFAULT_STORE_LIMIT,
    store_total: int = DEFAULT_STORE_TOTAL,
) -> dict:
    """Run the model on x and write the golden file; returns its metadata."""
    if store_limit < 0 or store_total < 0:
        raise NpusimError("--store-limit must not be negative")
    graph = load_model(model_path)
    if len(graph.inputs) != 1:
        raise NpusimError(
            f"{model_path}: the model has {len(graph.inputs)} inputs; golden vectors support one"
        )
    from ..npu.neural_art_run import profile_object  # neural-art: its default --n6-* options

    interp = Interpreter(graph, profile=profile_object(profile), warm=False)  # one run
    graph = interp.graph  # a uint8 model's is shifted to int8 (npusim/runtime/uint8.py), with its tensors
    values = interp.run_all(x)
    arrays: dict = {"input_0": np.ascontiguousarray(values[graph.inputs[0]])}
    for k, t in enumerate(graph.outputs):
        arrays[f"output_{k}"] = np.ascontiguousarray(values[t])
    entries, total = [], 0
    for t, op_index, kind in _execution_tensors(interp):
        v = np.ascontiguousarray(values[t])
        stored = v.nbytes <= store_limit and total + v.nbytes <= store_total
        if stored:
            arrays[f"tensor_{t}"] = v
            total += v.nbytes
        entries.append(
            {
                "index": t,
                "name": graph.tensors[t].name,
                "op": op_index,
                "kind": kind,
                "dtype": v.dtype.str,
                "shape": list(v.shape),
                "sha256": tensor_hash(v),
                "stored": stored,
            }
        )
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "npusim_version": __version__,
        "model_sha256": file_sha256(model_path),
        "model_name": Path(model_path).name,
        "profile": profile,
        "batch": int(values[graph.inputs[0]].shape[0]),
        "inputs": 1,
        "outputs": len(graph.outputs),
        "output_tensors": [int(t) for t in graph.outputs],
        "store_limit": store_limit,
        "tensors": entries,
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    # Written under a temporary name, checked and renamed: an interrupted or failed write never leaves
    # half a golden, and the previous one stays (npusim/app/atomic.py).
    try:
        with replacing(out_path) as f:
            np.savez_compressed(f, **arrays)
    except WriteFailed as e:
        raise NpusimError(f"cannot write golden file {out_path}: {e.strerror}") from None
    return meta


GOLDEN_SUFFIX = ".golden.npz"
MODEL_SUFFIXES = (".tflite", ".onnx")


def pairs_in_directory(directory) -> list:
    """(model or None, golden, problem or None) for every NAME.golden.npz under directory, subfolders
    included, in path order; its model is NAME.tflite or NAME.onnx beside it, the layout of
    docs/golden.md. A golden with no model, or with both, has a problem instead of a model."""
    directory = Path(directory)
    goldens = sorted(p for p in directory.rglob("*" + GOLDEN_SUFFIX) if p.is_file())
    if not goldens:
        raise NpusimError(f"{directory}: no *{GOLDEN_SUFFIX} golden file in the directory or below")
    out = []
    for g in goldens:
        stem = g.name[: -len(GOLDEN_SUFFIX)]
        models = [g.with_name(stem + s) for s in MODEL_SUFFIXES if g.with_name(stem + s).is_file()]
        if len(models) == 1:
            out.append((models[0], g, None))
        else:
            names = " or ".join(stem + s for s in MODEL_SUFFIXES)
            why = f"no model beside it, expected {names}" if not models else f"both {names} beside it"
            out.append((None, g, f"{g}: {why}; name the pair: golden check MODEL {g}"))
    return out


# ----------------------------------------------------------------------------------------------
# Load (every defect of the file is one NpusimError)


@dataclass
class Golden:
    meta: dict
    inputs: list  # list[np.ndarray]
    outputs: list  # list[np.ndarray]
    values: dict  # {tensor index: np.ndarray} of the stored intermediates


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TYPE_WORDS = {int: "an integer", str: "a string", list: "a list", bool: "a boolean", dict: "an object"}


def _require(cond: bool, what: str):
    if not cond:
        raise NpusimError(what)


def _check_meta(meta, where: str) -> dict:
    bad = f"{where}: damaged golden file:"
    _require(isinstance(meta, dict), f"{bad} metadata is not a JSON object")
    _require(
        meta.get("format") == FORMAT,
        f"{where}: not an npusim golden file (format {meta.get('format')!r}, expected {FORMAT!r})",
    )
    v = meta.get("format_version")
    _require(
        isinstance(v, int) and not isinstance(v, bool), f"{bad} format_version missing or not an integer"
    )
    _require(
        v <= FORMAT_VERSION,
        f"{where}: golden format version {v} is newer than this npusim reads ({FORMAT_VERSION})",
    )
    for key, typ in (
        ("npusim_version", str),
        ("model_sha256", str),
        ("model_name", str),
        ("profile", str),
        ("batch", int),
        ("inputs", int),
        ("outputs", int),
        ("tensors", list),
    ):
        _require(key in meta, f"{bad} metadata key {key!r} is missing")
        _require(
            isinstance(meta[key], typ) and not isinstance(meta[key], bool),
            f"{bad} metadata key {key!r} is not {_TYPE_WORDS[typ]}",
        )
    _require(bool(_HEX64.match(meta["model_sha256"])), f"{bad} model_sha256 is not a SHA-256 hex digest")
    _require(meta["profile"] in PROFILES, f"{bad} unknown profile {meta['profile']!r}")
    _require(meta["inputs"] == 1 and meta["outputs"] >= 1, f"{bad} expected 1 input and at least 1 output")
    if "output_tensors" in meta:  # absent from files written before it was recorded
        ot = meta["output_tensors"]
        _require(
            isinstance(ot, list)
            and len(ot) == meta["outputs"]
            and all(isinstance(t, int) and not isinstance(t, bool) for t in ot),
            f"{bad} output_tensors is not a list of {meta['outputs']} tensor indices",
        )
    seen = set()
    for e in meta["tensors"]:
        _require(isinstance(e, dict), f"{bad} a tensor entry is not an object")
        for key, typ in (
            ("index", int),
            ("name", str),
            ("dtype", str),
            ("shape", list),
            ("sha256", str),
            ("stored", bool),
        ):
            _require(
                isinstance(e.get(key), typ) and (typ is bool or not isinstance(e.get(key), bool)),
                f"{bad} tensor entry {e.get('index')!r}: key {key!r} missing or not {_TYPE_WORDS[typ]}",
            )
        _require(
            e.get("op") is None or (isinstance(e["op"], int) and not isinstance(e["op"], bool)),
            f"{bad} tensor {e['index']}: op is not an integer",
        )
        _require(
            e.get("kind") is None or isinstance(e["kind"], str),
            f"{bad} tensor {e['index']}: kind is not a string",
        )
        _require(bool(_HEX64.match(e["sha256"])), f"{bad} tensor {e['index']}: sha256 is not a hex digest")
        _require(e["index"] not in seen, f"{bad} tensor {e['index']} is listed twice")
        seen.add(e["index"])
    _require(bool(meta["tensors"]), f"{bad} no tensors recorded")
    return meta


def _numeric(a, key: str, where: str) -> np.ndarray:
    _require(
        isinstance(a, np.ndarray) and a.dtype.kind in "iubf",
        f"{where}: damaged golden file: {key} is not a numeric array",
    )
    return a


def _check_sizes(path, where: str) -> None:
    """Refuse a golden file that would decompress to more than MAX_GOLDEN_BYTES, read from the zip's
    member headers and each array's .npy header (numpy allocates what the header says before it reads
    the data), before any member is decompressed. Not a zip: left to np.load to say what it is."""
    import zipfile

    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return
    bad = f"{where}: damaged golden file:"
    with archive:
        members = archive.infolist()
        total = sum(m.file_size for m in members)
        _require(
            total <= MAX_GOLDEN_BYTES,
            f"{where}: golden file would decompress to {total:,} bytes, more than {MAX_GOLDEN_BYTES:,}",
        )
        for m in members:
            if not m.filename.endswith(".npy"):
                continue
            try:
                with archive.open(m) as f:
                    version = np.lib.format.read_magic(f)
                    read = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read(f)
            except Exception:  # whatever the damaged header leads to
                raise NpusimError(f"{bad} the header of {m.filename} cannot be read") from None
            _require(not dtype.hasobject, f"{bad} {m.filename} holds Python objects")
            size = int(np.prod(shape, dtype=object)) * dtype.itemsize
            _require(
                size <= m.file_size,
                f"{bad} {m.filename} says {size:,} bytes of data, its member holds {m.file_size:,}",
            )


def load_golden(path) -> Golden:
    where = str(path)
    if Path(path).exists():
        _check_sizes(path, where)
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise NpusimError(f"{where}: no such golden file") from None
    except Exception as e:  # zipfile, zlib and numpy raise whatever the damaged bytes lead to
        raise NpusimError(
            f"{where}: damaged or foreign golden file, not a readable .npz ({type(e).__name__})"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise NpusimError(f"{where}: not a golden file (a single .npy array, expected an .npz archive)")
    try:
        with archive:
            keys = set(archive.files)
            _require("meta" in keys, f"{where}: damaged or foreign golden file: no 'meta' entry")
            raw = archive["meta"]
            _require(
                isinstance(raw, np.ndarray)
                and (raw.dtype == np.uint8 and raw.ndim == 1 or raw.dtype.kind == "U" and raw.ndim == 0),
                f"{where}: damaged golden file: 'meta' is not a uint8 or str array",
            )
            text = raw.tobytes().decode("utf-8") if raw.dtype == np.uint8 else str(raw[()])
            try:
                meta = json.loads(text)
            except ValueError:
                raise NpusimError(f"{where}: damaged golden file: 'meta' is not valid JSON") from None
            meta = _check_meta(meta, where)
            needed = (
                ["input_0"]
                + [f"output_{k}" for k in range(meta["outputs"])]
                + [f"tensor_{e['index']}" for e in meta["tensors"] if e["stored"]]
            )
            missing = [k for k in needed if k not in keys]
            _require(
                not missing,
                f"{where}: damaged golden file: missing "
                f"entr{'y' if len(missing) == 1 else 'ies'} {', '.join(missing[:5])}",
            )
            inputs = [_numeric(archive["input_0"], "input_0", where)]
            outputs = [_numeric(archive[f"output_{k}"], f"output_{k}", where) for k in range(meta["outputs"])]
            values = {
                e["index"]: _numeric(archive[f"tensor_{e['index']}"], f"tensor_{e['index']}", where)
                for e in meta["tensors"]
                if e["stored"]
            }
    except NpusimError:
        raise
    except Exception as e:  # a truncated or corrupted member shows up only when it is read
        raise NpusimError(
            f"{where}: damaged golden file, an entry cannot be read ({type(e).__name__})"
        ) from None
    _require(
        inputs[0].ndim >= 1 and inputs[0].shape[0] == meta["batch"],
        f"{where}: damaged golden file: input batch does not match the metadata",
    )
    _check_stored_hashes(meta, inputs, outputs, values, where)
    return Golden(meta=meta, inputs=inputs, outputs=outputs, values=values)


def _check_stored_hashes(meta: dict, inputs: list, outputs: list, values: dict, where: str) -> None:
    """Every stored array must be what its own entry records (type, shape, hash): a file whose values
    disagree with its hashes is damaged, whatever the model computes (it was not a divergence of the
    model's that made it so). The input is checked where its tensor is known (check())."""
    entries = {e["index"]: e for e in meta["tensors"]}
    stored = [(f"tensor_{t}", entries[t], v) for t, v in values.items()]
    for k, t in enumerate(meta.get("output_tensors", [])):
        if t in entries:
            stored.append((f"output_{k}", entries[t], outputs[k]))
    for key, e, v in stored:
        _require(
            tensor_hash(np.ascontiguousarray(v)) == e["sha256"],
            f"{where}: damaged golden file: the stored {key} does not match its recorded hash",
        )


# ----------------------------------------------------------------------------------------------
# Check


@dataclass
class Mismatch:
    op_index: int | None  # None: a graph input
    kind: str | None
    tensor: int
    name: str
    elements: int
    count: int | None  # mismatching elements, None when only the hash was recorded
    max_diff: float | None  # largest |difference| (LSB for integer tensors)
    integer: bool
    reason: str = ""


@dataclass
class OutputStatus:
    index: int  # k of output_<k>, the graph's output order
    tensor: int
    name: str
    mismatch: Mismatch | None  # None: the output matches the golden


def _diff_text(f: Mismatch) -> str:
    if f.count is None:
        return "values differ from the recorded hash"
    unit = " LSB" if f.integer else ""
    diff = (
        "-"
        if f.max_diff is None
        else (f"{int(f.max_diff)}" if float(f.max_diff).is_integer() else f"{f.max_diff:.6g}")
    )
    return f"{f.count:,} of {f.elements:,} elements differ, largest difference {diff}{unit}"


@dataclass
class CheckResult:
    meta: dict
    checked: int  # tensors compared
    mismatches: list  # list[Mismatch] in execution order
    outputs: list = field(default_factory=list)  # list[OutputStatus], one per graph output

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def differing_outputs(self) -> list:
        return [o for o in self.outputs if o.mismatch is not None]

    def outputs_text(self) -> str:
        """Which graph outputs differ, e.g. 'output 1 (tensor 5 'head1'): 3 of 64 elements differ,
        ...; output 0 matches'."""
        n = len(self.outputs)
        bad = self.differing_outputs
        if not bad:
            return f"{'the output matches' if n == 1 else f'all {n} outputs match'} the golden"
        parts = []
        for o in bad:
            name = o.name if len(o.name) <= 40 else o.name[:37] + "..."
            parts.append(f"output {o.index} (tensor {o.tensor} {name!r}): {_diff_text(o.mismatch)}")
        good = [str(o.index) for o in self.outputs if o.mismatch is None]
        text = f"{len(bad)} of {n} graph output(s) differ: " + "; ".join(parts)
        if good:
            many = len(good) > 1
            text += f"; output{'s' if many else ''} {', '.join(good)} match{'' if many else 'es'}"
        return text

    def message(self) -> str:
        m = self.meta
        what = (
            f"{m['model_name']}, profile {m['profile']}, batch {m['batch']}, "
            f"recorded with npusim {m['npusim_version']}"
        )
        n = len(self.outputs)
        if self.ok:
            outs = f", including {'the output' if n == 1 else f'all {n} outputs'}" if n else ""
            return f"OK: {self.checked} tensors match the golden{outs} ({what})"
        f = self.mismatches[0]
        where = "the graph input" if f.op_index is None else f"op {f.op_index} ({f.kind})"
        if f.count is None:
            detail = f"{_diff_text(f)}; {f.reason}"
        else:
            detail = _diff_text(f)
            if f.reason:
                detail += f" ({f.reason})"
        later = len(self.mismatches) - 1
        name = f.name if len(f.name) <= 60 else f.name[:57] + "..."
        outs = f"; {self.outputs_text()}" if self.outputs else ""
        return (
            f"MISMATCH: first diverging op (execution order): {where}, output tensor {f.tensor} {name!r}: "
            f"{detail}{f'; {later} later tensor(s) also differ' if later else ''}{outs} ({what})"
        )


def check(model_path, golden_path) -> CheckResult:
    """Re-run the model on the golden's input and compare. Raises NpusimError (exit 2) for a damaged
    or foreign golden file or a model other than the recorded one; mismatches are in the result."""
    graph = load_model(model_path)  # first: a folder, a float or a foreign file says what it is
    check_int8(graph, UINT8_PROFILE)  # a uint8 model: the recorded profile decides, below
    golden = load_golden(golden_path)
    meta = golden.meta
    check_int8(graph, str(meta["profile"]))
    sha = file_sha256(model_path)
    if sha != meta["model_sha256"]:
        raise NpusimError(
            f"{model_path} (sha256 {sha[:12]}...) is not the model {golden_path} was recorded for "
            f"({meta['model_name']}, sha256 {meta['model_sha256'][:12]}...)"
        )
    _require(
        meta["outputs"] == len(graph.outputs),
        f"{golden_path}: damaged golden file: {meta['outputs']} output(s) recorded, "
        f"the model has {len(graph.outputs)}",
    )
    _require(
        meta.get("output_tensors", list(graph.outputs)) == list(graph.outputs),
        f"{golden_path}: damaged golden file: output_tensors {meta.get('output_tensors')} "
        f"are not the model's outputs {list(graph.outputs)}",
    )
    from ..npu.neural_art_run import profile_object

    interp = Interpreter(graph, profile=profile_object(meta["profile"]), warm=False)  # one run
    graph = interp.graph  # a uint8 model's is shifted to int8 (npusim/runtime/uint8.py), as record() saw it
    entries = {e["index"]: e for e in meta["tensors"]}
    produced = _execution_tensors(interp)
    extra = sorted(set(entries) - {t for t, _, _ in produced})
    _require(
        not extra,
        f"{golden_path}: damaged golden file: tensor "
        f"{extra[0] if extra else ''} is not an activation of the model",
    )
    # A golden records every activation (record()): a shorter list is a cut one, never a pass.
    absent = [t for t, _, _ in produced if t not in entries]
    _require(
        not absent,
        f"{golden_path}: damaged golden file: {len(entries)} tensors recorded, the model has "
        f"{len(produced)} activations (tensor {absent[0] if absent else ''} is not listed)",
    )
    x = golden.inputs[0]
    t_in = graph.inputs[0]
    if t_in in entries and tensor_hash(np.ascontiguousarray(x)) != entries[t_in]["sha256"]:
        raise NpusimError(
            f"{golden_path}: damaged golden file: the stored input does not match its recorded hash"
        )
    values = interp.run_all(x)
    references = {t: [v] for t, v in golden.values.items()}
    for k, t in enumerate(graph.outputs):
        references.setdefault(t, []).append(golden.outputs[k])
    mismatches, checked = [], 0
    for t, op_index, kind in produced:
        if t not in entries:
            continue
        checked += 1
        v = np.ascontiguousarray(values[t])
        e = entries[t]
        hash_ok = tensor_hash(v) == e["sha256"]
        bad_refs = []
        for ref in references.get(t, []):
            if ref.shape != v.shape:
                bad_refs.append((v.size, None, f"stored shape {list(ref.shape)}, computed {list(v.shape)}"))
                continue
            count, largest = array_difference(v, ref)
            if count:
                bad_refs.append((count, largest, ""))
        if hash_ok and not bad_refs:
            continue
        _require(
            not (hash_ok and bad_refs),  # a stored array the file's own hash disowns (an older file)
            f"{golden_path}: damaged golden file: the stored values of tensor {t} disagree with its "
            "recorded hash, which the run matches",
        )
        integer = v.dtype.kind in "iub"
        if bad_refs:
            count, largest, reason = max(bad_refs, key=lambda r: r[0])
        else:
            count, largest = None, None
            if v.dtype.str != e["dtype"] or list(v.shape) != e["shape"]:
                reason = f"recorded {e['dtype']} {e['shape']}, computed {v.dtype.str} {list(v.shape)}"
            elif references.get(t):
                reason = "the stored values match the run but not the recorded hash"
            else:
                reason = "values not stored (over the store limit), only the hash was recorded"
        mismatches.append(
            Mismatch(op_index, kind, t, graph.tensors[t].name, int(v.size), count, largest, integer, reason)
        )
    by_tensor = {m.tensor: m for m in mismatches}
    outputs = []
    for k, t in enumerate(graph.outputs):
        m = by_tensor.get(t)
        if (
            m is None and t not in entries and t in values
        ):  # an output that is no activation (not hashed): values only
            v, ref = np.ascontiguousarray(values[t]), golden.outputs[k]
            same_shape = ref.shape == v.shape
            count, largest = array_difference(v, ref) if same_shape else (int(v.size), None)
            if count:
                m = Mismatch(
                    None,
                    None,
                    t,
                    graph.tensors[t].name,
                    int(v.size),
                    count,
                    largest,
                    v.dtype.kind in "iub",
                    "" if same_shape else f"stored shape {list(ref.shape)}, computed {list(v.shape)}",
                )
                mismatches.append(m)
        outputs.append(OutputStatus(k, t, graph.tensors[t].name, m))
    return CheckResult(meta=meta, checked=checked, mismatches=mismatches, outputs=outputs)
