"""`npusim golden record/check` through the CLI: the happy path, damaged and foreign golden files,
a golden of another model, and tampered outputs and intermediates (the diverging op is named)."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import npusim
from npusim.app.cli import main
from npusim.app.golden import load_golden, tensor_hash

from shared_paths import MOBILENET, RESNET, need


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result


def assert_one_line_error(result, code=2):
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def read_npz(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def write_npz(path, arrays: dict) -> Path:
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def meta_of(arrays: dict) -> dict:
    return json.loads(arrays["meta"].tobytes().decode("utf-8"))


def with_meta(arrays: dict, meta: dict) -> dict:
    out = dict(arrays)
    out["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    return out


@pytest.fixture(scope="module")
def resnet_golden(tmp_path_factory):
    """A golden of ResNet-8 on 3 random images, recorded once for the module."""
    model = need(RESNET)
    d = tmp_path_factory.mktemp("golden")
    x = np.random.default_rng(0).integers(-128, 128, (3, 32, 32, 3)).astype(np.int8)
    np.save(d / "x.npy", x)
    result = cli("golden", "record", model, "--input", d / "x.npy", "-o", d / "resnet.golden.npz")
    assert result.exit_code == 0, result.output
    return model, d / "resnet.golden.npz", x, d


# -- record ----------------------------------------------------------------------------------


def test_record_writes_exact_path_and_contents(resnet_golden):
    model, golden, x, _ = resnet_golden
    assert golden.exists() and not Path(str(golden) + ".npz").exists()  # written at exactly the path given
    arrays = read_npz(golden)  # readable without pickle
    meta = meta_of(arrays)
    assert meta["npusim_version"] == npusim.__version__
    assert meta["model_sha256"] == hashlib.sha256(Path(model).read_bytes()).hexdigest()
    assert meta["profile"] == "tflm" and meta["batch"] == 3
    np.testing.assert_array_equal(arrays["input_0"], x)
    interp = npusim.Interpreter(model)
    values = interp.run_all(x)
    np.testing.assert_array_equal(arrays["output_0"], values[interp.graph.outputs[0]])
    # one hash per activation tensor, in execution order: the input, then every op output
    order = [interp.graph.inputs[0]] + [t for k in interp.kernels for t in k.op.outputs]
    assert [e["index"] for e in meta["tensors"]] == order
    for e in meta["tensors"]:
        assert e["sha256"] == tensor_hash(values[e["index"]])
        assert e["stored"]  # ResNet-8's tensors are all under the default limit
        np.testing.assert_array_equal(arrays[f"tensor_{e['index']}"], values[e["index"]])
    assert arrays["meta"].dtype == np.uint8


def test_tensor_hash_covers_dtype_shape_and_bytes():
    a = np.arange(6, dtype=np.int8)
    assert tensor_hash(a) == tensor_hash(a.copy())
    assert tensor_hash(a) != tensor_hash(a.view(np.uint8))
    assert tensor_hash(a) != tensor_hash(a.reshape(2, 3))
    b = a.copy()
    b[3] += 1
    assert tensor_hash(a) != tensor_hash(b)
    assert tensor_hash(a.reshape(2, 3).T) == tensor_hash(np.ascontiguousarray(a.reshape(2, 3).T))


def test_record_store_limit_keeps_hashes_only(resnet_golden, tmp_path):
    model, _, _, d = resnet_golden
    out = tmp_path / "h.npz"
    result = cli("golden", "record", model, "--input", d / "x.npy", "-o", out, "--store-limit", 0)
    assert result.exit_code == 0, result.output
    arrays = read_npz(out)
    assert not [k for k in arrays if k.startswith("tensor_")]
    assert all(not e["stored"] for e in meta_of(arrays)["tensors"])
    assert cli("golden", "check", model, out).exit_code == 0


def test_record_bad_input_is_one_line(resnet_golden, tmp_path):
    model, _, _, _ = resnet_golden
    np.save(tmp_path / "bad.npy", np.zeros((2, 32, 32, 3), np.uint8))
    assert_one_line_error(
        cli("golden", "record", model, "--input", tmp_path / "bad.npy", "-o", tmp_path / "g.npz")
    )
    assert not (tmp_path / "g.npz").exists()


# -- check: match ----------------------------------------------------------------------------


def test_check_ok(resnet_golden):
    model, golden, _, _ = resnet_golden
    result = cli("golden", "check", model, golden)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("OK")
    assert len(result.stdout.strip().splitlines()) == 1


def test_mobilenet_record_and_check(tmp_path):
    model = need(MOBILENET)
    x = np.random.default_rng(1).integers(0, 256, (2, 128, 128, 3)).astype(np.uint8)
    np.save(tmp_path / "x.npy", x)
    assert (
        cli("golden", "record", model, "--input", tmp_path / "x.npy", "-o", tmp_path / "m.npz").exit_code == 0
    )
    result = cli("golden", "check", model, tmp_path / "m.npz")
    assert result.exit_code == 0 and "OK" in result.stdout


# -- check: another model, damaged and foreign files -------------------------------------------


def test_golden_of_another_model_exits_2(resnet_golden):
    _, golden, _, _ = resnet_golden
    line = assert_one_line_error(cli("golden", "check", need(MOBILENET), golden))
    assert "not the model" in line


@pytest.mark.parametrize("keep", [0, 10, 200, 0.5, -100])
def test_truncated_golden_exits_2(resnet_golden, tmp_path, keep):
    model, golden, _, _ = resnet_golden
    data = golden.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (len(data) + keep if keep < 0 else keep)
    (tmp_path / "t.npz").write_bytes(data[:n])
    assert_one_line_error(cli("golden", "check", model, tmp_path / "t.npz"))


def test_random_bytes_and_corruption_exit_2(resnet_golden, tmp_path):
    model, golden, _, _ = resnet_golden
    (tmp_path / "r.npz").write_bytes(
        np.random.default_rng(3).integers(0, 256, 4096).astype(np.uint8).tobytes()
    )
    assert_one_line_error(cli("golden", "check", model, tmp_path / "r.npz"))
    # a zip whose member data is damaged in the middle: the archive opens, the member does not read
    data = bytearray(golden.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(64)
    (tmp_path / "c.npz").write_bytes(bytes(data))
    assert_one_line_error(cli("golden", "check", model, tmp_path / "c.npz"))


def test_foreign_files_exit_2(resnet_golden, tmp_path):
    model, _, x, _ = resnet_golden
    np.save(tmp_path / "plain.npy", x)
    assert "not a golden file" in assert_one_line_error(cli("golden", "check", model, tmp_path / "plain.npy"))
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    assert "meta" in assert_one_line_error(cli("golden", "check", model, tmp_path / "other.npz"))
    with zipfile.ZipFile(tmp_path / "text.npz", "w") as z:
        z.writestr("meta.npy", "not an npy")
    assert_one_line_error(cli("golden", "check", model, tmp_path / "text.npz"))
    # a pickled object array must never be unpickled
    np.savez(tmp_path / "pickle.npz", meta=np.array([{"format": "npusim-golden"}], dtype=object))
    assert_one_line_error(cli("golden", "check", model, tmp_path / "pickle.npz"))
    assert_one_line_error(cli("golden", "check", model, tmp_path / "does-not-exist.npz"))


@pytest.mark.parametrize("drop", ["meta", "input_0", "output_0", "tensor_25"])
def test_missing_keys_exit_2(resnet_golden, tmp_path, drop):
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    del arrays[drop]
    line = assert_one_line_error(cli("golden", "check", model, write_npz(tmp_path / "g.npz", arrays)))
    assert drop in line


def _edit_meta(meta, edit):
    meta = json.loads(json.dumps(meta))
    edit(meta)
    return meta


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.pop("model_sha256"),
        lambda m: m.update(batch="3"),
        lambda m: m.update(format="something-else"),
        lambda m: m.update(format_version=99),
        lambda m: m.update(profile="fast"),
        lambda m: m.update(tensors="all"),
        lambda m: m["tensors"][2].update(sha256=42),
        lambda m: m["tensors"][2].pop("stored"),
        lambda m: m.update(tensors=m["tensors"] + [dict(m["tensors"][0], index=9999)]),
    ],
)
def test_bad_metadata_exits_2(resnet_golden, tmp_path, edit):
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    bad = with_meta(arrays, _edit_meta(meta_of(arrays), edit))
    assert_one_line_error(cli("golden", "check", model, write_npz(tmp_path / "g.npz", bad)))


@pytest.mark.parametrize(
    "meta",
    [
        np.array([1.5, 2.0]),
        np.frombuffer(b"{not json", np.uint8),
        np.frombuffer(b"[1, 2]", np.uint8),
        np.frombuffer(b"\xff\xfe", np.uint8),
    ],
)
def test_meta_of_wrong_type_exits_2(resnet_golden, tmp_path, meta):
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    arrays["meta"] = meta
    assert_one_line_error(cli("golden", "check", model, write_npz(tmp_path / "g.npz", arrays)))


def test_wrong_array_types_exit_2(resnet_golden, tmp_path):
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    arrays["output_0"] = np.array(["a", "b"])
    assert_one_line_error(cli("golden", "check", model, write_npz(tmp_path / "g.npz", arrays)))
    arrays = read_npz(golden)
    arrays["input_0"] = arrays["input_0"][:1]  # batch no longer the recorded one
    assert_one_line_error(cli("golden", "check", model, write_npz(tmp_path / "g.npz", arrays)))


def test_meta_as_str_array_is_accepted(resnet_golden, tmp_path):
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    arrays["meta"] = np.array(json.dumps(meta_of(arrays)))
    assert cli("golden", "check", model, write_npz(tmp_path / "g.npz", arrays)).exit_code == 0


def test_tampered_input_is_damage(resnet_golden, tmp_path):
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    arrays["input_0"] = arrays["input_0"].copy()
    arrays["input_0"][0, 0, 0, 0] ^= 1
    assert "input" in assert_one_line_error(
        cli("golden", "check", model, write_npz(tmp_path / "g.npz", arrays))
    )


# -- check: mismatches -------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["output_0", "tensor_26"])
def test_a_stored_array_that_disagrees_with_its_hash_is_damage(resnet_golden, tmp_path, key):
    """A changed output or intermediate, its hash left: the file contradicts itself (the run still
    matches the hash), so it is damaged (exit 2), never the model's mismatch."""
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    arrays[key] = _tamper(arrays[key], [3])
    message = assert_one_line_error(cli("golden", "check", model, write_npz(tmp_path / "g.npz", arrays)))
    assert "damaged" in message and key in message and "hash" in message


