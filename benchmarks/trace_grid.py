"""Hold the closed-form estimate to the exact trace over a grid of setups.

    .venv/bin/python benchmarks/trace_grid.py [--sample N] [--seed S] [--out FILE]
        [--only FIELD=V1,V2 ...]

`--only` keeps the rows of the same sample whose field (`family` or an axis) is one of the
values, e.g. `--only method=lora,qlora --only precision=bf16-mixed`: a subset of the same grid.

Compared, for each setup: the weights; every gradient (all exist at the optimizer step); the
optimizer state; the activations at the moment the trace peaks (the estimate's model of that
same moment); and the allocated peak. Agreement targets (issue 4): weights, gradients and
optimizer state within 1 %, activations and the allocated peak within 5 %. Buckets under 1 MiB
on both sides count as agreeing (a bucket that is zero on one side and a few kilobytes on the
other is not a disagreement worth a line).

Why not each side's split at its own peak: when two moments of the step are within a fraction
of a percent of each other (the loss and the top layer's backward, say), which one wins decides
whether a gigabyte shows up as "activations" or as "gradients". That split is not a property of
either model, and it reported +988 % gradient errors on setups whose peaks agreed within 1 %.
So the state buckets are compared whole, and activations at one moment, the trace's peak.
`phase` says whether both sides put the peak in the same phase.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vram import Estimate, MomentBytes, TrainingSetup, estimate, load_model
from vram.model.catalog import load_config

MIB = 2**20
TOLERANCE = {"weights": 0.01, "gradients": 0.01, "optimizer": 0.01, "activations": 0.05,
             "peak": 0.05}

FAMILIES = {
    "llama3": "llama-3.2-1b",
    "qwen2-gqa": "qwen2.5-0.5b-instruct",
    "mistral-gqa": "mistral-7b-v0.1",
    "gemma2": "gemma-2-2b",
    "phi": "phi-1_5",
    "falcon": "falcon-7b",
    "mixtral-moe": "mixtral-8x7b-v0.1",
}

#: Families held to the trace in tests/trace/test_agreement.py but not yet in the committed
#: grid (`trace_grid.txt` was run without them). GPT-2's QLoRA is left out: the trace's
#: quantizer replaces nn.Linear only, not GPT-2's Conv1D.
#: OLMoE's LoRA is left out like the grid leaves out MoE LoRA: frozen expert banks are not
#: modelled yet (the closed form still counts the gathered expert inputs: +6 % activations).
#: OPT, GPT-J and GPT-BigCode (issue 9). GPT-J's bf16-mixed eager runs differed from the trace
#: (+50 % activations at seq 2048) while the trace's CPU autocast left `softmax` in bf16; the
#: trace now autocasts as CUDA does (vram/trace/cuda_autocast.py): lora +1.7 %, full -0.1 %.
SAMPLE_ONLY = {"gpt2": "gpt2", "opt": "opt-125m", "opt-post-ln": "opt-350m", "gptj": "gpt-j-6b",
               "starcoder-mqa": "starcoderbase-1b",
               "olmoe": "olmoe-1b-7b-0924", "deepseek-mla": "deepseek-v2-lite"}

AXES = {
    "method": ["full", "lora", "qlora"],
    "optimizer": ["adamw", "sgd-momentum", "adamw-8bit", "adafactor"],
    "precision": ["bf16-true", "bf16-mixed", "fp32"],
    "micro_batch": [1, 2],
    "seq_len": [512, 2048, 8192, 32768],
    "grad_ckpt": [False, True],
    "attention": ["sdpa", "eager"],
}


def combinations(families: Iterable[str], axes: dict[str, list[Any]],
                 keep: Callable[[str, dict[str, Any]], bool]) -> list[tuple[str, dict[str, Any]]]:
    """Every family × every combination of the axes that `keep` accepts, in axis order."""
    keys = list(axes)
    return [(family, fields) for family in families
            for fields in (dict(zip(keys, values, strict=True))
                           for values in itertools.product(*(axes[k] for k in keys)))
            if keep(family, fields)]


def _runnable(family: str, fields: dict[str, Any]) -> bool:
    # s×s scores at 32k are terabytes: not a setup anyone runs
    eager_long = fields["attention"] == "eager" and fields["seq_len"] > 8192
    # the trace cannot put LoRA/QLoRA on 3D expert tensors
    adapted_banks = family == "mixtral-moe" and fields["method"] != "full"
    return not (eager_long or adapted_banks)


def grid() -> list[tuple[str, dict[str, object]]]:
    """Every family × a covering sample of the other axes (all pairs appear)."""
    return combinations(FAMILIES, AXES, _runnable)


@dataclass
class Row:
    family: str
    fields: dict[str, object]
    errors: dict[str, float]
    phase_match: bool
    seconds: float

    def passes(self) -> bool:
        return all(abs(self.errors[k]) <= TOLERANCE[k] for k in TOLERANCE)


def relative_error(ours: int, theirs: int) -> float:
    """(ours − theirs) / theirs; 0 where both are under a MiB (noise, not a disagreement)."""
    if max(ours, theirs) < MIB:
        return 0.0
    return (ours - theirs) / max(theirs, 1)


def moments_for(peak_at: str) -> tuple[str, ...]:
    """The estimate's moments that stand for the trace segment `peak_at`."""
    phase, *where = peak_at.split(" / ")
    role = where[-1] if where else ""
    if phase == "forward":
        if role.endswith(":after"):  # after the last block: the head and the loss's forward
            return ("end of forward", "the output cast to fp32", "the loss")
        if role.startswith(("first", "last")):  # inside a block's forward
            return ("the last layer's forward", "end of forward")
        return ("end of forward", "the output cast to fp32")
    if where and where[0] == "vision":  # a vision-language model's tower
        if phase == "backward":
            return ("the vision tower's backward", "the first layer's backward")
        return ("end of forward",)
    if phase == "backward":
        if role == "head":
            return ("the loss",)
        if role == "embed":
            return ("the embedding's backward",)
        if role.startswith("last"):
            return ("the top layer's backward",)
        if role.startswith("first"):
            return ("the first layer's backward",)
    if phase == "optimizer step":
        return ("the optimizer step",)
    return ()


