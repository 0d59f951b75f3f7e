"""JSON and text views of a plan (the CLI prints them; the app reads the same fields)."""

from __future__ import annotations

from typing import Any

from vram.plan.planner import Plan, RunOption
from vram.plan.solve import Proof

GB = 1e9


def _proof(proof: Proof) -> dict[str, Any]:
    return proof.model_dump()


def _option(option: RunOption) -> dict[str, Any]:
    return {
        "gpu": option.gpu, "count": option.count, "hours": option.hours,
        "usd_per_run": option.usd_per_run, "usd_per_hour": option.usd_per_hour,
        "usd_per_million_tokens": option.usd_per_million_tokens,
        "tokens_per_second": option.tokens_per_second,
        "device_peak_bytes": option.device_peak_bytes, "usable_bytes": option.usable_bytes,
        "proof": _proof(option.proof),
    }


def plan_json(plan: Plan) -> dict[str, Any]:
    """The `python -m vram plan --json` object (keys in design.md)."""
    return {
        "model": plan.model_name,
        "hardware": {"gpu": plan.hardware.gpu, "count": plan.hardware.count,
                     "nodes": plan.hardware.nodes, "given": plan.hardware_given},
        "fits": plan.fits,
        "headroom_bytes": plan.headroom_bytes,
        "device_peak_bytes": plan.device_peak_bytes,
        "usable_bytes": plan.usable_bytes,
        "max_micro_batch": plan.max_micro_batch.value,
        "max_micro_batch_proof": _proof(plan.max_micro_batch),
        "max_seq_len": plan.max_seq_len.value,
        "max_seq_len_proof": _proof(plan.max_seq_len),
        "levers": [lever.model_dump() for lever in plan.levers],
        "costly_levers": [{**lever.model_dump(), "costs_bytes": -lever.saved_bytes}
                          for lever in plan.costly_levers],
        "path": [step.model_dump() for step in plan.path],
        "path_fits": plan.path_fits,
        "path_summary": plan.path_summary,
        "tokens": plan.tokens,
        "tokens_per_second": plan.tokens_per_second,
        "hours": plan.hours,
        "usd_per_run": plan.usd_per_run,
        "usd_per_million_tokens": plan.usd_per_million_tokens,
        "options": [_option(o) for o in plan.options if o.fits],
        "misses": [{"gpu": o.gpu, "largest_count": o.proof.past,
                    "device_peak_bytes": o.device_peak_bytes, "usable_bytes": o.usable_bytes}
                   for o in plan.options if not o.fits],
        "estimates": plan.estimates,
    }


def _gb(n_bytes: int | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / GB:.1f} GB"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} h"


def plan_text(plan: Plan) -> str:
    """A table a person reads: verdict, limits, path, levers, then the catalog by run cost."""
    hw = plan.hardware
    where = f"{hw.count}x {hw.gpu}" + (f" x {hw.nodes} nodes" if hw.nodes > 1 else "")
    verdict = (f"fits, {_gb(plan.headroom_bytes)} headroom" if plan.fits
               else f"short by {_gb(plan.shortfall_bytes)}")
    lines = [
        f"{plan.model_name} on {where}{'' if plan.hardware_given else ' (cheapest run)'}: "
        f"peak {_gb(plan.device_peak_bytes)} of {_gb(plan.usable_bytes)} per GPU: {verdict}",
        f"largest micro-batch that fits as set up: {plan.max_micro_batch.value} "
        f"(next: {_gb(plan.max_micro_batch.past_peak_bytes)}); longest sequence: "
        f"{plan.max_seq_len.value:,} tokens",
        f"path: {plan.path_summary}",
    ]
    if plan.tokens:
        after = " after the path" if plan.path else ""
        lines.append(f"run{after}: {plan.tokens:,.0f} tokens in {_hours(plan.hours)}, "
                     f"{_money(plan.usd_per_run)} ({_money(plan.usd_per_million_tokens)} per "
                     "million tokens)")
    lines.append("")
    lines.append(f"{'lever':<42} {'saves':>10} {'time':>8} {'fits':>5}  quality")
    for lever in plan.levers:
        lines.append(f"{lever.name:<42} {_gb(lever.saved_bytes):>10} "
                     f"{(lever.time_factor - 1) * 100:+7.0f}% {'yes' if lever.fits else 'no':>5}"
                     f"  tier {lever.quality_tier}")
    for lever in plan.costly_levers:
        lines.append(f"{lever.name:<42} {'costs ' + _gb(-lever.saved_bytes):>16} here")
    lines.append("")
    lines.append(f"{'option (cheapest run first)':<28} {'hours':>8} {'$ per run':>12} "
                 f"{'$/M tokens':>11}")
    for option in plan.options:
        if option.fits:
            lines.append(f"{option.count}x {option.gpu:<23} {_hours(option.hours):>10} "
                         f"{_money(option.usd_per_run):>12} "
                         f"{_money(option.usd_per_million_tokens):>11}")
    return "\n".join(lines)
