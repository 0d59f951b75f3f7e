"""`python -m vram`: estimate, trace, validate, and list GPUs and models.

    python -m vram estimate --model llama-3.1-8b --method qlora --optimizer adamw \\
        --precision bf16-mixed --batch 1 --seq 2048 --json
    python -m vram estimate --from axolotl.yml --gpus 2 --json
    python -m vram estimate --model llama-3.1-8b --method full --compress optimizer=4 --json
    python -m vram export --to trl --from axolotl.yml
    python -m vram gpus
    python -m vram validate ../shared/validation/cases.csv

Bad flags exit with status 2 and one line naming the flag.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from vram.cli import commands
from vram.cli import plan as plan_cli
from vram.cli import rl as rl_cli
from vram.cli.flags import Parser, add_setup_flags, fail
from vram.errors import VramError
from vram.io.readers import cli_hook


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m vram", description=__doc__.splitlines()[0])
    subcommands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    estimate_parser = subcommands.add_parser("estimate", help="memory of one training step")
    add_setup_flags(estimate_parser, model_required=False)
    estimate_parser.add_argument(
        "--compress", action="append", metavar="BUCKET=RATIO",
        help="what if BUCKET (weights, gradients, optimizer, activations) were stored RATIO "
             "times smaller (1 to 1024); repeat for several; the JSON gains what_if with the "
             "new buckets, device_peak_bytes and the cheapest fit")
    cli_hook.add_from_flags(estimate_parser)
    trace = subcommands.add_parser("trace", help="exact trace on fake tensors (needs vram[trace])")
    add_setup_flags(trace)
    trace.add_argument("--layers", type=int, help="trace this many layers exactly (no "
                       "extrapolation)")
    trace.add_argument("--reserved", action="store_true",
                       help="also replay the step from the model's build through the caching "
                            "allocator model (full depth: minutes for a large model) and "
                            "report max_memory_reserved under --alloc-conf")
    cli_hook.add_export_command(subcommands, add_setup_flags)
    gpus = subcommands.add_parser("gpus", help="list the GPU catalog")
    gpus.add_argument("--json", action="store_true",
                      help="print the catalog as one JSON list (memory in bytes)")
    models = subcommands.add_parser("models", help="list the model catalog")
    models.add_argument("--json", action="store_true",
                        help="print the catalog as one JSON list (parameters, Hub ids)")
    validate = subcommands.add_parser("validate", help="compare estimates with measured runs")
    validate.add_argument("cases", help="a case file (validation/README.md schema)")
    plan_cli.register(subcommands)  # plan, validate-speed
    rl_cli.add_command(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"python -m vram {args.command}"
    handlers = {"estimate": commands.run_estimate, "trace": commands.run_trace,
                "gpus": commands.run_gpus, "models": commands.run_models,
                "validate": commands.run_validate, "export": commands.run_export,
                **plan_cli.register_handlers(), "rl": rl_cli.run}
    try:
        return handlers[args.command](args, parser)
    except VramError as exc:
        return fail(prog, str(exc).splitlines()[0])
    except BrokenPipeError:
        return 0
    except OSError as exc:
        return fail(prog, f"{exc.filename or ''}: {exc.strerror or exc}")


if __name__ == "__main__":
    raise SystemExit(main())
