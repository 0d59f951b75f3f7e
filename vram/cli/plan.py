"""`python -m vram plan` and `python -m vram validate-speed`, registered by `vram.cli`.

    python -m vram plan --model llama-3.1-8b --method qlora --seq 4096 --batch 4 \\
        --gpu rtx-4090 --gpu-count 2 --tokens 1e9 --json
    python -m vram validate-speed [data/throughput.csv]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from vram.cli.flags import add_setup_flags, setup_from_args
from vram.errors import VramError
from vram.io.readers import cli_hook
from vram.setup import TrainingSetup

Handler = Callable[[argparse.Namespace, argparse.ArgumentParser], int]


def register_handlers() -> dict[str, Handler]:
    """The subcommands' handlers, by name."""
    return {"plan": _plan, "validate-speed": _validate_speed}


def register(commands: Any) -> None:
    """Add the subcommands to `commands` (argparse subparsers)."""
    plan = commands.add_parser("plan", help="fit my GPUs, the largest batch and sequence, "
                               "the levers that make it fit, time and cost of the run")
    add_setup_flags(plan, model_required=False)
    cli_hook.add_from_flags(plan)  # --from FILE: the run as a training config describes it
    plan.add_argument("--gpu", help="GPU id from `python -m vram gpus` (default: the "
                      "catalog option whose whole run costs least)")
    plan.add_argument("--gpu-count", type=int, default=1, help="GPUs per node (default 1)")
    plan.add_argument("--nodes", type=int, default=1,
                      help="nodes of --gpu-count GPUs each (default 1)")
    plan.add_argument("--tokens", type=float, help="tokens to train (e.g. 1e9)")
    plan.add_argument("--steps", type=int, help="optimizer steps (tokens = steps x micro-batch "
                      "x accumulation x GPUs x sequence)")
    plan.add_argument("--dataset-tokens", type=float, help="tokens in the data set")
    plan.add_argument("--epochs", type=float, default=1.0, help="with --dataset-tokens")
    plan.add_argument("--max-seq", action="store_true",
                      help="how long can my context be on these GPUs: the longest sequence "
                           "as set and with context parallel, tensor parallel, activation "
                           "offload and FP8, with what each sends per step")
    speed = commands.add_parser("validate-speed",
                                help="the time model's error on published throughputs")
    speed.add_argument("table", nargs="?", help="a throughput table (default: "
                       "data/throughput.csv)")


def _positive(name: str, value: float | None, *, upper: float) -> None:
    if value is not None and not 0 < value <= upper:
        raise VramError(f"{name}: must be above 0 and at most {upper:g} (got {value:g})")


def tokens_from(args: argparse.Namespace, setup: TrainingSetup, n_gpus: int) -> float | None:
    """Tokens to train from --tokens, --steps or --dataset-tokens x --epochs."""
    _positive("--tokens", args.tokens, upper=1e16)
    _positive("--steps", args.steps, upper=1e12)
    _positive("--dataset-tokens", args.dataset_tokens, upper=1e16)
    _positive("--epochs", args.epochs, upper=1e6)
    given = [flag for flag, value in (("--tokens", args.tokens), ("--steps", args.steps),
                                      ("--dataset-tokens", args.dataset_tokens)) if value]
    if len(given) > 1:
        raise VramError(f"{given[1]}: give one of --tokens, --steps, --dataset-tokens")
    if args.tokens:
        return float(args.tokens)
    if args.steps:
        return float(args.steps * setup.micro_batch * setup.grad_accum * n_gpus
                     * setup.seq_len)
    if args.dataset_tokens:
        return float(args.dataset_tokens * args.epochs)
    return None


def _plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from vram.gpus import load_gpus
    from vram.model.catalog import load_model
    from vram.plan.hardware import Hardware, find_gpu
    from vram.plan.planner import plan
    from vram.plan.report import plan_json, plan_text

    if args.from_file:
        model, setup, _ = cli_hook.from_file(args, parser, args.argv)
    elif args.model:
        model, setup = load_model(args.model), setup_from_args(args)
    else:
        raise VramError("--model: required (or give a training config with --from FILE)")
    if not 1 <= args.gpu_count <= 64:
        raise VramError(f"--gpu-count: must be 1 to 64 (got {args.gpu_count})")
    if not 1 <= args.nodes <= 64:
        raise VramError(f"--nodes: must be 1 to 64 (got {args.nodes})")
    gpus = load_gpus()
    hardware = None
    if args.gpu:
        hardware = Hardware(gpu=find_gpu(args.gpu, gpus, "--gpu").id, count=args.gpu_count,
                            nodes=args.nodes)
    total = hardware.total if hardware else setup.n_gpus
    if args.max_seq:
        return _max_seq(model, setup, hardware, args.json)
    result = plan(model, setup, hardware=hardware,
                  tokens=tokens_from(args, setup, total), gpus=gpus)
    if args.json:
        print(json.dumps(plan_json(result), indent=2))
    else:
        print(plan_text(result))
    return 0


def _max_seq(model: Any, setup: TrainingSetup, hardware: Any, as_json: bool) -> int:
    from vram.plan.context import context_json, context_text, max_context

    if hardware is None:
        raise VramError("--gpu: --max-seq needs the GPU (and --gpu-count)")
    answer = max_context(model, setup, gpu=hardware.gpu, count=hardware.total)
    print(json.dumps(context_json(answer), indent=2) if as_json else context_text(answer))
    return 0


def _validate_speed(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from vram.plan.calibration import read_runs, report_lines

    print("\n".join(report_lines(read_runs(args.table))))
    return 0
