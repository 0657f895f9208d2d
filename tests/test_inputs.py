"""zo: pixels -> the model's input (zo/inputs.py), fresh heads (zo/head.py) and the dead-run warning,
on small generated int8 models, through the Python API and the `zo train` command line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

import npusim
from npusim import load_model
from npusim.testing.oracle import run_tflm
from zo.errors import ZoError
from zo.head import LOGIT_RANGE, PROBE_CODES
from zo.inputs import ImageInput, choose_mapping, model_inputs, quantize_real
from zo.trainer import TrainConfig, Trainer, calibration_indices

from shared_paths import SHARED, need
from zo_fixtures import color_dataset, tiny_classifier

ZO = [sys.executable, "-m", "zo.cli"]

# (name, input dtype, scale, zero point, the range auto must find)
INPUTS = [
    ("raw pixels", np.int8, 1.0, -128, "0:255"),
    ("[0, 1]", np.int8, 1 / 255, -128, "0:1"),
    ("[-1, 1] int8", np.int8, 2 / 255, 0, "-1:1"),
    ("[-1, 1] uint8", np.uint8, 2 / 255, 127, "-1:1"),
]


def write(tmp_path, model_bytes: bytes, **data) -> tuple:
    model, npz = tmp_path / "model.tflite", tmp_path / "data.npz"
    model.write_bytes(model_bytes)
    np.savez(npz, **color_dataset(**data))
    return model, npz


def run_cli(args):
    return subprocess.run(ZO + args, capture_output=True, text=True, timeout=300)


def train_args(model, data, out, *extra):
    return [
        "train",
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(out),
        "--q",
        "fixed:2",
        "--batch",
        "16",
        "--budget",
        "200",
        "--quiet",
        *extra,
    ]


@pytest.mark.parametrize("name,dtype,scale,zp,expected", INPUTS, ids=[i[0] for i in INPUTS])
def test_auto_picks_the_range_and_training_moves_the_loss(tmp_path, name, dtype, scale, zp, expected):
    model, data = write(tmp_path, tiny_classifier(input_scale=scale, input_zero_point=zp, input_dtype=dtype))
    image = ImageInput.of(load_model(str(model)))
    mapping = choose_mapping(image)
    assert mapping.name == expected and mapping.source == "auto"
    # Pixel 0 and 255 land on the ends of the code range, and the codes are monotone in the pixel.
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1).repeat(3, axis=-1)
    image16 = ImageInput(
        image.name, image.dtype, 16, 16, 3, False, image.scale, image.zero_point, image.interval, image.code
    )
    codes, clipped = model_inputs(pixels, image16, mapping)
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    flat = codes[..., 0].ravel().astype(int)
    assert clipped == 0 and abs(flat[0] - lo) <= 1 and abs(flat[-1] - hi) <= 1 and np.all(np.diff(flat) >= 0)
    t = Trainer(
        TrainConfig(
            model=str(model),
            data=str(data),
            q="fixed:4",
            batch=16,
            budget=800,
            eval_every=400,
            new_head=True,
            head_init="zero",  # the loss must move from ln C: the mapping gave the features meaning
            checkpoint_every=1000,
        ),
        tmp_path / "run",
        warn=pytest.fail,
    )
    t.run()
    losses = [
        float(r["train_loss"])
        for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv"))
        if r["train_loss"]
    ]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.05, (losses[:10], losses[-10:])
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["input_mapping"]
    assert recorded["range"] == expected and recorded["source"] == "auto"


def test_quantize_real_rounds_half_away_and_reports_clipping():
    real = np.array([0.0, 1.0, 127.0, 128.0, 200.0, 255.0])
    q, clipped = quantize_real(real, np.int8, 1.0, -128)
    assert q.tolist() == [-128, -127, -1, 0, 72, 127] and clipped == 0
    # 1/2 -> 1; 255/2 = 127.5 -> 128 -> 127, within half a code of the range: not counted as clipped.
    q, clipped = quantize_real(real, np.int8, 2.0, 0)
    assert q.tolist() == [0, 1, 64, 64, 100, 127] and clipped == 0
    q, clipped = quantize_real(np.array([-300.0, 0.0, 256.0, 300.0]), np.int8, 2.0, 0)
    assert q.tolist() == [-128, 0, 127, 127] and clipped == pytest.approx(3 / 4)
    f, _ = quantize_real(real / 255, np.float32)
    assert f.dtype == np.float32 and f.max() == pytest.approx(1.0)
    with pytest.raises(ZoError, match="int16"):
        quantize_real(real, np.int16)


def test_grayscale_nchw_and_non_square_inputs(tmp_path):
    rgb = np.zeros((2, 8, 8, 3), np.uint8)
    rgb[0, ..., 0] = 255  # pure red
    rgb[1, ..., 2] = 200  # blue
    gray = ImageInput.of(load_model(tiny_classifier(channels=1, input_scale=1 / 255)))
    codes, _ = model_inputs(rgb, gray, choose_mapping(gray))
    luma = np.array([0.299 * 255, 0.114 * 200])  # BT.601
    assert codes.shape == (2, 4, 4, 1) and np.array_equal(codes[:, 0, 0, 0], np.round(luma).astype(int) - 128)
    nchw = ImageInput.of(load_model(tiny_classifier(nchw=True, side=6, width=10)))
    assert nchw.nchw and (nchw.height, nchw.width, nchw.channels) == (6, 10, 3)
    codes, _ = model_inputs(rgb, nchw, choose_mapping(nchw))
    assert codes.shape == (2, 3, 6, 10) and np.all(codes[0, 0] == 127) and np.all(codes[0, 1:] == -128)
    # A non-square NHWC input is resized to its own height and width, and trains end to end.
    model, data = write(tmp_path, tiny_classifier(side=4, width=7))
    r = run_cli(train_args(model, data, tmp_path / "run", "--new-head"))
    assert r.returncode == 0, r.stderr


def test_saturating_mapping_warns_with_the_mapping_named(tmp_path):
    model, data = write(tmp_path, tiny_classifier(input_scale=1 / 255))
    r = run_cli(train_args(model, data, tmp_path / "run", "--mean", "0,0,0", "--std", "0.1,0.1,0.1"))
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "clipped" in warnings[0] and "--mean 0,0,0 --std 0.1,0.1,0.1" in warnings[0]
    config = json.loads((tmp_path / "run" / "config.json").read_text())["input_mapping"]
    assert config["range"] == "mean/std" and config["std"] == [0.1, 0.1, 0.1]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--mean", "0.5,0.5,0.5"], "--mean given without --std"),
        (["--std", "0.5,0.5,0.5"], "--std given without --mean"),
        (["--mean", "0.5,0.5", "--std", "0.5,0.5"], "expected 3"),
        (["--mean", "a,b,c", "--std", "1,1,1"], "comma-separated numbers"),
        (["--input-range", "0:255"], "contradicts"),
        (["--input-range", "-1:1"], "contradicts"),
    ],
    ids=["mean-alone", "std-alone", "channels", "not-numbers", "range-0:255", "range-1:1"],
)
def test_bad_mapping_exits_2_with_one_line(tmp_path, extra, message):
    model, data = write(tmp_path, tiny_classifier(input_scale=1 / 255))  # a [0, 1] model
    r = run_cli(train_args(model, data, tmp_path / "run", *extra))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unmatched_interval_asks_for_mean_and_std(tmp_path):
    # ImageNet mean/std normalisation: codes cover about [-2.1, 2.6].
    model, data = write(tmp_path, tiny_classifier(input_scale=4.75 / 255, input_zero_point=-13))
    r = run_cli(train_args(model, data, tmp_path / "run"))
    assert r.returncode == 2 and "matches none" in r.stderr and "--mean" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_cli(
        train_args(model, data, tmp_path / "run", "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225")
    )
    assert r.returncode == 0, r.stderr


# The model's own head estimated by ZO at a fixed eps, every pass a probe (the dead-run warning is
# about probe pairs; the default exact head needs none).
ZO_HEAD = dict(keep_head=True, head_gradient="zo", eps=1, keep="last")
ZO_HEAD_ARGS = ("--keep-head", "--head-gradient", "zo", "--eps", "1", "--keep", "last")


def test_dead_run_warns_once_and_counts_zero_differences(tmp_path):
    # Logits at scale 50: a one-step weight perturbation never moves them by a code.
    model, data = write(tmp_path, tiny_classifier(logits_scale=50.0))
    warnings = []
    t = Trainer(
        TrainConfig(
            model=str(model),
            data=str(data),
            q="fixed:2",
            batch=16,
            budget=4 * 60,
            checkpoint_every=1000,
            **ZO_HEAD,
        ),
        tmp_path / "run",
        warn=warnings.append,
    )
    t.run()
    assert len(warnings) == 1 and "L+ == L-" in warnings[0] and "50 consecutive steps" in warnings[0]
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r["train_loss"]]
    assert all(float(r["zero_differences"]) == 1.0 for r in rows)
    # A live model: the column says how many pairs differed.
    model, data = write(tmp_path, tiny_classifier())
    t = Trainer(
        TrainConfig(
            model=str(model),
            data=str(data),
            q="fixed:2",
            batch=16,
            budget=200,
            new_head=True,
            checkpoint_every=1000,
            head_gradient="zo",
            eps=1,
        ),
        tmp_path / "live",
        warn=pytest.fail,
    )
    t.run()
    rows = [r for r in csv.DictReader(open(tmp_path / "live" / "metrics.csv")) if r["train_loss"]]
    assert np.mean([float(r["zero_differences"]) for r in rows]) < 0.5


def test_replaced_head_is_quantized_from_the_features(tmp_path):
    model, data = write(tmp_path, tiny_classifier(classes=4))
    t = Trainer(TrainConfig(model=str(model), data=str(data), budget=100, batch=16), tmp_path / "run")
    assert t.model.num_classes == 4  # same class count, no --new-head: the deployed head is kept
    t = Trainer(
        TrainConfig(model=str(model), data=str(data), budget=100, batch=16, new_head=True, head_init="zero"),
        tmp_path / "run2",
    )  # the probe rule's scales, before an initialization may coarsen them (tests/test_zo_head_init.py)
    g = t.model.graph
    head = [op for op in g.ops if op.kind == "FULLY_CONNECTED"][-1]
    w, logits = g.tensors[head.inputs[1]], g.tensors[head.outputs[0]]
    assert not w.data.any() and logits.zero_point == 0
    assert logits.scale == pytest.approx(2 * LOGIT_RANGE / 255, rel=1e-6)
    calibration = t.data.x_train[calibration_indices(len(t.data.y_train))]
    features = t.model.features(t.inputs_of(calibration), head.inputs[0])
    rms = np.sqrt(np.mean(np.sum(features**2, axis=1)))
    assert w.quant.scale == pytest.approx(PROBE_CODES * logits.scale / rms, rel=1e-5)


def test_appended_head_trains_and_exports_bit_exact_in_tflm(tmp_path):
    """An embedding model (no classifier) gets a FULLY_CONNECTED head with --new-head; the exported
    file runs in TFLM with the same outputs as npusim."""
    model, data = write(tmp_path, tiny_classifier(head=False))
    r = run_cli(train_args(model, data, tmp_path / "no-head"))
    assert r.returncode == 2 and "--new-head" in r.stderr and len(r.stderr.strip().splitlines()) == 1, (
        r.stderr
    )
    r = run_cli(train_args(model, data, tmp_path / "run", "--new-head", "--budget", "400"))
    assert r.returncode == 0, r.stderr
    exported = (tmp_path / "run" / "model.tflite").read_bytes()
    graph = load_model(exported)
    assert graph.output().shape == (1, 4) and graph.ops[-1].kind == "FULLY_CONNECTED"
    assert np.any(graph.tensors[graph.ops[-1].inputs[1]].data)  # trained
    x = np.random.default_rng(0).integers(-128, 128, (8, 4, 4, 3), dtype=np.int8)
    assert np.array_equal(run_tflm(exported, x), npusim.Interpreter(exported).run(x))


@pytest.mark.parametrize(
    "name,dtype,expected",
    [
        ("blazeface_front_128_quant_pc_ff_od_widerface.tflite", np.float32, "0:1"),  # float, then QUANTIZE
        ("yolov8n_256_quant_pc_uf_od_coco-person.tflite", np.uint8, "0:1"),
        ("yolov8n_256_quant_pc_ii_seg_coco-st.tflite", np.int8, "0:1"),
        ("mobilenetv2_a100_256_128_fft_int8.tflite", np.uint8, "-1:1"),
    ],
)
def test_auto_reads_the_stm32n6_models(name, dtype, expected):
    path = need(SHARED / "models" / "stm32n6" / name)
    image = ImageInput.of(load_model(path))
    assert image.dtype == dtype and choose_mapping(image).name == expected


def test_fresh_head_behind_a_reshape_exports_a_model_every_runtime_loads(tmp_path):
    """FC -> RESHAPE -> SOFTMAX (as converters write it), 4 classes, trained on 6: the reshape
    carries the new logits' quantization and class count, and LiteRT and TFLM both run the export."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    model, data = write(tmp_path, tiny_classifier(classes=4, reshape_logits=True), classes=6)
    r = run_cli(train_args(model, data, tmp_path / "run", "--budget", "120"))
    assert r.returncode == 0, r.stderr
    exported = (tmp_path / "run" / "model.tflite").read_bytes()
    x = np.random.default_rng(1).integers(-128, 128, (4, 4, 4, 3), dtype=np.int8)
    assert np.array_equal(run_tflm(exported, x), npusim.Interpreter(exported).run(x))
    lite = LiteRT(model_content=exported)
    lite.allocate_tensors()
    lite.set_tensor(lite.get_input_details()[0]["index"], x[:1])
    lite.invoke()
    assert lite.get_tensor(lite.get_output_details()[0]["index"]).shape == (1, 1, 6)


