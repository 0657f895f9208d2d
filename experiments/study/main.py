"""The study: adaptive q (QScheduler) against every fixed q, on two models and two data sets.

    python -m experiments.study --grid full|quick|ci [--executor local|ray] [--address ADDR] [--workers N]

Every run is one zo training run with its own directory under --runs; a run whose directory holds
result.json is finished and is not redone, so an interrupted sweep resumes where it stopped. The
report (CSV, Markdown, PNG) is then generated from the run directories into --results.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from zo.schedulers import QSCHEDULER

from .report import update_readme, write_report

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SHARED = ROOT.parent / "shared"


@dataclass(frozen=True)
class Cell:
    """One (model, data set) pair with the settings shared by every scheduler in it."""

    name: str
    model: str  # path under shared/models
    data: str  # file name under shared/data
    trainable: str
    budget: int  # forward passes per run, the same for every scheduler of the cell
    role: str = "evaluation"  # "design": the rule was designed and tuned on it; "evaluation": judged on it
    optimizer: str | None = None  # None: `zo train`'s default step rule and learning rate
    lr: float | None = None
    eps: int | None = 1  # None: measured per block (zo train's default since the hybrid trainer)
    batch: int = 32
    train_size: int | None = None
    test_size: int | None = None
    input_range: str = "auto"  # pixels -> model input, as `zo train --input-range / --mean / --std`
    mean: str | None = None
    std: str | None = None
    options: tuple = ()  # further TrainConfig fields as (name, value) pairs, e.g. (("master", "none"),)
    budget_ms: float | None = None  # set: the budget is estimated STM32N6 time (--budget-ms), not passes

    def config(self, shared: Path, **run) -> "TrainConfig":  # noqa: F821 (imported in the worker)
        from zo.trainer import TrainConfig

        step_rule = {"optimizer": self.optimizer} if self.optimizer else {}
        fields = dict(
            model=str(shared / "models" / self.model),
            data=str(shared / "data" / self.data),
            trainable=self.trainable,
            **step_rule,
            lr=self.lr,
            eps=self.eps,
            batch=self.batch,
            budget=self.budget,
            budget_ms=self.budget_ms,
            new_head=True,
            train_size=self.train_size,
            test_size=self.test_size,
            input_range=self.input_range,
            mean=self.mean,
            std=self.std,
        )
        return TrainConfig(**(fields | dict(self.options) | run))

    @property
    def folder(self) -> str:
        """The cell's run folder: its name and a digest of every setting but the role, so a run made
        with other settings (an older grid) is never taken for a finished run of this one."""
        settings = {k: v for k, v in asdict(self).items() if k != "role"}
        if settings["budget_ms"] is None:  # the cells before device-time budgets keep their folders
            del settings["budget_ms"]
        return f"{self.name}-{hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]}"

    def describe_settings(self) -> str:
        step = f"{self.optimizer or 'default step rule'}" + (
            f" lr {self.lr}" if self.lr else " at its default lr"
        )
        extra = "".join(f", --{k.replace('_', '-')} {v}" for k, v in self.options)
        return f"fresh head, {step}, eps {self.eps or 'auto'}{extra}"


@dataclass(frozen=True)
class Grid:
    cells: tuple[Cell, ...]
    schedulers: tuple[str, ...]
    seeds: tuple[int, ...]
    evals: int = 20  # test evaluations per run
    headline: str = "qscheduler"  # the scheduler the grid's claim is about
    auc_goal: bool = True  # the goal also asks the AUC of the best fixed q in most cells (before v4)


RESNET8 = "resnet8_cifar10_int8.tflite"
MOBILENETV2 = "mobilenet_v2_0.35_128_flowers_int8.tflite"
REID = "stm32n6/mobilenetv2_a100_256_128_fft_int8.tflite"  # no classifier: an appended head (--new-head)
HEAD_BUDGET = 120_000  # forward passes; see FLAT_POINTS for the criterion the budgets are held to
DEEP_BUDGET = 60_000

# Pre-registered (earlier-studies.md, "Design and evaluation cells"): the rules and their defaults were
# designed and tuned on the design cells only; the claim is judged on the evaluation cells. Every
# cell trains with `zo train`'s defaults (step rule, learning rate, eps, batch), as a user would.
CELLS = {
    c.name: c
    for c in (
        Cell("resnet8-eurosat", RESNET8, "eurosat32_subset.npz", "last:1", HEAD_BUDGET, "design"),
        Cell("mobilenetv2-eurosat", MOBILENETV2, "eurosat64_subset.npz", "last:1", HEAD_BUDGET, "design"),
        Cell("reid-eurosat", REID, "eurosat64_subset.npz", "last:1", HEAD_BUDGET, "design"),
        Cell("resnet8-cifar10", RESNET8, "cifar10_subset.npz", "last:1", HEAD_BUDGET),
        Cell("mobilenetv2-cifar10", MOBILENETV2, "cifar10_subset.npz", "last:1", HEAD_BUDGET),
        Cell("reid-cifar10", REID, "cifar10_subset.npz", "last:1", HEAD_BUDGET),
        Cell("resnet8-eurosat-last3", RESNET8, "eurosat32_subset.npz", "last:3", DEEP_BUDGET),
        Cell("resnet8-cifar10-last3", RESNET8, "cifar10_subset.npz", "last:3", DEEP_BUDGET),
    )
}
# Pre-registered after the full grid had run, and before any of these cells ran (earlier-studies.md, "Step
# rules where q matters"): the full grid's evaluation cells again under `zo train`'s other two step
# rules at their default lr, where a one-seed pilot of fixed q alone on the design cells (seed 99;
# no scheduler ran) put 4 to 23 points between q = 1 and q = 64. The rule stays the one frozen
# before the full grid. Evaluation only: nothing was designed on them.
STEP_RULE_CELLS = tuple(
    replace(c, name=f"{c.name}-{optimizer}", optimizer=optimizer)
    for optimizer, names in (
        (
            "sgd",
            (
                "resnet8-cifar10",
                "mobilenetv2-cifar10",
                "reid-cifar10",
                "resnet8-eurosat-last3",
                "resnet8-cifar10-last3",
            ),
        ),
        ("adam", ("resnet8-cifar10", "mobilenetv2-cifar10", "reid-cifar10")),
    )
    for c in (CELLS[n] for n in names)
)
# QScheduler v3's first evaluation, pre-registered with its first form (the move since the last
# measurement; docs/study.md, "QScheduler v3") before any of these cells ran: fresh cells under the
# two step rules for which `qscheduler` names the efficiency test. That form's tables are in
# experiments/results/v3.0-anchor; with the current form these cells are design cells of v3.1.
V3_CELLS = (
    Cell(
        "resnet8-eurosat-last2-sgd", RESNET8, "eurosat32_subset.npz", "last:2", DEEP_BUDGET, "design", "sgd"
    ),
    Cell("resnet8-cifar10-last2-sgd", RESNET8, "cifar10_subset.npz", "last:2", DEEP_BUDGET, "design", "sgd"),
    Cell(
        "resnet8-eurosat-last3-adam", RESNET8, "eurosat32_subset.npz", "last:3", DEEP_BUDGET, "design", "adam"
    ),
    Cell(
        "resnet8-cifar10-last3-adam", RESNET8, "cifar10_subset.npz", "last:3", DEEP_BUDGET, "design", "adam"
    ),
)
# QScheduler v3.1's evaluation (the step's own second-order term), pre-registered with the frozen
# rule before any of these cells ran: no grid had run them, and none informed a rule. The last:4
# pair was added after the last:2 pair had run and before it ran itself; the rule did not change.
V31_CELLS = (
    Cell(
        "resnet8-eurosat-last2-adam", RESNET8, "eurosat32_subset.npz", "last:2", DEEP_BUDGET, optimizer="adam"
    ),
    Cell(
        "resnet8-cifar10-last2-adam", RESNET8, "cifar10_subset.npz", "last:2", DEEP_BUDGET, optimizer="adam"
    ),
    Cell(
        "resnet8-eurosat-last4-sgd", RESNET8, "eurosat32_subset.npz", "last:4", DEEP_BUDGET, optimizer="sgd"
    ),
    Cell(
        "resnet8-cifar10-last4-adam", RESNET8, "cifar10_subset.npz", "last:4", DEEP_BUDGET, optimizer="adam"
    ),
)
# The study's claim on the trainer with an initialized fresh head (`--head-init ridge`, the default
# since issue 28), pre-registered with the frozen trainer and rule before any of these runs ran
# (earlier-studies.md, "An initialized head"): a trainable set no nsgd grid ran (ResNet-8 `last:2`) and
# two evaluation cells of the full grid on seeds no grid ran (5, 6). Evaluation only. Registered
# first at 60,000 / 120,000 passes; re-registered at 30,000 when the first run (unread) showed that
# the loaded machine could not finish that grid in the session (results/earlier-studies.md).
INIT_BUDGET = 30_000
INIT_CELLS = (
    Cell("resnet8-eurosat-last2-init", RESNET8, "eurosat32_subset.npz", "last:2", INIT_BUDGET),
    Cell("resnet8-cifar10-init", RESNET8, "cifar10_subset.npz", "last:1", INIT_BUDGET),
    Cell("mobilenetv2-cifar10-init", MOBILENETV2, "cifar10_subset.npz", "last:1", INIT_BUDGET),
)
FIXED = tuple(f"fixed:{q}" for q in (1, 2, 4, 8, 16, 32, 64))
# The hybrid trainer's study (issue 46; docs/study.md, "Study v4"), pre-registered before any of its
# runs: `zo train`'s defaults (the head's exact gradient, ZO one block a step below it, eps measured,
# channel subspace, the model kept on a held-out tenth) on ResNet-8 `last:3`, and the integer-only
# mode (--master none, no float copy: q has no learning rate to trade against there). Baselines in
# the same grid: constant q 1 and 4 (in FIXED), q = 1 under a cosine lr, and a small (q, lr) grid at
# three times the default lr (a run "SPEC@VARIANT": zo train --q SPEC with --lr-schedule cosine or
# --lr X). The back-propagation bound and the forward-only start are in every cell's table.
V4_BUDGET = 20_000
V4_INT = (("master", "none"),)
V4_CELLS = (
    Cell("r8-eurosat-last3", RESNET8, "eurosat32_subset.npz", "last:3", V4_BUDGET, eps=None),
    Cell("r8-cifar10-last3", RESNET8, "cifar10_subset.npz", "last:3", V4_BUDGET, eps=None),
    Cell(
        "r8-eurosat-last3-int", RESNET8, "eurosat32_subset.npz", "last:3", V4_BUDGET, eps=None, options=V4_INT
    ),
    Cell(
        "r8-cifar10-last3-int", RESNET8, "cifar10_subset.npz", "last:3", V4_BUDGET, eps=None, options=V4_INT
    ),
    Cell("mnv2-eurosat-last3", MOBILENETV2, "eurosat64_subset.npz", "last:3", V4_BUDGET, eps=None),
)
V4_RUNS = FIXED[:5] + ("qscheduler", "snr", "fixed:1@cosine", "fixed:4@lr0.03", "fixed:16@lr0.03")
# The study of the cost-aware rule (issue 53; docs/study.md, "Study v5"), pre-registered before any of
# its runs: the trainer with the exact tail and activity perturbation (`--estimator activity`, zo train's
# default since issue 53), cells chosen by restricted bounds measured first (experiments/study/v5_bounds.py:
# back-propagation below the tail worth more than 2 points over the tail alone), budgets in device time
# of different fixed-to-direction cost ratios, and one cell budgeted in passes (the control, where the
# fixed cost is one pass). The budget of a device-time cell: the device time of V5_PASSES suffix passes
# of its trainable set at batch 32 (npusim's N6 view, `zo cost`), so every cell gets the same number of
# pass-equivalents and the steps' fixed work decides how many steps that buys.
V5_PASSES = 20_000
V5_ESTIMATOR = (("estimator", "activity"),)


def v5_budget_ms(model: str, trainable: str, shared: Path = DEFAULT_SHARED, batch: int = 32) -> float:
    """V5_PASSES suffix passes of `trainable` on `model` at `batch`, in milliseconds of N6 time."""
    from npusim import load_model
    from zo.cost import step_parts
    from zo.model import TrainableModel

    m = TrainableModel(load_model(str(shared / "models" / model)), trainable, num_classes=10, new_head=True)
    parts = step_parts(m.interp, [p.tensor for p in m.params], 1, batch)
    return round(V5_PASSES * parts["suffix_pass_s"] * 1e3, -2)


# (name, model, data, trainable, budget in ms or None for the pass budget): fixed before any run; the
# milliseconds are v5_budget_ms's, written out so that a change of the cost model cannot move them.
V5_SPECS = (
    ("r8-eurosat-last6", RESNET8, "eurosat32_subset.npz", "last:6", 399_100.0),
    ("mnv2-cifar10-last8", MOBILENETV2, "cifar10_subset.npz", "last:8", 743_500.0),
    ("r8-eurosat-last6-passes", RESNET8, "eurosat32_subset.npz", "last:6", None),
)
V5_CELLS = tuple(
    Cell(name, model, data, trainable, V5_PASSES, eps=None, options=V5_ESTIMATOR, budget_ms=ms)
    for name, model, data, trainable, ms in V5_SPECS
)
V5_RUNS = tuple(f"fixed:{q}" for q in (1, 2, 4, 8, 16, 32)) + ("rate", "fixed:1@cosine")
# The design cells under the two step rules whose step does not grow with q: with the nsgd design
# cells, where QScheduler v3's efficiency test was designed (earlier-studies.md, "QScheduler v3").
DESIGN_STEP_RULE_CELLS = tuple(
    replace(c, name=f"{c.name}-{optimizer}", optimizer=optimizer)
    for optimizer in ("sgd", "adam")
    for c in CELLS.values()
    if c.role == "design"
)
FAMILIES = ("slope", "coupled", "snr")  # QScheduler v3's candidate rules (zo/schedulers.py)
# The full study runs the frozen rule as "qscheduler" and the other families beside it.
ADAPTIVE_RUNS = (
    ("qscheduler",) + tuple(f for f in FAMILIES if f != QSCHEDULER[True]) + ("linear:32", "power:32")
)
SEEDS = (0, 1, 2, 3, 4)
DESIGN = tuple(c for c in CELLS.values() if c.role == "design")

GRIDS = {
    "full": Grid(tuple(CELLS.values()), FIXED + ADAPTIVE_RUNS, SEEDS),
    "design": Grid(DESIGN, FIXED + FAMILIES + ("linear:32", "power:32"), SEEDS),
    # The frozen rule and the literature's two ramps; coupled and snr, which lost in every cell of the
    # full grid, are left out to keep the sweep inside the study's time bound.
    "design-steprules": Grid(
        DESIGN + DESIGN_STEP_RULE_CELLS, FIXED + ("efficiency",), (0, 1, 2), headline="efficiency"
    ),
    # It ran the slope test, what `qscheduler` named under every step rule before v3.
    "steprules": Grid(STEP_RULE_CELLS, FIXED + ("slope", "linear:32", "power:32"), SEEDS, headline="slope"),
    "v3": Grid(V3_CELLS, FIXED + ("qscheduler",), SEEDS),
    "v31": Grid(V31_CELLS, FIXED + ("qscheduler",), SEEDS),
    # q up to 32 (the best fixed q of every nsgd cell of the full grid lay there), 2 seeds: to fit the
    # machine's time (results/earlier-studies.md).
    "init": Grid(INIT_CELLS, FIXED[:6] + ("qscheduler",), (5, 6)),
    "v4": Grid(V4_CELLS, V4_RUNS, (0, 1, 2), auc_goal=False),
    "v5": Grid(V5_CELLS, V5_RUNS, (0, 1, 2), headline="rate", auc_goal=False),
    # The same study at twice the budgets, for the flattening criterion that 7 of 8 cells of "full"
    # miss (results/earlier-studies.md); the rule stays the one frozen before "full" ran.
    "long": Grid(
        tuple(replace(c, budget=2 * c.budget) for c in CELLS.values()), FIXED + ADAPTIVE_RUNS, SEEDS
    ),
    "quick": Grid(
        (
            replace(CELLS["resnet8-eurosat"], budget=30_000),
            replace(CELLS["mobilenetv2-eurosat"], budget=30_000),
        ),
        ("fixed:1", "fixed:4", "fixed:16", "fixed:64", "qscheduler"),
        (0, 1),
    ),
    # A few seconds a run: CI checks the sweep machinery (local pool, Ray, resume) on it.
    "ci": Grid(
        (replace(CELLS["resnet8-eurosat"], budget=400, train_size=500, test_size=200),),
        ("fixed:2", "qscheduler"),
        (0,),
        evals=4,
    ),
}

# grid -> (the file, its marked block): the current study in docs/study.md, the earlier ones (the
# trainer before the hybrid one) in experiments/results/earlier-studies.md
EARLIER = Path("experiments") / "results" / "earlier-studies.md"
DOCS_BLOCKS = {
    "full": (EARLIER, "study"),
    "steprules": (EARLIER, "study-steprules"),
    "v31": (EARLIER, "study-v31"),
    "init": (EARLIER, "study-init"),
    "v4": (Path("docs") / "study.md", "study-v4"),
    "v5": (Path("docs") / "study.md", "study-v5"),
}


@dataclass(frozen=True)
class Run:
    cell: Cell
    scheduler: str
    seed: int
    evals: int

    @property
    def key(self) -> str:
        return f"{self.cell.folder}/{self.scheduler.replace(':', '-')}/seed{self.seed}"


def runs_of(grid: Grid) -> list[Run]:
    return [Run(c, s, seed, grid.evals) for c in grid.cells for s in grid.schedulers for seed in grid.seeds]


# -- one run, in a worker -------------------------------------------------------------------------------
_CACHES: dict = {}


def prefix_caches(cell: Cell, shared: Path, cache_dir: Path):
    """Dataset and frozen-prefix activations of a cell: computed once per machine, then read from disk."""
    from npusim import load_model
    from zo.data import load_dataset, subset
    from zo.inputs import model_inputs
    from zo.trainer import build_model

    key = hashlib.sha256(
        json.dumps(
            [
                cell.model,
                cell.data,
                cell.trainable,
                cell.train_size,
                cell.test_size,
                cell.input_range,
                cell.mean,
                cell.std,
            ]
        ).encode()
    ).hexdigest()[:16]
    if key in _CACHES:
        return _CACHES[key]
    data = load_dataset(shared / "data" / cell.data)
    if cell.train_size or cell.test_size:
        data = subset(data, cell.train_size, cell.test_size, seed=0)
    path = cache_dir / f"{key}.npz"
    if path.exists():
        with np.load(path) as z:
            train = {int(k[6:]): z[k] for k in z.files if k.startswith("train_")}
            test = {int(k[5:]): z[k] for k in z.files if k.startswith("test_")}
    else:
        model, image, mapping = build_model(
            cell.config(shared), load_model(shared / "models" / cell.model), data
        )
        train = model.boundary_activations(model_inputs(data.x_train, image, mapping)[0])
        test = model.boundary_activations(model_inputs(data.x_test, image, mapping)[0])
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f"{key}.{os.getpid()}.tmp.npz"
        np.savez(
            tmp, **{f"train_{t}": v for t, v in train.items()}, **{f"test_{t}": v for t, v in test.items()}
        )
        os.replace(tmp, path)
    _CACHES[key] = (data, (train, test))
    return _CACHES[key]


def backprop_bounds(grid, shared: Path, cache_dir: Path) -> dict:
    """The back-propagation upper bounds per cell: the same trainable layers from the trainer's own
    initialized start, on its training images, with its own lr chosen on the held-out tenth
    (zo.backprop.bound_with_own_lr), seed 0: below the head in full, along ZO's subspace only, and
    frozen (the head alone); cached as JSON."""
    from zo.backprop import BELOW, bound_with_own_lr
    from zo.trainer import Trainer

    out = {}
    for cell in grid.cells:
        if dict(cell.options).get("estimator") == "activity":  # v5: the bounds its cells were chosen by
            out[cell.name] = v5_cell_bounds(cell, shared)
            continue
        path = cache_dir / f"backprop-bounds-{cell.folder}.json"
        if path.exists():
            out[cell.name] = json.loads(path.read_text())
            continue
        data, caches = prefix_caches(cell, shared, cache_dir)
        start = cache_dir / f"bound-start-{cell.folder}"
        trainer = Trainer(cell.config(shared, checkpoint_every=10**9), start, dataset=data, caches=caches)
        bounds = {}
        for below in BELOW:
            lr, result = bound_with_own_lr(trainer, 0, below)
            bounds[below] = {
                "lr": lr,
                **{
                    k: float(v)
                    for k, v in result.items()
                    if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                },
            }
        shutil.rmtree(start, ignore_errors=True)
        out[cell.name] = {**bounds["full"], "subspace": bounds["subspace"], "frozen": bounds["frozen"]}
        cache_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out[cell.name]))
    return out


def v5_cell_bounds(cell: Cell, shared: Path) -> dict:
    """The whole set's bound with the head alone and the exact tail alone beside it, from
    experiments/study/v5_bounds.py (cached there: the measurements the cells were chosen by)."""
    from .v5_bounds import CANDIDATES, measure

    candidate = next(
        c for c in CANDIDATES if (c.model, c.data, c.trainable) == (cell.model, cell.data, cell.trainable)
    )
    r = measure(candidate, shared)
    return {**r["whole"], "tail": r["tail"], "frozen": r["head"]}


def execute(run: Run, shared: str, runs_dir: str, cache_dir: str) -> dict:
    """Train one run (or return its stored result). Deterministic: same run, same result anywhere."""
    from zo.trainer import TrainConfig, Trainer

    out = Path(runs_dir) / run.key
    done = out / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    shared = Path(shared)
    data, caches = prefix_caches(run.cell, shared, Path(cache_dir))
    c = run.cell
    spec, _, variant = run.scheduler.partition("@")
    known = {f.name for f in fields(TrainConfig)}
    for name, value in c.options:  # a grid needs the trainer it was registered for (v5: the estimator)
        if name not in known:
            raise SystemExit(f"error: cell {c.name}: zo train has no option {name} (expected {value!r})")
    config = c.config(
        shared,
        q=spec,
        seed=run.seed,
        eval_every=None if c.budget_ms else c.budget // run.evals,  # device time: the trainer's /20
        checkpoint_every=10**9,
        **variant_options(variant),
    )
    if out.exists():  # an interrupted run: start it again from scratch
        shutil.rmtree(out)
    start = time.perf_counter()
    trainer = Trainer(config, out, dataset=data, caches=caches)  # its scheduler: config.q, run.scheduler
    summary = trainer.run()
    result = {
        "key": run.key,
        "cell": c.name,
        "scheduler": run.scheduler,
        "seed": run.seed,
        "test_accuracy": summary["test_accuracy"],
        "steps": summary["steps"],
        "forward_passes": summary["forward_passes"],
        "wall_seconds": time.perf_counter() - start,
        "q_changes": getattr(trainer.scheduler, "changes", []),
    }
    tmp = out / "result.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, done)
    return result


def variant_options(variant: str) -> dict:
    """A baseline run's TrainConfig fields: "" (none), "cosine" (--lr-schedule cosine) or "lrX" (--lr X)."""
    if not variant:
        return {}
    if variant in ("cosine", "linear"):
        return {"lr_schedule": variant}
    if variant.startswith("lr"):
        return {"lr": float(variant[2:])}
    raise ValueError(f"run variant {variant!r}: expected cosine, linear or lrX")


ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def one_thread_worker():
    # Two workers on two cores: each keeps to one thread so they do not fight over the cores.
    import numba

    numba.set_num_threads(1)


