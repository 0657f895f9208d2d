"""The `zo` command line: forward-only fine-tuning of an int8 .tflite or .onnx model on npusim.

Only click and zo's light modules are imported here: npusim and the trainer are imported by the
commands, under the interrupt guard, so that Ctrl-C while they load is one line too."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from npusim.app import interrupt
from npusim.app.cli_usage import OneLineGroup
from npusim.errors import NpusimError
from npusim.profiles import zo_profiles

from .errors import ZoError


def fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def the_zo_command() -> bool:
    """This process is `zo` itself (the console script or python -m zo.cli), not a caller of main()."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return Path(sys.argv[0]).name == "zo" or (spec is not None and spec.name == "zo.cli")


def interrupted(message: str):
    """Ctrl-C's (or SIGTERM's, SIGHUP's) one line and exit 130; a second signal while it is written
    changes nothing."""
    interrupt.ignore_further()
    click.echo(f"error: {message}", err=True)
    if the_zo_command():
        # Python's own exit, after the simulator has run, takes 1 to 2 s on a loaded 2-core machine
        # (measured: tearing down Numba's and the run's objects); by now everything the run writes
        # is written, closed and synced, so the process leaves at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    sys.exit(130)


@click.group(cls=OneLineGroup)
@click.version_option(package_name="npusim-zo")
def main():
    """Zeroth-order (forward-only) on-device training on the npusim INT8 simulator."""