def test_one_class_data_and_bad_class_counts_exit_2(tmp_path):
    model, data = write(tmp_path, tiny_classifier())
    d = dict(np.load(data))
    d["y_train"][:] = 0
    d["y_test"][:] = 0
    d["class_names"] = d["class_names"][:1]
    np.savez(tmp_path / "one.npz", **d)
    r = run_cli(train_args(model, tmp_path / "one.npz", tmp_path / "run"))
    assert r.returncode == 2 and "at least 2 classes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    for classes in ("0", "-3"):
        r = run_cli(["cost", "--model", str(model), "--classes", classes])
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_resume_compares_the_resolved_mapping(tmp_path):
    model, data = write(tmp_path, tiny_classifier())  # raw pixels: auto resolves to 0:255
    out = tmp_path / "run"
    assert run_cli(train_args(model, data, out, "--budget", "80", "--checkpoint-every", "5")).returncode == 0
    r = run_cli(
        train_args(model, data, out, "--budget", "160", "--input-range", "0:255", "--resume", str(out))
    )
    assert r.returncode == 0, r.stderr  # the same mapping, spelled out
    r = run_cli(
        train_args(
            model, data, out, "--budget", "240", "--mean", "0,0,0", "--std", "1,1,1", "--resume", str(out)
        )
    )
    assert r.returncode == 2 and "input mapping" in r.stderr, r.stderr


