"""`python -m vram`: estimate, trace, validate, and list GPUs and models.

    python -m vram estimate --model llama-3.1-8b --method qlora --optimizer adamw \\
        --precision bf16-mixed --batch 1 --seq 2048 --json
    python -m vram estimate --from axolotl.yml --gpus 2 --json
    python -m vram export --to trl --from axolotl.yml
    python -m vram gpus
    python -m vram validate ../shared/validation/cases.csv

Bad flags exit with status 2 and one line naming the flag.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from vram.cli import plan as plan_cli
from vram.cli import rl as rl_cli
from vram.errors import VramError
from vram.gpus import fit, load_gpus
from vram.io.knobs import AUTO, SetupKnob, build_setup, setup_knobs
from vram.io.readers import cli_hook
from vram.io.report import (
    estimate_json,
    estimate_json_text,
    estimate_table,
    gpus_table,
    setup_warnings,
)
from vram.io.validate import report_lines, run_cases
from vram.model.catalog import load_config, load_model, model_catalog
from vram.setup import TrainingSetup
from vram.step.estimate import estimate
from vram.units import format_gib

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line and exits with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _flag_name(knob: SetupKnob) -> str:
    return knob.flag


def _flag_type(knob: SetupKnob) -> Callable[[str], object]:
    """The knob's own parser, reporting its allowed values the argparse way."""

    def parse(text: str) -> object:
        try:
            return knob.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = knob.name
    return parse


def _add_knob_flag(parser: argparse.ArgumentParser, knob: SetupKnob) -> None:
    """One flag from the knob's declaration; its default is the library's (`TrainingSetup`)."""
    names = [knob.flag, *knob.meta.flag_aliases]
    default = None if knob.optional else knob.outer(knob.default)
    shown = knob.labels.get(AUTO, "the stack's") if knob.optional else knob.text(knob.default)
    help_text = knob.meta.help or knob.label
    if "default" not in help_text:
        help_text += f" (default: {shown})"
    help_text = help_text.replace("%", "%%")
    metavar = knob.flag.removeprefix("--").upper().replace("-", "_")
    if knob.kind == "bool":
        parser.add_argument(*names, dest=knob.name, action=argparse.BooleanOptionalAction,
                            default=default, help=help_text)
    elif knob.kind == "choice":
        choices = [str(c) for c in knob.choices] + list(knob.meta.aliases)
        choices += [AUTO] if knob.optional else []
        parser.add_argument(*names, dest=knob.name, choices=choices, default=default,
                            help=help_text)
    else:
        parser.add_argument(*names, dest=knob.name, type=_flag_type(knob), default=default,
                            metavar=metavar, help=help_text)


def _add_setup_flags(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    parser.add_argument("--model", required=model_required,
                        help="catalog name, Hub id, path to a config.json, or a size such as 7B")
    for knob in setup_knobs():
        _add_knob_flag(parser, knob)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m vram", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    estimate_parser = commands.add_parser("estimate", help="memory of one training step")
    _add_setup_flags(estimate_parser, model_required=False)
    cli_hook.add_from_flags(estimate_parser)
    trace = commands.add_parser("trace", help="exact trace on fake tensors (needs vram[trace])")
    _add_setup_flags(trace)
    trace.add_argument("--layers", type=int, help="trace this many layers exactly (no "
                       "extrapolation)")
    cli_hook.add_export_command(commands, _add_setup_flags)
    gpus = commands.add_parser("gpus", help="list the GPU catalog")
    gpus.add_argument("--json", action="store_true")
    models = commands.add_parser("models", help="list the model catalog")
    models.add_argument("--json", action="store_true")
    validate = commands.add_parser("validate", help="compare estimates with measured runs")
    validate.add_argument("cases", help="a case file (validation/README.md schema)")
    plan_cli.register(commands, _add_setup_flags)  # plan, validate-speed
    rl_cli.add_command(commands)
    return parser


def setup_from_args(args: argparse.Namespace) -> TrainingSetup:
    """A TrainingSetup from parsed flags; a bad one raises `KnobError` naming the flag."""
    fields: dict[str, object] = {}
    for knob in setup_knobs():
        value = getattr(args, knob.name)
        if value is None:
            continue  # an optional knob left to the stack
        if knob.kind == "choice":
            value = knob.parse(str(value))
        fields[knob.name] = knob.outer(value)
    return build_setup(fields, _flag_name)


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _estimate(args: argparse.Namespace) -> int:
    if args.from_file:
        return _estimate_from_file(args)
    if not args.model:
        raise VramError("--model: required (or give a training config with --from FILE)")
    setup = setup_from_args(args)
    model = load_model(args.model)
    result = estimate(model, setup)
    report = fit(model, setup)
    for warning in setup_warnings(setup):
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(estimate_json_text(result, report))
    else:
        print(estimate_table(result, report))
    return 0


def _estimate_from_file(args: argparse.Namespace) -> int:
    model, setup, loaded = cli_hook.from_file(args, build_parser(), args.argv)
    result = estimate(model, setup)
    report = fit(model, setup)
    for warning in setup_warnings(setup):
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        payload = cli_hook.add_to_json(estimate_json(result, report), setup, loaded)
        print(json.dumps(payload, indent=2))
    else:
        print("\n".join(loaded.report.lines()) + "\n")
        print(estimate_table(result, report))
    return 0


def _export(args: argparse.Namespace) -> int:
    return cli_hook.run_export(args, build_parser(), setup_from_args)


def _trace(args: argparse.Namespace) -> int:
    from vram.trace import TraceUnavailable, trace_step

    setup = setup_from_args(args)
    config = load_config(args.model)
    try:
        traced = trace_step(config, setup, n_layers=args.layers)
    except TraceUnavailable as exc:
        print(f"python -m vram trace: {exc}", file=sys.stderr)
        return 1
    payload = traced.to_json()
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        for name, value in payload.get("buckets", {}).items():
            print(f"{name:<12} {format_gib(value, 10)}")
        print(f"{'peak':<12} {format_gib(payload['allocated_peak_bytes'], 10)} "
              f"(allocated, {payload.get('phase', '')})")
    return 0


def _gpus(args: argparse.Namespace) -> int:
    gpus = load_gpus()
    if args.json:
        print(json.dumps([gpu.model_dump() for gpu in gpus], indent=2))
    else:
        print(gpus_table(gpus))
    return 0


def _models(args: argparse.Namespace) -> int:
    entries = model_catalog()
    if args.json:
        print(json.dumps([entry.model_dump() for entry in entries], indent=2))
    else:
        for entry in entries:
            size = f" [{entry.teaching_size}]" if entry.teaching_size else ""
            print(f"{entry.slug:<34} {entry.params / 1e9:8.2f}B  {entry.display_name}{size}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    results = run_cases(args.cases)
    print("\n".join(report_lines(results)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"python -m vram {args.command}"
    commands = {"estimate": _estimate, "trace": _trace, "gpus": _gpus, "models": _models,
                "validate": _validate, "export": _export, **plan_cli.register_handlers(),
                "rl": rl_cli.run}
    try:
        return commands[args.command](args)
    except VramError as exc:
        return _fail(prog, str(exc).splitlines()[0])
    except BrokenPipeError:
        return 0
    except OSError as exc:
        return _fail(prog, f"{exc.filename or ''}: {exc.strerror or exc}")


if __name__ == "__main__":
    raise SystemExit(main())
