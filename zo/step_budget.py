"""What the trainer's budget counts: forward passes, and under --budget-ms the device time of each
step's fixed work in passes of equal device time (zo/cost.py prices it). A part of Trainer.

Two pricings of a step's device time:
- the hybrid trainer (`--estimator activity` with the exact head): zo/cost.step_parts, part by part
  for the layer the step perturbs: the head's pass of the trainable suffix and 2 passes of what
  follows the perturbed layer per direction (npusim's N6 latency), the local weight gradients of the
  exact tail and of the perturbed layer, the head's outer product, the write-back and the loss on
  the M55; a step that measures the rate rule's statistics forms the perturbed layer's gradient
  twice (zo/activity_step.py) and pays that local gradient once more;
- the weights estimator: its forward passes at a whole pass's time and the M55 work of
  zo/cost.step_overhead_seconds.
`overhead_seconds` is what the steps cost beyond their forward passes counted at a whole pass's time
(for the hybrid trainer it may fall: its suffix passes cost less than whole passes)."""

from __future__ import annotations

import functools

from .cost import m55_mac_seconds, step_overhead_seconds, step_parts
from .errors import ZoError


class StepBudget:
    @property
    def spent(self) -> float:
        """The budget spent, in forward passes; with --budget-ms, the device time spent (the steps' fixed
        work included) over one pass's."""
        return self.forward_passes + self.charged(self.overhead_seconds)

    def charged(self, seconds: float) -> float:
        """Fixed device work of `seconds` in the budget's unit: passes of equal device time under
        --budget-ms; nothing under --budget, which counts passes only."""
        return 0 if self.config.budget_ms is None else seconds / self.device_seconds_per_pass

    def budget_option(self) -> str:
        cfg = self.config
        if cfg.budget_ms is None:
            return f"--budget {cfg.budget}"
        per_pass = self.device_seconds_per_pass * 1e3
        return f"--budget-ms {cfg.budget_ms:g} ({self.total:.0f} forward passes of {per_pass:.3g} ms)"

    @property
    def hybrid(self) -> bool:
        """The exact head with its tail and activity perturbation below it (step_parts prices it)."""
        return self.head is not None and self.config.estimator in ("activity", "local", "guided")

    @functools.cached_property
    def hybrid_parts(self) -> dict:
        """Per layer the step perturbs (its op, None without activity layers): (fixed seconds, seconds
        per direction) of zo/cost.step_parts; under None the round robin's mean; under "exact" a step
        that perturbs no layer (q = 0: the rate rule's skip)."""
        interp, batch = self.model.interp, self.config.batch
        tensors = [p.tensor for p in self.model.params]
        position = {id(k.op): pos for pos, k in enumerate(interp.kernels)}
        layers = self.activity.layers if self.activity is not None else []
        parts = {}
        mean = step_parts(interp, tensors, 1, batch)
        parts[None] = (mean["fixed_s"], mean["per_direction_s"])
        parts["exact"] = (step_parts(interp, tensors, 1, batch, estimated=False)["fixed_s"], 0.0)
        for layer in layers:
            try:
                r = step_parts(interp, tensors, 1, batch, layer=position[id(layer.op)])
            except ZoError:  # a graph where zo/cost.py's tail differs from zo/tail.py's: the mean
                r = mean
            parts[id(layer.op)] = (r["fixed_s"], r["per_direction_s"])
        return parts

    def activity_layer_of_step(self, step: int):
        act = self.activity
        return None if act is None else act.layers[step % len(act.layers)]

    def measures_activity(self, q: int) -> bool:
        """Whether this step forms the activity layer's gradient from two halves of its directions for
        the rate rule's statistics (zo/activity_step.py)."""
        measures = getattr(self.scheduler, "measures", None)
        return self.activity is not None and q >= 2 and measures is not None and measures(self.step)

    def step_overhead(self, q: int, batches: int) -> float:
        """Device seconds of this step's work besides its forward passes at a whole pass's time."""
        block = self.block_of_step(self.step) if self.blocks else None
        head = self.head
        if getattr(self, "local", None) is not None and block is None:
            return self.local_overhead()  # zo/local_step.py
        if not self.hybrid:
            return step_overhead_seconds(
                q if block else 0, batches, block.dims if block else 0, block.size if block else 0,
                params=self.master.size, passes=self.step_passes(q, batches),
                logits=self.config.batch * self.model.num_classes,
                head_macs=self.config.batch * head.classes * head.features if head else 0,
            )  # fmt: skip
        layer = self.activity_layer_of_step(self.step) if q else None  # q = 0: the exact part alone
        key = "exact" if not q and self.activity is not None else None if layer is None else id(layer.op)
        fixed, per_direction = self.hybrid_parts[key]
        seconds = fixed + (q * per_direction if layer is not None else 0.0)
        if self.measures_activity(q):
            seconds += m55_mac_seconds(self.config.batch * layer.macs_per_image, "fp32")
        passes = 1 + (2 * q if layer is not None else 0)
        if block is not None:  # tensors the activity estimator cannot take, in weight-perturbation blocks
            zo_passes = 2 * q * batches
            seconds += zo_passes * self.device_seconds_per_pass + step_overhead_seconds(
                q, batches, block.dims, block.size, params=0, passes=zo_passes,
                logits=self.config.batch * self.model.num_classes, head_macs=0,
            )  # fmt: skip
            passes += zo_passes
        return seconds - passes * self.device_seconds_per_pass

    def step_cost_split(self, batches: int) -> tuple:
        """(what a step costs whatever q is, what each direction adds), in the budget's unit (forward
        passes; under --budget-ms, passes of equal device time): the q rule's C_s and C_p. The hybrid
        trainer's: the round robin's mean of step_parts (under --budget: the head's pass, and a
        direction's two passes), then what a step of the exact head and tail alone costs and the
        number of estimated layers taking turns (ProgressRate.observe_costs)."""
        if self.hybrid and not self.blocks:
            layers = len(self.activity.layers) if self.activity is not None else 0
            if self.config.budget_ms is None:
                return 1.0, 2.0, 1.0, layers
            unit = self.device_seconds_per_pass
            (fixed, per_direction), (exact, _) = self.hybrid_parts[None], self.hybrid_parts["exact"]
            return fixed / unit, per_direction / unit, exact / unit, layers
        one, two = self.step_overhead(1, batches), self.step_overhead(2, batches)
        per_direction = 2 * batches + self.charged(two - one)
        return (self.head is not None) + self.charged(2 * one - two), per_direction

    def validation_passes(self) -> int:
        """Forward passes of one evaluation of the held-out images (--keep best), one per mini-batch."""
        return -(-len(self.val_rows) // self.config.batch) if len(self.val_rows) else 0

    def step_passes(self, q: int, batches: int) -> int:
        """Forward passes of one step: the head's pass, 2q for the activity layer, and 2q per probed
        mini-batch for a ZO block."""
        return (
            (self.head is not None)
            + (2 * q if self.activity is not None else 0)
            + (2 * q * batches if self.blocks else 0)
            + (self.local_passes() if getattr(self, "local", None) is not None else 0)
        )

    def feature_passes(self) -> int:
        """Forward passes of the head's initialization: one per mini-batch of the training set, as
        the device would run the deployed model over it (the budget counts mini-batch passes)."""
        return -(-len(self.train_rows) // self.config.batch)
