"""Plain-text and JSON views of an estimate, for the command line and downloads.

Bytes stay integers in JSON; text shows GiB (2^30) and GB (10^9) side by side, labelled.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import Any

from vram.gpus import FitReport, Gpu
from vram.io.knobs import setup_record
from vram.result import Estimate
from vram.setup import Sharding, TrainingSetup
from vram.step.through_step import peak_moment
from vram.step.what_if import WhatIf
from vram.units import format_gb, format_gib, size_text


def _cheapest(report: FitReport) -> list[dict[str, Any]]:
    return [
        {"gpu": option.gpu.id, "name": option.gpu.name, "count": option.count,
         "sharding": option.sharding.value, "usd_per_hour": option.usd_per_hour,
         "device_peak_bytes": option.device_peak_bytes,
         "headroom_bytes": option.headroom_bytes}
        for option in report.fits
    ]


def what_if_json(what: WhatIf, report: FitReport) -> dict[str, Any]:
    """`estimate --compress ... --json`'s "what_if": the compressed buckets at the new peak,
    the new peak and its moment, and the cheapest fit (design.md)."""
    return {"ratios": what.ratios, "buckets": what.buckets,
            "allocated_peak_bytes": what.allocated_peak_bytes,
            "device_peak_bytes": what.device_peak_bytes, "moment": what.moment,
            "saved_bytes": what.saved_bytes, "cheapest": _cheapest(report)}


def estimate_json(result: Estimate, report: FitReport | None = None,
                  what_if: tuple[WhatIf, FitReport] | None = None) -> dict[str, Any]:
    """The estimate as the JSON object the CLI contract names (design.md), plus line items;
    with `what_if` (`--compress`), its "what_if" object."""
    payload: dict[str, Any] = {
        "model": result.model_name,
        "setup": setup_record(result.setup),
        "params": result.params.model_dump(),
        "buckets": result.bucket_bytes,
        "allocated_peak_bytes": result.allocated_peak_bytes,
        "reserved_peak_bytes": result.reserved_peak_bytes,
        "device_peak_bytes": result.device_peak_bytes,
        "phase": result.phase.value,
        "host_bytes": result.host_bytes,
        "paged_bytes": result.paged_bytes,
        "inference": {
            "total_bytes": result.inference.total_bytes,
            "items": [item.model_dump() for item in result.inference.items],
        },
        "training_to_inference": round(result.training_to_inference, 3),
        "line_items": {
            bucket.name.value: [item.model_dump() for item in bucket.items]
            for bucket in result.buckets
        },
        "approximate": result.approximate,
        "notes": list(result.notes),
    }
    if report is not None:
        payload["cheapest"] = _cheapest(report)
    if what_if is not None:
        payload["what_if"] = what_if_json(*what_if)
    return payload


def estimate_json_text(result: Estimate, report: FitReport | None = None,
                       what_if: tuple[WhatIf, FitReport] | None = None) -> str:
    """The one serialized form of an estimate: what ``estimate --json`` prints and the app's
    download holds, byte for byte (two-space indent, a final newline)."""
    return json.dumps(estimate_json(result, report, what_if), indent=2) + "\n"


def what_if_lines(what: WhatIf, report: FitReport) -> list[str]:
    """The what-if under the estimate's table."""
    ratios = ", ".join(f"{name} {ratio:g}x smaller" for name, ratio in what.ratios.items())
    lines = ["", f"what if ({ratios}):"]
    lines += [f"  {name:<13}{size_text(n_bytes)}" for name, n_bytes in what.buckets.items()]
    lines.append(f"  {'device peak':<13}{size_text(what.device_peak_bytes)}   at {what.moment}"
                 f" (saves {size_text(what.saved_bytes)})")
    best = report.fits[0] if report.fits else None
    lines.append(f"  cheapest: {best.count} x {best.gpu.name}" if best else
                 "  cheapest: none in the catalog")
    return lines


def setup_warnings(setup: TrainingSetup) -> list[str]:
    """Things a setup asks for that do nothing as given, said rather than silently accepted."""
    warnings = []
    if setup.n_gpus == 1 and setup.sharding is Sharding.ZERO3:
        warnings.append(
            "--sharding zero3 on 1 GPU shards nothing: the one GPU holds every parameter, "
            "gradient and optimizer state (ZeRO-3's own buffers are still counted); "
            "give --gpus N to shard across N GPUs.")
    return warnings


