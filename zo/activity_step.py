"""The activity-perturbation part of a hybrid step (zo/activity.py), and what it tells the rate rule
(`--q rate`, zo/schedulers.ProgressRate). A part of Trainer.

The rule needs the variance v of one direction's estimate and the signal s = |g|^2 of the layer's
weight gradient. Activity perturbation forms one weight gradient from all q directions' output
gradients, so on a step that measures (one in the rule's `every`) the q directions are split in two
groups of q_a and q_b, each group's weight gradient formed on its own (the local gradient once more,
charged by zo/step_budget.py) from its own directions, and the step's estimate is their weighted mean
(q_a A + q_b B) / q: the same 2q suffix passes, an estimate of the same kind. From the group means A
and B: E[A . B] = |g|^2 and E|A - B|^2 = v (1/q_a + 1/q_b) (schedulers.two_means_statistics).
The same step moves the exact head and tail along their exact gradient g_exact, whose progress does
not grow with q: the rule weighs it too, as E = |g_exact|^2 in the same units (loss per trainer unit
of each coordinate, the mini-batch's gradient, as s is), docs/zo.md. At q = 0 (the rule skips the
estimated layers: a step with them would make less progress per unit of cost than the exact part
alone) the step moves the exact part only."""

from __future__ import annotations

import numpy as np

from .schedulers import Progress, two_means_statistics

# The second group's directions come from steps no training step or eps measurement uses.
SECOND_GROUP = 2**41


class ActivityStep:
    def activity_gradient(
        self, q: int, values: dict, labels: np.ndarray, estimate, exact: np.ndarray
    ) -> np.ndarray:
        """This step's activity layer's estimated gradient, zero over the other activity layers; exact:
        the step's exact gradient (head and tail), whose |g|^2 the rate rule weighs beside the estimate."""
        act = self.activity
        for note in self.scheduler.__dict__.get("notes", [])[:]:  # the rate rule's skip, in one line each
            self.report(note)
            self.scheduler.notes.remove(note)
        if q == 0:  # the rate rule skips the estimated layers this step (zo/schedulers.ProgressRate)
            self.zero_differences = 0.0
            return np.zeros(act.coords.size)
        layer = self.activity_layer_of_step(self.step)
        if self.measures_activity(q):
            qa = q // 2
            a, d_a = act.gradient(values, layer, qa, self.step, labels)
            b, d_b = act.gradient(values, layer, q - qa, SECOND_GROUP + self.step, labels)
            g_layer, d = (qa * a + (q - qa) * b) / q, np.concatenate([d_a, d_b])
            signal, noise = two_means_statistics(a, b, qa, q - qa)
            progress = Progress(self.step, self.spent, self.total)
            self.scheduler.observe_estimates(progress, signal, noise, exact=float(exact @ exact))
            estimate.local_macs += len(labels) * layer.macs_per_image  # the second local gradient
        else:
            g_layer, d = act.gradient(values, layer, q, self.step, labels)
        g = np.zeros(act.coords.size)
        start = sum(c.size for other in act.layers[: act.layers.index(layer)] for c in other.coords)
        g[start : start + g_layer.size] = g_layer
        self.zero_differences = float(np.mean(d == 0))
        estimate.estimates = d.ravel()
        estimate.suffix_passes += 2 * q
        estimate.local_macs += len(labels) * layer.macs_per_image
        return g
