"""Hold the closed-form estimate to the exact trace on issue 22's new families.

    PYTHONPATH=. .venv/bin/python benchmarks/trace_grid_2026.py [--sample N] [--seed S]
        [--out FILE] [--only FIELD=V1,V2 ...]

The same comparison as `benchmarks/trace_grid.py` (weights, gradients and optimizer state within
1 %, activations at the trace's peak moment and the allocated peak within 5 %), over the new
families' catalog configs (or the type's default config, `tests/data/families/`, where the
catalog has none) and a covering sample of full / LoRA / QLoRA, checkpointing on and off,
batch, sequence and attention kernel. Mixture-of-experts families run `bf16-true` only: the
other recipes put their expert banks in fp32, which transformers' grouped experts refuse on
fake tensors (benchmarks/FAMILY_TRACE_NOTES.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.trace_grid import Row, kept, relative_error, run, same_moment
from vram import TrainingSetup, estimate, load_model
from vram.model.catalog import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "families"

#: family label -> catalog slug, or "default:<model_type>" for the type's default config.
FAMILIES = {
    "qwen3": "qwen3-0.6b",
    "smollm3-nope": "smollm3-3b",
    "seed-oss": "seed-oss-36b",
    "phi4-mini": "phi-4-mini",
    "gemma3-5to1": "gemma-3-1b",
    "olmo3-3to1": "default:olmo3",
    "exaone4": "default:exaone4",
    "glm4": "default:glm4",
    "apertus-xielu": "default:apertus",
}
#: MoE families: bf16-true only (see the module docstring).
MOE_FAMILIES = {"ernie45-moe": "default:ernie4_5_moe", "glm45-air": "glm-4.5-air"}

AXES: dict[str, list[Any]] = {
    "method": ["full", "lora", "qlora"],
    "optimizer": ["adamw", "adamw-8bit"],
    "precision": ["bf16-true", "bf16-mixed"],
    "micro_batch": [1, 2],
    "seq_len": [512, 2048],
    "grad_ckpt": [False, True],
    "attention": ["sdpa", "eager"],
}


def config_of(family: str) -> dict[str, Any]:
    ref = FAMILIES.get(family) or MOE_FAMILIES[family]
    if ref.startswith("default:"):
        config: dict[str, Any] = json.loads((FIXTURES / f"{ref[8:]}.json").read_text())
        return config
    return load_config(ref)


def grid() -> list[tuple[str, dict[str, object]]]:
    combos = []
    keys = list(AXES)
    for family in (*FAMILIES, *MOE_FAMILIES):
        for values in itertools.product(*(AXES[k] for k in keys)):
            fields = dict(zip(keys, values, strict=True))
            if family in MOE_FAMILIES and (fields["precision"] != "bf16-true"
                                           or fields["method"] == "qlora"):
                continue
            combos.append((family, fields))
    return combos


def compare(family: str, fields: dict[str, object]) -> Row:
    from vram.trace import trace_step

    config = config_of(family)
    setup = TrainingSetup(framework="hf-trainer", lora_targets="q_proj,v_proj", lora_rank=16,
                          **fields)  # type: ignore[arg-type]
    start = time.perf_counter()
    traced = trace_step(config, setup)
    seconds = time.perf_counter() - start
    ours = estimate(load_model(config), setup)
    moment = same_moment(ours, traced.peak_at)
    mine = {"weights": ours.bucket_bytes["weights"], "gradients": ours.gradient_bytes_total,
            "optimizer": ours.bucket_bytes["optimizer"]}
    errors = {name: relative_error(mine[name], traced.bucket_max.get(name, 0)) for name in mine}
    errors["activations"] = relative_error(moment.activation_bytes,
                                           traced.buckets.get("activations", 0))
    errors["peak"] = relative_error(ours.allocated_peak_bytes, traced.allocated_peak_bytes)
    return Row(family, fields, errors, ours.phase.value == traced.phase, seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sample", type=int, default=72)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", action="append", default=[], metavar="FIELD=V1,V2")
    args = parser.parse_args()
    combos = grid()
    random.Random(args.seed).shuffle(combos)
    # a covering sample: every family gets its share before any gets more
    per_family: dict[str, list[tuple[str, dict[str, object]]]] = {}
    for family, fields in combos:
        per_family.setdefault(family, []).append((family, fields))
    ordered = [row for group in itertools.zip_longest(*per_family.values()) for row in group
               if row is not None]
    chosen = [(f, fields) for f, fields in ordered[: args.sample] if kept(f, fields, args.only)]
    lines = run(chosen, compare)
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