def _label_lines(label: str, width: int = 52) -> list[str]:
    """A line item's label in lines of at most `width`, broken between words (never inside)."""
    return textwrap.wrap(label, width, break_long_words=False, break_on_hyphens=False) or [""]


def inference_line(result: Estimate) -> str:
    """Training against inference, per GPU and, on several GPUs, for the whole run: per-GPU
    training against whole-model inference alone would read 0.9x on 32 GPUs."""
    n_gpus = result.setup.n_gpus
    ratio = result.training_to_inference
    if n_gpus == 1:
        return f"(training needs {ratio:.1f}x)"
    whole = result.device_peak_bytes * n_gpus / max(1, result.inference.total_bytes)
    return (f"(one GPU, whole model; training holds {ratio:.1f}x that per GPU, "
            f"{whole:.1f}x across its {n_gpus} GPUs)")


def estimate_table(result: Estimate, report: FitReport | None = None) -> str:
    """A readable breakdown: buckets with their line items, the peaks, and the cheapest GPUs."""
    setup = result.setup
    lines = [
        f"{result.model_name}: {setup.method.value}, {setup.optimizer.value}, "
        f"{setup.precision.value}, batch {setup.micro_batch} x {setup.seq_len} tokens, "
        f"{setup.n_gpus} GPU(s) {setup.sharding.value}, {setup.framework.value}",
        f"parameters {result.params.total:,} (trainable {result.params.trainable:,})",
        "",
    ]
    for bucket in result.buckets:
        lines.append(f"{bucket.name.value:<13}{size_text(bucket.bytes)}")
        for item in bucket.items:
            if item.bytes:
                *first, last = _label_lines(item.label)
                lines.extend(f"  {line}" for line in first)
                lines.append(f"  {last:<53}{size_text(item.bytes)}")
    lines += [
        "",
        f"{'allocated peak':<22}{size_text(result.allocated_peak_bytes)}   "
        "(torch.cuda.max_memory_allocated)",
        f"{'reserved peak':<22}{size_text(result.reserved_peak_bytes)}   "
        "(torch.cuda.max_memory_reserved)",
        f"{'device peak':<22}{size_text(result.device_peak_bytes)}   (nvidia-smi; fit uses this)",
        f"{'peak during':<22}{_peak_text(result)}",
        f"{'inference':<22}{size_text(result.inference.total_bytes)}   "
        f"{inference_line(result)}",
    ]
    if result.host_bytes:
        lines.append(f"{'host memory':<22}{size_text(result.host_bytes)}   (offloaded)")
    for note in result.notes:
        lines.append(f"note: {note}")
    if report is not None:
        lines += ["", "cheapest per hour that hold it (all the GPUs):"]
        for option in report.fits[:8]:
            price = f"${option.usd_per_hour:.2f}/h" if option.usd_per_hour else "price n/a"
            lines.append(f"  {option.count} x {option.gpu.name:<32} {price:>12}   "
                         f"headroom {size_text(option.headroom_bytes)}")
        if not report.fits:
            lines.append("  none in the catalog")
        if report.unsupported:
            names = ", ".join(g.name for g in report.unsupported)
            lines.append(f"  left out (no bf16; fp16-mixed runs there): {names}")
    return "\n".join(lines)


def _peak_text(result: Estimate) -> str:
    moment = peak_moment(result)
    if moment is None or moment.phase is not result.phase:
        return result.phase.value
    return f"{result.phase.value} pass, at {moment.label}"


def gpus_table(gpus: Sequence[Gpu]) -> str:
    lines = [f"{'id':<18} {'name':<34} {'memory (GiB, GB)':>23} {'bf16 TFLOP/s':>13} "
             f"{'$/h':>7}"]
    for gpu in gpus:
        tflops = f"{gpu.bf16_dense_tflops:.0f}" if gpu.bf16_dense_tflops else "-"
        price = f"{gpu.usd_per_hour:.2f}" if gpu.usd_per_hour else "-"
        memory = f"{format_gib(gpu.memory_bytes, 7, 1)} {format_gb(gpu.memory_bytes, 7, 1)}"
        lines.append(f"{gpu.id:<18} {gpu.name[:34]:<34} {memory:>23} {tflops:>13} {price:>7}")
    return "\n".join(lines)