@main.command()
@click.option(
    "--model",
    type=click.Path(),  # a folder: load_model's one error line, not click's usage block
    help="Deployed int8 model, .tflite or ONNX QDQ / QOperator .onnx.",
)
@click.option(
    "--data",
    type=click.Path(),
    help=".npz, EuroSAT folder of class folders, or STL-10 binary folder.",
)
@click.option(
    "--trainable",
    default="tail",
    show_default=True,
    help="tail (the head and the layers with only parameter-free ops up to it: exact gradients) | last:K "
    "| NAME,... (weight or output tensor names) | biases",
)
@click.option(
    "--q",
    "q",
    default="qscheduler",
    show_default=True,
    help="fixed:N | qscheduler[:QMAX] (the rate rule under --estimator activity and the exact head; else "
    "the slope test under nsgd, the efficiency test under sgd and adam) "
    "| slope, coupled, snr, efficiency, rate (progress per unit of cost, docs/zo.md), linear, power [:QMAX]",
)
@click.option(
    "--optimizer",
    type=click.Choice(["nsgd", "sgd", "adam"]),
    default="nsgd",
    show_default=True,
    help="nsgd: SGD with momentum on the estimate normalized by its own probes (scale-free); sgd; "
    "adam (ZO-Adam).",
)
@click.option(
    "--lr",
    type=float,
    default=None,
    help="Learning rate in integer steps (default nsgd 0.01, 0.03 from --head-init zero; adam 0.1; sgd 0.5).",
)
@click.option(
    "--lr-schedule",
    type=click.Choice(["constant", "cosine", "linear"]),
    default="constant",
    show_default=True,
)
@click.option("--momentum", type=float, default=0.9, show_default=True)
@click.option(
    "--eps",
    default="auto",
    show_default=True,
    help="Perturbation size in int8 steps of each weight's scale; auto: measured per block before the "
    "first step (the smallest that resolves the loss; passes charged to --budget).",
)
@click.option(
    "--direction", type=click.Choice(["rademacher", "gaussian"]), default="rademacher", show_default=True
)
@click.option(
    "--rounding",
    type=click.Choice(["nearest", "stochastic"]),
    default="nearest",
    show_default=True,
    help="Write-back rounding of the master copy to int8.",
)
@click.option("--batch", type=int, default=32, show_default=True)
@click.option(
    "--budget",
    type=int,
    default=20000,
    show_default=True,
    help="Forward passes (of one mini-batch) to spend in all. With --resume: the run's new total "
    "(passes already spent included), not passes to add.",
)
@click.option(
    "--budget-ms",
    type=float,
    default=None,
    help="The budget as estimated STM32N6 time instead of passes: each step priced part by part as zo cost "
    "prints it (suffix passes at npusim's N6 latency; local weight gradients, the head's outer product, "
    "directions, write-back and loss on the Cortex-M55). Instead of --budget; with --resume, the new total.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--eval-every",
    type=int,
    default=None,
    help="Forward passes between test evaluations (default budget/20).",
)
@click.option(
    "--checkpoint-every", type=int, default=100, show_default=True, help="Steps between checkpoints."
)
@click.option(
    "--profile",
    type=click.Choice(zo_profiles()),
    default="tflm",
    show_default=True,
    help="The rounding profile the steps run under: the profiles table's entries zo trains on (Profile.zo).",
)
@click.option("--train-size", type=int, default=None, help="Use a stratified subset of the training images.")
@click.option("--test-size", type=int, default=None, help="Use a stratified subset of the test images.")
@click.option(
    "--new-head",
    is_flag=True,
    help="Append a fresh classifier head to a model without one (an embedding). A model's own head is "
    "replaced by a fresh one anyway, unless --keep-head.",
)
@click.option(
    "--keep-head",
    is_flag=True,
    help="Train the model's own classifier head (the data must have its class count).",
)
@click.option(
    "--estimator",
    type=click.Choice(["activity", "weights", "local", "guided"]),
    default="activity",
    show_default=True,
    help="Below the head: activity (the exact tail: layers with only parameter-free ops up to the head get "
    "exact gradients; below it each layer's output is perturbed, per example) or weights (every tensor's "
    "weights perturbed, the estimator before issue 53); local: the exact tail, then each layer below it "
    "along the exact gradient of a local loss (an auxiliary linear head on its block's pooled output, no "
    "extra pass); guided: that local direction, sized and signed by 2 suffix passes (zo/local.py). "
    "The pure-ZO setting: --head-gradient zo.",
)
@click.option(
    "--local-layers",
    type=click.Choice(["all", "round-robin"]),
    default="all",
    show_default=True,
    help="--estimator local: every layer below the tail moves each step, or one a step in turn "
    "(cheaper steps: the local weight gradients on the M55 dominate a step's device time).",
)
@click.option(
    "--local-examples",
    type=int,
    default=None,
    help="--estimator local|guided: form the local layers' weight gradients from this many examples of "
    "each batch (drawn per step, scaled to the batch: unbiased, and that many times cheaper on the M55; "
    "default: all).",
)
@click.option(
    "--head-gradient",
    type=click.Choice(["exact", "zo"]),
    default="exact",
    show_default=True,
    help="The classifier's gradient: exact (its input features and softmax error, from one forward pass "
    "per step; no backward pass through the NPU) or zo (estimated like the layers below).",
)
@click.option(
    "--master",
    type=click.Choice(["float", "none"]),
    default="float",
    show_default=True,
    help="float: a float master copy of the trainable values; none: updates go straight to the int8 "
    "codes by stochastic rounding, no momentum (saves 4-8 bytes per parameter on the device).",
)
@click.option(
    "--keep",
    type=click.Choice(["best", "last"]),
    default="best",
    show_default=True,
    help="The model written: best on a held-out split of the training images (a tenth, at least 1000 where "
    "a quarter allows; charged to --budget; never the test set) when it beats the last by 2 standard "
    "errors, else the last; or last (no held-out split).",
)
@click.option(
    "--head-init",
    default="ridge",
    show_default=True,
    help="How a fresh head starts: ridge (least squares on the training images' features), imprint "
    "(class-mean prototypes) or zero; the feature passes are charged to --budget.",
)
@click.option(
    "--input-range",
    type=click.Choice(["auto", "0:255", "0:1", "-1:1"]),
    default="auto",
    show_default=True,
    help="Real range the model was trained on for pixels 0..255; auto reads it from the input quantization.",
)
@click.option(
    "--mean", default=None, help="Per-channel mean, R,G,B: input = (pixel/255 - mean) / std (with --std)."
)
@click.option("--std", default=None, help="Per-channel std, R,G,B (with --mean).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Run directory.")
@click.option(
    "--resume",
    type=click.Path(file_okay=False),
    default=None,
    help="Continue the run in DIR from its last checkpoint, with the options in DIR/config.json.",
)
@click.option("--quiet", is_flag=True, help="No setup lines and no progress line.")
@click.pass_context
def train(ctx, out_dir, resume, quiet, **options):
    """Fine-tune MODEL on DATA with zeroth-order gradient estimates; all forward passes on npusim.

    `zo train --resume DIR` alone continues the run in DIR with the options it recorded."""
    given = {k for k in options if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE}
    run_dir = resume or out_dir
    trainer = None
    try:
        with interrupt.guarded():
            trainer = set_up(options, given, out_dir, resume, quiet)
            result, before = train_and_report(trainer, quiet)
    except ZoError as e:
        fail(str(e))
    except NpusimError as e:  # the trained model could not be written (checked before training too)
        fail(f"{e}; the last checkpoint is kept")
    except OSError as e:  # metrics.csv, config.json or the exported model could not be written
        from .resume import resume_command

        fail(
            f"cannot write {e.filename or run_dir}: {e.strerror or e}; the last checkpoint is kept, "
            f"continue with: {resume_command(run_dir)}"
        )
    except (KeyboardInterrupt, SystemError) as e:
        if not interrupt.is_interrupt(e):
            raise
        interrupted(interrupt_message(run_dir, trainer, {k: options[k] for k in given}))
    finally:
        if run_dir is not None:  # a caller of main() in one process may train in the folder again
            from .run_lock import release_run

            release_run(run_dir)
    from .progress import percent

    exported = next(Path(run_dir).glob("model.*"), Path(run_dir) / "model.tflite")
    if result.get("kept"):
        click.echo(result["kept"])
    click.echo(
        f"test accuracy {percent(before)} -> {percent(result['test_accuracy'])} after {result['steps']} "
        f"steps, {result['forward_passes']} forward passes; model written to {exported}"
    )


