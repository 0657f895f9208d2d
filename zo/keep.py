"""--keep best: which model a run writes, chosen on images held out of the training set. A part of
Trainer.

The held-out split: a tenth of the training images (VALIDATION_EVERY), and at least VALIDATION_IMAGES of them
where the training set allows, but never more than a VALIDATION_MAX_SHARE of it (the head's
initialization and the steps need the rest). Why 1000: two models of the same run disagree on a
fraction f of the held-out images, and the standard error of their accuracy difference on n images
is sqrt(f / n): for f = 0.025 (the best and the last model of a ResNet-8 EuroSAT-32 run at the
defaults) to 0.1, 0.5 to 1 point at n = 1000, where the 200 images of a 2000-image set's tenth give
1.1 to 2.2 (the issue's MobileNetV2 run kept a model 1.4 points worse than its last).

The choice, on the held-out curve smoothed over each evaluation and its two neighbours (the mean of
their per-image correctness): its peak P, among the evaluations after the start and before the last,
is written instead of the last model only when its smoothed lead over the curve's end (the last two
evaluations) is resolved: at least KEEP_Z standard errors of that paired difference (sqrt of the sum
of the per-image differences squared, / n: McNemar's for two models) after the lead is lessened by its
selection bias. P is the maximum of many smoothed values on the same images, so its lead is optimistic;
the bias is estimated by the bootstrap over the held-out images (Tibshirani and Tibshirani 2009, the
bias of a minimum cross-validated error): on each resample of the images the peak is picked again,
and its lead there less its lead on all images, averaged, is the optimism. The smoothing is what lets
a broad peak (an overfitting run: ResNet-8 CIFAR-10 `last:3`, held-out 78.0 -> 80.4 -> 78.6) be
resolved where one model's lead is not, and what keeps one lucky evaluation from being picked. P must
be resolved ahead of the start too, by the same rule. Otherwise the last model is written, unless the
start (the model before the first step, kept aside too) scores higher on the held-out split: start
and last are fixed in advance, not picked as the maximum of many evaluations, so the plain comparison
of the two carries no selection bias and needs no margin. A run that training made worse on the
held-out images then writes its start instead of a worse model (measured: MobileNetV2-0.35 on
CIFAR-10, whose ridge head already fits the training images, lost 1 point on the test split at
`last:3`, docs/zo.md).
"""

from __future__ import annotations

import math

import numpy as np

from .config import VALIDATION_EVERY

VALIDATION_IMAGES = 1000
VALIDATION_MAX_SHARE = 0.25
KEEP_Z = 2.0
RESAMPLES = 200  # bootstrap resamples of the held-out images for the peak's selection bias


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


def smoothed(rights: np.ndarray) -> np.ndarray:
    """[E - 2, n]: each interior evaluation's per-image correctness averaged with its two neighbours'
    (rights [E, n], the start first)."""
    r = np.asarray(rights, dtype=np.float64)
    return (r[:-2] + r[1:-1] + r[2:]) / 3


def peak_lead(
    rights: np.ndarray, peak: int, against: np.ndarray, seed: int = 0
) -> tuple[float, float, float]:
    """(the smoothed curve's lead at the interior evaluation `peak` (rights' row peak + 1) over `against`
    [n] (per-image correctness, or a mean of it); the standard error of that paired difference; the
    selection bias of the curve's maximum, by the bootstrap over the images: module docstring)."""
    w = smoothed(rights)
    means = w.mean(axis=1)
    d = w[peak] - np.asarray(against, dtype=np.float64)
    n = d.size
    rng = np.random.Generator(np.random.PCG64([seed, 0xB007]))
    bias = 0.0
    for _ in range(RESAMPLES):
        resampled = w[:, rng.integers(0, n, n)].mean(axis=1)
        pick = int(np.argmax(resampled))
        bias += (resampled[pick] - means[pick]) / RESAMPLES
    return float(d.mean()), float(np.sqrt(np.sum(d * d)) / n), bias


