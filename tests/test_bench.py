"""Smoke tests of experiments/bench/main.py: it runs end to end and writes its table (no wall-time checks).
The section of the AVX2 code compiled for Haswell runs with the conv and model tests: its rows must
exist and be bit-exact where this host runs Haswell code, and say why it was skipped where not."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from shared_paths import SHARED

pytest.importorskip("tflite_micro", reason="tflite-micro (the TFLM oracle) is not installed")

try:
    from experiments.bench import main as bench  # noqa: E402
except ImportError:  # plain `pytest` (not `python -m pytest`) does not put the repository on sys.path
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from experiments.bench import main as bench  # noqa: E402


def _read_table(out: Path) -> list[str]:
    assert out.exists(), "the bench did not write its report"
    text = out.read_text()
    assert "# npusim speed benchmark" in text
    assert "| workload | batch |" in text
    assert "Peak RSS" in text
    lines = text.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| workload")))
    rows = []
    for line in lines[first + 2 :]:  # the main table: header, rule, then rows up to the first blank line
        if not line.startswith("| "):
            break
        rows.append(line)
    return rows


def _exactness(row: str) -> tuple[str, str]:
    """The main table's last two cells: "exact vs TFLM" (npusim tflm) and "exact vs LiteRT**"
    (npusim xnnpack), e.g. ("yes (2 img)", "yes (2 img)")."""
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    return cells[-2], cells[-1]


def _section(out: Path, title: str) -> str:
    text = out.read_text()
    assert f"## {title}" in text, f"no section {title!r}"
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


HASWELL = "AVX2 code compiled for Haswell, on this host"


def _haswell_rows(out: Path, workloads) -> list[str]:
    """The Haswell section's rows for the workloads, checked bit-exact, with its avx2 path rates; or,
    on a host that cannot run Haswell code, the section's reason for skipping (and no rows)."""
    section = _section(out, HASWELL)
    reason = bench.haswell_unsupported()
    if reason is not None:
        assert f"Skipped: {reason}." in section
        return []
    rows = [line for line in section.splitlines() if line.startswith(tuple(f"| {w} |" for w in workloads))]
    assert [r.split("|")[1].strip() for r in rows] == list(workloads), section
    for r in rows:
        assert "| bit-exact (" in r, r  # the Haswell code's output equals the host code's, whole batch
    assert "| CONV_2D 56x56x64 -> 64, 3x3 | avx2 |" in section
    assert "| DEPTHWISE_CONV_2D 28x28x96, 3x3 | avx2 form |" in section
    assert "NUMBA_CPU_NAME=haswell (its own features only)" in section  # the child compiled for Haswell
    return rows


def test_conv_quick_batch1(tmp_path, capsys):
    out = tmp_path / "bench.md"
    # The conv model is built inside the bench: the shared folder is not needed here.
    assert (
        bench.main(
            ["--shared", str(tmp_path), "--quick", "--only", "conv", "--conv-batches", "1", "--out", str(out)]
        )
        == 0
    )
    rows = _read_table(out)
    assert len(rows) == 1 and rows[0].startswith("| conv | 1 |")
    # Exactness is a property, not a timing: npusim equals TFLM and (xnnpack profile) LiteRT.
    assert _exactness(rows[0]) == ("yes (1 img)", "yes (1 img)"), rows[0]
    assert "| conv | 1 |" in capsys.readouterr().out  # the table is printed too
    _haswell_rows(out, ["conv"])


