"""zo train's defaults that train (issue 53, item 6): `--trainable tail` (the head and its exact tail,
said in one line), `--keep best` on a held-out split that resolves a point and says what it kept,
and a note when the training loss is about zero from the start."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import zo.cli
from zo.keep import KEEP_Z, held_out_rows, paired_lead
from zo.trainer import TrainConfig, Trainer

from zo_fixtures import deep_classifier


@pytest.fixture
def deep(tmp_path):
    """The tiny classifier with two 1x1 convs: the upper one is the exact tail, the lower one below it."""
    return deep_classifier(tmp_path)


def train(model, data, out, *extra):
    args = ["train", "--model", model, "--data", data, "--out", out, "--batch", 16, "--budget", 400]
    return CliRunner().invoke(zo.cli.main, [str(a) for a in args + list(extra)])


def test_the_default_trains_the_head_and_its_exact_tail_and_says_so(deep, tmp_path):
    model, data = deep
    result = train(model, data, tmp_path / "run")
    assert result.exit_code == 0, result.output + result.stderr
    said = [line for line in result.stderr.splitlines() if "trains the head" in line]
    assert said == [
        "zo train: trains the head and its exact tail: conv1/weights (only parameter-free ops lie between "
        "them and the head, so one forward pass gives their exact gradients; --trainable tail); "
        "--trainable last:K to change"
    ]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["trainable"] == "tail"
    # the head and the upper conv (weights and biases); the lower conv, behind a weighted layer, is not
    t = Trainer(TrainConfig(model=str(model), data=str(data), trainable="tail"), tmp_path / "api")
    assert [p.name for p in t.model.params if not p.is_bias][:1] == ["conv1/weights"]
    assert t.activity is None and not t.blocks and t.tail is not None
    # --trainable last:K still trains more, with the gradients line
    deeper = train(model, data, tmp_path / "deeper", "--trainable", "last:3")
    assert deeper.exit_code == 0 and "trains the head" not in deeper.stderr
    assert "estimated by activity perturbation" in deeper.stderr


def test_the_held_out_split_resolves_a_point_where_the_training_set_allows():
    def sizes(n, classes=10):
        return len(held_out_rows(np.arange(n) % classes))

    assert sizes(10_000) == 1000 and sizes(5_000) == 1000 and sizes(2_000) == 500  # a quarter at most
    assert sizes(100_000) == 10_000 and sizes(10) == 0  # a tenth at least
    for labels in (np.arange(2_000) % 10, np.repeat(np.arange(10), 200)):  # cycling, or class after class
        rows = held_out_rows(labels)
        assert np.array_equal(np.bincount(labels[rows]), np.full(10, 50))  # every class its share
        assert len(set(rows.tolist())) == len(rows)
    blocks = np.repeat(np.arange(10), 1000)  # EuroSAT-32's 10,000: every tenth image of each class
    assert np.array_equal(held_out_rows(blocks), np.arange(0, 10_000, 10))


def test_an_earlier_model_is_kept_only_when_its_lead_is_resolved():
    last = np.zeros(1000, dtype=bool)
    last[:800] = True
    small = last.copy()
    small[800:815] = True  # 15 images more: 1.5 points, se sqrt(15) / 1000 = 0.39 points
    lead, se = paired_lead(small, last)
    assert lead == pytest.approx(0.015) and lead >= KEEP_Z * se
    noisy = last.copy()
    noisy[800:840] = True
    noisy[:30] = False  # 40 right and 30 wrong more: 1 point ahead, se sqrt(70) / 1000 = 0.84 points
    lead, se = paired_lead(noisy, last)
    assert lead == pytest.approx(0.01) and lead < KEEP_Z * se


def test_keep_best_says_which_step_it_kept_and_never_contradicts_the_progress_line(deep, tmp_path):
    model, data = deep
    result = train(model, data, tmp_path / "run")
    assert result.exit_code == 0
    kept, final = result.output.splitlines()[-2:]
    assert kept.startswith("kept the model of step ") and "held-out" in kept and "test" in kept
    step = int(kept.split("step ")[1].split(":")[0])
    test = kept.split("test ")[1].split("%")[0]
    assert final.split(" -> ")[1].startswith(f"{test}%")  # the final figure is the kept model's
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    evals = [dict(zip(header, r.split(","))) for r in rows[1:]]
    evals = [r for r in evals if r["test_accuracy"]]
    at = [r for r in evals if int(r["step"]) == step]
    assert at and f"{100 * float(at[-1]['test_accuracy']):.1f}" == test  # as the metrics logged it


def test_a_loss_about_zero_from_the_start_gets_one_note(deep, tmp_path):
    model, data = deep
    lines = []
    t = Trainer(TrainConfig(model=str(model), data=str(data), batch=16, budget=400), tmp_path / "run",
                report=lines.append)  # fmt: skip
    lines.clear()
    t.note_fitted(0.2)
    assert lines == []
    t.note_fitted(0.00002)
    assert len(lines) == 1 and lines[0].startswith("note: the training loss is 0.0000 at the first step: ")
    assert "the fresh head (ridge) already fits the training images" in lines[0]