class KeepBest:
    def split_validation(self):
        """--keep best: held_out_rows of the training images are held out (never trained on) to
        choose the model to keep; the rest is trained on. --keep last trains on all."""
        held = np.zeros(len(self.data.y_train), dtype=bool)
        if self.config.keep == "best":
            held[held_out_rows(self.data.y_train)] = True
        self.train_rows, self.val_rows = np.flatnonzero(~held), np.flatnonzero(held)
        self.clear_records()

    def clear_records(self):
        # records: (held-out accuracy, test accuracy, integers, step, per-image correctness)
        self.best = None  # the smoothed curve's peak so far (its window complete)
        self.peak = -1.0  # its smoothed held-out accuracy
        self.previous = (
            None  # the evaluation before the latest, integers kept (a peak once its window closes)
        )
        self.latest = None  # the last evaluation (the integers not kept: they are deployed)
        self.start_record = None  # the evaluation before the first step
        self.curve: list[tuple] = []  # every evaluation's (held-out, test, step, correctness)

    def record_validation(self, acc: float) -> float:
        """The held-out accuracy of the deployed model (charged to the budget by the caller), and the
        records updated: the window of the evaluation before this one is now complete."""
        right = self.model.predict(self.val_cache) == self.data.y_train[self.val_rows]
        val = float(np.mean(right))
        record = (val, acc, self.deployed().copy(), self.step, right)
        if self.step == 0 and self.start_record is None:
            self.start_record = record
        self.curve.append((val, acc, self.step, right))
        if len(self.curve) >= 3:
            window = float(np.mean([c[0] for c in self.curve[-3:]]))
            if window > self.peak:
                self.best, self.peak = self.previous, window
        self.previous = record
        self.latest = (val, acc, None, self.step, right)
        return val

    def keep_chosen(self):
        """--keep best: the smoothed peak replaces the last model before the export when its lead over
        the curve's end and over the start is resolved, bias included, else the start does when it is
        ahead of the last (module docstring); final_accuracy is then that model's test accuracy."""
        self.kept = None
        if self.config.keep != "best" or self.latest is None:
            return
        start, chosen, why = self.start_record, self.latest, "last"
        lead = se = bias = 0.0
        steps = [c[2] for c in self.curve]
        if self.best is not None and len(self.curve) >= 4 and self.best[3] in steps[1:-1]:
            rights, peak = np.array([c[3] for c in self.curve]), steps.index(self.best[3]) - 1
            lead, se, bias = peak_lead(rights, peak, rights[-2:].mean(axis=0))
            ahead = lead - bias > 0 and lead - bias >= KEEP_Z * se
            if start is not None and ahead:
                lead0, se0, _ = peak_lead(rights, peak, start[4])
                ahead = lead0 - bias > 0 and lead0 - bias >= KEEP_Z * se0
            if ahead:
                chosen, why = self.best, "best"
        if why == "last" and start is not None and start[3] != self.latest[3] and start[0] > self.latest[0]:
            chosen, why = start, "start"
        val, acc, ints, step, _ = chosen
        if why != "last":
            self.model.set_values(self.split(ints.astype(np.float64)))
            self.final_accuracy = acc
        self.kept = {
            "step": step,
            "held_out": val,
            "test": acc,
            "lead": lead,
            "se": se,
            "bias": bias,
            "why": why,
        }

    def kept_line(self) -> str | None:
        """What --keep best chose, in one line (None with --keep last)."""
        k = getattr(self, "kept", None)
        if k is None:
            return None
        n = len(self.val_rows)
        last_val, last_acc, _, last_step, _ = self.latest
        last = f"step {last_step}: held-out {100 * last_val:.1f}%, test {100 * last_acc:.1f}%"
        peak = ""
        if self.best is not None and self.best[3] != k["step"]:
            peak = (
                f"the smoothed held-out curve's peak (step {self.best[3]}, {100 * self.peak:.1f}%) leads "
                f"its end by {100 * k['lead']:.1f} points, {100 * k['bias']:.1f} of them selection bias: not "
                f"resolved at {KEEP_Z:g} standard errors ({100 * k['se']:.1f} each) ahead of the end and "
                "the start"
            )
        if k["why"] == "start":
            why = f"the start, ahead of the last model ({last}): training did not beat its start there"
            why += f"; {peak}" if peak else ""
        elif k["why"] == "last":
            why = "the last model" + (f": {peak}" if peak else "")
        else:
            why = (
                f"the smoothed held-out curve's peak ({100 * self.peak:.1f}%), ahead of its end (last: "
                f"{last}) by {100 * k['lead']:.1f} points less {100 * k['bias']:.1f} of selection bias, over "
                f"{KEEP_Z:g} standard errors ({100 * k['se']:.1f} each), and ahead of the start"
            )
        return (
            f"kept the model of step {k['step']}: held-out {100 * k['held_out']:.1f}% ({n} training images "
            f"never trained on), test {100 * k['test']:.1f}%; {why}"
        )

    def best_state(self) -> dict:
        """The checkpoint's arrays of the records and the curve (zo/checkpoint.py's best_ prefix)."""
        out = {}
        records = (
            ("best", self.best), ("best_latest", self.latest), ("best_start", self.start_record),
            ("best_previous", self.previous),
        )  # fmt: skip
        for name, rec in records:
            if rec is not None:
                out[f"{name}_scores"] = np.array([rec[0], rec[1], rec[3]], dtype=np.float64)
                out[f"{name}_right"] = rec[4].astype(np.uint8)
                if name != "best_latest":
                    out[f"{name}_ints"] = rec[2]
        if self.curve:
            out["best_curve_scores"] = np.array([[c[0], c[1], c[2]] for c in self.curve], dtype=np.float64)
            out["best_curve_right"] = np.array([c[3] for c in self.curve], dtype=np.uint8)
            out["best_peak"] = np.array([self.peak])
        return out

    def load_best_state(self, extra: dict):
        """The records back; a checkpoint from before the smoothed curve has none: its curve restarts."""

        def record(name, ints):
            val, acc, step = (float(v) for v in extra[f"{name}_scores"])
            return (val, acc, ints, int(step), np.asarray(extra[f"{name}_right"], dtype=bool))

        for name, attr in (("best", "best"), ("best_start", "start_record"), ("best_previous", "previous")):
            if f"{name}_ints" in extra:
                setattr(self, attr, record(name, np.asarray(extra[f"{name}_ints"], dtype=np.int64)))
        if "best_latest_scores" in extra:
            self.latest = record("best_latest", None)
        if "best_curve_scores" in extra:
            rights = np.asarray(extra["best_curve_right"], dtype=bool)
            scores = np.asarray(extra["best_curve_scores"], dtype=np.float64)
            self.curve = [(float(v), float(a), int(st), r) for (v, a, st), r in zip(scores, rights)]
            self.peak = float(np.asarray(extra["best_peak"]).ravel()[0])
        else:
            self.best, self.previous = None, None