def interrupt_message(run_dir, trainer, given: dict) -> str:
    if run_dir is None:
        return "interrupted before the first step; nothing to resume"
    from .resume import resume_command

    checkpoint = Path(run_dir) / "checkpoints" / "last.npz"
    if not checkpoint.exists():
        return "interrupted before the first step; nothing to resume"
    at = f" at step {trainer.step}" if trainer is not None else ""
    return f"interrupted{at}; checkpoint {checkpoint}; continue with: {resume_command(run_dir, given)}"


def parse_eps(value) -> int | None:
    """--eps: auto (None: measured per block) or a positive number of int8 steps."""
    if value is None or value == "auto":
        return None
    try:
        eps = int(value)
    except (TypeError, ValueError):
        raise ZoError(f"--eps {value!r}: expected auto or a positive integer number of int8 steps") from None
    if eps < 1:
        raise ZoError(f"--eps {value!r}: expected auto or a positive integer number of int8 steps")
    return eps


def set_up(options: dict, given: set, out_dir, resume, quiet):
    """The Trainer of the command's run: a new one, or the one in --resume DIR with its checkpoint."""
    import npusim

    from .resume import resume_command, resumed_options
    from .run_lock import lock_run, refuse_own_model
    from .trainer import TrainConfig, Trainer

    npusim.tune_process()
    options["eps"] = parse_eps(options["eps"])
    if {"budget", "budget_ms"} <= given:
        raise ZoError("--budget and --budget-ms: expected one of them (passes, or device milliseconds)")
    if "budget" in given:  # a budget in passes replaces a recorded one in device time
        given = given | {"budget_ms"}
    for name in ("model", "data"):
        if options[name] is not None:  # recorded as absolute paths: a resume works from anywhere
            options[name] = str(Path(options[name]).absolute())
    if resume:
        if out_dir is not None and Path(resume).resolve() != Path(out_dir).resolve():
            raise ZoError(
                f"--resume {resume}: resume continues a run in place, expected no --out or --out {resume}"
            )
        lock_run(resume, "--resume")  # before anything of the run is read: one writer at a time
        options = resumed_options(resume, options, given)
        refuse_own_model(options["model"], resume, "--resume")
    else:
        for name in ("model", "data", "out_dir"):
            if (options | {"out_dir": out_dir})[name] is None:
                raise ZoError(
                    f"--{name.split('_')[0]} is required to start a run (or --resume DIR to continue one)"
                )
        refuse_own_model(options["model"], out_dir)
        if (Path(out_dir) / "checkpoints" / "last.npz").exists():
            raise ZoError(
                f"--out {out_dir}: already holds a run; continue it with: {resume_command(out_dir)}, or "
                "choose a new directory"
            )
    report = None if quiet else (lambda message: click.echo(f"zo train: {message}", err=True))
    trainer = Trainer(TrainConfig(**options), resume or out_dir, report=report)
    if not resume:  # the model and data read, nothing written yet: the new run's folder is its own
        lock_run(out_dir)
        if (Path(out_dir) / "checkpoints" / "last.npz").exists():  # another run's, written meanwhile
            raise ZoError(f"--out {out_dir}: already holds a run; choose a new directory")
    if resume:
        trainer.load_checkpoint(Path(resume))
        cfg = trainer.config
        if cfg.budget_ms is None:
            spent = f"{trainer.forward_passes} forward passes spent of the run's total budget {cfg.budget}"
            left = f"{max(cfg.budget - trainer.forward_passes, 0)} left"
        else:
            ms = trainer.spent * trainer.device_seconds_per_pass * 1e3
            spent = f"{ms:.1f} device ms spent of the run's total budget {cfg.budget_ms:g} ms"
            left = f"{max(cfg.budget_ms - ms, 0):.1f} ms left"
        trainer.report(
            f"resumed from {Path(resume) / 'checkpoints' / 'last.npz'} at step {trainer.step}: {spent} "
            f"(--budget is the total, not passes to add), {left}"
        )
    return trainer


