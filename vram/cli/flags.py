"""The command line's shared flags: every setup knob as a flag (declared once on the
`TrainingSetup` field, `vram.io.knobs`), the one-line usage error, and the setup they build.
Every subcommand's module imports this one, never `vram.cli` itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

from vram.io.knobs import AUTO, SetupKnob, build_setup, setup_knobs
from vram.setup import TrainingSetup

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
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


def add_knob_flag(parser: argparse.ArgumentParser, knob: SetupKnob) -> None:
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


def add_setup_flags(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    parser.add_argument("--model", required=model_required,
                        help="catalog name, Hub id, path to a config.json, or a size such as 7B")
    for knob in setup_knobs():
        add_knob_flag(parser, knob)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


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


def fail(prog: str, message: str) -> int:
    """One line on stderr, then the usage error's exit status."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE
