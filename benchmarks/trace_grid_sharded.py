"""Hold the closed-form estimate to the exact trace of rank 0 of an FSDP2 run (issue 9).

    .venv/bin/python benchmarks/trace_grid_sharded.py [--sample N] [--seed S] [--out FILE]
        [--traces FILE]

Each setup is traced by `vram.trace` as rank 0 of `n_gpus` ranks (FSDP2 `fully_shard` per
decoder layer and on the root, a fake process group; see `vram.trace.sharded`) and estimated by
`vram.estimate` with `sharding=zero3`, `fsdp_version=2`, `gpus=N`. Compared (closed form minus
trace, relative to the trace):

* model state on rank 0, whole: the sharded weights (padded to a multiple of N), the sharded
  gradients (all exist at the optimizer step) and the sharded optimizer state: within 1 %;
* at the moment the trace peaks, the estimate's model of that same moment (see
  `benchmarks/trace_grid.py` for why not each side's own split): the activations, and what
  FSDP2 has in flight (all-gathered parameters and all-gather buffers, unsharded gradients and
  reduce-scatter buffers): within 5 %;
* the allocated peak: within 5 %.

The traced figures are kept in `--traces` (JSON lines, one per setup), so the closed form can be
compared again without tracing (`--compare-only`): tracing the grid takes about half an hour of
CPU on two contended cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.trace_grid import moments_for, relative_error
from vram import Estimate, MomentBytes, TrainingSetup, estimate, load_model
from vram.model.catalog import load_config

TOLERANCE = {"weights": 0.01, "gradients": 0.01, "optimizer": 0.01, "activations": 0.05,
             "in_flight": 0.05, "peak": 0.05}
IN_FLIGHT = ("gathered", "reducing")

FAMILIES = {
    "llama3": "llama-3.2-1b",  # tied embedding: the root unit holds it for the head and input
    "qwen2-gqa": "qwen2.5-0.5b-instruct",
    "mistral-gqa": "mistral-7b-v0.1",
}

AXES: dict[str, list[Any]] = {
    "n_gpus": [2, 4, 8],
    "fsdp_reshard_after_forward": [True, False],
    "precision": ["bf16-mixed", "bf16-true"],
    "method": ["full", "lora"],
    "grad_ckpt": [False, True],
    "micro_batch": [1, 2],
    "seq_len": [1024, 4096],
}
FIXED: dict[str, Any] = {"framework": "hf-trainer", "sharding": "zero3", "fsdp_version": 2,
                         "lora_base_16bit": False,  # the grid was traced with an fp32 base
                         "optimizer": "adamw", "attention": "sdpa",
                         "lora_targets": "q_proj,v_proj", "lora_rank": 16}
#: `--layout units`: the embedding and the head as FSDP2 units of their own
#: (`fsdp_embedding_units`, torchtune's and torchtitan's wrapping), on untied models (a tied
#: head stays in the root with the embedding).
UNITS_FAMILIES = {
    "mistral-gqa": "mistral-7b-v0.1",
    "llama31-8b": "llama-3.1-8b",  # torchtune's and torchtitan's model: a 128k vocabulary
}
UNITS_FIELDS: dict[str, Any] = {"fsdp_embedding_units": True}
TRACE_KEYS = ("buckets", "bucket_max", "allocated_peak_bytes", "peak_at", "phase")


def grid(layout: str = "root") -> list[tuple[str, dict[str, Any]]]:
    """Every family × every combination of the axes (`layout="units"`: the untied families
    with the embedding and head as units of their own)."""
    keys = list(AXES)
    families, extra = (UNITS_FAMILIES, UNITS_FIELDS) if layout == "units" else (FAMILIES, {})
    return [(family, {**dict(zip(keys, values, strict=True)), **extra})
            for family in families for values in itertools.product(*(AXES[k] for k in keys))]


def config_name(family: str) -> str:
    return FAMILIES.get(family) or UNITS_FAMILIES[family]


def setup_of(fields: dict[str, Any]) -> TrainingSetup:
    return TrainingSetup(**FIXED, **fields)


def key_of(family: str, fields: dict[str, Any]) -> str:
    return json.dumps([family, fields], sort_keys=True)


def trace(family: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The traced figures of one setup (what the comparison reads)."""
    from vram.trace import trace_step

    start = time.process_time()
    traced = trace_step(load_config(config_name(family)), setup_of(fields)).to_json()
    out = {k: traced[k] for k in TRACE_KEYS}
    out["cpu_s"] = round(time.process_time() - start, 1)
    return out


@dataclass
class Row:
    family: str
    fields: dict[str, Any]
    errors: dict[str, float]
    phase_match: bool

    def passes(self) -> bool:
        return all(abs(self.errors[k]) <= TOLERANCE[k] for k in TOLERANCE)


def sharded_moments_for(peak_at: str) -> tuple[str, ...]:
    """The estimate's moments that stand for the trace segment `peak_at`. Under FSDP2 a
    block's segment starts with its all-gather (`vram.trace.sharded` labels a block before
    FSDP2's pre-forward hook runs), so inside the last block's forward the candidates are its
    all-gather, its forward and the end of the forward. The blocks between the first and the
    last peak in backward at one end of their run: the block below the top or the second."""
    phase, *where = peak_at.split(" / ")
    role = where[-1] if where else ""
    if phase == "forward" and role.startswith(("first", "mid", "last")) and ":" not in role:
        return ("the last block's all-gather", "the last layer's forward", "end of forward")
    if phase == "backward" and role == "mid":  # the blocks between (traced from three on)
        return ("the block below the top's backward", "the second layer's backward")
    if phase == "forward" and role.endswith(":after"):
        return ("end of forward", "the output cast to fp32", "the loss")
    return moments_for(peak_at)


