"""Trace rank 0 of tensor-, context-parallel, offloaded and float8 runs (issue 23).

    PYTHONPATH=. python benchmarks/trace_grid_parallel.py --sample 72 --seed 0 \
        --traces benchmarks/trace_grid_parallel.jsonl [--worker i/k] [--list]

Each setup is traced by `vram.trace.parallel.trace_parallel` (two depths, extended to the
model's) and its figures appended to `--traces` (JSON lines; a setup already there is not
traced again), then compared with the closed form of the same setup (`--compare-only`: the
traces already there, nothing traced): rank 0's weights, gradients and optimizer state within
1 %, the activations at the trace's peak moment and the allocated peak within 5 %. Float8 rows
need torchao (`pip install torchao`); without it they are skipped, as the trace says why.

Axes: Llama 3.1 8B and Mistral 7B v0.3 (32 query / 8 kv heads, untied) and Qwen2.5 7B
(28 / 4, untied) x a layout (TP 2-8 with and without sequence parallel, CP 2-8 ring or
Ulysses, TP 2 x CP 2-4) x sequence 8k / 32k / 128k x activation offload x float8 (rowwise)
x FSDP2 over the CP ranks; full fine-tune in bf16 with checkpointing, AdamW, torchtitan's
stack (untied head, the HF loss on fp32 logits), one micro-batch.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.trace_grid import combinations, relative_error
from benchmarks.trace_grid_sharded import same_moment
from vram import TrainingSetup, estimate, load_model
from vram.model.catalog import load_config

TOLERANCE = {"weights": 0.01, "gradients": 0.01, "optimizer": 0.01, "activations": 0.05,
             "peak": 0.05}

FAMILIES = {"llama31-8b": "llama-3.1-8b", "mistral-7b": "mistral-7b-v0.3",
            "qwen25-7b": "qwen2.5-7b-instruct"}
#: (tp, sequence parallel, cp, cp kind)
LAYOUTS: list[tuple[int, bool, int, str]] = [
    (2, True, 1, "ring"), (4, True, 1, "ring"), (8, True, 1, "ring"),
    (2, False, 1, "ring"), (4, False, 1, "ring"),
    (1, True, 2, "ring"), (1, True, 4, "ring"), (1, True, 8, "ring"),
    (1, True, 2, "ulysses"), (1, True, 4, "ulysses"), (1, True, 8, "ulysses"),
    (2, True, 2, "ring"), (2, True, 4, "ring"),
]
AXES: dict[str, list[Any]] = {
    "layout": LAYOUTS,
    "seq_len": [8192, 32768, 131072],
    "offload": [False, True],
    "fp8": [None, "rowwise"],
    "fsdp": [False, True],
}
FIXED: dict[str, Any] = {"method": "full", "precision": "bf16-true", "micro_batch": 1,
                         "grad_ckpt": True, "attention": "sdpa", "optimizer": "adamw",
                         "framework": "torchtitan"}


def valid(family: str, point: dict[str, Any]) -> bool:
    """Layouts the stacks run: whole heads per TP rank (Qwen2.5 7B has 4 kv heads), FSDP2
    only over CP ranks (a CP layout), float8 not with TP (torchtitan's float8 TP is tensorwise
    with Float8 styles, which the trace does not plan)."""
    tp, _sp, cp, _kind = point["layout"]
    if family == "qwen25-7b" and tp > 4:
        return False
    if point["fsdp"] and cp == 1:
        return False
    return not (point["fp8"] and tp > 1)


def grid() -> list[tuple[str, dict[str, Any]]]:
    return combinations(FAMILIES, AXES, valid)


def chosen(sample: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """`sample` setups drawn evenly over the layouts (each layout's share shuffled by `seed`),
    interleaved so that any prefix covers every layout."""
    rng = random.Random(seed)
    per_layout = []
    for layout in LAYOUTS:
        combos = [c for c in grid() if c[1]["layout"] == layout]
        rng.shuffle(combos)
        per_layout.append(combos)
    share = -(-sample // len(LAYOUTS))
    rounds = zip(*(combos[:share] for combos in per_layout), strict=False)
    return [c for batch in rounds for c in batch][:sample]


def setup_and_spec(point: dict[str, Any]) -> tuple[TrainingSetup, Any]:
    from vram.trace.parallel import ParallelSpec

    tp, sp, cp, kind = point["layout"]
    fields = dict(FIXED, seq_len=point["seq_len"])
    if point["fsdp"]:
        fields.update(sharding="zero3", fsdp_version=2, n_gpus=cp)
    spec = ParallelSpec(tp=tp, sequence_parallel=sp, cp=cp, cp_kind=kind,
                        offload_activations=point["offload"], fp8=point["fp8"])
    return TrainingSetup(**fields), spec


def estimate_setup(point: dict[str, Any]) -> TrainingSetup:
    """The traced setup in the knobs' words: tp x cp GPUs (no data parallel); FSDP2 over the CP
    ranks, else DDP among them (the trace sums nothing: the closed form's DDP buckets are left
    out of the comparison, `compare`), activation offload as torchtune runs it (with
    checkpointing). Ulysses is compared on the HF Trainer's stack (Accelerate's deepspeed
    backend runs it; torchtitan runs the ring only): the trace runs Transformers' model code
    either way."""
    tp, sp, cp, kind = point["layout"]
    fields = dict(FIXED, seq_len=point["seq_len"], n_gpus=tp * cp, tp=tp, cp=cp)
    if kind == "ulysses" and cp > 1:
        # the trace's FSDP2 wrapping is torchtitan's (embedding and head units of their own)
        fields.update(framework="hf-trainer", fsdp_embedding_units=True)
    if tp > 1:
        fields["sequence_parallel"] = sp
    if cp > 1:
        fields.update(cp_kind=kind, sharding="zero3" if point["fsdp"] else "ddp")
        if point["fsdp"]:
            fields["fsdp_version"] = 2
    if point["offload"]:
        fields["offload"] = "activations"
    if point["fp8"]:
        fields["fp8"] = point["fp8"]
    return TrainingSetup(**fields)


def compare(family: str, point: dict[str, Any], traced: dict[str, Any]) -> dict[str, float]:
    """(closed form - trace) / trace for each compared figure."""
    ours = estimate(load_model(FAMILIES[family]), estimate_setup(point))
    moment = same_moment(ours, traced["peak_at"])
    step = next(m for m in ours.moments if m.label == "the optimizer step")
    state = {item.key: item.bytes for bucket in ours.buckets for item in bucket.items}
    mine = {"weights": sum(b for k, b in state.items()
                           if k.startswith("weights.") and not k.startswith("weights.fsdp2_")),
            "gradients": step.gradient_bytes,
            "optimizer": sum(b for k, b in state.items() if k.startswith("optimizer."))}
    errors = {k: relative_error(v, traced["bucket_max"].get(k, 0)) for k, v in mine.items()}
    errors["activations"] = relative_error(moment.activation_bytes,
                                           traced["buckets"].get("activations", 0))
    ddp = state.get("gradients.ddp_buckets", 0)  # the trace all-reduces nothing
    errors["peak"] = relative_error(ours.allocated_peak_bytes - ddp,
                                    traced["allocated_peak_bytes"])
    return errors


def key_of(family: str, point: dict[str, Any]) -> str:
    return json.dumps([family, point], sort_keys=True)


def trace(family: str, point: dict[str, Any]) -> dict[str, Any]:
    from vram.trace.parallel import trace_parallel

    setup, spec = setup_and_spec(point)
    start = time.perf_counter()
    result, raw = trace_parallel(load_config(FAMILIES[family]), setup, spec)
    traced = result.to_json()
    out = {k: traced[k] for k in ("buckets", "bucket_max", "allocated_peak_bytes", "peak_at",
                                  "phase", "n_layers_traced")}
    out["host_peak_bytes"] = raw.host_peak_bytes
    out["wall_s"] = round(time.perf_counter() - start, 1)
    return out


def _load(path: Path | None) -> dict[str, Any]:
    if path is None or not path.exists():
        return {}
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {key_of(r["family"], r["point"]): r["trace"] for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=72)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traces", type=Path)
    parser.add_argument("--worker", default="0/1")
    parser.add_argument("--list", action="store_true", help="print the chosen setups only")
    parser.add_argument("--compare-only", action="store_true",
                        help="compare the setups already in --traces, trace nothing")
    parser.add_argument("--out", type=Path, help="write the comparison here too")
    args = parser.parse_args()
    index, count = (int(x) for x in args.worker.split("/"))
    todo = chosen(args.sample, args.seed)[index::count]
    if args.list:
        for family, point in todo:
            print(family, point)
        return
    cache = _load(args.traces)
    for family, point in todo:
        key = key_of(family, point)
        if key in cache or args.compare_only:
            continue
        try:
            traced = trace(family, point)
        except Exception as exc:  # the trace says why; the grid goes on
            print(f"{family} {point}: not traced: {str(exc)[:120]}", file=sys.stderr)
            continue
        cache[key] = traced
        if args.traces:
            with args.traces.open("a") as fh:
                fh.write(json.dumps({"family": family, "point": point, "trace": traced},
                                    sort_keys=True) + "\n")
        print(f"{family} {point} peak {traced['allocated_peak_bytes']:,} at "
              f"{traced['peak_at']} ({traced['wall_s']} s)", file=sys.stderr, flush=True)
    report(todo, cache, args.out)


def _row_text(family: str, point: dict[str, Any], errors: dict[str, float]) -> str:
    tp, sp, cp, kind = point["layout"]
    layout = (f"tp{tp}{'+sp' if sp and tp > 1 else ''}" if tp > 1 else "") + (
        f"{'x' if tp > 1 else ''}cp{cp} {kind}" if cp > 1 else "")
    flags = ",".join(k for k in ("offload", "fsdp") if point[k]) + (
        f",fp8 {point['fp8']}" if point["fp8"] else "")
    ok = all(abs(errors[k]) <= tol for k, tol in TOLERANCE.items())
    return (f"{family:<11} {layout:<18} {point['seq_len']:>6} {flags:<22} "
            + " ".join(f"{100 * errors[k]:+7.1f}%" for k in TOLERANCE)
            + f"  {'yes' if ok else 'NO'}")


def report(todo: list[tuple[str, dict[str, Any]]], cache: dict[str, Any],
           out: Path | None) -> None:
    """One line per traced setup and a summary (the figures of `TOLERANCE`)."""
    lines = [f"{'family':<11} {'layout':<18} {'seq':>6} {'':<22} "
             + " ".join(f"{k[:7]:>8}" for k in TOLERANCE) + "  ok"]
    rows = []
    for family, point in todo:
        traced = cache.get(key_of(family, point))
        if traced is None:
            continue
        try:
            errors = compare(family, point, traced)
        except Exception as exc:  # the trace is kept; report the setup and go on
            lines.append(f"{family} {point}: not compared: {str(exc)[:100]}")
            continue
        rows.append(errors)
        lines.append(_row_text(family, point, errors))
    lines.append("")
    for name, tol in TOLERANCE.items():
        within = sum(1 for r in rows if abs(r[name]) <= tol)
        worst = max((abs(r[name]) for r in rows), default=0.0)
        lines.append(f"{name:<12} within {100 * tol:.0f}%: {within}/{len(rows)}  "
                     f"largest {100 * worst:.2f}%")
    passing = sum(all(abs(r[k]) <= t for k, t in TOLERANCE.items()) for r in rows)
    lines.append(f"setups={len(rows)} all_within_tolerance={passing}")
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
