"""A run folder's config.json and checkpoint, written and restored (zo/checkpoint.py). A part of
Trainer."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from npusim.app import atomic

from . import checkpoint
from .errors import ZoError


class RunFiles:
    @functools.cached_property
    def identity(self) -> dict:
        """What a checkpoint must have been made with. Hashed once: checkpoints are written often."""
        identity = checkpoint.fingerprint(
            self.config.model, self.config.data, len(self.data.y_train), len(self.data.y_test)
        )
        # The mapping as resolved, not the options' spelling: "auto" and the range it found are one.
        mapping = self.mapping.describe()
        identity["input_mapping"] = {k: mapping[k] for k in ("range", "mean", "std")}
        return identity

    def write_config(self):
        config = asdict(self.config)
        config["input_mapping"] = {
            **self.mapping.describe(),
            "model_input": self.image.name,
            "model_interval": self.image.interval,
            "channels": self.image.channels,
            "layout": "NCHW" if self.image.nchw else "NHWC",
            "size": [self.image.height, self.image.width],
        }
        config["fingerprint"] = self.identity
        config["scheduler"] = self.scheduler.describe()
        atomic.write_text(self.out / "config.json", json.dumps(config, indent=2))

    def save_checkpoint(self):
        """checkpoints/last.npz from the current state (zo/checkpoint.py)."""
        meta = {
            "step": self.step,
            "forward_passes": self.forward_passes,
            "overhead_seconds": self.overhead_seconds,
            "wall": self.wall(),
            "metric_rows": self.metrics.rows,
            "dead_steps": self.dead_steps,
            "next_eval": self.next_eval,
            "last_eval_passes": self.last_eval_passes,
            "final_accuracy": self.final_accuracy,
            "scheduler": self.scheduler.state(),
            "fingerprint": self.identity,
            "params": [p.name for p in self.model.params],
            "config": asdict(self.config),
        }
        ints = np.concatenate([v.astype(np.int64).ravel() for v in self.model.values()])
        state = dict(self.optimizer.state())
        if self.head_optimizer is not None:
            state.update({f"head_{k}": v for k, v in self.head_optimizer.state().items()})
        state.update(self.best_state())
        if getattr(self, "activity", None) is not None:
            state["activity_signal"] = self.activity.state()
        if getattr(self, "local", None) is not None:
            state["activity_local_heads"] = self.local.state()
        checkpoint.save(self.out, meta, self.master, ints, state)

    def load_checkpoint(self, directory: Path):
        """Restore a run. Everything is read and checked before anything is applied: a damaged,
        foreign or mismatched checkpoint is a one-line ZoError and leaves the file untouched."""
        r = checkpoint.validate(
            checkpoint.load(directory),
            self.config,
            self.identity,
            [p.name for p in self.model.params],
            self.master.size,
        )
        self.master = r.master
        self.model.set_values(self.split(r.ints))
        self.optimizer = r.optimizer
        try:
            if self.head_optimizer is not None:
                self.head_optimizer.load({k[5:]: v for k, v in r.extra.items() if k.startswith("head_")})
            self.load_best_state(r.extra)
            if getattr(self, "activity", None) is not None and "activity_signal" in r.extra:
                self.activity.load(r.extra["activity_signal"])
            if getattr(self, "local", None) is not None and "activity_local_heads" in r.extra:
                self.local.load(r.extra["activity_local_heads"])
        except (KeyError, ValueError, TypeError) as e:
            raise ZoError(f"{checkpoint.damaged_message(directory)} ({type(e).__name__}: {e})") from None
        self.scheduler.load(r.scheduler_state)
        self.step, self.forward_passes, self.overhead_seconds = r.step, r.forward_passes, r.overhead_seconds
        self.metrics.rows, self.next_eval, self.dead_steps = r.metric_rows, r.next_eval, r.dead_steps
        self.wall_offset, self.last_eval_passes, self.final_accuracy = (
            r.wall,
            r.last_eval_passes,
            r.final_accuracy,
        )
        checkpoint.truncate_csv(self.metrics.path, self.metrics.rows)
