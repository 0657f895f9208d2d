"""The bench's ONNX row (experiments/bench/onnx_row.py) on one image, one repetition: its table and that
the two sides it times give nearby outputs."""

import pytest

from shared_paths import SHARED, need

pytest.importorskip("onnxruntime")


def test_yolo26_row_on_one_image():
    from experiments.bench import onnx_row as bench_onnx

    need(SHARED / "models" / "onnx" / bench_onnx.MODEL)
    need(SHARED / "data" / "eurosat64_subset.npz")
    lines = bench_onnx.bench_yolo26(SHARED, batch=1, reps=1, log=lambda m: None)
    row = next(line for line in lines if line.startswith("| YOLO26n-256"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "1" and float(cells[4]) > 0  # batch, ORT / npusim ratio
    assert float(cells[5]) >= 0.5 and float(cells[6]) >= 0.5  # within one step of ORT's optimized run


def test_missing_model_is_reported(tmp_path):
    from experiments.bench import onnx_row as bench_onnx

    lines = bench_onnx.bench_yolo26(tmp_path, batch=1, reps=1, log=lambda m: None)
    assert lines[0].startswith("Skipped:") and "not found" in lines[0]
