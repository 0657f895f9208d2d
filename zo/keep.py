"""--keep best: which model a run writes, chosen on images held out of the training set. A part of
Trainer.

The held-out split: a tenth of the training images (VALIDATION_EVERY), and at least VALIDATION_IMAGES of them
where the training set allows, but never more than a VALIDATION_MAX_SHARE of it (the head's
initialization and the steps need the rest). Why 1000: two models of the same run disagree on a
fraction f of the held-out images, and the standard error of their accuracy difference on n images
is sqrt(f / n): for f = 0.025 (the best and the last model of a ResNet-8 EuroSAT-32 run at the
defaults) to 0.1, 0.5 to 1 point at n = 1000, where the 200 images of a 2000-image set's tenth give
1.1 to 2.2 (the issue's MobileNetV2 run kept a model 1.4 points worse than its last).

The choice: at each evaluation the model of the best held-out accuracy so far (the start included)
is kept aside; at the end it is written instead of the last model only when its lead over the last
is at least KEEP_Z standard errors of their paired difference (sqrt(discordant) / n, the images on
which exactly one of the two is right: McNemar's). A noisy held-out split then keeps the last model
instead of a lucky earlier one. Otherwise the last model is written, unless the start (the model
before the first step, kept aside too) scores higher on the held-out split: start and last are
fixed in advance, not picked as the maximum of many evaluations, so the plain comparison of the two
carries no selection bias and needs no margin. A run that training made worse on the held-out
images then writes its start instead of a worse model (measured: MobileNetV2-0.35 on CIFAR-10,
whose ridge head already fits the training images, lost 1 point on the test split at `last:3`,
docs/zo.md).
"""

from __future__ import annotations

import math

import numpy as np

from .config import VALIDATION_EVERY

VALIDATION_IMAGES = 1000
VALIDATION_MAX_SHARE = 0.25
KEEP_Z = 2.0


