"""Set vram's estimate beside what one H200 measured (`benchmarks/gpu_measure.py`).

    PYTHONPATH=. python benchmarks/gpu_compare.py benchmarks/gpu_h200_raw/grid*/rows_*.jsonl \
        > benchmarks/gpu_h200.csv

RAW files are the `rows*.jsonl` the measuring script wrote; rows that did not run are left out.
Each row's setup becomes a `TrainingSetup` with the same knobs (LoRA rank 16, alpha 32,
all-linear, dropout 0.05; SDPA attention; framework hf-trainer = fused AdamW, peft-accelerate =
foreach AdamW), and the estimate's allocated / reserved / device figures are set beside the
measured `max_memory_allocated`, `max_memory_reserved` and the driver's per-process figure.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from vram import TrainingSetup, estimate
from vram.model.architecture import ModelSpec, model_from_config
from vram.model.catalog import load_config

MIB = 2**20

COLUMNS = [
    "grid", "id", "model", "layers", "method", "quant", "precision", "optimizer", "framework",
    "ckpt", "seq", "batch", "targets", "attn", "alloc_conf", "attn_implementation",
    "experts_implementation", "params_trainable",
    "measured_allocated_mib", "measured_active_mib", "measured_reserved_mib",
    "measured_nvml_process_mib", "measured_nvml_device_mib", "ran_alone", "measured_paged_mib",
    "measured_step1_allocated_mib", "measured_steps23_allocated_mib",
    "estimate_allocated_mib", "estimate_reserved_mib", "estimate_device_mib",
    "estimate_paged_mib", "allocated_error_pct", "reserved_error_pct", "device_error_pct",
]


def model_of(row: dict[str, Any]) -> ModelSpec:
    config = load_config(str(row["model"]))
    if row.get("layers"):
        config = dict(config, num_hidden_layers=int(row["layers"]))
        name = f"{row['model']} ({row['layers']} blocks)"
    else:
        name = str(row["model"])
    return model_from_config(config, name)


def setup_of(row: dict[str, Any]) -> TrainingSetup:
    return TrainingSetup(
        method=row["method"], quant=None if row["quant"] == "none" else row["quant"],
        lora_rank=16, lora_targets=row.get("targets", "all-linear"), lora_dropout=0.05,
        optimizer=row["optimizer"], precision=row["precision"], micro_batch=int(row["batch"]),
        seq_len=int(row["seq"]), grad_ckpt=row["ckpt"] != "off",
        ckpt_reentrant={"off": None, "reentrant": True, "nonreentrant": False}[row["ckpt"]],
        attention=row.get("attn", "sdpa"),
        framework=row["framework"],
        # gpu_measure.py builds with from_config(dtype=fp32) under a mixed recipe: an fp32 base
        lora_base_16bit=False if row["method"] == "lora" else None,
        # gpu_measure.py set `_experts_implementation = "eager"` on the MoE models it ran
        # without bf16 weights; the column records what ran
        experts_implementation=row.get("experts_implementation") or "grouped_mm",
    )


def _mib(value: Any) -> float | None:
    return None if value is None else round(value / MIB, 1)


def _err(estimated: float | None, measured: float | None) -> float | None:
    if estimated is None or not measured:
        return None
    return round(100.0 * (estimated - measured) / measured, 1)


def compare(row: dict[str, Any]) -> dict[str, Any]:
    est = estimate(model_of(row), setup_of(row))
    out = {key: row.get(key) for key in COLUMNS if key in row}
    out["layers"] = row.get("layers") or ""
    out["targets"] = row.get("targets", "all-linear")
    out["attn"] = row.get("attn", "sdpa")
    out["alloc_conf"] = row.get("alloc_conf", "")
    measured = {
        "measured_allocated_mib": _mib(row["allocated_peak"]),
        "measured_active_mib": _mib(row["active_peak"]),
        "measured_reserved_mib": _mib(row["reserved_peak"]),
        "measured_nvml_process_mib": _mib(row.get("nvml_proc_max")),
        "measured_nvml_device_mib": _mib(row.get("nvml_device_max")),
        "measured_step1_allocated_mib": _mib(row["step1_allocated_peak"]),
        "measured_steps23_allocated_mib": _mib(row["steps23_allocated_peak"]),
        "estimate_allocated_mib": _mib(est.allocated_peak_bytes),
        "estimate_reserved_mib": _mib(est.reserved_peak_bytes),
        "estimate_device_mib": _mib(est.device_peak_bytes),
        "estimate_paged_mib": _mib(est.paged_bytes),
    }
    out.update(measured)
    # Only a process alone on the device owns the device-wide figure; what it holds beyond its
    # own (per-process) figure and the idle device is memory the process table does not list:
    # bitsandbytes' paged (cudaMallocManaged) optimizer state.
    out["ran_alone"] = int(bool(row["ran_alone"]))
    if row["ran_alone"] and row.get("nvml_device_max") and row.get("nvml_proc_max"):
        extra = row["nvml_device_max"] - row["nvml_proc_max"] - row["idle_device_used"]
        out["measured_paged_mib"] = _mib(extra)
    out["allocated_error_pct"] = _err(measured["estimate_allocated_mib"],
                                      measured["measured_allocated_mib"])
    out["reserved_error_pct"] = _err(measured["estimate_reserved_mib"],
                                     measured["measured_reserved_mib"])
    out["device_error_pct"] = _err(measured["estimate_device_mib"],
                                   measured["measured_nvml_process_mib"])
    return out


def main(paths: list[str]) -> None:
    """Each path is a rows*.jsonl file; its folder's name (grid1, grid2) is the row's grid."""
    rows = []
    for path in map(Path, paths):
        context = json.loads((path.parent / "context.json").read_text())
        for line in path.read_text().splitlines():
            rows.append(dict(json.loads(line), grid=path.parent.name,
                             ran_alone=path.name == "rows_alone.jsonl",
                             idle_device_used=context["device_used_before"]))
    writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    ok = (r for r in rows if r.get("status") == "ok")
    for row in sorted(ok, key=lambda r: (r["grid"], r["id"])):
        writer.writerow(compare(row))


if __name__ == "__main__":
    main(sys.argv[1:])
