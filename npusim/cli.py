"""The `npusim` command line. Errors in the user's model or input: one line on stderr, exit 2."""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import click
import numpy as np

from .errors import NpusimError
from .interpreter import Interpreter
from .tflite_io import load_model

PROFILE = click.option("--profile", type=click.Choice(["tflm", "xnnpack", "single"]), default="tflm", show_default=True,
                       help="Rounding profile: tflm (TFLite Micro), xnnpack (LiteRT's default CPU path), single (CMSIS-NN single rounding).")


def fail(message: str, code: int = 2):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def friendly_errors(func):
    """Turn the project's errors into one line and exit 2; never a traceback for bad input."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except NpusimError as e:
            fail(str(e))
        except KeyboardInterrupt:
            fail("interrupted", 130)
    return wrapper


def load_array(path: str, what: str) -> np.ndarray:
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise NpusimError(f"{what} {path}: cannot read as .npy ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if not isinstance(x, np.ndarray):
        raise NpusimError(f"{what} {path}: expected a single .npy array, got an archive")
    return x


def tensor_file_name(index: int, name: str) -> str:
    return f"{index:04d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:80]}.npy"


@click.group()
@click.version_option(package_name="npusim-zo")
def main():
    """Bit-exact INT8 NPU simulator (TFLite Micro integer numerics)."""


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--input", "input_path", required=True, type=click.Path(dir_okay=False), help="N inputs stacked on axis 0 (.npy).")
@click.option("--output", "output_path", required=True, type=click.Path(dir_okay=False), help="Where to write the N outputs (.npy).")
@PROFILE
@click.option("--dump", type=click.Path(file_okay=False), help="Write every intermediate tensor as DIR/<index>_<name>.npy.")
@friendly_errors
def run(model, input_path, output_path, profile, dump):
    """Run MODEL on a batch of inputs."""
    interp = Interpreter(load_model(model), profile=profile)
    x = load_array(input_path, "--input")
    values = interp.run_all(x)
    y = values[interp.graph.outputs[0]]
    try:
        np.save(output_path, y)
        if dump:
            write_dump(interp, values, Path(dump))
    except OSError as e:
        raise NpusimError(f"cannot write output: {e.strerror}: {e.filename}") from None


def write_dump(interp: Interpreter, values: dict, directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    for index, value in values.items():
        np.save(directory / tensor_file_name(index, interp.graph.tensors[index].name), value)


def shape_text(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--target", type=click.Choice(["generic", "stm32n6"]), default="generic", show_default=True)
@friendly_errors
def inspect(model, target):
    """One row per op: shapes, MACs and parameters, then the totals."""
    interp = Interpreter(load_model(model))
    if target == "stm32n6":
        from .npu import report
        click.echo(report(interp))
        return
    g = interp.graph
    rows = [("#", "op", "inputs", "outputs", "MACs", "params")]
    total_macs = total_params = 0
    for k in interp.kernels:
        acts = [shape_text(g.tensors[t].shape) for t in k.op.inputs if t >= 0 and not g.tensors[t].is_constant]
        params = sum(g.tensors[t].data.size for t in k.op.inputs if t >= 0 and g.tensors[t].is_constant)
        outs = [shape_text(g.tensors[t].shape) for t in k.op.outputs]
        macs = k.macs()
        total_macs += macs
        total_params += params
        rows.append((str(k.op.index), k.kind, ", ".join(acts), ", ".join(outs), f"{macs:,}", f"{params:,}"))
    rows.append(("", "total", "", "", f"{total_macs:,}", f"{total_params:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(c.rjust(w) if i in (0, 4, 5) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


if __name__ == "__main__":
    main()