def sweep(
    runs: list[Run],
    shared: Path,
    runs_dir: Path,
    cache_dir: Path,
    executor: str,
    workers: int,
    address: str | None,
):
    todo = [r for r in runs if not (runs_dir / r.key / "result.json").exists()]
    print(
        f"{len(runs)} runs, {len(runs) - len(todo)} already done, {len(todo)} to do ({executor})", flush=True
    )
    if not todo:
        return
    args = (str(shared), str(runs_dir), str(cache_dir))
    # Runs that share a cell's prefix cache go first one per cell, so the cache is built once.
    if executor == "ray":
        import ray

        ray.init(
            address=address,
            ignore_reinit_error=True,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": ONE_THREAD},
            **({} if address else {"num_cpus": workers}),
        )
        remote = ray.remote(num_cpus=1)(_ray_execute)
        pending = [remote.remote(r, *args) for r in todo]
        for i, result in enumerate(_ray_results(ray, pending), 1):
            report_progress(i, len(todo), result)
        ray.shutdown()
        return
    if workers <= 1:
        for i, r in enumerate(todo, 1):
            report_progress(i, len(todo), execute(r, *args))
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    for r in {r.cell.name: r for r in todo}.values():  # build each cell's cache before fanning out
        prefix_caches(r.cell, shared, cache_dir)
    os.environ.update(ONE_THREAD)  # inherited by the spawned workers before they load numpy
    with ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=one_thread_worker
    ) as pool:
        futures = [pool.submit(execute, r, *args) for r in todo]
        for i, f in enumerate(as_completed(futures), 1):
            report_progress(i, len(todo), f.result())


