"""The exact trace with the caching allocator model, beside the 61 real H200 steps.

    PYTHONPATH=. nice -n 10 python benchmarks/trace_reserved_h200.py \
        > benchmarks/trace_reserved_h200.txt

For every measured row of `benchmarks/gpu_h200_raw/` (`benchmarks/gpu_measure.py`), the same
setup is traced on fake tensors from the model's build on (`vram.trace.allocator`), at the
measured depth (the MoE models cut to 2 blocks, as measured), and its allocations are replayed
through `vram.memory.allocator` the way the GPU ran them: the build, `reset_peak_memory_stats`,
three steps. The replay's `max_memory_reserved` and `max_memory_allocated` are set beside the
measured ones. Rows that ran after other setups in the same process start with what the
measured process held then (`baseline_allocated`: one small block kept in a 2 MiB segment);
rows measured with `PYTORCH_CUDA_ALLOC_CONF` replay under the same settings.

Traces are cached per setup (`--cache DIR`, default /tmp/vram_alloc_traces): a second run only
replays. `--only SUBSTRING` limits the rows. Misses and their causes: TRACE_RESERVED_NOTES.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_compare import setup_of
from vram.memory.allocator import ALLOC, Event, parse_alloc_conf, replay
from vram.model.catalog import load_config
from vram.trace.allocator import AllocationLog, trace_allocations

ROOT = Path(__file__).resolve().parent
RAW = ROOT / "gpu_h200_raw"
MIB = 2**20


def measured_rows(only: str = "") -> list[dict[str, Any]]:
    rows = []
    for path in sorted(RAW.glob("grid*/rows_*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("status") == "ok" and only in row["id"]:
                rows.append(dict(row, grid=path.parent.name, lane=path.stem[5:]))
    return rows


def trace_key(row: dict[str, Any]) -> str:
    """Rows the trace cannot tell apart share a trace (it runs non-reentrant checkpointing,
    which measured the same as reentrant on every pair, GPU_H200.md finding 1)."""
    fields = ("model", "layers", "method", "quant", "precision", "optimizer", "framework",
              "seq", "batch", "targets", "attn")
    ckpt = "ckpt" if row["ckpt"] != "off" else "nockpt"
    return "|".join(str(row.get(f) or "") for f in fields) + "|" + ckpt


def traced(row: dict[str, Any], cache: Path) -> AllocationLog:
    path = cache / (trace_key(row).replace("|", "_").replace("/", "-") + ".pkl")
    if path.exists():
        log: AllocationLog = pickle.loads(path.read_bytes())
        return log
    config = load_config(str(row["model"]))
    layers = int(row["layers"]) if row.get("layers") else None
    log = trace_allocations(config, setup_of(row), n_layers=layers)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(log))
    return log


def prelude(row: dict[str, Any]) -> list[Event]:
    """What the measured process held before the build: a block of `baseline_allocated`."""
    base = int(row.get("baseline_allocated") or 0)
    return [(ALLOC, -1, base, 0)] if base else []


def compare(row: dict[str, Any], log: AllocationLog) -> dict[str, Any]:
    conf = parse_alloc_conf(row.get("alloc_conf") or "")
    start = time.perf_counter()
    result = replay([*prelude(row), *log.program()], conf)
    seconds = time.perf_counter() - start
    out = {"grid": row["grid"], "lane": row["lane"], "id": row["id"],
           "measured_allocated_mib": row["allocated_peak"] / MIB,
           "traced_allocated_mib": result.allocated_peak_bytes / MIB,
           "measured_reserved_mib": row["reserved_peak"] / MIB,
           "traced_reserved_mib": result.reserved_peak_bytes / MIB,
           "replay_s": seconds, "trace_s": log.seconds}
    out["allocated_error_pct"] = 100 * (out["traced_allocated_mib"] /
                                        out["measured_allocated_mib"] - 1)
    out["reserved_error_pct"] = 100 * (out["traced_reserved_mib"] /
                                       out["measured_reserved_mib"] - 1)
    return out


def summary(name: str, errors: list[float]) -> str:
    errs = sorted(abs(e) for e in errors)
    p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
    return (f"{name}: rows={len(errs)} median_abs_pct={statistics.median(errs):.2f} "
            f"p90_abs_pct={p90:.2f} max_abs_pct={errs[-1]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/vram_alloc_traces"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    results = []
    for row in measured_rows(args.only):
        log = traced(row, args.cache)
        gc.collect()
        res = compare(row, log)
        results.append(res)
        print(f"{res['grid']:5} {res['lane']:5} {res['measured_reserved_mib']:8.0f} "
              f"{res['traced_reserved_mib']:8.0f} {res['reserved_error_pct']:+6.2f}%   "
              f"{res['measured_allocated_mib']:8.0f} {res['traced_allocated_mib']:8.0f} "
              f"{res['allocated_error_pct']:+6.2f}%  {res['id']}", flush=True)
    print(summary("reserved (trace + allocator model)",
                  [r["reserved_error_pct"] for r in results]))
    print(summary("allocated (trace)", [r["allocated_error_pct"] for r in results]))
    print(f"replay: max {max(r['replay_s'] for r in results):.3f} s per row", file=sys.stderr)


if __name__ == "__main__":
    main()