def test_a_cut_tensor_list_is_damage(resnet_golden, tmp_path):
    model, golden, _, _ = resnet_golden
    arrays = read_npz(golden)
    meta = meta_of(arrays)
    kept = meta["tensors"][:3]
    meta["tensors"] = kept
    arrays = {k: v for k, v in arrays.items() if not k.startswith("tensor_")}
    arrays.update({f"tensor_{e['index']}": read_npz(golden)[f"tensor_{e['index']}"] for e in kept})
    message = assert_one_line_error(
        cli("golden", "check", model, write_npz(tmp_path / "g.npz", with_meta(arrays, meta)))
    )
    assert "damaged" in message and "3 tensors recorded, the model has 17" in message


def test_a_golden_that_would_decompress_beyond_the_bound_is_refused_before(resnet_golden, tmp_path):
    """A small file whose input's .npy header claims a huge array (numpy allocates what the header
    says): refused from the headers, with memory bounded."""
    import tracemalloc

    model, golden, _, _ = resnet_golden
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(golden) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for m in src.infolist():
            data = src.read(m)
            if m.filename == "input_0.npy":
                header = {"descr": "|i1", "fortran_order": False, "shape": (1 << 28, 32, 32, 3)}
                f = io.BytesIO()
                np.lib.format.write_array_header_1_0(f, header)
                data = f.getvalue() + data[len(f.getvalue()) :]
            dst.writestr(m, data)
    zeros = tmp_path / "zeros.npz"  # a member that inflates to 2 GiB of zeros, few MB compressed
    with zipfile.ZipFile(zeros, "w", zipfile.ZIP_DEFLATED) as dst:
        with dst.open("input_0.npy", "w", force_zip64=True) as f:
            for _ in range(2048):
                f.write(bytes(1 << 20))
    tracemalloc.start()
    for path, expected in ((bomb, "says"), (zeros, "would decompress")):
        with pytest.raises(npusim.NpusimError, match=expected):
            load_golden(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_hash_only_mismatch_still_names_the_op(resnet_golden, tmp_path):
    model, _, _, d = resnet_golden
    out = tmp_path / "h.npz"
    assert (
        cli("golden", "record", model, "--input", d / "x.npy", "-o", out, "--store-limit", 0).exit_code == 0
    )
    arrays = read_npz(out)
    meta = meta_of(arrays)
    entry = next(e for e in meta["tensors"] if e["op"] == 7)
    entry["sha256"] = "0" * 64
    result = cli("golden", "check", model, write_npz(tmp_path / "g.npz", with_meta(arrays, meta)))
    assert result.exit_code == 1, result.output
    assert "op 7 (ADD)" in result.stdout and "hash" in result.stdout


def test_numerics_change_is_reported_at_the_first_op(resnet_golden, tmp_path):
    """A golden recorded under tflm, checked as if xnnpack were the recorded profile: the run parts
    from the record at the first requantizing op, with counts and differences from stored values."""
    model, golden, x, _ = resnet_golden
    arrays = read_npz(golden)
    meta = meta_of(arrays)
    meta["profile"] = "xnnpack"
    result = cli("golden", "check", model, write_npz(tmp_path / "g.npz", with_meta(arrays, meta)))
    assert result.exit_code == 1, result.output
    interp = npusim.Interpreter(model, profile="xnnpack")
    values = interp.run_all(x)
    diff = values[22] != arrays["tensor_22"]
    assert diff.any()
    assert "op 0 (CONV_2D), output tensor 22" in result.stdout
    assert f"{int(diff.sum()):,} of {diff.size:,} elements differ" in result.stdout
    assert "later tensor(s) also differ" in result.stdout


def test_check_api_returns_all_mismatches(resnet_golden, tmp_path):
    from npusim.app.golden import check

    model, golden, _, _ = resnet_golden
    result = check(model, golden)
    assert result.ok and result.checked == 17
    golden_obj = load_golden(golden)
    assert golden_obj.meta["batch"] == 3 and len(golden_obj.values) == 17


# -- a model with two outputs, through the installed CLI (subprocess) --------------------------


def npusim_cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "npusim.app.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def two_head_golden(tmp_path_factory):
    """O.two_head_model: output 0 'head_conv' (op 1 CONV_2D, tensor 4), output 1 'head_pool' (op 0
    MAX_POOL_2D, tensor 3); a golden of 3 random inputs recorded by a subprocess."""
    from npusim.testing.oracle import two_head_model

    d = tmp_path_factory.mktemp("two")
    model = d / "two.tflite"
    model.write_bytes(two_head_model())
    x = np.random.default_rng(1).integers(-128, 128, (3, 8, 8, 4)).astype(np.int8)
    np.save(d / "x.npy", x)
    r = npusim_cli("golden", "record", model, "--input", d / "x.npy", "-o", d / "two.golden.npz")
    assert r.returncode == 0, r.stderr
    return model, d / "two.golden.npz", x


def test_two_outputs_recorded_and_checked(two_head_golden):
    model, golden, x = two_head_golden
    arrays = read_npz(golden)
    meta = meta_of(arrays)
    assert meta["outputs"] == 2 and meta["output_tensors"] == [4, 3]
    values = npusim.Interpreter(str(model)).run_all(x)
    np.testing.assert_array_equal(arrays["output_0"], values[4])
    np.testing.assert_array_equal(arrays["output_1"], values[3])
    r = npusim_cli("golden", "check", model, golden)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("OK: 3 tensors match the golden, including all 2 outputs")


def _tamper(a: np.ndarray, flat) -> np.ndarray:
    a = a.copy()
    a.flat[flat] = np.where(a.flat[flat] > 0, a.flat[flat] - 3, a.flat[flat] + 3)
    return a


def test_two_outputs_numerics_change_names_the_output(two_head_golden, tmp_path):
    """Recorded under tflm, checked as xnnpack: only the CONV_2D head (output 0) parts."""
    model, golden, x = two_head_golden
    arrays = read_npz(golden)
    meta = meta_of(arrays)
    meta["profile"] = "xnnpack"
    r = npusim_cli("golden", "check", model, write_npz(tmp_path / "g.npz", with_meta(arrays, meta)))
    assert r.returncode == 1, r.stdout + r.stderr
    va = npusim.Interpreter(str(model), profile="xnnpack").run_all(x)[4]
    n = int(np.count_nonzero(va != arrays["output_0"]))
    assert n > 0
    assert "first diverging op (execution order): op 1 (CONV_2D)" in r.stdout
    assert f"output 0 (tensor 4 'head_conv'): {n} of 1,536 elements differ" in r.stdout
    assert "output 1 matches" in r.stdout


def test_two_outputs_hash_only_output_is_named(two_head_golden, tmp_path):
    model, _, x = two_head_golden
    out = tmp_path / "h.npz"
    np.save(tmp_path / "x.npy", x)
    r = npusim_cli("golden", "record", model, "--input", tmp_path / "x.npy", "-o", out, "--store-limit", 0)
    assert r.returncode == 0, r.stderr
    arrays = read_npz(out)
    meta = meta_of(arrays)
    next(e for e in meta["tensors"] if e["index"] == 3)["sha256"] = "0" * 64
    r = npusim_cli("golden", "check", model, write_npz(tmp_path / "g.npz", with_meta(arrays, meta)))
    # output_1 is stored whatever the limit: a hash that disowns it makes the file damaged
    assert r.returncode == 2 and "damaged" in r.stderr and "output_1" in r.stderr, r.stdout + r.stderr


def test_golden_without_output_tensors_still_checks(two_head_golden, tmp_path):
    """A file written before output_tensors was recorded (same format version) checks as before."""
    model, golden, _ = two_head_golden
    arrays = read_npz(golden)
    meta = meta_of(arrays)
    del meta["output_tensors"]
    path = write_npz(tmp_path / "old.npz", with_meta(arrays, meta))
    r = npusim_cli("golden", "check", model, path)
    assert r.returncode == 0, r.stdout + r.stderr
    arrays["output_1"] = _tamper(arrays["output_1"], [1])  # its hash left: the file is damaged
    r = npusim_cli("golden", "check", model, write_npz(tmp_path / "old2.npz", with_meta(arrays, meta)))
    assert r.returncode == 2 and "damaged" in r.stderr and "tensor 3" in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize(
    "damage",
    [
        lambda a, m: (a.pop("output_1"), None),  # an output missing
        lambda a, m: (a.pop("output_1"), m.update(outputs=1, output_tensors=[4])),  # recorded as one
        lambda a, m: (None, m.update(output_tensors=[3, 4])),  # outputs swapped
        lambda a, m: (None, m.update(output_tensors=[4])),  # wrong length
        lambda a, m: (None, m.update(output_tensors="4,3")),
    ],
)
def test_two_outputs_damaged_exit_2(two_head_golden, tmp_path, damage):
    model, golden, _ = two_head_golden
    arrays = read_npz(golden)
    meta = meta_of(arrays)
    damage(arrays, meta)
    r = npusim_cli("golden", "check", model, write_npz(tmp_path / "g.npz", with_meta(arrays, meta)))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "damaged" in lines[0], r.stderr