def same_moment(ours: Estimate, peak_at: str) -> MomentBytes:
    """The estimate's moment for the trace's peak segment (the larger where a segment spans
    two; the estimate's own peak if none matches)."""
    labels = moments_for(peak_at)
    matching = [m for m in ours.moments if m.label in labels]
    return max(matching or ours.moments, key=lambda m: m.allocated_bytes)


def compare(family: str, fields: dict[str, object]) -> Row:
    slug = FAMILIES.get(family) or SAMPLE_ONLY[family]
    setup = TrainingSetup(framework="hf-trainer", lora_targets="q_proj,v_proj", lora_rank=16,
                          **fields)  # type: ignore[arg-type]
    errors, phase_match, seconds = against_trace(load_config(slug), setup)
    return Row(family, fields, errors, phase_match, seconds)


def against_trace(config: dict[str, Any], setup: TrainingSetup, *, mixer_kernels: bool = False,
                  ) -> tuple[dict[str, float], bool, float]:
    """Trace one step of `config` under `setup` and compare the closed form with it: each
    state bucket with the trace's largest, the activations at the trace's peak moment, the
    allocated peak; whether the peak phase agrees; the trace's seconds. `mixer_kernels`: the
    hybrid layers' kernels, emulated in the trace (`vram.trace.mixer_kernels`)."""
    from vram.trace import trace_step

    # the CPU trace runs transformers' PyTorch fallback of the hybrid layers unless the fused
    # kernels (fla, mamba_ssm, causal-conv1d) are emulated: the estimate is held to the same
    setup = setup.model_copy(update={"mixer_kernels": mixer_kernels})
    start = time.perf_counter()
    traced = trace_step(config, setup)
    seconds = time.perf_counter() - start
    ours = estimate(load_model(config), setup)
    buckets = ours.bucket_bytes
    moment = same_moment(ours, traced.peak_at)
    mine = {"weights": buckets["weights"], "gradients": ours.gradient_bytes_total,
            "optimizer": buckets["optimizer"]}
    errors = {name: relative_error(mine[name], traced.bucket_max.get(name, 0)) for name in mine}
    errors["activations"] = relative_error(moment.activation_bytes,
                                           traced.buckets.get("activations", 0))
    errors["peak"] = relative_error(ours.allocated_peak_bytes, traced.allocated_peak_bytes)
    return errors, ours.phase.value == traced.phase, seconds