def test_appended_head_keeps_litert_signature_runner_working(tmp_path):
    """The ReID MobileNetV2 ends in MEAN; with an appended head its export's signature names the logits."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    path = need(SHARED / "models" / "stm32n6" / "mobilenetv2_a100_256_128_fft_int8.tflite")
    data = tmp_path / "data.npz"
    np.savez(data, **color_dataset(side=16, n_train=40, n_test=20))
    r = run_cli(
        [
            "train",
            "--model",
            path,
            "--data",
            str(data),
            "--out",
            str(tmp_path / "run"),
            "--new-head",
            "--q",
            "fixed:1",
            "--batch",
            "8",
            "--budget",
            "10",
            "--quiet",
        ]
    )
    assert r.returncode == 0, r.stderr
    lite = LiteRT(model_path=str(tmp_path / "run" / "model.tflite"))
    runner = lite.get_signature_runner()
    x = np.random.default_rng(0).integers(0, 256, (1, 256, 128, 3), dtype=np.uint8)
    outputs = runner(**{lite.get_signature_list()["serving_default"]["inputs"][0]: x})
    assert list(outputs) == ["logits"] and outputs["logits"].shape == (1, 4)


def test_dead_run_warning_counts_across_a_resume(tmp_path):
    model, data = write(tmp_path, tiny_classifier(logits_scale=50.0))
    out = tmp_path / "run"
    args = train_args(model, data, out, "--checkpoint-every", "1", *ZO_HEAD_ARGS)
    args[args.index("--budget") + 1] = "120"  # 30 steps: no warning yet
    r = run_cli(args)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    args[args.index("--budget") + 1] = "200"  # 20 more: the 50th consecutive dead step
    r = run_cli(args + ["--resume", str(out)])
    assert r.returncode == 0 and r.stderr.count("50 consecutive steps") == 1, r.stderr


@pytest.mark.parametrize(
    "optimizer, q, warned",
    [
        ("sgd", "slope", True),
        ("adam", "linear", True),
        ("sgd", "qscheduler", False),  # the efficiency test under this step rule
        ("adam", "efficiency", False),
        ("sgd", "fixed:1", False),
        ("nsgd", "qscheduler", False),
    ],
)
def test_a_q_rule_made_for_nsgd_under_a_step_that_does_not_grow_with_q_warns(tmp_path, optimizer, q, warned):
    model, data = write(tmp_path, tiny_classifier())
    warnings = []
    config = TrainConfig(
        model=str(model),
        data=str(data),
        q=q,
        optimizer=optimizer,
        batch=16,
        budget=400,
        new_head=True,
        checkpoint_every=1000,
    )
    Trainer(config, tmp_path / "run", warn=warnings.append)
    assert [w for w in warnings if "--q qscheduler" in w and optimizer in w] == (
        [warnings[0]] if warned else []
    )
