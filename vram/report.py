"""Plain-text and JSON views of an estimate, for the command line and downloads.

Bytes stay integers in JSON; text shows GiB (2^30) and GB (10^9) side by side, labelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vram.gpus import FitReport, Gpu
from vram.knobs import setup_record
from vram.result import Estimate
from vram.units import format_gib, size_text


def estimate_json(result: Estimate, report: FitReport | None = None) -> dict[str, Any]:
    """The estimate as the JSON object the CLI contract names (design.md), plus line items."""
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
        payload["cheapest"] = [
            {"gpu": option.gpu.id, "name": option.gpu.name, "count": option.count,
             "sharding": option.sharding.value, "usd_per_hour": option.usd_per_hour,
             "device_peak_bytes": option.device_peak_bytes,
             "headroom_bytes": option.headroom_bytes}
            for option in report.fits
        ]
    return payload


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
                lines.append(f"  {item.label[:52]:<53}{format_gib(item.bytes, 9)}")
    lines += [
        "",
        f"{'allocated peak':<22}{size_text(result.allocated_peak_bytes)}   "
        "(torch.cuda.max_memory_allocated)",
        f"{'reserved peak':<22}{size_text(result.reserved_peak_bytes)}   "
        "(torch.cuda.max_memory_reserved)",
        f"{'device peak':<22}{size_text(result.device_peak_bytes)}   (nvidia-smi; fit uses this)",
        f"{'peak during':<22}{result.phase.value}",
        f"{'inference':<22}{size_text(result.inference.total_bytes)}   "
        f"(training needs {result.training_to_inference:.1f}x)",
    ]
    if result.host_bytes:
        lines.append(f"{'host memory':<22}{size_text(result.host_bytes)}   (offloaded)")
    for note in result.notes:
        lines.append(f"note: {note}")
    if report is not None:
        lines += ["", "cheapest setups that hold it:"]
        for option in report.fits[:8]:
            price = f"${option.usd_per_hour:.2f}/h" if option.usd_per_hour else "price n/a"
            lines.append(f"  {option.count} x {option.gpu.name:<32} {price:>12}   "
                         f"headroom {format_gib(option.headroom_bytes, 6, 1)}")
        if not report.fits:
            lines.append("  none in the catalog")
    return "\n".join(lines)


def gpus_table(gpus: Sequence[Gpu]) -> str:
    lines = [f"{'id':<18} {'name':<34} {'memory':>10} {'bf16 TFLOP/s':>13} {'$/h':>7}"]
    for gpu in gpus:
        tflops = f"{gpu.bf16_dense_tflops:.0f}" if gpu.bf16_dense_tflops else "-"
        price = f"{gpu.usd_per_hour:.2f}" if gpu.usd_per_hour else "-"
        lines.append(f"{gpu.id:<18} {gpu.name[:34]:<34} {format_gib(gpu.memory_bytes, 6, 1)} "
                     f"{tflops:>13} {price:>7}")
    return "\n".join(lines)