def held_out_rows(labels: np.ndarray) -> np.ndarray:
    """Positions of the held-out images among the training labels, sorted: max(n / VALIDATION_EVERY,
    min(VALIDATION_IMAGES, n * VALIDATION_MAX_SHARE)) of the n images, taken from each class in
    proportion to its size and evenly spaced within it (seed-free: the same for every run; per class,
    so a data set stored class after class, or cycling through the classes, gives every class its
    share)."""
    labels = np.asarray(labels)
    n = len(labels)
    if n < 2 * VALIDATION_EVERY:
        return np.zeros(0, dtype=np.int64)
    k = max(-(-n // VALIDATION_EVERY), min(VALIDATION_IMAGES, int(n * VALIDATION_MAX_SHARE)))
    rows = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        kc = int(round(k * len(members) / n))
        rows.append(members[(np.arange(kc, dtype=np.int64) * len(members)) // max(kc, 1)])
    return np.sort(np.concatenate(rows))


def paired_lead(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(accuracy of a minus accuracy of b, the standard error of that difference) from per-image
    correctness on the same images."""
    n = len(a)
    discordant = int(np.count_nonzero(a != b))
    return (int(np.count_nonzero(a)) - int(np.count_nonzero(b))) / n, math.sqrt(discordant) / n


class KeepBest:
    def split_validation(self):
        """--keep best: held_out_rows of the training images are held out (never trained on) to
        choose the model to keep; the rest is trained on. --keep last trains on all."""
        held = np.zeros(len(self.data.y_train), dtype=bool)
        if self.config.keep == "best":
            held[held_out_rows(self.data.y_train)] = True
        self.train_rows, self.val_rows = np.flatnonzero(~held), np.flatnonzero(held)
        self.best = None  # (held-out accuracy, test accuracy, integers, step, per-image correctness)
        self.latest = None  # the same of the last evaluation (the integers not kept: they are deployed)
        self.start_record = None  # the same of the evaluation before the first step

    def record_validation(self, acc: float) -> float:
        """The held-out accuracy of the deployed model (charged to the budget by the caller), and the
        best and latest records updated."""
        right = self.model.predict(self.val_cache) == self.data.y_train[self.val_rows]
        val = float(np.mean(right))
        record = (val, acc, self.deployed().copy(), self.step, right)
        if self.step == 0 and self.start_record is None:
            self.start_record = record
        if self.best is None or val > self.best[0]:
            self.best = record
        self.latest = (val, acc, None, self.step, right)
        return val

    def keep_chosen(self):
        """--keep best: the best held-out model replaces the last one before the export when its lead
        is resolved, else the start does when it is ahead of the last (module docstring);
        final_accuracy is then that model's test accuracy."""
        self.kept = None
        if self.config.keep != "best" or self.best is None or self.latest is None:
            return
        lead, se = paired_lead(self.best[4], self.latest[4])
        start = self.start_record
        if self.best[3] != self.latest[3] and lead > 0 and lead >= KEEP_Z * se:
            chosen, why = self.best, "best"
        elif start is not None and start[3] != self.latest[3] and start[0] > self.latest[0]:
            chosen, why = start, "start"
        else:
            chosen, why = self.latest, "last"
        val, acc, ints, step, _ = chosen
        if why != "last":
            self.model.set_values(self.split(ints.astype(np.float64)))
            self.final_accuracy = acc
        self.kept = {"step": step, "held_out": val, "test": acc, "lead": lead, "se": se, "why": why}

    def kept_line(self) -> str | None:
        """What --keep best chose, in one line (None with --keep last)."""
        k = getattr(self, "kept", None)
        if k is None:
            return None
        n = len(self.val_rows)
        last_val, last_acc, _, last_step, _ = self.latest
        last = f"step {last_step}: held-out {100 * last_val:.1f}%, test {100 * last_acc:.1f}%"
        under = f"{100 * k['lead']:.1f} points, under {KEEP_Z:g} standard errors ({100 * k['se']:.1f} each)"
        if k["why"] == "start":
            why = f"the start, ahead of the last model ({last}): training did not beat its start there"
            if self.best[3] != k["step"]:
                why += f"; the best held-out model (step {self.best[3]}) leads the last by {under}"
        elif k["why"] == "last":
            why = "the last model"
            if self.best[3] != last_step:
                best = f"step {self.best[3]}, {100 * self.best[0]:.1f}%"
                why += f": the best held-out one ({best}) leads it by {under}"
        else:
            why = f"ahead of the last model ({last}) by {100 * k['lead']:.1f} points, over {KEEP_Z:g} "
            why += "standard errors"
        return (
            f"kept the model of step {k['step']}: held-out {100 * k['held_out']:.1f}% ({n} training images "
            f"never trained on), test {100 * k['test']:.1f}%; {why}"
        )

    def best_state(self) -> dict:
        """The checkpoint's arrays of the records (zo/checkpoint.py's best_ prefix)."""
        out = {}
        for name, rec in (
            ("best", self.best),
            ("best_latest", self.latest),
            ("best_start", self.start_record),
        ):
            if rec is not None:
                out[f"{name}_scores"] = np.array([rec[0], rec[1], rec[3]], dtype=np.float64)
                out[f"{name}_right"] = rec[4].astype(np.uint8)
        for name, rec in (("best", self.best), ("best_start", self.start_record)):
            if rec is not None:
                out[f"{name}_ints"] = rec[2]
        return out

    def load_best_state(self, extra: dict):
        def record(name, ints):
            val, acc, step = (float(v) for v in extra[f"{name}_scores"])
            return (val, acc, ints, int(step), np.asarray(extra[f"{name}_right"], dtype=bool))

        if "best_ints" in extra:
            self.best = record("best", np.asarray(extra["best_ints"], dtype=np.int64))
        if "best_latest_scores" in extra:
            self.latest = record("best_latest", None)
        if "best_start_ints" in extra:
            self.start_record = record("best_start", np.asarray(extra["best_start_ints"], dtype=np.int64))
