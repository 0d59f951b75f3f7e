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

import json
from pathlib import Path
from typing import Any

from benchmarks.trace_grid import Row, against_trace, combinations, covering_main
from vram import TrainingSetup
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
    return combinations((*FAMILIES, *MOE_FAMILIES), AXES, lambda family, fields: not (
        family in MOE_FAMILIES and (fields["precision"] != "bf16-true"
                                    or fields["method"] == "qlora")))


def compare(family: str, fields: dict[str, object]) -> Row:
    setup = TrainingSetup(framework="hf-trainer", lora_targets="q_proj,v_proj", lora_rank=16,
                          **fields)  # type: ignore[arg-type]
    errors, phase_match, seconds = against_trace(config_of(family), setup)
    return Row(family, fields, errors, phase_match, seconds)


def main() -> None:
    covering_main(grid(), compare, 72)


if __name__ == "__main__":
    main()