def same_moment(ours: Estimate, peak_at: str) -> MomentBytes:
    """The estimate's moment for the trace's peak segment (the largest where a segment spans
    several; the estimate's own peak if none matches)."""
    labels = sharded_moments_for(peak_at)
    matching = [m for m in ours.moments if m.label in labels]
    return max(matching or ours.moments, key=lambda m: m.allocated_bytes)


def compare(family: str, fields: dict[str, Any], traced: dict[str, Any]) -> Row:
    """The closed form of `family` under `fields`, against its traced figures."""
    ours = estimate(load_model(config_name(family)), setup_of(fields))
    moment = same_moment(ours, traced["peak_at"])
    step = next(m for m in ours.moments if m.label == "the optimizer step")
    state = {item.key: item.bytes for bucket in ours.buckets for item in bucket.items}
    sharded_weights = sum(b for k, b in state.items()
                          if k.startswith("weights.") and not k.startswith("weights.fsdp2_"))
    mine = {"weights": sharded_weights, "gradients": step.gradient_bytes,
            "optimizer": sum(b for k, b in state.items() if k.startswith("optimizer."))}
    bucket_max, buckets = traced["bucket_max"], traced["buckets"]
    errors = {name: relative_error(mine[name], bucket_max.get(name, 0)) for name in mine}
    errors["activations"] = relative_error(moment.activation_bytes, buckets.get("activations", 0))
    errors["in_flight"] = relative_error(moment.in_flight_bytes,
                               sum(buckets.get(k, 0) for k in IN_FLIGHT))
    errors["peak"] = relative_error(ours.allocated_peak_bytes, traced["allocated_peak_bytes"])
    return Row(family, fields, errors, ours.phase.value == traced["phase"])


def _load(paths: list[Path]) -> dict[str, dict[str, Any]]:
    out = {}
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    out[key_of(r["family"], r["fields"])] = r["trace"]
    return out


def chosen(sample: int, seed: int, layout: str = "root") -> list[tuple[str, dict[str, Any]]]:
    combos = grid(layout)
    random.Random(seed).shuffle(combos)
    return combos[:sample]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--traces", type=Path, help="JSON lines of traced figures (read, and "
                        "appended to with every new trace)")
    parser.add_argument("--also", type=Path, nargs="*", default=[],
                        help="more --traces files to read")
    parser.add_argument("--layout", choices=("root", "units"), default="root",
                        help="root: the embedding and head in the root unit (Accelerate); "
                             "units: units of their own (torchtune, torchtitan)")
    parser.add_argument("--compare-only", action="store_true",
                        help="compare the setups already in --traces, trace nothing")
    parser.add_argument("--worker", default="0/1",
                        help="i/k: trace only every k-th setup from the i-th (k processes "
                             "share a grid, each with its own --traces file)")
    parser.add_argument("--reverse", action="store_true",
                        help="trace from the end of the list (a helper process that meets "
                             "the others in the middle; reads every --also file first)")
    args = parser.parse_args()
    index, count = (int(x) for x in args.worker.split("/"))
    cache = _load([*([args.traces] if args.traces else []), *args.also])
    header = (f"{'family':<12} {'N':>2} {'reshard':<7} {'precision':<10} {'method':<6} "
              f"{'ckpt':<5} {'b':>2} {'seq':>5} " + " ".join(f"{k[:7]:>7}" for k in TOLERANCE)
              + "  phase  ok")
    lines = [header]
    rows: list[Row] = []
    todo = chosen(args.sample, args.seed, args.layout)[index::count]
    for family, fields in reversed(todo) if args.reverse else todo:
        key = key_of(family, fields)
        if key not in cache and args.reverse:  # another process may have traced it since
            cache.update(_load([*([args.traces] if args.traces else []), *args.also]))
        if key not in cache:
            if args.compare_only:
                continue
            cache[key] = trace(family, fields)
            if args.traces:
                with args.traces.open("a") as fh:
                    fh.write(json.dumps({"family": family, "fields": fields,
                                         "trace": cache[key]}, sort_keys=True) + "\n")
        try:
            row = compare(family, fields, cache[key])
        except Exception as exc:  # the trace is kept; report the setup and go on
            lines.append(f"{family:<12} {fields} -> not compared: {str(exc)[:80]}")
            print(lines[-1], file=sys.stderr, flush=True)
            continue
        rows.append(row)
        f = row.fields
        lines.append(
            f"{family:<12} {f['n_gpus']:>2} {f['fsdp_reshard_after_forward']!s:<7} "
            f"{f['precision']:<10} {f['method']:<6} {f['grad_ckpt']!s:<5} "
            f"{f['micro_batch']:>2} {f['seq_len']:>5} "
            + " ".join(f"{100 * row.errors[k]:+6.1f}%" for k in TOLERANCE)
            + f"  {'same' if row.phase_match else 'DIFF'}  {'yes' if row.passes() else 'NO'}")
        print(lines[-1], file=sys.stderr, flush=True)
    lines.append("")
    for name, tol in TOLERANCE.items():
        within = sum(1 for r in rows if abs(r.errors[name]) <= tol)
        worst = max((abs(r.errors[name]) for r in rows), default=0.0)
        lines.append(f"{name:<12} within {100 * tol:.0f}%: {within}/{len(rows)}  "
                     f"largest {100 * worst:.2f}%")
    lines.append(f"setups={len(rows)} all_within_tolerance={sum(r.passes() for r in rows)} "
                 f"phase_agrees={sum(r.phase_match for r in rows)}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
