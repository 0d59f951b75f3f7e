"""`python -m vram`: estimate, trace, validate, and list GPUs and models.

    python -m vram estimate --model llama-3.1-8b --method qlora --optimizer adamw \\
        --precision bf16-mixed --batch 1 --seq 2048 --json
    python -m vram gpus
    python -m vram validate ../shared/validation/cases.csv

Bad flags exit with status 2 and one line naming the flag.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import ValidationError

from vram.catalog import load_config, load_model, model_catalog
from vram.errors import VramError
from vram.estimate import estimate
from vram.gpus import fit, load_gpus
from vram.plan import cli as plan_cli
from vram.report import estimate_json, estimate_table, gpus_table
from vram.setup import (
    Attention,
    Framework,
    Loss,
    Method,
    Offload,
    Optimizer,
    Precision,
    Quant,
    Sharding,
    TrainingSetup,
)
from vram.validate import report_lines, run_cases

EXIT_USAGE = 2

#: Setup field -> the flag a person typed, for error messages.
FLAG_FOR_FIELD: dict[str, str] = {
    "method": "--method", "lora_rank": "--lora-rank", "lora_targets": "--lora-targets",
    "lora_dropout": "--lora-dropout", "quant": "--quant", "optimizer": "--optimizer",
    "precision": "--precision", "micro_batch": "--batch", "seq_len": "--seq",
    "grad_accum": "--grad-accum", "grad_ckpt": "--grad-ckpt", "attention": "--attention",
    "loss": "--loss", "n_gpus": "--gpus", "sharding": "--sharding", "offload": "--offload",
    "framework": "--framework", "compile": "--compile",
    "longest_batch_repeats": "--single-longest-batch",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line and exits with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _values(enum: type[Any]) -> list[str]:
    return [member.value for member in enum]


def _add_setup_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="catalog name, path to a config.json, or a size such as 7B")
    parser.add_argument("--method", choices=_values(Method), default="full")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-targets", default="all-linear",
                        help="q_proj,v_proj,... or all-linear")
    parser.add_argument("--lora-dropout", type=float, default=0.05)
    parser.add_argument("--quant", choices=_values(Quant))
    parser.add_argument("--optimizer", choices=_values(Optimizer), default="adamw")
    parser.add_argument("--precision", choices=_values(Precision), default="bf16-mixed")
    parser.add_argument("--batch", type=int, default=1, help="micro-batch per GPU")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing")
    parser.add_argument("--single-longest-batch", action="store_true",
                        help="only one step is as long as --seq (default: long steps can "
                             "follow each other)")
    parser.add_argument("--attention", choices=_values(Attention), default="sdpa")
    parser.add_argument("--loss", choices=_values(Loss),
                        help="standard or chunked cross-entropy (default: the stack's)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile (default: the stack's)")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--sharding", default="none",
                        choices=[*_values(Sharding), "fsdp-full", "fsdp-grad-op",
                                 "fsdp-no-shard"])
    parser.add_argument("--offload", choices=_values(Offload), default="none")
    parser.add_argument("--framework", choices=_values(Framework), default="hf-trainer")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m vram", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_setup_flags(commands.add_parser("estimate", help="memory of one training step"))
    trace = commands.add_parser("trace", help="exact trace on fake tensors (needs vram[trace])")
    _add_setup_flags(trace)
    trace.add_argument("--layers", type=int, help="trace this many layers exactly (no "
                       "extrapolation)")
    gpus = commands.add_parser("gpus", help="list the GPU catalog")
    gpus.add_argument("--json", action="store_true")
    models = commands.add_parser("models", help="list the model catalog")
    models.add_argument("--json", action="store_true")
    validate = commands.add_parser("validate", help="compare estimates with measured runs")
    validate.add_argument("cases", help="a case file (validation/README.md schema)")
    plan_cli.register(commands, _add_setup_flags)  # plan, validate-speed
    return parser


def setup_from_args(args: argparse.Namespace) -> TrainingSetup:
    """A TrainingSetup from parsed flags; raises ValidationError naming setup fields."""
    fields: dict[str, Any] = {
        "method": args.method, "lora_rank": args.lora_rank, "lora_targets": args.lora_targets,
        "lora_dropout": args.lora_dropout, "optimizer": args.optimizer,
        "precision": args.precision, "micro_batch": args.batch, "seq_len": args.seq,
        "grad_accum": args.grad_accum, "grad_ckpt": args.grad_ckpt,
        "longest_batch_repeats": not args.single_longest_batch,
        "attention": args.attention, "n_gpus": args.gpus, "sharding": args.sharding,
        "offload": args.offload, "framework": args.framework,
    }
    if args.quant is not None:
        fields["quant"] = args.quant
    if args.loss is not None:
        fields["loss"] = args.loss
    if args.compile is not None:
        fields["compile"] = args.compile
    return TrainingSetup.model_validate(fields)


def validation_message(exc: ValidationError) -> str:
    """One line: the flag and what is allowed."""
    error = exc.errors()[0]
    field = str(error["loc"][0]) if error["loc"] else ""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not field and ": " in message:  # cross-field rules start with the field they are about
        field, message = message.split(": ", 1)
    flag = FLAG_FOR_FIELD.get(field, field or "setup")
    return f"{flag}: {message}"


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _estimate(args: argparse.Namespace) -> int:
    setup = setup_from_args(args)
    model = load_model(args.model)
    result = estimate(model, setup)
    report = fit(model, setup)
    if args.json:
        print(json.dumps(estimate_json(result, report), indent=2))
    else:
        print(estimate_table(result, report))
    return 0


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
            print(f"{name:<12} {value / 2**30:10.2f} GiB")
        print(f"{'peak':<12} {payload['allocated_peak_bytes'] / 2**30:10.2f} GiB "
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
    prog = f"python -m vram {args.command}"
    commands = {"estimate": _estimate, "trace": _trace, "gpus": _gpus, "models": _models,
                "validate": _validate, **plan_cli.register_handlers()}
    try:
        return commands[args.command](args)
    except ValidationError as exc:
        return _fail(prog, validation_message(exc))
    except VramError as exc:
        return _fail(prog, str(exc).splitlines()[0])
    except BrokenPipeError:
        return 0
    except OSError as exc:
        return _fail(prog, f"{exc.filename or ''}: {exc.strerror or exc}")


if __name__ == "__main__":
    raise SystemExit(main())
