"""What the trainer's budget counts: forward passes, and under --budget-ms the device time of each
step's fixed work in passes of equal device time (zo/cost.py prices it). A part of Trainer."""

from __future__ import annotations

from .cost import step_overhead_seconds


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

    def step_overhead(self, q: int, batches: int) -> float:
        """Device seconds of this step's work besides its forward passes (zo/cost.py)."""
        block = self.block_of_step(self.step) if self.blocks else None
        head = self.head
        return step_overhead_seconds(
            q if block else 0, batches, block.dims if block else 0, block.size if block else 0,
            params=self.master.size, passes=self.step_passes(q, batches),
            logits=self.config.batch * self.model.num_classes,
            head_macs=self.config.batch * head.classes * head.features if head else 0,
        )  # fmt: skip

    def step_cost_split(self, batches: int) -> tuple[float, float]:
        """(what a step costs whatever q is, what each direction adds), in the budget's unit (forward
        passes; under --budget-ms, passes of equal device time): the q rule's C_s and C_p."""
        one, two = self.step_overhead(1, batches), self.step_overhead(2, batches)
        per_direction = 2 * batches + self.charged(two - one)
        return (self.head is not None) + self.charged(2 * one - two), per_direction

    def validation_passes(self) -> int:
        """Forward passes of one evaluation of the held-out images (--keep best), one per mini-batch."""
        return -(-len(self.val_rows) // self.config.batch) if len(self.val_rows) else 0

    def step_passes(self, q: int, batches: int) -> int:
        """Forward passes of one step: the head's pass, and 2q per probed mini-batch for a ZO block."""
        zo = self.blocks or self.activity is not None
        return (self.head is not None) + (2 * q * batches if zo else 0)

    def feature_passes(self) -> int:
        """Forward passes of the head's initialization: one per mini-batch of the training set, as
        the device would run the deployed model over it (the budget counts mini-batch passes)."""
        return -(-len(self.train_rows) // self.config.batch)
