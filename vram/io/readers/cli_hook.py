"""`python -m vram estimate --from FILE`: the CLI side of the readers, kept apart from cli.py.

Flags typed on the command line override what the file set; flags left at their defaults do
not. `--json` adds the mapped `setup` and the mapping report to the estimate's JSON.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vram.errors import ConfigError
from vram.files import write_text
from vram.io.knobs import build_setup, setup_knobs
from vram.io.readers import FORMATS, LoadedTrainingConfig, load_training_config
from vram.io.readers.mapper import split_fields
from vram.model.architecture import ModelSpec
from vram.model.catalog import load_model
from vram.setup import TrainingSetup


def add_from_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="from_file", metavar="FILE",
                        help="a training config to read: axolotl, torchtune, LLaMA-Factory, "
                             "TRL or ms-swift YAML/JSON, or an ms-swift launch script (`swift "
                             "sft ...`, read, never run); other flags override it")
    parser.add_argument("--format", choices=FORMATS,
                        help="the config's tool (default: inferred from its keys)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="torchtune override, as `tune run` takes it (repeatable)")


def explicit_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the options typed in `argv`: exact spellings, `--flag=value`, and the
    unambiguous prefixes argparse accepts (`--batc 4`)."""
    typed = {token.split("=", 1)[0] for token in argv if token.startswith("-")}
    actions = _all_actions(parser)
    options = {option: action.dest for action in actions for option in action.option_strings}
    dests: set[str] = set()
    for token in typed:
        if token in options:
            dests.add(options[token])
            continue
        matches = {dest for option, dest in options.items()
                   if token.startswith("--") and option.startswith(token)}
        if len(matches) == 1:
            dests |= matches
    return dests


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    actions = list(parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                actions.extend(sub._actions)
    return actions


def flag_overrides(args: argparse.Namespace, dests: set[str]) -> dict[str, Any]:
    """Setup fields from the flags that were typed (a flag's dest is its knob's field)."""
    fields: dict[str, Any] = {}
    for knob in setup_knobs():
        if knob.name not in dests:
            continue
        value = getattr(args, knob.name, None)
        if value is not None and knob.kind == "choice":
            value = knob.parse(str(value))
        fields[knob.name] = knob.outer(value) if value is not None else None
    if fields.get("method") not in (None, "qlora") and "quant" not in fields:
        fields["quant"] = None  # the file's 4/8-bit base goes with its QLoRA, not with --method
    return fields


def from_file(args: argparse.Namespace, parser: argparse.ArgumentParser,
              argv: Sequence[str]) -> tuple[ModelSpec, TrainingSetup, LoadedTrainingConfig]:
    """Model and setup for `--from FILE`, with typed flags on top. Raises VramError naming the
    file's key or the flag."""
    loaded = load_training_config(args.from_file, format=args.format,
                                  overrides=tuple(args.override))
    dests = explicit_dests(parser, argv)
    overrides = flag_overrides(args, dests)
    accepted, _, _ = split_fields({**loaded.fields, **overrides})
    setup = build_setup(accepted, lambda knob: knob.flag)
    if "model" in dests and args.model:
        model = load_model(args.model)
    elif loaded.model is not None:
        model = loaded.model
    else:
        raise ConfigError("--model", (loaded.model_problem or "the file names no model")
                          + " (or give --model)")
    return model, setup, loaded


def add_to_json(payload: Mapping[str, Any], setup: TrainingSetup,
                loaded: LoadedTrainingConfig) -> dict[str, Any]:
    """The estimate's JSON with the mapped setup and the mapping report."""
    out = dict(payload)
    out.setdefault("setup", setup.model_dump(mode="json"))
    out["from"] = {"format": loaded.format, "model_ref": loaded.model_ref,
                   "fields": loaded.fields, "mapping": loaded.report.model_dump(mode="json")}
    return out


def add_export_command(commands: Any, add_setup_flags: Callable[..., None]) -> None:
    """`python -m vram export --to axolotl|trl (--from FILE | setup flags) [--out PATH]`."""
    export = commands.add_parser("export", help="write a setup as an axolotl or TRL config")
    add_setup_flags(export, model_required=False)
    add_from_flags(export)
    export.add_argument("--to", choices=("axolotl", "trl"), required=True,
                        help="the training config to write: an axolotl YAML or a TRL SFT "
                             "config")
    export.add_argument("--out", help="write here instead of printing")


def run_export(args: argparse.Namespace, parser: argparse.ArgumentParser,
               setup_from_args: Callable[[argparse.Namespace], TrainingSetup]) -> int:
    from vram.io.export import to_axolotl_yaml, to_trl_yaml

    if args.from_file:
        _, setup, loaded = from_file(args, parser, args.argv)
        model = args.model or loaded.model_slug or loaded.model_ref or "MODEL"
    else:
        if not args.model:
            raise ConfigError("--model", "required (or give a training config with --from)")
        setup = setup_from_args(args)
        model = args.model
    writer = to_axolotl_yaml if args.to == "axolotl" else to_trl_yaml
    text, _ = writer(setup, model)
    if args.out:  # a regular file only: never a FIFO or a device (vram.files)
        write_text(args.out, text, what="--out")
    else:
        print(text, end="")
    return 0