def kept(family: str, fields: dict[str, object], only: list[str]) -> bool:
    """Whether a row matches every `FIELD=V1,V2` filter (values compared as text)."""
    row = {"family": family, **fields}
    for condition in only:
        key, _, values = condition.partition("=")
        if key not in row:
            raise SystemExit(f"--only {condition}: FIELD must be one of {', '.join(row)}")
        if str(row[key]) not in values.split(","):
            return False
    return True


def row_line(row: Row) -> str:
    f = row.fields
    return (f"{row.family:<12} {f['method']!s:<6} {f['optimizer']!s:<13} {f['precision']!s:<10} "
            f"{f['micro_batch']!s:>2} {f['seq_len']!s:>6} {f['grad_ckpt']!s:<5} "
            f"{f['attention']!s:<6} "
            + " ".join(f"{100 * row.errors[k]:+6.1f}%" for k in TOLERANCE)
            + f"  {'same' if row.phase_match else 'DIFF'}  {'yes' if row.passes() else 'NO'}")


def run(chosen: list[tuple[str, dict[str, object]]],
        compare_one: Callable[[str, dict[str, object]], Row]) -> list[str]:
    """Compare every chosen setup (printing each row as it comes) and summarize."""
    lines = [f"{'family':<12} {'method':<6} {'optimizer':<13} {'precision':<10} {'b':>2} "
             f"{'seq':>6} {'ckpt':<5} {'attn':<6} " + " ".join(f"{k[:6]:>7}" for k in TOLERANCE)
             + "  phase  ok"]
    rows: list[Row] = []
    for family, fields in chosen:
        try:
            row = compare_one(family, fields)
        except Exception as exc:
            lines.append(f"{family:<12} {fields} -> not traced: {str(exc)[:80]}")
            continue
        rows.append(row)
        lines.append(row_line(row))
        print(lines[-1], file=sys.stderr, flush=True)
    lines.append("")
    for key, tol in TOLERANCE.items():
        within = sum(1 for r in rows if abs(r.errors[key]) <= tol)
        lines.append(f"{key:<12} within {100 * tol:.0f}%: {within}/{len(rows)}")
    passed = sum(1 for r in rows if r.passes())
    median = sorted(r.seconds for r in rows)[len(rows) // 2] if rows else 0.0
    lines.append(f"setups={len(rows)} all_within_tolerance={passed} "
                 f"phase_agrees={sum(r.phase_match for r in rows)} median_trace_s={median:.2f}")
    return lines


Combo = tuple[str, dict[str, object]]


def covering_main(combos: list[Combo], compare_one: Callable[[str, dict[str, object]], Row],
                  sample: int) -> None:
    """A family grid's command line: a covering sample of `combos` (every family gets its share
    before any gets more), compared and summarized, printed and optionally written."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=sample)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", action="append", default=[], metavar="FIELD=V1,V2")
    args = parser.parse_args()
    random.Random(args.seed).shuffle(combos)
    per_family: dict[str, list[Combo]] = {}
    for family, fields in combos:
        per_family.setdefault(family, []).append((family, fields))
    ordered = [row for group in itertools.zip_longest(*per_family.values()) for row in group
               if row is not None]
    chosen = [(f, fields) for f, fields in ordered[: args.sample] if kept(f, fields, args.only)]
    lines = run(chosen, compare_one)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=320)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", action="append", default=[], metavar="FIELD=V1,V2")
    args = parser.parse_args()
    combos = grid()
    random.Random(args.seed).shuffle(combos)
    chosen = [(family, fields) for family, fields in combos[: args.sample]
              if kept(family, fields, args.only)]
    lines = run(chosen, compare)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
