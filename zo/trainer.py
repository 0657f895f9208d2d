"""Zeroth-order training of a deployed int8 model, every forward pass on npusim.

One step, on one mini-batch (the frozen prefix's activations cached):
- the classifier (when trainable) takes its exact gradient from one forward pass as deployed: its
  input features and the softmax error, no backward pass through the NPU (zo/head_grad.py);
- the trainable tensors below it are estimated by ZO, one block a step (zo/blocks.py): q integer
  directions u_i from (seed, step, i) over that block; the loss at w + eps*u_i and w - eps*u_i
  (2q forward passes, run as one batched call of the trainable suffix with stacked perturbed
  weights); d_i = (L+ - L-) / (2 eps), eps measured per block; g = (1/q) sum d_i u_i / E[u^2].
The step rules move a float64 master copy (in integer steps of each tensor's unit), or with
--master none the integer codes themselves by stochastic rounding; the int8 weights / int32 biases
are written back with fixed scales.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from npusim import NpusimError, load_model, write_model
from npusim.app import atomic, interrupt
from npusim.formats.model_io import model_suffix
from npusim.npu import plan_device
from npusim.runtime.interpreter import check_int8

from . import blocks as zo_blocks
from . import head_init
from .activity import ActivityEstimator
from .activity_step import ActivityStep
from .config import (  # noqa: F401 (re-exported: the API imports them from here)
    CALIBRATION_IMAGES,
    DEAD_STEPS,
    DEFAULT_LR,
    FITTED_LOSS,
    HEAD_LR,
    HEAD_SCHEDULE,
    INITIALIZED_LR,
    MAX_IMAGES_PER_CALL,
    VALIDATION_EVERY,  # noqa: F401 (re-exported)
    TrainConfig,
    default_lr,
)
from .data import Dataset, load_dataset, subset
from .errors import ZoError
from .estimate import StepEstimate
from .float_ops import FLOAT_OPS
from .head_grad import ExactHead
from .inputs import SATURATION_WARNING, model_inputs
from .keep import KeepBest
from .local_step import LocalStep
from .loss import group_losses
from .metrics import MetricsLog
from .model import (  # noqa: F401 (build_model, calibration_indices: re-exported)
    TrainableModel,
    build_model,
    calibration_indices,
    check_trainable,
    fresh_head_wanted,
    input_mapping,
)
from .optim import OPTIMIZERS, Adam, learning_rate, make_optimizer
from .perturbation import direction, second_moment
from .run_files import RunFiles
from .schedulers import EfficiencyTest, FixedQ, Progress, ProgressRate, Scheduler, direction_statistics
from .step_budget import StepBudget
from .tail import ExactTail


class Trainer(StepBudget, RunFiles, KeepBest, ActivityStep, LocalStep):
    def __init__(
        self,
        config: TrainConfig,
        out_dir: str | Path,
        dataset: Dataset | None = None,
        scheduler: Scheduler | None = None,
        caches: tuple[dict, dict] | None = None,
        warn=None,
        report=None,
    ):
        """dataset and caches (the prefix activations of train and test) let a sweep share them across runs;
        warn(message) reports what the user should know (default: a line on stderr); report(message)
        says what each step of the setup does (default: nothing). Ctrl-C in the setup is a
        KeyboardInterrupt, never another exception (npusim/app/interrupt.py)."""
        self.warn = warn or (lambda message: print(f"warning: {message}", file=sys.stderr, flush=True))
        self.report = report or (lambda message: None)
        with interrupt.guarded():
            self._set_up(config, out_dir, dataset, scheduler, caches)

    def _read(self, config, dataset):
        """(the model's graph, the data set: `dataset` if given, else --data's file)."""
        self.report(f"reading the model {config.model}")
        try:
            graph = load_model(config.model)
            check_int8(graph)  # before the input checks: a float or uint8 model says what it is
        except NpusimError as e:
            raise ZoError(str(e)) from None
        check_trainable(config.trainable, graph)  # before the data set is read
        if dataset is None:
            self.report(f"reading the data {config.data}")
            dataset = load_dataset(config.data)
            if config.train_size or config.test_size:
                dataset = subset(dataset, config.train_size, config.test_size, seed=0)
        return graph, dataset

    def _head_wanted(self, config, graph, data) -> bool:
        """Whether a fresh head replaces the model's; --keep-head with another class count is refused."""
        classes = graph.output().shape[-1]
        if config.keep_head and data.num_classes != classes:
            raise ZoError(
                f"--keep-head: the model's head has {classes} classes, the data {data.num_classes}; "
                "expected the same count (or leave --keep-head out for a fresh head)"
            )
        fresh = fresh_head_wanted(config, graph) or data.num_classes != classes
        if fresh and not config.new_head and data.num_classes == classes:
            self.report(
                f"the model's head has {classes} classes like the data; a fresh head fitted to the data "
                "replaces it (--keep-head keeps the model's own)"
            )
        return fresh

    def _set_up(self, config, out_dir, dataset, scheduler, caches):
        config.validate()
        self.config = config
        self.out = Path(out_dir)
        graph, data = self._read(config, dataset)
        self.data = data
        self.split_validation()
        fresh = self._head_wanted(config, graph, data)
        calibrated = len(calibration_indices(len(data.y_train)))
        head = f", with a fresh head quantized from the features of {calibrated} training images"
        self.report(
            f"{len(data.y_train)} training and {len(data.y_test)} test images, {data.num_classes} classes; "
            f"preparing the {config.profile} interpreter and the trainable layers {config.trainable}"
            + (head if fresh else "")
        )
        self.model, self.image, self.mapping = build_model(config, graph, data)
        interrupt.check()
        clipped = model_inputs(data.x_train[: config.batch], self.image, self.mapping)[1]
        if clipped > SATURATION_WARNING:
            self.warn(
                f"{clipped:.1%} of the first batch's input values are clipped to the {self.image.dtype.name} "
                f"limits with the input mapping {self.mapping}; check --input-range or --mean/--std"
            )
        self.scheduler = scheduler or config.make_scheduler()
        # What the device pays per forward pass of a mini-batch, kept apart from simulator wall time.
        self.macs_per_pass = self.model.interp.macs() * config.batch
        self.device_seconds_per_pass = plan_device(self.model.interp).latency_s(batch=config.batch)
        # The budget in forward passes; --budget-ms as the passes its device time buys (see spent).
        self.total = (
            config.budget
            if config.budget_ms is None
            else config.budget_ms / 1e3 / self.device_seconds_per_pass
        )
        self.overhead_seconds = 0.0  # device time of the steps beyond their passes at a whole pass's
        if not OPTIMIZERS[config.optimizer].step_grows_with_q and not isinstance(
            self.scheduler, (FixedQ, EfficiencyTest, ProgressRate)
        ):
            # Measured, not assumed: the steprules grid of the study (experiments/results/earlier-studies.md).
            self.warn(
                f"--q {config.q} with --optimizer {config.optimizer}: this q rule assumes nsgd's step, "
                "which grows with q; with a step that does not, the slope test and the ramps ended 1.5 to "
                "14 points under the best fixed q in the study (experiments/results/earlier-studies.md); "
                "use --q qscheduler (the efficiency test under this step rule) or a fixed q"
            )
        first_step = 2 * self.scheduler.next_q(Progress(0, 0, self.total))  # at most; checked again below
        fresh = self.model.head_op is not None and config.head_init != "zero"
        init = self.feature_passes() if fresh else 0
        if self.total < first_step + init:
            head = f" and the head's initialization ({init})" if init else ""
            raise ZoError(f"{self.budget_option()}: below one step ({first_step} forward passes){head}")
        # The frozen prefix never changes: its outputs are computed once for the whole data set.
        if caches is None:
            self.report(
                f"{self.model.size:,} trainable parameters; running the frozen prefix "
                f"({len(self.model.prefix)} ops) once over the {len(data.y_train) + len(data.y_test)} images"
            )
            caches = (
                self.model.boundary_activations(self.inputs_of(data.x_train)),
                self.model.boundary_activations(self.inputs_of(data.x_test)),
            )
        self.train_cache, self.test_cache = caches
        self.val_cache = {t: v[self.val_rows] for t, v in self.train_cache.items()}
        # The fresh head as deployed before any training (zero): the back-propagation bound's start.
        self.uninitialized = [v.copy() for v in self.model.values()]
        self.init_passes = self.initialize_head() if self.model.head_op is not None else 0
        self.units = np.concatenate(
            [
                np.full(v.size, p.unit, dtype=np.float64)
                for p, v in zip(self.model.params, self.model.values())
            ]
        )
        self.master = np.concatenate([v.astype(np.float64).ravel() for v in self.model.values()]) / self.units
        self.bounds = np.concatenate(
            [np.full(v.size, p.bound / p.unit) for p, v in zip(self.model.params, self.model.values())]
        )
        self.head, self.blocks = self.partition()
        self.optimizer = make_optimizer(config.optimizer, self.master.size, config.momentum)
        if config.master == "none":
            self.optimizer.momentum = 0.0  # no buffer beside the codes: the device keeps none
        # The coordinates of the head's Adam, in the order their gradient is concatenated: the head,
        # its exact tail, the activity-perturbed layers.
        self.exact_coords = (
            None
            if self.head is None
            else np.concatenate(
                [self.head.coords]
                + ([self.tail.coords] if self.tail is not None else [])
                + ([self.activity.coords] if self.activity is not None else [])
                + ([self.local.coords] if self.local is not None else [])
            )
        )
        self.head_optimizer = Adam(len(self.exact_coords)) if self.head is not None else None
        self.u_moment = second_moment(config.direction)
        self.step = 0
        self.forward_passes = self.init_passes  # the head's initialization is paid from the budget
        measured = self.calibrate_eps()
        self.forward_passes += measured
        first = self.step_passes(self.scheduler.next_q(Progress(0, 0, self.total)), 1)
        setup = self.forward_passes + 2 * self.validation_passes()
        if self.total < setup + first:
            raise ZoError(
                f"{self.budget_option()}: below one step ({first} forward passes) after the setup's "
                f"{setup}: the head's initialization ({self.init_passes}), the eps measurement ({measured}) "
                f"and two evaluations of the held-out images ({2 * self.validation_passes()}, --keep best)"
            )
        self.wall_offset = 0.0
        self.eval_every = config.eval_every or max(int(self.total) // 20, 1)
        self.next_eval = 0
        self._perm_epoch, self._perm = -1, None
        self.zero_differences = 0.0  # of the last step's probe pairs
        self.last_estimate = StepEstimate()  # what the last step measured and cost (zo/estimate.py)
        self.dead_steps = 0  # consecutive steps in which every probe pair gave L+ == L-
        self.last_lr = learning_rate(config.learning_rate, config.lr_schedule, 0.0)
        self.last_eval_passes, self.final_accuracy = -1, float("nan")
        self.wall = lambda: self.wall_offset
        self.metrics = MetricsLog(self.out / "metrics.csv")

    # -- where the forward passes go -------------------------------------------------------------
    def partition(self) -> tuple[ExactHead | None, list]:
        """The exact-gradient head (or None) and the ZO blocks: every trainable tensor outside the head
        and its exact tail (self.tail, zo/tail.py)."""
        offsets = self.flat_offsets()
        head = ExactHead.find(self.model, offsets) if self.config.head_gradient == "exact" else None
        # --estimator weights (and pure ZO, --head-gradient zo): every tensor below the head in ZO blocks.
        activity = head is not None and self.config.estimator in ("activity", "local", "guided")
        self.tail = ExactTail.find(self.model, head, offsets) if activity else None
        taken = set() if head is None else set(head.op.inputs[1:3])
        if self.tail is not None:
            taken |= {t for f in self.tail.layers for t in f.op.inputs[1:3]}
        below = []
        if activity:  # the layers whose weights are trainable, outside head and tail: activity perturbation
            ops = {k.op.index: k.op for k in self.model.suffix}
            for p in self.model.params:
                op = ops[p.op_index]
                if p.tensor not in taken and not p.is_bias and op.kind in FLOAT_OPS:
                    below.append(FLOAT_OPS[op.kind](op, self.model.graph))
                    taken |= {t for t in op.inputs[1:3] if t in offsets}
        estimated = below and self.config.estimator == "activity"
        self.activity = ActivityEstimator(self.model, below, offsets, self.config.seed) if estimated else None
        self.local = self.make_local(below, offsets)  # --estimator local|guided (zo/local_step.py)
        blocks = self.weight_blocks(offsets, taken)
        self.report(self.describe_training(head, blocks))
        return head, blocks

    def weight_blocks(self, offsets: dict, taken: set) -> list:
        """The ZO blocks (zo/blocks.py) of the trainable tensors outside `taken`, as weight perturbation
        moves them (a channel subspace with --zo-subspace channels). offsets: tensor -> (start, end) in
        the flat vector."""
        tensors = self.model.graph.tensors
        blocks = []
        for p in self.model.params:
            if p.tensor in taken:
                continue
            t = tensors[p.tensor]
            axis = None
            if not p.is_bias and self.config.zo_subspace == "channels":
                axis = t.quant.axis if t.quant is not None and t.quant.scale.size > 1 else 0
            block = zo_blocks.Block(p.name, *offsets[p.tensor], self.config.eps or 1)
            block.shape, block.channel_axis = tuple(t.shape), axis
            blocks.append(block)
        return blocks

    def flat_offsets(self) -> dict:
        """Each trainable tensor's (start, end) in the flat vector of trainable values."""
        offsets, i = {}, 0
        for p, v in zip(self.model.params, self.model.values()):
            offsets[p.tensor] = (i, i + v.size)
            i += v.size
        return offsets

    def describe_training(self, head, blocks) -> str:
        """One line: what each trainable layer's gradient is and why."""
        if self.config.trainable == "tail" and head is not None and self.activity is None and not blocks:
            if self.tail is None:
                return (
                    "trains the head alone: no layer reaches it through parameter-free ops only "
                    "(--trainable tail); --trainable last:K trains more, estimated below the head"
                )
            names = ", ".join(f.inputs[1].name for f in self.tail.layers)
            return (
                f"trains the head and its exact tail: {names} (only parameter-free ops lie between them "
                "and the head, so one forward pass gives their exact gradients; --trainable tail); "
                "--trainable last:K to change"
            )
        parts = []
        if head is not None:
            parts.append("the head: exact (its features and softmax error, one pass)")
        if self.tail is not None:
            names = ", ".join(f.inputs[1].name for f in self.tail.layers)
            parts.append(f"exact tail {names}: exact (only parameter-free ops lie between it and the head)")
        if self.activity is not None:
            names = ", ".join(layer.name for layer in self.activity.layers)
            parts.append(f"{names}: estimated by activity perturbation (2q suffix passes, one layer a step)")
        parts += self.local_description()
        if blocks:
            parts.append(f"{len(blocks)} tensor(s): estimated by weight perturbation (2q passes a step)")
        return "gradients: " + "; ".join(parts)

    def calibrate_eps(self) -> int:
        """Each ZO block's eps from d(eps) against d(2 eps) (zo/blocks.py), unless --eps is given;
        returns the forward passes it cost."""
        if self.activity is not None:
            return self.calibrate_activity_eps()
        if self.local is not None:
            return self.calibrate_local()
        if self.config.eps is not None or not self.blocks:
            return 0
        rng = np.random.Generator(np.random.PCG64([self.config.seed, 0xCA1B]))
        rows = self.train_rows
        indices = rows[rng.choice(len(rows), min(self.config.batch, len(rows)), replace=False)]
        return zo_blocks.measure_eps(
            self.blocks,
            self.deployed(),
            self.units,
            lambda stacked: self.losses_at(stacked, indices),
            lambda k, i, dims: direction(self.config.seed, 2**40 + k, i, dims, self.config.direction),
            interrupt.check,
        )

    def calibrate_activity_eps(self) -> int:
        """The activity layers' eps (LSB of each layer's output), measured as the blocks' are, on one
        mini-batch; --eps fixes it. Returns the forward passes spent."""
        if self.config.eps is not None:
            for layer in self.activity.layers:
                layer.eps = self.config.eps
            return 0
        rng = np.random.Generator(np.random.PCG64([self.config.seed, 0xCA1B]))
        rows = self.train_rows
        indices = rows[rng.choice(len(rows), min(self.config.batch, len(rows)), replace=False)]
        values = {t: v[indices] for t, v in self.train_cache.items()}
        self.model.interp.evaluate(values, self.model.suffix)
        return 1 + self.activity.measure_eps(values, self.data.y_train[indices], interrupt.check)

    # -- the fresh head's initialization -----------------------------------------------------------
    def initialize_head(self) -> int:
        """Fill the fresh head from the features of the training images (zo/head_init.py); returns
        the forward passes it cost."""
        cfg = self.config
        if cfg.head_init == "zero":
            return 0
        self.report(f"initializing the fresh head ({cfg.head_init}) from the features of the training images")
        features = self.model.head_features({t: v[self.train_rows] for t, v in self.train_cache.items()})
        self.head_clamped = head_init.initialize(
            self.model, features, self.data.y_train[self.train_rows], cfg.head_init, self.warn
        )
        return self.feature_passes()

    # -- data ---------------------------------------------------------------------------------
    def inputs_of(self, x_uint8: np.ndarray) -> np.ndarray:
        """uint8 RGB images -> the model's input values, with this run's input mapping."""
        return model_inputs(x_uint8, self.image, self.mapping)[0]

    def batch_indices(self, step: int) -> np.ndarray:
        """Mini-batch of a step: a function of (seed, step) only, so resumed runs see the same batches."""
        n = len(self.train_rows)
        b = min(self.config.batch, n)
        per_epoch = n // b
        epoch, k = divmod(step, per_epoch)
        if epoch != self._perm_epoch:
            self._perm = np.random.Generator(np.random.PCG64([self.config.seed, epoch, 0xDA7A])).permutation(
                n
            )
            self._perm_epoch = epoch
        return self.train_rows[self._perm[k * b : (k + 1) * b]]

    def second_batch_indices(self, step: int) -> np.ndarray:
        """The other mini-batch of a paired step (a scheduler's probe of the data noise): drawn from
        (seed, step) alone, apart from the epoch order, so it is the same in every run of the seed."""
        n = len(self.train_rows)
        rng = np.random.Generator(np.random.PCG64([self.config.seed, step, 0xB2]))
        return self.train_rows[rng.choice(n, min(self.config.batch, n), replace=False)]

    # -- the estimator ----------------------------------------------------------------------------
    def split(self, flat: np.ndarray) -> list[np.ndarray]:
        out, i = [], 0
        for v in self.model.values():
            out.append(flat[i : i + v.size].reshape(v.shape))
            i += v.size
        return out

    def block_of_step(self, step: int):
        return self.blocks[step % len(self.blocks)]

    def probe_losses(self, q: int, indices: np.ndarray, block) -> tuple[np.ndarray, np.ndarray]:
        """Losses L(w + eps u_i) and L(w - eps u_i), i < q, u_i over the block's coordinates, on one
        mini-batch, in batched suffix calls."""
        cfg = self.config
        ints = self.deployed()
        units, values = self.units[block.start : block.end], ints[block.start : block.end]
        per_call = max(MAX_IMAGES_PER_CALL // (2 * len(indices)), 1)
        losses = np.empty(2 * q)
        for i0 in range(0, q, per_call):
            i1 = min(i0 + per_call, q)
            stacked = np.repeat(ints[None], 2 * (i1 - i0), axis=0)
            for i in range(i0, i1):
                u = direction(cfg.seed, self.step, i, block.dims, cfg.direction)
                delta = block.delta(u, values, block.eps, units)
                stacked[2 * (i - i0), block.start : block.end] += delta
                stacked[2 * (i - i0) + 1, block.start : block.end] -= delta
            losses[2 * i0 : 2 * i1] = self.losses_at(stacked, indices)
        return losses[0::2], losses[1::2]

    def deployed(self) -> np.ndarray:
        return np.concatenate([v.astype(np.int64).ravel() for v in self.model.values()])

    def losses_at(self, stacked: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """The mini-batch loss of each row of stacked (a full set of trainable integers), in one call."""
        boundary = {t: v[indices] for t, v in self.train_cache.items()}
        logits = self.model.logits(boundary, self.grouped_overrides(stacked))
        return group_losses(logits, self.data.y_train[indices], stacked.shape[0])

    def taylor_terms(self, start: np.ndarray, update: np.ndarray) -> tuple[float, float]:
        """The first- and second-order terms of the loss change that `update` makes from master copy
        `start`: (-g . update, update' H update / 2), from L(start + d), L(start - d) and L(start) on
        a mini-batch that never saw the update (3 forward passes). The probe d is the update scaled
        to the SPSA probes' size (RMS eps) and stochastically rounded to integers, so its
        expectation is exactly the scaled update."""
        cfg = self.config
        rms = float(np.sqrt(np.mean(np.square(update))))
        if rms == 0.0:
            return 0.0, 0.0
        scale = self.block_of_step(self.step - 1).eps / rms
        rng = np.random.Generator(np.random.PCG64([cfg.seed, self.step, 0xF1]))
        delta = np.floor(scale * update * self.units + rng.random(update.size)).astype(np.int64)
        ints = np.rint(start * self.units).astype(np.int64)
        plus, minus, here = self.losses_at(
            np.stack([ints + delta, ints - delta, ints]), self.second_batch_indices(self.step)
        )
        return -(plus - minus) / (2.0 * scale), (plus + minus - 2.0 * here) / (2.0 * scale**2)

    def grouped_overrides(self, stacked: np.ndarray) -> dict:
        """Per trainable tensor a [G, ...] array of its G versions (rows of stacked), clipped to the
        tensor's bounds; the interpreter groups what else the grouped ops read (run_grouped)."""
        g = stacked.shape[0]
        overrides, i = {}, 0
        for p, v in zip(self.model.params, self.model.values()):
            block = stacked[:, i : i + v.size]
            i += v.size
            overrides[p.tensor] = np.clip(block, -p.bound, p.bound).astype(v.dtype).reshape((g,) + v.shape)
        return overrides

    def gradient(self, q: int, derivatives: np.ndarray, block) -> np.ndarray:
        """g = (1/q) sum_i d_i u_i / E[u^2] over the block's dims, as a move of its values (zero
        elsewhere), regenerating each u_i from its seed (never stored)."""
        sub, squares = np.zeros(block.dims), 0.0
        for i in range(q):
            one = derivatives[i] * direction(
                self.config.seed, self.step, i, block.dims, self.config.direction
            )
            sub += one
            squares += float(np.dot(one, one))
        if getattr(self.scheduler, "wants_estimates", False) and q >= 2:
            # per-direction estimates g_i = d_i u_i / E[u^2], streamed (schedulers.direction_statistics)
            signal, noise = direction_statistics(sub / self.u_moment, squares / self.u_moment**2, q)
            self.scheduler.observe_estimates(Progress(self.step, self.spent, self.total), signal, noise)
        g = np.zeros(self.master.size)
        values = self.deployed()[block.start : block.end]
        g[block.start : block.end] = block.lift(sub / (q * self.u_moment), values)
        return g

    def write_back(self):
        """Master copy -> deployed integers, scales untouched. Nearest rounding is the default: the
        master copy keeps sub-step updates, so they accumulate instead of rounding to zero."""
        scaled = self.master * self.units
        if self.config.rounding == "stochastic" or self.config.master == "none":
            rng = np.random.Generator(np.random.PCG64([self.config.seed, self.step, 0x5EED]))
            ints = np.floor(scaled + rng.random(scaled.size))
        else:
            ints = np.rint(scaled)
        if self.config.master == "none":  # no copy beside the codes: the codes are the state
            self.master = np.clip(ints, -self.bounds * self.units, self.bounds * self.units) / self.units
        self.model.set_values(self.split(ints))

    def train_step(self, q: int, batches: int = 1) -> float:
        """One step: the head's exact gradient on the step's mini-batch, and q directions of this
        step's ZO block probed on it (and with batches=2 on a second one too: a paired step, the
        update averaging both). Both are measured at the same point, then applied."""
        cfg = self.config
        lr = learning_rate(cfg.learning_rate, cfg.lr_schedule, self.spent / self.total)
        self.overhead_seconds += self.step_overhead(q, batches)
        if hasattr(self.scheduler, "observe_costs") and (self.blocks or self.activity is not None):
            self.scheduler.observe_costs(*self.step_cost_split(batches))
        update = np.zeros(self.master.size)
        losses = []
        estimate = StepEstimate()
        if self.head is not None:
            indices = self.batch_indices(self.step)
            labels = self.data.y_train[indices]
            values = {t: v[indices] for t, v in self.train_cache.items()}
            self.model.interp.evaluate(values, self.model.suffix)
            loss, g = self.head.loss_and_gradient(values, self.data.y_train[indices])
            if self.tail is not None:
                g = np.concatenate([g, self.tail.gradient(values, self.head.input_gradient(values))])
            if self.activity is not None:
                g = np.concatenate([g, self.activity_gradient(q, values, labels, estimate, g)])
                self.forward_passes += 2 * q
            if self.local is not None:
                g = np.concatenate([g, self.local_gradient(values, labels, estimate)])
            head_lr = learning_rate(HEAD_LR, HEAD_SCHEDULE, self.spent / self.total)
            move = self.head_optimizer.step(g, head_lr)
            if self.activity is not None:  # the estimated layers' moves, by sqrt(signal fraction)
                move[move.size - self.activity.coords.size :] *= self.activity.update_scale()
            update[self.exact_coords] = move
            losses.append(loss)
            self.forward_passes += 1
            b = len(indices)
            estimate.suffix_passes += 1
            estimate.exact_coords = len(self.exact_coords)
            estimate.local_macs += b * self.head.classes * self.head.features
            if self.tail is not None:
                estimate.local_macs += b * self.tail.macs_per_image
                estimate.local_elements += b * self.tail.elements_per_image
        measure = False
        if self.blocks:
            loss_plus, loss_minus, zo_update = self.zo_update(q, batches, lr)
            update += zo_update
            losses.append(float(np.mean((loss_plus + loss_minus) / 2)))
            estimate.suffix_passes += 2 * q * batches
            eps = self.block_of_step(self.step).eps
            estimate.estimates = np.ravel((loss_plus - loss_minus) / (2.0 * eps))
            measure = self.scheduler.measure_step(Progress(self.step, self.spent, self.total))
        before = self.master.copy() if measure else None
        self.master += update
        # Parameters stay inside what int8 / int32 can hold; the master copy must not drift beyond.
        np.clip(self.master, -self.bounds, self.bounds, out=self.master)
        self.write_back()
        self.step += 1
        if self.blocks:
            self.forward_passes += 2 * q * batches
            if before is not None and self.spent + 3 <= self.total:
                first, second = self.taylor_terms(before, self.master - before)
                self.forward_passes += 3
                self.scheduler.observe_taylor(Progress(self.step, self.spent, self.total), first, second)
            self.scheduler.observe(Progress(self.step, self.spent, self.total), q, loss_plus, loss_minus)
        self.last_lr = lr
        self.last_estimate = estimate
        return float(np.mean(losses))

    def zo_update(self, q: int, batches: int, lr: float) -> tuple:
        """The probes of this step's block and the step rule's move: (L+, L-, update)."""
        block = self.block_of_step(self.step)
        indices = [self.batch_indices(self.step), self.second_batch_indices(self.step)][:batches]
        probes = np.array([self.probe_losses(q, i, block) for i in indices])  # [batches, 2 (L+, L-), q]
        loss_plus, loss_minus = (probes[0, 0], probes[0, 1]) if batches == 1 else (probes[:, 0], probes[:, 1])
        derivatives = np.atleast_2d((loss_plus - loss_minus) / (2.0 * block.eps)).mean(axis=0)
        self.zero_differences = float(np.mean(loss_plus == loss_minus))
        self.dead_steps = self.dead_steps + 1 if self.zero_differences == 1.0 else 0
        if self.dead_steps == DEAD_STEPS:
            self.warn(
                f"every probe pair gave L+ == L- for {DEAD_STEPS} consecutive steps (to step "
                f"{self.step + 1}): no perturbation moves the logits by a code of their output scale "
                f"{self.model.logits_scale:.4g}. Likely: eps {block.eps} below that resolution, dead "
                f"(all-zero) features, or an input saturated by the mapping {self.mapping}. Try "
                "--new-head (a head quantized for its features), a larger --eps, or check "
                "--input-range / --mean / --std"
            )
        grad = self.gradient(q, derivatives, block)
        update = self.optimizer.step(grad, lr, derivatives, step_q=self.scheduler.step_q(q))
        return loss_plus, loss_minus, update

    # -- evaluation ------------------------------------------------------------------------------
    def test_accuracy(self) -> float:
        return float(np.mean(self.model.predict(self.test_cache) == self.data.y_test))

    # -- the loop ---------------------------------------------------------------------------------
    def run(self, on_step=None) -> dict:
        """Train until the budget is spent; checkpoint on the way and on interrupt."""
        cfg = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "checkpoints").mkdir(exist_ok=True)
        self.write_config()
        start = time.perf_counter() - self.wall_offset
        self.wall = lambda: time.perf_counter() - start
        self.last_lr = learning_rate(cfg.learning_rate, cfg.lr_schedule, self.spent / self.total)
        metrics = self.metrics
        metrics.open()
        # Ctrl-C is taken between steps (npusim/app/interrupt.py): the checkpoint then records a whole step.
        with interrupt.deferred():
            try:
                # (a resumed run already evaluated at its checkpoint does not pay for it again)
                if self.forward_passes >= self.next_eval and self.forward_passes != self.last_eval_passes:
                    self.log_eval()
                while True:
                    interrupt.check(between_steps=True)
                    progress = Progress(self.step, self.spent, self.total)
                    q = self.scheduler.next_q(progress)
                    batches = self.scheduler.probe_batches(progress)
                    cost = self.step_passes(q, batches)
                    if self.forward_passes + cost >= self.next_eval:
                        cost += self.validation_passes()
                    cost += self.charged(self.step_overhead(q, batches))
                    # The last evaluation's validation passes are kept in reserve: within the budget.
                    if self.spent + cost + self.validation_passes() > self.total:
                        break
                    loss = self.train_step(q, batches)
                    if self.step == 1:
                        self.note_fitted(loss)
                    self.log(
                        {
                            "step": self.step,
                            "q": q if self.blocks or self.activity is not None else 0,
                            "forward_passes": self.forward_passes,
                            "train_loss": f"{loss:.6f}",
                            "zero_differences": f"{self.zero_differences:.4f}",
                        }
                    )
                    if self.forward_passes >= self.next_eval:
                        self.log_eval()
                    if on_step:
                        on_step(self, q, loss)
                    if self.step % cfg.checkpoint_every == 0:
                        metrics.flush()
                        self.save_checkpoint()
                if self.forward_passes != self.last_eval_passes:
                    self.log_eval()
            except KeyboardInterrupt:
                metrics.flush()
                self.save_checkpoint()
                metrics.close()
                raise
            metrics.flush()
            self.save_checkpoint()
            metrics.close()
            self.keep_chosen()
            # An interrupt from here on is raised when the block ends: after the export, which a
            # resumed run (nothing left to train) would write again.
            self.export(self.out / ("model" + model_suffix(self.model.graph)))  # model.tflite or model.onnx
        return {
            "steps": self.step,
            "forward_passes": self.forward_passes,
            "test_accuracy": self.final_accuracy,
            "kept": self.kept_line(),
        }

    def note_fitted(self, loss: float):
        """One line when the first step's training loss is already about zero (below FITTED_LOSS
        nats: the batch's labels have probability above 0.999 on average, so every exact gradient,
        p - y, is about zero and training can move little)."""
        if loss >= FITTED_LOSS:
            return
        fresh = self.model.head_op is not None and self.config.head_init != "zero"
        who = f"the fresh head ({self.config.head_init}) already fits" if fresh else "the model already fits"
        self.report(
            f"note: the training loss is {loss:.4f} at the first step: {who} the training images, so the "
            "gradients are about zero and training moves little; the held-out and test accuracy say more"
        )

    def log(self, row: dict):
        row.setdefault("wall_seconds", f"{self.wall():.3f}")
        row.setdefault("macs", self.forward_passes * self.macs_per_pass)
        device = self.forward_passes * self.device_seconds_per_pass + self.overhead_seconds
        row.setdefault("device_seconds", f"{device:.4f}")
        row.setdefault("lr", f"{self.last_lr:.6g}")
        self.metrics.write(row)

    def log_eval(self):
        acc = self.test_accuracy()
        q = self.scheduler.next_q(Progress(self.step, self.spent, self.total))
        row = {
            "step": self.step,
            "q": q,
            "forward_passes": self.forward_passes,
            "test_accuracy": f"{acc:.6f}",
        }
        if len(self.val_rows):
            # The device runs the held-out images to choose the model it keeps: charged to the budget.
            self.forward_passes += self.validation_passes()
            row["val_accuracy"] = f"{self.record_validation(acc):.6f}"
        self.log(row)
        self.final_accuracy = acc
        self.last_eval_passes = self.forward_passes
        while self.next_eval <= self.forward_passes:
            self.next_eval += self.eval_every

    def export(self, path: Path):
        atomic.write_bytes(path, write_model(self.model.graph))  # whole or not at all
