"""The handlers of `python -m vram estimate`, `trace`, `export`, `gpus`, `models` and
`validate`; each takes the parsed flags and the parser that made them.
"""

from __future__ import annotations

import argparse
import json
import sys

from vram.cli.flags import setup_from_args
from vram.errors import VramError
from vram.gpus import FitReport, fit, load_gpus
from vram.io.readers import cli_hook
from vram.io.report import (
    estimate_json,
    estimate_json_text,
    estimate_table,
    gpus_table,
    setup_warnings,
    what_if_lines,
)
from vram.io.validate import report_lines, run_cases
from vram.model.architecture import ModelSpec
from vram.model.catalog import load_config, load_model, model_catalog
from vram.result import Estimate
from vram.setup import TrainingSetup
from vram.step.estimate import estimate
from vram.step.what_if import CompressError, WhatIf, parse_ratios, what_if, what_if_fit
from vram.units import size_text


def run_estimate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.from_file:
        return run_estimate_from_file(args, parser)
    if not args.model:
        raise VramError("--model: required (or give a training config with --from FILE)")
    setup = setup_from_args(args)
    model = load_model(args.model)
    result = estimate(model, setup)
    report = fit(model, setup)
    compress = _what_if(args, model, setup, result)
    for warning in setup_warnings(setup):
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        sys.stdout.write(estimate_json_text(result, report, compress))
    else:
        print(estimate_table(result, report))
        if compress is not None:
            print("\n".join(what_if_lines(*compress)))
    return 0


def _what_if(args: argparse.Namespace, model: ModelSpec, setup: TrainingSetup,
             result: Estimate) -> tuple[WhatIf, FitReport] | None:
    """`--compress BUCKET=RATIO ...`: the step and the fit with those buckets smaller."""
    if not getattr(args, "compress", None):
        return None
    try:
        ratios = parse_ratios(args.compress)
    except CompressError as exc:
        raise VramError(f"--compress: {exc}") from None
    return what_if(result, ratios), what_if_fit(model, setup, ratios)


def run_estimate_from_file(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    model, setup, loaded = cli_hook.from_file(args, parser, args.argv)
    result = estimate(model, setup)
    report = fit(model, setup)
    compress = _what_if(args, model, setup, result)
    for warning in setup_warnings(setup):
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        payload = cli_hook.add_to_json(estimate_json(result, report, compress), setup, loaded)
        print(json.dumps(payload, indent=2))
    else:
        print("\n".join(loaded.report.lines()) + "\n")
        print(estimate_table(result, report))
        if compress is not None:
            print("\n".join(what_if_lines(*compress)))
    return 0


def run_export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    return cli_hook.run_export(args, parser, setup_from_args)


def run_trace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from vram.trace import TraceUnavailable, trace_step

    setup = setup_from_args(args)
    config = load_config(args.model)
    try:
        traced = trace_step(config, setup, n_layers=args.layers)
        if args.reserved:
            from vram.trace.allocator import with_reserved

            traced = with_reserved(traced, config, setup)
    except TraceUnavailable as exc:
        print(f"python -m vram trace: {exc}", file=sys.stderr)
        return 1
    payload = traced.to_json()
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        for name, value in payload.get("buckets", {}).items():
            print(f"{name:<12} {size_text(value)}")
        print(f"{'peak':<12} {size_text(payload['allocated_peak_bytes'])} "
              f"(allocated, {payload.get('phase', '')})")
        if traced.reserved_peak_bytes is not None:
            print(f"{'reserved':<12} {size_text(traced.reserved_peak_bytes)} "
                  f"(caching allocator, {traced.alloc_conf or 'default settings'})")
    return 0


def run_gpus(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    gpus = load_gpus()
    if args.json:
        print(json.dumps([gpu.model_dump() for gpu in gpus], indent=2))
    else:
        print(gpus_table(gpus))
    return 0


def run_models(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    entries = model_catalog()
    if args.json:
        print(json.dumps([entry.model_dump() for entry in entries], indent=2))
    else:
        for entry in entries:
            size = f" [{entry.teaching_size}]" if entry.teaching_size else ""
            print(f"{entry.slug:<34} {entry.params / 1e9:8.2f}B  {entry.display_name}{size}")
    return 0


def run_validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    results = run_cases(args.cases)
    print("\n".join(report_lines(results)))
    return 0