def _ray_execute(run, shared, runs_dir, cache_dir):
    one_thread_worker()
    return execute(run, shared, runs_dir, cache_dir)


def _ray_results(ray, pending):
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        yield ray.get(done[0])


def report_progress(i: int, n: int, result: dict):
    print(
        f"[{i}/{n}] {result['key']}: test accuracy {result['test_accuracy']:.4f} "
        f"({result['steps']} steps, {result['wall_seconds']:.0f} s)",
        flush=True,
    )


def sweep_seconds(runs_dir: Path) -> float | None:
    clock = runs_dir / "_cache" / "sweep_seconds"
    return float(clock.read_text()) if clock.exists() else None


def run_sweep(grid: Grid, a, runs_dir: Path):
    start = time.perf_counter()
    try:
        sweep(runs_of(grid), a.shared, runs_dir, runs_dir / "_cache", a.executor, a.workers, a.address)
    except KeyboardInterrupt:
        sys.exit("interrupted: finished runs are kept; run the same command again to resume")
    finally:  # the sweep's wall time, summed over the invocations that resumed it
        clock = runs_dir / "_cache" / "sweep_seconds"
        clock.parent.mkdir(parents=True, exist_ok=True)
        total = float(clock.read_text()) if clock.exists() else 0.0
        clock.write_text(str(total + time.perf_counter() - start))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m experiments.study",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--grid", choices=sorted(GRIDS), default="quick")
    p.add_argument("--shared", type=Path, default=DEFAULT_SHARED)
    p.add_argument(
        "--runs", type=Path, default=None, help="run directories (default experiments/runs/<grid>)"
    )
    p.add_argument(
        "--results", type=Path, default=None, help="report directory (default experiments/results/<grid>)"
    )
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument(
        "--address", default=None, help="Ray cluster address (default: start a local Ray instance)"
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-baseline", action="store_true", help="skip the back-propagation upper bound")
    p.add_argument(
        "--readme",
        action="store_true",
        help="also put the table into its marked block (v4: docs/study.md; earlier grids: "
        "experiments/results/earlier-studies.md)",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="write the report from the runs finished so far (a sweep may still be running)",
    )
    a = p.parse_args(argv)
    if not (a.shared / "models").is_dir():
        sys.exit(f"error: --shared {a.shared}: no models/ folder there, expected the shared data directory")
    grid = GRIDS[a.grid]
    runs_dir = a.runs or ROOT / "experiments" / "runs" / a.grid
    results = a.results or ROOT / "experiments" / "results" / a.grid
    if not a.report_only:
        run_sweep(grid, a, runs_dir)
    write_report(
        grid,
        runs_dir,
        results,
        bounds=None if a.no_baseline else (lambda g: backprop_bounds(g, a.shared, runs_dir / "_cache")),
        command=" ".join(["python -m experiments.study"] + (argv if argv is not None else sys.argv[1:])),
        sweep_seconds=sweep_seconds(runs_dir),
    )
    if a.readme and a.grid in DOCS_BLOCKS:
        where, block = DOCS_BLOCKS[a.grid]
        update_readme(
            ROOT / where,
            results / "table.md",
            f"<!-- {block}:begin -->",
            f"<!-- {block}:end -->",
        )


if __name__ == "__main__":
    main()
