"""Hold the closed form to the exact trace on vision-language models with images (issue 22).

    PYTHONPATH=. .venv/bin/python benchmarks/trace_grid_vlm.py [--sample N] [--seed S]
        [--out FILE] [--only FIELD=V1,V2 ...]

The comparison of `benchmarks/trace_grid.py` (weights, gradients and optimizer state within
1 %, activations at the trace's peak moment and the allocated peak within 5 %) on the
image-text-to-text class of each VLM type the trace runs (`vram/trace/vision.py`), fed the
setup's images: full, LoRA and QLoRA, checkpointing on and off, `bf16-true` and `bf16-mixed`,
LoRA on every Linear (PEFT's all-linear: the tower and projector too) or on q_proj/v_proj, the
vision side frozen or not. Each family has one image size, stated in its label with the
resized size and its tokens. Llama 4 is left out (transformers 5.24.0's forward fails,
`benchmarks/FAMILY_TRACE_NOTES.md`), as are mllama (its cross-attention states are not
modelled) and Qwen3.5 (its Gated DeltaNet layers run the slow fallback on a CPU).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from benchmarks.trace_grid import Row, against_trace, combinations, covering_main
from vram import TrainingSetup, estimate, load_model
from vram.model.catalog import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "families"

#: label -> (catalog slug or "default:<type>", the images: (per sample, height, width),
#: vision_config keys changed for a default config that cannot run a step).
FAMILIES: dict[str, tuple[str, tuple[int, int, int], dict[str, Any]]] = {
    "qwen2.5-vl": ("qwen2.5-vl-7b", (2, 1080, 1920), {}),
    "qwen3-vl": ("qwen3-vl-4b", (1, 1024, 1024), {}),
    "gemma3": ("gemma-3-4b", (1, 896, 896), {}),
    "paligemma": ("paligemma2-3b-pt-448", (1, 448, 448), {}),
    "llava": ("default:llava", (2, 336, 336), {}),
    "internvl": ("default:internvl", (1, 448, 896), {}),
    # Idefics3Config's default tower (224 px, patch 32: 7x7 patches) cannot be pixel-shuffled
    # by 2 (vlm_trace_probe.py): 448 px gives 14x14
    "idefics3": ("default:idefics3", (1, 448, 448), {"image_size": 448}),
    "mistral3": ("default:mistral3", (1, 448, 672), {}),
}

#: Qwen2.5-VL at the issue's max_pixels (1080x1920 -> 728x1316, 1,222 tokens per image).
EXTRA = {"qwen2.5-vl": {"max_pixels": 1_003_520}}

AXES: dict[str, list[Any]] = {
    "method": ["full", "lora", "qlora"],
    "optimizer": ["adamw"],
    "precision": ["bf16-true", "bf16-mixed"],
    "micro_batch": [1],
    "seq_len": [4096],
    "grad_ckpt": [False, True],
    "attention": ["sdpa"],
    "lora_targets": ["all-linear", "q_proj,v_proj"],
    "freeze_vision": [None, True],
}


def config_of(family: str) -> dict[str, Any]:
    ref, _, fix = FAMILIES[family]
    if ref.startswith("default:"):
        config: dict[str, Any] = json.loads((FIXTURES / f"{ref[8:]}.json").read_text())
    else:
        config = copy.deepcopy(load_config(ref))
    config["vision_config"].update(fix)
    return config


def grid() -> list[tuple[str, dict[str, object]]]:
    # LoRA targets mean nothing without adapters: one full row per other combination
    return combinations(FAMILIES, AXES, lambda _, fields: not (
        fields["method"] == "full" and fields["lora_targets"] != "all-linear"))


def _setup(family: str, fields: dict[str, object]) -> TrainingSetup:
    images, height, width = FAMILIES[family][1]
    return TrainingSetup.model_validate({
        "framework": "hf-trainer", "lora_rank": 16, "images_per_sample": images,
        "image_height": height, "image_width": width, **EXTRA.get(family, {}), **fields})


def label(family: str, setup: TrainingSetup, config: dict[str, Any]) -> str:
    """The family with its images: per sample x resized size, LM tokens each, and what the
    LoRA targets and the freeze are."""
    vision = estimate(load_model(config), setup).vision
    assert vision is not None
    frozen = "frozen" if setup.freeze_vision else "open"
    targets = "all" if setup.lora_targets == "all-linear" else "qv"
    return (f"{family} {vision.images_per_sample}x{vision.resized_height}x"
            f"{vision.resized_width}={vision.tokens_per_image} {targets} {frozen}")


def compare(family: str, fields: dict[str, object]) -> Row:
    config = config_of(family)
    setup = _setup(family, fields)
    errors, phase_match, seconds = against_trace(config, setup)
    return Row(label(family, setup, config), fields, errors, phase_match, seconds)


def main() -> None:
    covering_main(grid(), compare, 48)


if __name__ == "__main__":
    main()
