"""The `npusim` command line. Errors in the user's model or input: one line on stderr, exit 2."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

import click
import numpy as np

from ..errors import NpusimError, numpy_load_error
from ..formats.model_io import load_model, model_suffix
from ..profiles import N6_CHOICES, PROFILES
from . import interrupt
from .atomic import WriteFailed, replacing
from .cli_usage import OneLineGroup
from .display import shown, shown_lines

# The kernels (interpreter.py, and with it Numba) are imported by the commands that run a model,
# when they run: `npusim --help` and a bad argument answer at once.

# Not click.Path(dir_okay=False): click answers a folder with its usage block; the readers
# (load_model, load_array) say what the path is in one `error:` line, as for every other bad file.
FILE = click.Path()

PROFILE = click.option(
    "--profile",
    type=click.Choice(list(PROFILES)),
    default="tflm",
    show_default=True,
    help=(
        "Rounding profile: tflm (TFLite Micro), xnnpack (LiteRT's default CPU interpreter: "
        "XNNPACK and LiteRT's builtin kernels), single (CMSIS-NN single rounding), onnxruntime "
        "(ONNX Runtime's CPU kernels: float32 requantization, MLAS tables; see docs/numerics.md), "
        "neural-art (the STM32N6 NPU's integer datapath as ST's compiler configures it, --n6-* "
        "options; docs/neural-art.md)."
    ),
)


class ProfileSpec(click.ParamType):
    """A profile name, or for neural-art a spec with that side's own --n6-* choices:
    "neural-art:rounding=truncate,compiler=2.1" (npu.neural_art_run.parse_profile_spec)."""

    name = "PROFILE[:KEY=VALUE,...]"

    def convert(self, value, param, ctx):
        if value.partition(":")[0] not in PROFILES:
            self.fail(f"{value!r}: the profile is one of {', '.join(PROFILES)}", param, ctx)
        return value


def n6_options(func):
    """The --n6-* options of --profile neural-art (the datapath's unknowns, docs/neural-art.md),
    handed to the command as one `n6` argument (npu.N6Options)."""
    helps = {
        "rounding": "what round_mode_o does to a right shift",
        "add_products": "ADD: the two products summed exact then rounded once, or each rounded first",
        "shift_a": "CONVACC shift_a: no effect, or a left shift of the accumulator before shift_o",
        "input_offset": "conv input zero point: suboff subtracts it; or adds 128 and BC folds the rest",
        "compiler": "the ST Edge AI version whose conv requantization is derived (3.0: one ARITH; 2.x: two)",
    }
    for key, choices in reversed(N6_CHOICES.items()):
        flag = "--n6-" + key.replace("_", "-")
        func = click.option(
            flag,
            f"n6_{key}",
            type=click.Choice(choices),
            default=choices[0],
            show_default=True,
            help=f"--profile neural-art: {helps[key]}.",
        )(func)

    func = click.option(
        "--compiled",
        "n6_compiled",
        type=click.Path(dir_okay=False),
        default=None,
        help=(
            "ST Edge AI's compiled program (network_ecblobs.h, the network.c that includes it, or 3.0's "
            "readable <network>_blob_trace.c): inspect --target stm32n6 decodes its units beside the derived "
            "ones and counts latency on its epochs (internal RAM on network.c's buffers); --profile "
            "neural-art runs them (docs/neural-art.md)."
        ),
    )(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        values = {key: kwargs.pop(f"n6_{key}") for key in N6_CHOICES}
        compiled = kwargs.pop("n6_compiled")
        changed = [f"--n6-{k.replace('_', '-')}" for k, v in values.items() if v != N6_CHOICES[k][0]]
        changed += ["--compiled"] if compiled is not None and "target" not in kwargs else []
        profiles = [kwargs[k].partition(":")[0] for k in ("profile", "a", "b") if kwargs.get(k) is not None]
        if changed and profiles and "neural-art" not in profiles:
            fail(f"{', '.join(changed)} apply only to --profile neural-art, not to {', '.join(profiles)}")

        from ..npu.neural_art import N6Options

        return func(*args, n6=N6Options(**values, compiled=compiled), **kwargs)

    return wrapper


def fail(message: str, code: int = 2):
    click.echo(f"error: {shown(message)}", err=True)  # names from the file, escaped (npusim/app/display.py)
    sys.exit(code)


def friendly_errors(func):
    """Turn the project's errors into one line and exit 2; never a traceback for bad input. A
    SIGINT, SIGTERM or SIGHUP while the command runs: one line and exit 130 (npusim/app/interrupt.py),
    whatever the command was doing (a KeyboardInterrupt, or an error it caused on its way out)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from ..kernels.tuning import tune_process  # here, not in the group: a usage error loads no kernel

        try:
            with interrupt.guarded():
                tune_process()
                return func(*args, **kwargs)
        except NpusimError as e:
            if interrupt.is_interrupt(e):  # raised while an interrupt unwound (a write cut short)
                interrupted()
            fail(str(e))
        except (KeyboardInterrupt, Exception) as e:
            if not interrupt.is_interrupt(e):
                raise
            interrupted()

    return wrapper


def interrupted():
    interrupt.end_command()  # the command line's own process ends here (npusim/app/interrupt.py says why)
    interrupt.ignore_further()
    fail("interrupted", interrupt.EXIT_STATUS)


def load_array(path: str, what: str) -> np.ndarray:
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise NpusimError(f"{what} {path}: cannot read as .npy: {numpy_load_error(path, e)}") from None
    if not isinstance(x, np.ndarray):
        raise NpusimError(f"{what} {path}: expected a single .npy array, got an archive")
    return x


def check_output_path(path: str, option: str, suffixes=(".npy", ".npz")):
    """Before anything runs: an output path names its format, one of `suffixes` (numpy would add
    .npy to any other name and write a file the user did not name)."""
    if Path(path).suffix.lower() not in suffixes:
        names = " or ".join(suffixes)
        raise NpusimError(f"{option} {path}: expected a path ending in {names}, nothing written")


def save_array(path, value=None, archive: dict | None = None):
    """np.save / np.savez to exactly `path` (given a name, both would append their own suffix), whole
    or not at all: the previous file stays where this one cannot be written (npusim/app/atomic.py)."""
    try:
        with replacing(path) as f:
            if archive is None:
                np.save(f, value)
            else:
                np.savez(f, **archive)
    except WriteFailed as e:
        raise NpusimError(e.message("output")) from None


def tensor_file_name(index: int, name: str) -> str:
    return f"{index:04d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:80]}.npy"


@click.group(cls=OneLineGroup)
@click.version_option(package_name="npusim-zo")
def main():
    """Bit-exact INT8 NPU simulator (TFLite Micro integer numerics)."""


@main.command()
@click.argument("model", type=FILE)
@click.option(
    "--input",
    "input_paths",
    required=True,
    multiple=True,
    type=FILE,
    help="N inputs stacked on axis 0 (.npy). Repeat --input and --output to run several in one process.",
)
@click.option(
    "--output",
    "output_paths",
    required=True,
    multiple=True,
    type=FILE,
    help=(
        "Where to write the N outputs: .npy (a model with one output) or .npz (every output, keys "
        "output_0, output_1, ... in the graph's output order). The k-th --output takes the k-th --input's."
    ),
)
@PROFILE
@click.option(
    "--dump",
    type=click.Path(file_okay=False),
    help="Write every intermediate tensor as DIR/<index>_<name>.npy (one --input).",
)
@n6_options
@friendly_errors
def run(model, input_paths, output_paths, profile, dump, n6):
    """Run MODEL on a batch of inputs."""
    from ..runtime.interpreter import Interpreter

    if len(input_paths) != len(output_paths):
        raise NpusimError(
            f"--input given {len(input_paths)} time(s), --output {len(output_paths)}: "
            "expected one --output per --input, in the same order"
        )
    if dump and len(input_paths) > 1:
        raise NpusimError(f"--dump writes the tensors of one input, got {len(input_paths)} --input")
    for output_path in output_paths:
        check_output_path(output_path, "--output")
    from ..npu.neural_art_run import profile_object

    # its inputs run once each
    interp = Interpreter(load_model(model), profile=profile_object(profile, n6), warm=False)
    outputs = interp.graph.outputs
    for output_path in output_paths:
        if not output_path.lower().endswith(".npz") and len(outputs) > 1:
            raise NpusimError(
                f"model has {len(outputs)} outputs, --output {output_path} holds one: "
                "give an .npz path to write them all (keys output_0, output_1, ...)"
            )
    xs = [load_array(input_path, "--input") for input_path in input_paths]  # all read before any run
    for x, output_path in zip(xs, output_paths):
        if dump:  # every tensor kept, for the dump
            values = interp.run_all(x)
            results = [values[t] for t in outputs]
        else:
            # run(): each activation dropped after its last reader, and PADs and elementwise chains
            # folded into their readers; run_all() held all of MobileNetV2's at batch 256 (a first
            # call of 0.67 s and 520 MB against 0.49 s and 280 MB).
            results = interp.run(x)
            results = [results] if len(outputs) == 1 else results
        if output_path.lower().endswith(".npz"):
            save_array(output_path, archive={f"output_{k}": v for k, v in enumerate(results)})
        else:
            save_array(output_path, results[0])
        if dump:
            try:
                write_dump(interp, values, Path(dump))
            except OSError as e:  # the folder (a WriteFailed names its file and cause)
                raise NpusimError(f"--dump {dump}: {e}") from None
        values = results = None  # this input's tensors go before the next input runs


def write_dump(interp, values: dict, directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    for index, value in values.items():
        save_array(directory / tensor_file_name(index, interp.graph.tensors[index].name), value)


@main.command()
@click.argument("model", type=FILE)
@click.option("--target", type=click.Choice(["generic", "stm32n6"]), default="generic", show_default=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: the table; json: the same content as one JSON object, for scripts.",
)
@click.option(
    "--calibration",
    type=FILE,
    default=None,
    help=(
        "stm32n6: refit the latency model's NPU efficiency and epoch overhead on your own board "
        "measurements, a CSV with the columns of published.csv (file, npu_ms, ...; docs/stm32n6.md)."
    ),
)
@click.option(
    "--npu-efficiency",
    type=float,
    default=None,
    help=(
        "stm32n6: fraction of the NPU's 300 GMAC/s peak a deep convolution sustains [default: the fitted "
        "npusim.npu.NPU_EFFICIENCY]."
    ),
)
@click.option(
    "--m55-macs-per-cycle",
    type=float,
    default=None,
    help=(
        "stm32n6: int8 MACs per cycle of software epochs on the Cortex-M55 [default: "
        "npusim.npu.M55_MACS_PER_CYCLE]."
    ),
)
@click.option(
    "--lint",
    is_flag=True,
    help=(
        "stm32n6: list the layers where the Neural-ART datapath loses precision, each with its reason "
        "and predicted error in output steps (docs/neural-art.md)."
    ),
)
@n6_options
@friendly_errors
def inspect(model, target, fmt, calibration, npu_efficiency, m55_macs_per_cycle, lint, n6):
    """The inputs and outputs (name, shape, dtype, scale, zero point: how to feed the model), then one
    row per op: shapes, MACs and parameters, whether npusim runs it, then the totals (docs/inspect.md).

    With --target stm32n6: the NPU/M55 placement, epochs, internal RAM over the N6 RAM banks, weight
    memory and an estimated latency (the model, its constants and their sources: docs/stm32n6.md)."""
    from ..runtime.interpreter import Interpreter, uint8_model
    from .inspect_report import (
        batch_lines,
        io_details,
        io_lines,
        op_records,
        op_table,
        unsupported,
        unsupported_line,
    )

    interp = Interpreter(load_model(model, plan_only=True), plan_only=True)
    inputs, outputs = io_details(interp.graph)
    edges = {"model": Path(model).name, "inputs": inputs, "outputs": outputs, "batch": interp.batch.as_dict()}
    left_out = unsupported(interp)
    onnx = model_suffix(interp.graph) == ".onnx"
    head = [*io_lines(inputs, outputs, onnx), *batch_lines(interp.batch)]
    if target == "stm32n6" and interp.legacy_uint8 is not None:
        raise NpusimError(
            f"{uint8_model(interp.graph, interp.legacy_uint8)}: the STM32N6 view takes int8 models only "
            "(legacy uint8 is outside the Neural-ART's int8 scheme); plain `npusim inspect` lists it"
        )
    if target == "stm32n6":
        from ..npu import (
            CostModel,
            fit_cost_model,
            format_report,
            plan_device,
            read_calibration_csv,
            report_dict,
        )
        from ..npu.report import neural_art_ops

        cost, fitted = CostModel(), None
        if calibration is not None:
            fitted = fit_cost_model(read_calibration_csv(calibration), cost)
            cost = fitted.cost
        if npu_efficiency is not None:
            cost.npu_efficiency = npu_efficiency
        if m55_macs_per_cycle is not None:
            cost.m55_macs_per_cycle = m55_macs_per_cycle
        cost.__post_init__()  # validate the overrides
        dev = plan_device(interp, cost)
        program = None
        if n6.compiled is not None:
            from ..npu.compiled import read_compiled
            from ..npu.compiled_view import compiled_view, network_c_beside, read_network_c

            program = read_compiled(n6.compiled, interp.graph)
            network_c = network_c_beside(n6.compiled)
            view = compiled_view(dev, program, read_network_c(network_c) if network_c else None)
        note = unsupported_line(interp, "left out of this estimate")
        findings = None
        if lint:
            from ..npu.neural_art_lint import lint as n6_lint
            from ..npu.neural_art_lint import lint_lines

            findings = n6_lint(interp.graph, n6, {o.op_index for o in dev.npu_ops})
        if fmt == "json":
            data = {**edges, **report_dict(dev, Path(model).name, fitted), "unsupported": left_out}
            neural_art_ops(data, interp.graph, n6)
            if program is not None:
                from ..npu.compiled import compiled_ops

                compiled_ops(data, interp.graph, program, n6)
                data["compiled"]["n6_view"] = view
            if findings is not None:
                data["lint"] = findings
            click.echo(json.dumps(data, indent=1))
        else:
            text = format_report(dev, Path(model).name, fitted)
            lines = [*head, text, *([note] if note else [])]
            if program is not None:
                from ..npu.compiled import summary_lines
                from ..npu.compiled_view import view_lines

                lines += summary_lines(program, interp.graph, n6) + view_lines(view)
            click.echo(shown_lines("\n".join(lines + ([""] + lint_lines(findings) if lint else []))))
        return
    n6_only = (npu_efficiency, m55_macs_per_cycle, calibration, n6.compiled)
    if any(v is not None for v in n6_only) or lint:
        raise NpusimError(
            "--calibration, --npu-efficiency, --m55-macs-per-cycle, --lint and --compiled apply only with "
            "--target stm32n6"
        )
    records = op_records(interp)
    if fmt == "json":
        data = {**edges, "target": "generic", "ops": records, "unsupported": left_out}
        data.update(
            total_macs=sum(r["macs"] or 0 for r in records), total_params=sum(r["params"] for r in records)
        )
        click.echo(json.dumps(data, indent=1))
        return
    note = unsupported_line(interp, "`npusim run` refuses the model, the totals leave them out")
    click.echo(shown_lines("\n".join([*head, *op_table(records), *([note] if note else [])])))


@main.group()
def server():
    """The resident server that serves `npusim` calls (Linux: by default; NPUSIM_RESIDENT=0 turns it
    off): one per user, Python, installed sources and numeric environment, serving only callers of
    its own context (docs/performance.md)."""


@server.command("status")
def server_status():
    """This user's servers, one line each (exit 0), or that none runs (exit 1)."""
    from . import resident_files

    found = resident_files.servers(os.environ)
    if not found:
        click.echo("npusim server: not running")
        sys.exit(1)
    for s in found:
        click.echo(f"npusim server: running, pid {s['pid']}, socket {s['sock']}, log {s['log']}")


@server.command("stop")
def server_stop():
    """Stop all of this user's servers (of every source tree and environment); the calls they run
    finish. Exit 0 if one was stopped, 1 if none ran."""
    from . import resident_files

    stopped = resident_files.stop_all(os.environ)
    if not stopped:
        click.echo("npusim server: not running")
        sys.exit(1)
    for pid in stopped:
        click.echo(f"npusim server: stopped pid {pid}")


@main.group()
def golden():
    """Golden vectors: record a model's outputs and intermediates once, check them in CI."""


@golden.command("record")
@click.argument("model", type=FILE)
@click.option(
    "--input",
    "input_path",
    required=True,
    type=FILE,
    help="N inputs stacked on axis 0 (.npy).",
)
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    type=FILE,
    help="Golden file to write (.npz).",
)
@PROFILE
@click.option(
    "--store-limit",
    type=int,
    default=None,
    metavar="BYTES",
    help=(
        "Store an intermediate tensor's values (whole batch) up to "
        "this size; larger ones keep only their hash. [default: 1 MiB]"
    ),
)
@click.option(
    "--outputs-only",
    is_flag=True,
    help=(
        "Store only the input and the outputs' values (every intermediate keeps its hash, so a "
        "check still names the first diverging op): the small file for CI."
    ),
)
@friendly_errors
def golden_record(model, input_path, output_path, profile, store_limit, outputs_only):
    """Run MODEL on --input and write inputs, outputs, per-tensor hashes and small intermediates."""
    from .golden import DEFAULT_STORE_LIMIT, record

    check_output_path(output_path, "-o", (".npz",))
    if outputs_only and store_limit is not None:
        raise NpusimError(
            "--outputs-only and --store-limit: expected one of them (--outputs-only stores no intermediate)"
        )
    if outputs_only:
        store_limit = 0
    x = load_array(input_path, "--input")
    meta = record(
        model,
        x,
        output_path,
        profile=profile,
        store_limit=DEFAULT_STORE_LIMIT if store_limit is None else store_limit,
    )
    stored = sum(1 for e in meta["tensors"] if e["stored"])
    click.echo(
        f"recorded {len(meta['tensors'])} tensors ({stored} with values, {len(meta['tensors']) - stored} "
        f"hash only) of {meta['model_name']}, profile {profile}, batch {meta['batch']} -> {output_path} "
        f"({os.path.getsize(output_path):,} bytes)"
    )


@golden.command("check")
@click.argument("paths", nargs=-1, required=True, metavar="MODEL GOLDEN [MODEL GOLDEN]... | DIR")
@friendly_errors
def golden_check(paths):
    """Re-run MODEL on the golden input and check every tensor and every graph output. Exit 0: all
    match; 1: mismatch (first diverging op and the differing outputs printed); 2: another model, or a
    damaged or foreign golden file.

    Several MODEL GOLDEN pairs, or a DIR of NAME.golden.npz files each beside its NAME.tflite or
    NAME.onnx (subfolders included), are checked in one process: one line per golden, then a count.
    Exit 2 if any pair is bad input, else 1 if any mismatches, else 0 (docs/golden.md)."""
    from .golden import check

    if len(paths) == 2:  # one pair: its contract as it always was
        result = check(*paths)
        click.echo(shown_lines(result.message()))
        if not result.ok:
            sys.exit(1)
        return
    sys.exit(check_pairs(golden_pairs(paths)))


def golden_pairs(paths) -> list:
    """(model or None, golden, problem or None) from the arguments of `golden check`: MODEL GOLDEN
    pairs, or one directory."""
    from .golden import pairs_in_directory

    if len(paths) == 1:
        if not Path(paths[0]).is_dir():
            raise NpusimError(f"golden check {paths[0]}: expected MODEL GOLDEN, MODEL GOLDEN pairs or a DIR")
        return pairs_in_directory(paths[0])
    if len(paths) % 2:
        raise NpusimError(
            f"golden check: {len(paths)} paths, expected MODEL GOLDEN pairs (an even number) or one DIR"
        )
    return [(m, g, None) for m, g in zip(paths[::2], paths[1::2])]


def check_pairs(pairs) -> int:
    """Check each pair in this process (the start-up is paid once), one line each: GOLDEN: OK: ... or
    GOLDEN: MISMATCH: ... on stdout, error: ... on stderr; then the counts. Returns the exit code."""
    from .golden import check

    ok = mismatched = failed = 0
    for model, golden_file, problem in pairs:
        try:
            if problem:
                raise NpusimError(problem)
            result = check(model, golden_file)
        except NpusimError as e:
            failed += 1
            message = str(e)
            named = str(golden_file) in message or str(model) in message
            click.echo(f"error: {shown(message if named else f'{golden_file}: {message}')}", err=True)
            continue
        click.echo(shown_lines(f"{golden_file}: {result.message()}"))
        ok += result.ok
        mismatched += not result.ok
    click.echo(f"{len(pairs)} golden file(s) checked: {ok} OK, {mismatched} MISMATCH, {failed} error(s)")
    return 2 if failed else 1 if mismatched else 0


@main.command()
@click.argument("model", type=FILE)
@click.option(
    "--input",
    "input_path",
    required=True,
    type=FILE,
    help="N inputs stacked on axis 0 (.npy).",
)
@click.option(
    "--a",
    "--profile",
    "a",
    type=ProfileSpec(),
    default="tflm",
    show_default=True,
    help=(
        f"Profile of run A (the simulator's profile when comparing against --reference): one of "
        f"{', '.join(PROFILES)}; neural-art may carry this side's own --n6-* choices, as in "
        "neural-art:rounding=truncate,compiler=2.1 (over the --n6-* options both sides share)."
    ),
)
@click.option("--b", "b", type=ProfileSpec(), default=None, help="Profile of run B (as --a).")
@click.option(
    "--reference",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory of reference tensors, one .npy each: <index>_<name>.npy as --dump writes, or <name>.npy.",
)
@n6_options
@friendly_errors
def compare(model, input_path, a, b, reference, n6):
    """Per-op differences between two profiles (--a, --b) or against --reference DIR, the first op
    where they part and a summary per graph output. A report: exit 0 whenever it runs, 2 on bad input."""
    from .compare import compare_profiles, compare_reference, format_comparison

    if (b is None) == (reference is None):
        raise NpusimError("give exactly one of --b PROFILE or --reference DIR")
    graph = load_model(model)
    x = load_array(input_path, "--input")
    result = (
        compare_profiles(graph, x, a, b, n6)
        if reference is None
        else compare_reference(graph, x, reference, a, n6)
    )
    click.echo(shown_lines(format_comparison(result)))


@main.command()
@click.argument("int8_model", type=FILE)
@click.option(
    "--input",
    "input_path",
    required=True,
    metavar="X.npy",
    type=FILE,
    help="N samples (.npy): float32 (quantized by the model's input quantization) or the model's dtype.",
)
@click.option(
    "--float",
    "float_path",
    metavar="FLOAT_MODEL",
    type=FILE,
    help="The float32 .tflite the int8 model was made from (default: the int8 graph in float).",
)
@click.option(
    "--labels",
    "labels_path",
    metavar="Y.npy",
    type=FILE,
    help="N integer class labels (.npy): top-1 accuracy of both models and their agreement.",
)
@PROFILE
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "csv"]), default="text", show_default=True
)
@click.option(
    "--report",
    "report_dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Write DIR/index.html and its PNG plots.",
)
@n6_options
@friendly_errors
def validate(int8_model, input_path, float_path, labels_path, profile, fmt, report_dir, n6):
    """How far INT8_MODEL is from float: per output and per layer (docs/validate.md)."""
    from . import validate as v

    if report_dir:
        from .validate_report import report_directory

        report_directory(report_dir)
    x = load_array(input_path, "--input")
    labels = load_array(labels_path, "--labels") if labels_path else None
    int8 = load_model(int8_model)
    onnx_pair = int8.source.format == "onnx"  # a float ONNX is read by its reference
    reference = (float_path if onnx_pair else load_model(float_path)) if float_path else None
    result = v.validate(int8, x, reference, labels, profile, n6)
    for warning in result.warnings:
        click.echo(f"warning: {warning}", err=True)
    if report_dir:
        from .validate_report import write_report

        write_report(result, report_dir)
    if fmt == "json":
        click.echo(json.dumps(result.json, indent=1))
    elif fmt == "csv":
        click.echo(shown_lines(v.csv_report(result)), nl=False)
    else:
        click.echo(shown_lines(v.text_report(result)), nl=False)


if __name__ == "__main__":
    main()
