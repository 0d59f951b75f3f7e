"""Hold the hybrids' closed form without the mixer kernels to the exact trace (issue 22).

    PYTHONPATH=. .venv/bin/python benchmarks/trace_grid_hybrid.py [--out FILE]
        [--only FIELD=V1,V2 ...]

The CPU trace runs transformers' PyTorch fallback of every hybrid mixer (no fla, mamba_ssm or
causal-conv1d), and `against_trace` estimates with `mixer_kernels` false: the fallback's saved
set (`vram.model.families.fallback`). Each type's default config (`tests/data/families/`), cut
to a few layers with an adapted attention layer first, and the `-default` / `-first` rows in
the type's default order, where Mamba-2, MoE, Gated DeltaNet or convolution layers come before
the first attention: without checkpointing nothing before the first LoRA adapter needs a
gradient, so those layers keep nothing (`vram.memory.activations.lead`; PEFT refuses `out_proj`
on the Mamba types, so the LoRA rows target q_proj, v_proj; the `qwen3.5-gdn` rows
`all-linear`). Jamba's fallback loops over every token in Python: its rows are one Mamba layer
at 256 tokens, or its default order cut to 6 layers at 128. With `mixer_kernels` true the
trace emulates the kernels instead (`vram.trace.mixer_kernels`): `trace_grid_kernels.py`
holds the closed form to that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.trace_grid import Row, against_trace, covering_main
from vram import TrainingSetup

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "families"

#: family label -> (model type, config changes: depth and layer kinds).
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3.5-gdn": ("qwen3_5_text", {"num_hidden_layers": 4, "layer_types": [
        "full_attention", "linear_attention", "linear_attention", "linear_attention"]}),
    "nemotron-h": ("nemotron_h", {"layers_block_type": [
        "full_attention", "linear_attention", "mlp", "linear_attention"]}),
    "granite4-h": ("granitemoehybrid", {"num_hidden_layers": 4, "layer_types": [
        "attention", "mamba", "mamba", "mamba"]}),
    "falcon-h1": ("falcon_h1", {"num_hidden_layers": 4}),
    "lfm2-conv": ("lfm2", {"num_hidden_layers": 4, "layer_types": [
        "full_attention", "conv", "conv", "conv"], "full_attn_idxs": [0]}),
    "jamba": ("jamba", {"num_hidden_layers": 2, "attn_layer_period": 2, "attn_layer_offset": 0,
                        "expert_layer_period": 2, "expert_layer_offset": 1}),
    # each type's default layer order: the layers before the first adapted attention keep
    # nothing under LoRA without checkpointing (`vram.memory.activations.lead`)
    "nemotron-h-default": ("nemotron_h", {}),  # Mamba-2, MoE, attention, MLP
    "qwen3.5-default": ("qwen3_5_text", {"num_hidden_layers": 4, "layer_types": [
        "linear_attention", "linear_attention", "linear_attention", "full_attention"]}),
    "lfm2-conv-first": ("lfm2", {"num_hidden_layers": 4, "layer_types": [
        "conv", "conv", "full_attention", "conv"], "full_attn_idxs": [2]}),
    "jamba-default": ("jamba", {"num_hidden_layers": 6, "expert_layer_period": 2,
                                "expert_layer_offset": 1}),  # attention at layer 4 of 8
    "qwen3-next": ("qwen3_next", {"num_hidden_layers": 4, "layer_types": [
        "full_attention", "linear_attention", "linear_attention", "linear_attention"]}),
}

#: (family, method, grad_ckpt, seq_len): full / LoRA / QLoRA, checkpointing on and off.
ROWS: list[tuple[str, str, bool, int]] = [
    ("qwen3.5-gdn", "full", False, 512), ("qwen3.5-gdn", "lora", False, 1024),
    ("qwen3.5-gdn", "qlora", True, 2048),
    ("nemotron-h", "full", False, 1024), ("nemotron-h", "lora", False, 512),
    ("nemotron-h", "lora", True, 2048), ("nemotron-h", "qlora", False, 1024),
    ("granite4-h", "full", True, 1024), ("granite4-h", "lora", False, 512),
    ("granite4-h", "full", False, 512), ("granite4-h", "lora", True, 512),
    ("falcon-h1", "full", False, 512), ("falcon-h1", "lora", True, 1024),
    ("falcon-h1", "qlora", True, 512),
    ("lfm2-conv", "full", True, 2048), ("lfm2-conv", "lora", False, 1024),
    ("lfm2-conv", "qlora", False, 2048), ("lfm2-conv", "full", False, 512),
    ("jamba", "full", False, 256), ("jamba", "lora", False, 256),
    ("nemotron-h-default", "lora", False, 512), ("nemotron-h-default", "qlora", False, 512),
    ("nemotron-h-default", "lora", True, 512), ("falcon-h1", "lora", False, 512),
    ("qwen3.5-default", "lora", False, 512), ("lfm2-conv-first", "lora", False, 1024),
    ("jamba-default", "lora", False, 128),
]


def config_of(family: str) -> dict[str, Any]:
    model_type, changes = FAMILIES[family]
    config: dict[str, Any] = json.loads((FIXTURES / f"{model_type}.json").read_text())
    return {**config, **changes}


def compare(family: str, fields: dict[str, object], *, mixer_kernels: bool = False) -> Row:
    targets = "all-linear" if family == "qwen3.5-gdn" else "q_proj,v_proj"
    setup = TrainingSetup(framework="hf-trainer", lora_targets=targets, lora_rank=16,
                          **fields)  # type: ignore[arg-type]
    errors, phase_match, seconds = against_trace(config_of(family), setup,
                                                 mixer_kernels=mixer_kernels)
    return Row(family, fields, errors, phase_match, seconds)


def grid(rows: list[tuple[str, str, bool, int]] = ROWS) -> list[tuple[str, dict[str, object]]]:
    return [(family, {"method": method, "optimizer": "adamw", "precision": "bf16-true",
                      "micro_batch": 1, "seq_len": seq, "grad_ckpt": ckpt,
                      "attention": "sdpa"})
            for family, method, ckpt, seq in rows]


def main() -> None:
    covering_main(grid(), compare, len(ROWS))


if __name__ == "__main__":
    main()
