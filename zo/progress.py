"""What `zo train` shows while it runs, on stderr.

On a terminal, one status line redrawn in place at most REDRAWS_PER_S times a second (a step of a
small model takes milliseconds: redrawing each one costs more than the step and flickers). Anywhere
else (a log file, a pipe, CI), no carriage returns: one full line per test evaluation (every
--eval-every forward passes, 20 lines over a run by default), so a log reads as a table.
"""

from __future__ import annotations

import math
import sys
import time

REDRAWS_PER_S = 4


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def percent(accuracy: float) -> str:
    return "-" if not math.isfinite(accuracy) else f"{100 * accuracy:.1f}%"


class StatusLine:
    """The run's progress: passes of the budget, step, q, loss, the last test accuracy and the ETA
    (from this session's rate: a resumed run does not count the passes it did not spend)."""

    def __init__(self, budget: float, stream=None, clock=time.monotonic, ms_per_pass: float | None = None):
        """budget: in forward passes, compared with the trainer's `spent`; ms_per_pass set
        (--budget-ms): both shown as device milliseconds."""
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.budget, self.clock, self.ms_per_pass = budget, clock, ms_per_pass
        self.start = None  # (time, forward passes) when this session's first step was seen
        self.drawn_at = -math.inf
        self.logged_eval = None
        self.width = 0

    def text(self, trainer, q: int, loss: float) -> str:
        passes = trainer.spent
        now = self.clock()
        if self.start is None:
            self.start = (now, passes)
        spent, done = now - self.start[0], passes - self.start[1]
        eta = (self.budget - passes) * spent / done if done > 0 else math.nan
        if self.ms_per_pass is None:
            amount = f"{passes}/{self.budget} passes"
        else:
            amount = f"{passes * self.ms_per_pass:.0f}/{self.budget * self.ms_per_pass:.0f} device ms"
        # q means nothing to a run without an estimated part (the head and its exact tail): "-"
        estimated = getattr(trainer, "blocks", True) or getattr(trainer, "activity", None) is not None
        shown = q if estimated else "-"
        return (
            f"zo train {100 * passes / self.budget:3.0f}%  {amount}  "
            f"step {trainer.step}  q {shown}  loss {loss:.4f}  test {percent(trainer.final_accuracy)}  "
            f"ETA {duration(eta)}"
        )

    def update(self, trainer, q: int, loss: float):
        """After each step."""
        if self.tty:
            if self.clock() - self.drawn_at < 1.0 / REDRAWS_PER_S and trainer.spent < self.budget:
                return
            line = self.text(trainer, q, loss)
            self.stream.write("\r" + line.ljust(self.width))
            self.width = len(line)
            self.drawn_at = self.clock()
        else:
            line = self.text(trainer, q, loss)  # keeps the ETA's start at the first step
            evaluated = trainer.last_eval_passes
            if evaluated != self.logged_eval and evaluated == trainer.forward_passes:
                self.logged_eval = evaluated
                self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()