def test_models_quick_small_batch(tmp_path):
    if not (SHARED / "models" / bench.MODELS["resnet8"]).exists():
        msg = (
            f"shared models not found under {SHARED} (set NPU_SHARED): bench on the shared models NOT tested"
        )
        warnings.warn(msg, stacklevel=1)
        pytest.skip(msg)
    out = tmp_path / "bench.md"
    assert (
        bench.main(
            [
                "--shared",
                str(SHARED),
                "--quick",
                "--only",
                "models",
                "--model-batches",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = _read_table(out)
    assert [r.split("|")[1].strip() for r in rows] == list(bench.MODELS)
    # npusim (tflm) == TFLM on the timed images, npusim (xnnpack) == LiteRT on the whole batch.
    tflm = {r.split("|")[1].strip(): _exactness(r)[0] for r in rows}
    litert = {r.split("|")[1].strip(): _exactness(r)[1] for r in rows}
    assert tflm == {name: "yes (2 img)" for name in bench.MODELS}, rows
    litert_gaps = sorted(name for name, cell in litert.items() if cell != "yes (2 img)")
    section = out.read_text().split("## Memory of a model run", 1)[1].split("\n## ", 1)[0]
    memory = [
        line for line in section.splitlines() if line.startswith(("| resnet8 | 2 |", "| mobilenet_v2 | 2 |"))
    ]
    assert len(memory) == 2, memory
    for line in memory:  # the last column: resident memory growth over 10 further runs, MB
        assert abs(float(line.rstrip(" |").split("|")[-1])) < 8.0, line
    for row in _haswell_rows(out, list(bench.MODELS)):
        assert row.split("|")[2].strip() == "2", row  # the largest batch of the main table
    assert not litert_gaps, {name: litert[name] for name in litert_gaps}


def test_haswell_skipped_with_its_reason(tmp_path, monkeypatch):
    """Where Haswell code cannot run (ARM, a CPU without AVX2), the section says so and why; no child
    process is started. --no-haswell skips it the same way."""
    from experiments.bench import haswell as bench_haswell  # the section's module (bench.py runs it)

    monkeypatch.setattr(bench_haswell, "haswell_unsupported", lambda: "this host is aarch64, not x86-64")
    monkeypatch.setattr(bench_haswell, "haswell_run", lambda spec, log: pytest.fail("child started"))
    out = tmp_path / "bench.md"
    args = ["--shared", str(tmp_path), "--quick", "--only", "conv", "--conv-batches", "1", "--out", str(out)]
    assert bench.main(args) == 0
    assert "Skipped: this host is aarch64, not x86-64." in _section(out, HASWELL)
    assert bench.main([*args, "--no-haswell"]) == 0
    assert "Skipped: --no-haswell." in _section(out, HASWELL)


@pytest.mark.parametrize(
    "option, value, reason",
    [
        ("--conv-batches", "0", f"expected positive batch sizes, got {'0'!r}"),
        ("--model-batches", "64,-1", f"expected positive batch sizes, got {'64,-1'!r}"),
        ("--yolo-batches", ",", f"expected positive batch sizes, got {','!r}"),
        ("--conv-batches", "1,x", f"expected comma-separated batch sizes, got {'1,x'!r}"),
    ],
)
def test_bad_batches_rejected(tmp_path, capsys, option, value, reason):
    out = tmp_path / "x.md"
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--only", "conv", option, value, "--out", str(out)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: argument {option}: {reason}")
    assert not out.exists()


def test_yolo_quick_batch1(tmp_path):
    """YOLOv8n-256 (uint8 input, float output) through the same row code as the other models."""
    if not (SHARED / "models" / bench.YOLO_MODELS["yolov8n_256"]).exists():
        msg = f"YOLOv8n-256 not found under {SHARED} (set NPU_SHARED): bench on YOLO NOT tested"
        warnings.warn(msg, stacklevel=1)
        pytest.skip(msg)
    out = tmp_path / "bench.md"
    args = ["--shared", str(SHARED), "--quick", "--only", "yolo", "--yolo-batches", "1", "--out", str(out)]
    assert bench.main(args) == 0
    rows = _read_table(out)
    assert len(rows) == 1 and rows[0].startswith("| yolov8n_256 | 1 |"), rows
    assert "| yes (1 img) |" in rows[0], rows[0]  # npusim (tflm) == TFLM, bit-equal float output
    text = out.read_text()
    if (SHARED / "data" / "eurosat64_subset.npz").exists():
        assert "yolov8n_256 inputs: eurosat64_subset.npz x_test resized to 256x256 (PIL bilinear)" in text
    assert "| yolov8n_256 | 1 |" in text.split("## Memory of a model run", 1)[1]


def test_yolo_in_the_default_workloads():
    args = bench.build_parser().parse_args([])
    assert args.yolo_batches == [8] and args.only == "all"
    assert bench.YOLO_MODELS["yolov8n_256"].endswith("yolov8n_256_quant_pc_uf_od_coco-person.tflite")


def test_one_shot_section_quick(tmp_path):
    """The one-shot section: npusim run (in its own process and through the resident server) and the
    LiteRT script as fresh processes on 1 image and the largest model batch, each row with its ratios
    and whether the output files are equal."""
    if not (SHARED / "models" / bench.MODELS["resnet8"]).exists():
        msg = f"shared models not found under {SHARED} (set NPU_SHARED): the one-shot section NOT tested"
        warnings.warn(msg, stacklevel=1)
        pytest.skip(msg)
    out = tmp_path / "bench.md"
    args = [
        "--shared",
        str(SHARED),
        "--quick",
        "--only",
        "oneshot",
        "--model-batches",
        "2",
        "--yolo-batches",
        "1",
        "--no-haswell",
        "--out",
        str(out),
    ]
    assert bench.main(args) == 0
    section = _section(out, "One shot: a fresh process per run")
    assert section.strip().startswith("CPU: ") and "; features " in section  # the CPU is stated
    cli = section.split("Where the time of", 1)[0].splitlines()
    rows = [line.split("|")[1:-1] for line in cli if line.startswith("| resnet8 |")]
    rows += [line.split("|")[1:-1] for line in cli if line.startswith("| mobilenet_v2 |")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("resnet8", "1"),
        ("resnet8", "2"),
        ("mobilenet_v2", "1"),
        ("mobilenet_v2", "2"),
    ], section
    for r in rows:  # in process and through the resident server, against the LiteRT script
        assert r[5].strip().endswith("x") and r[6].strip().endswith("x") and r[7].strip() in ("yes", "no"), r
    table = section.split("Where the time of", 1)[1].split("| first / warm |", 1)[0].splitlines()
    table = [line for line in table if line.startswith("| ")][:-1]  # up to the first-call header
    phases = [line.split("|")[1].strip() for line in table[1:]]  # after the header
    assert phases[:3] == ["Python start", "numpy", "click"], phases
    assert phases[-2:] == ["a second run", "total"], phases
    # ResNet-8 under the xnnpack profile is LiteRT's output bit for bit, as in the main table.
    assert [r[7].strip() for r in rows[:2]] == ["yes", "yes"], rows
    # A process's first run against its warm ones, per model at the largest batch (ratios reported).
    firsts = section.split("| first / warm |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert [(r.split("|")[1].strip(), r.split("|")[2].strip()) for r in firsts] == [
        ("resnet8", "2"),
        ("mobilenet_v2", "2"),
        ("yolov8n_256", "1"),
    ], section
    assert all(float(r.split("|")[-2].strip().rstrip("x")) > 0 for r in firsts), firsts
