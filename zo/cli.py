"""The `zo` command line: forward-only fine-tuning of an int8 .tflite or .onnx model on npusim."""

from __future__ import annotations

import sys
from pathlib import Path

import click

import npusim

from .errors import ZoError
from .trainer import TrainConfig, Trainer


def fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group()
@click.version_option(package_name="npusim-zo")
def main():
    """Zeroth-order (forward-only) on-device training on the npusim INT8 simulator."""
    npusim.tune_process()


@main.command()
@click.option(
    "--model",
    required=True,
    type=click.Path(),  # a folder: load_model's one error line, not click's usage block
    help="Deployed int8 model, .tflite or ONNX QDQ / QOperator .onnx.",
)
@click.option(
    "--data",
    required=True,
    type=click.Path(),
    help=".npz, EuroSAT folder of class folders, or STL-10 binary folder.",
)
@click.option(
    "--trainable",
    default="last:1",
    show_default=True,
    help="last:K | NAME,... (weight or output tensor names) | biases",
)
@click.option(
    "--q",
    "q_spec",
    default="qscheduler",
    show_default=True,
    help="fixed:N | qscheduler[:QMAX] (the slope test under nsgd, the efficiency test under sgd and adam) "
    "| slope, coupled, snr, efficiency, linear, power [:QMAX]",
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
    help="Learning rate in integer steps (default: 0.03 for nsgd, 0.1 for adam, 0.5 for sgd).",
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
    type=int,
    default=1,
    show_default=True,
    help="Perturbation size in int8 steps of each weight's scale.",
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
    help="Forward passes (of one mini-batch) to spend.",
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
    "--profile", type=click.Choice(["tflm", "xnnpack", "single"]), default="tflm", show_default=True
)
@click.option("--train-size", type=int, default=None, help="Use a stratified subset of the training images.")
@click.option("--test-size", type=int, default=None, help="Use a stratified subset of the test images.")
@click.option(
    "--new-head",
    is_flag=True,
    help="Start from a zero classifier head even when the class count is unchanged.",
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
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run directory.")
@click.option(
    "--resume",
    type=click.Path(file_okay=False),
    default=None,
    help="Continue the run in DIR from its last checkpoint.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(
    model,
    data,
    trainable,
    q_spec,
    optimizer,
    lr,
    lr_schedule,
    momentum,
    eps,
    direction,
    rounding,
    batch,
    budget,
    seed,
    eval_every,
    checkpoint_every,
    profile,
    train_size,
    test_size,
    new_head,
    input_range,
    mean,
    std,
    out_dir,
    resume,
    quiet,
):
    """Fine-tune MODEL on DATA with zeroth-order gradient estimates; all forward passes on npusim."""
    config = TrainConfig(
        model=model,
        data=data,
        trainable=trainable,
        q=q_spec,
        optimizer=optimizer,
        lr=lr,
        lr_schedule=lr_schedule,
        momentum=momentum,
        eps=eps,
        direction=direction,
        rounding=rounding,
        batch=batch,
        budget=budget,
        seed=seed,
        eval_every=eval_every,
        checkpoint_every=checkpoint_every,
        profile=profile,
        train_size=train_size,
        test_size=test_size,
        new_head=new_head,
        input_range=input_range,
        mean=mean,
        std=std,
    )
    try:
        trainer = Trainer(config, resume or out_dir)
        if resume:
            if Path(resume).resolve() != Path(out_dir).resolve():
                raise ZoError(f"--resume {resume}: resume continues a run in place, expected --out {resume}")
            trainer.load_checkpoint(Path(resume))
        elif (Path(out_dir) / "checkpoints" / "last.npz").exists():
            raise ZoError(
                f"--out {out_dir}: already holds a run; pass --resume {out_dir} to continue it, or "
                "choose a new directory"
            )
        before = trainer.test_accuracy()
        bar = (
            None
            if quiet
            else click.progressbar(
                length=config.budget,
                label="zo train",
                file=sys.stderr,
                item_show_func=lambda s: s,
                show_pos=True,
            )
        )

        def on_step(t, q, loss):
            if bar is not None:
                bar.update(
                    t.forward_passes - bar.pos,
                    f"step {t.step} q {q} loss {loss:.4f} passes {t.forward_passes}",
                )

        if bar is not None:
            bar.__enter__()
            bar.update(trainer.forward_passes)
        try:
            result = trainer.run(on_step)
        finally:
            if bar is not None:
                bar.__exit__(None, None, None)
    except ZoError as e:
        fail(str(e))
    except OSError as e:  # metrics.csv, config.json or the exported model could not be written
        fail(
            f"cannot write {e.filename or out_dir}: {e.strerror or e}; the last checkpoint is "
            "kept, continue with --resume"
        )
    except KeyboardInterrupt:
        checkpoints = Path(resume or out_dir) / "checkpoints"
        if (checkpoints / "last.npz").exists():
            fail(f"interrupted; checkpoint written to {checkpoints}; continue with --resume", 130)
        fail("interrupted before the first step; nothing to resume", 130)
    exported = next(Path(out_dir).glob("model.*"), Path(out_dir) / "model.tflite")
    click.echo(
        f"test accuracy {before:.4f} -> {result['test_accuracy']:.4f} after {result['steps']} steps, "
        f"{result['forward_passes']} forward passes; model written to {exported}"
    )


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
def cost(model, trainable, q, batch, classes, new_head, calibration):
    """STM32N6 memory and time of one ZO step, next to back-propagation on the same layers."""
    from npusim import load_model
    from npusim.errors import NpusimError
    from npusim.npu import fit_cost_model, read_calibration_csv

    from .cost import format_zo_step_report, zo_step_report
    from .model import TrainableModel

    if q < 1 or batch < 1:
        fail(f"--q {q} --batch {batch}: expected both >= 1")
    try:
        m = TrainableModel(load_model(model), trainable, num_classes=classes, new_head=new_head)
        device = fit_cost_model(read_calibration_csv(calibration)).cost if calibration else None
    except (ZoError, NpusimError) as e:
        fail(str(e))
    click.echo(
        format_zo_step_report(zo_step_report(m.interp, [p.tensor for p in m.params], q, batch, device))
    )


if __name__ == "__main__":
    main()
