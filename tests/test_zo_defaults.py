"""zo train's defaults that train (issue 53, item 6): `--trainable tail` (the head and its exact tail,
said in one line), `--keep best` on a held-out split that resolves a point and says what it kept,
and a note when the training loss is about zero from the start."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import zo.cli
from zo.keep import KEEP_Z, KeepBest, held_out_rows, paired_lead
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


class Kept(KeepBest):
    """KeepBest's choice alone: a start, a last and a best record on 1000 held-out images."""

    def __init__(self, start_right: int, last_right: int, best_right: int | None = None):
        self.config = type("Config", (), {"keep": "best"})()
        self.val_rows = np.arange(1000)
        self.written, self.final_accuracy = None, 0.0
        self.model = type("Model", (), {"set_values": lambda _, values: setattr(self, "written", values)})()

        def record(right, step, value, first):
            r = np.zeros(1000, dtype=bool)
            r[first : first + right] = True  # the start and the last model disagree on 300 + 300 images
            return (right / 1000, right / 1000 + 0.01, np.full(3, value), step, r)

        self.start_record = record(start_right, 0, 1, 0)
        self.best = self.start_record if best_right is None else record(best_right, 50, 2, 300)
        self.latest = record(last_right, 100, 3, 300)
        self.latest = self.latest[:2] + (None,) + self.latest[3:]

    def split(self, flat):
        return flat


def test_the_start_is_written_when_it_is_ahead_of_the_last_model_on_the_held_out_split():
    # 0.9 points ahead: under 2 standard errors (sqrt(600) / 1000 each), but start and last are fixed
    # in advance, so the plain comparison decides: the start, with its own test accuracy.
    run = Kept(start_right=612, last_right=603)
    run.keep_chosen()
    assert run.kept["why"] == "start" and run.kept["step"] == 0 and np.all(run.written == 1)
    assert run.final_accuracy == pytest.approx(0.622)
    assert "the start, ahead of the last model (step 100" in run.kept_line()
    # the last model ahead of the start: the last is written, nothing replaced
    run = Kept(start_right=603, last_right=612)
    run.keep_chosen()
    assert run.kept["why"] == "last" and run.written is None
    # a best model resolved ahead of the last wins over the start behind it
    run = Kept(start_right=612, last_right=603, best_right=700)
    run.keep_chosen()
    assert run.kept["why"] == "best" and np.all(run.written == 2)
    # and the start's record survives a checkpoint (zo/checkpoint.py's best_ arrays)
    again = Kept(0, 0)
    again.start_record = None
    again.load_best_state(Kept(start_right=612, last_right=603).best_state())
    assert again.start_record[3] == 0 and again.start_record[0] == pytest.approx(0.612)
    assert np.all(again.start_record[2] == 1) and np.count_nonzero(again.start_record[4]) == 612


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