def train_and_report(trainer, quiet: bool) -> tuple[dict, float]:
    from .progress import StatusLine, percent

    trainer.report("evaluating the model on the test images before training")
    before = trainer.test_accuracy()
    trainer.report(f"test accuracy {percent(before)}; training (Ctrl-C stops at the next step, checkpointed)")
    ms = None if trainer.config.budget_ms is None else trainer.device_seconds_per_pass * 1e3
    status = None if quiet else StatusLine(trainer.total, ms_per_pass=ms)
    try:
        result = trainer.run(status.update if status else None)
    finally:
        if status is not None:
            status.close()
    return result, before


@main.command()
@click.option(
    "--model",
    required=True,
    type=click.Path(),  # a folder: load_model's one error line, not click's usage block
    help="Deployed int8 model, .tflite or ONNX QDQ / QOperator .onnx.",
)
@click.option("--trainable", default="last:1", show_default=True, help="last:K | NAME,... | biases")
@click.option("--q", "q", type=int, default=8, show_default=True, help="Gradient samples per step.")
@click.option("--batch", type=int, default=32, show_default=True)
@click.option(
    "--classes",
    type=int,
    default=None,
    help="Class count of the new task (replaces the head when it differs).",
)
@click.option("--new-head", is_flag=True, help="A fresh head (appended to a model without a classifier).")
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False),
    default=None,
    help="Refit the STM32N6 latency model on your board measurements (CSV as for npusim inspect).",
)
@click.option(
    "--master",
    type=click.Choice(["float", "none"]),
    default="float",
    show_default=True,
    help="As zo train's: none keeps no float master copy and no momentum buffer.",
)
def cost(model, trainable, q, batch, classes, new_head, calibration, master):
    """STM32N6 memory and time of one ZO step, next to back-propagation on the same layers."""
    from npusim import load_model
    from npusim.errors import NpusimError
    from npusim.npu import fit_cost_model, read_calibration_csv

    from .cost import format_step_parts, format_zo_step_report, step_parts, zo_step_report
    from .model import TrainableModel

    if q < 1 or batch < 1:
        fail(f"--q {q} --batch {batch}: expected both >= 1")
    import npusim

    npusim.tune_process()
    try:
        m = TrainableModel(load_model(model), trainable, num_classes=classes, new_head=new_head)
        device = fit_cost_model(read_calibration_csv(calibration)).cost if calibration else None
    except (ZoError, NpusimError) as e:
        fail(str(e))
    from .head_grad import ExactHead
    from .tail import ExactTail

    offsets, i = {}, 0
    for p in m.params:
        n = m.graph.tensors[p.tensor].data.size
        offsets[p.tensor] = (i, i + n)
        i += n
    tail = ExactTail.find(m, ExactHead.find(m, offsets), offsets)
    tensors = [p.tensor for p in m.params]
    report = zo_step_report(m.interp, tensors, q, batch, device, master=master)
    click.echo(format_zo_step_report(report, tail))
    click.echo(format_step_parts(step_parts(m.interp, tensors, q, batch, device)))
    from .local import cost_line

    line = cost_line(m, ExactHead.find(m, offsets), tail, offsets, batch)
    if line:
        click.echo(line)


if __name__ == "__main__":
    main()
