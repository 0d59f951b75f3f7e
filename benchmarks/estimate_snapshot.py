"""A fingerprint of the closed form: every figure of `estimate()` over a fixed sample of setups.

    .venv/bin/python benchmarks/estimate_snapshot.py --out /tmp/after.jsonl
    diff benchmarks/estimate_snapshot.jsonl /tmp/after.jsonl   # a refactor must print nothing

A refactor must not move a number. `validate` covers 121 published runs and the trace grid 320
setups, but both take a while and neither touches every knob on every family. This sample draws
setups at random (fixed seed) over every catalog model and every field of `TrainingSetup`, and
writes, per setup, every line item's key and bytes, the buckets, the three peaks, the phase and
every moment. A setup the estimator refuses is written with its error text, so a changed
refusal shows too. It runs in a few seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vram import TrainingSetup, estimate, load_model
from vram.errors import VramError

SEED = 20261130
DEFAULT_COUNT = 3000

#: The catalog when the snapshot was first taken: models added later do not reshuffle the sample.
SNAPSHOT_MODELS: tuple[str, ...] = (
    'bert-large-uncased',
    'bloom-560m',
    'bloomz-7b1',
    'codellama-13b',
    'codellama-34b',
    'codellama-7b',
    'falcon-7b',
    'flan-t5-base',
    'flan-t5-large',
    'flan-t5-xxl',
    'gemma-2-27b',
    'gemma-2-2b',
    'gemma-2-9b',
    'gemma-2b',
    'gemma-7b',
    'gpt-neox-20b',
    'llama-2-13b',
    'llama-2-70b',
    'llama-2-7b',
    'llama-3.1-405b-instruct',
    'llama-3.1-70b',
    'llama-3.1-70b-instruct',
    'llama-3.1-8b',
    'llama-3.1-8b-instruct',
    'llama-3.2-1b',
    'llama-3.2-3b',
    'llama-3.2-3b-instruct',
    'llama-3.3-70b-instruct',
    'llama-65b',
    'meta-llama-3-8b',
    'mistral-7b-v0.1',
    'mistral-7b-v0.3',
    'mistral-nemo-base-2407',
    'mixtral-8x22b-v0.1',
    'mixtral-8x7b-v0.1',
    'mt0-xxl',
    'olmo-2-1124-7b',
    'phi-1_5',
    'phi-2',
    'phi-3-medium-4k-instruct',
    'phi-3-mini-4k-instruct',
    'phi-3.5-mini-instruct',
    'qwen1.5-moe-a2.7b',
    'qwen2-7b-instruct',
    'qwen2.5-0.5b-instruct',
    'qwen2.5-1.5b-instruct',
    'qwen2.5-14b-instruct',
    'qwen2.5-32b-instruct',
    'qwen2.5-72b-instruct',
    'qwen2.5-7b-instruct',
    'qwen3-30b-a3b',
    'stablelm-base-alpha-3b',
    't0_3b',
    'tinyllama-1.1b',
    'yi-34b',
)

CHOICES: dict[str, list[Any]] = {
    "method": ["full", "lora", "qlora"],
    "lora_rank": [4, 8, 16, 64],
    "lora_targets": ["all-linear", ("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj"),
                     ("gate_proj", "up_proj", "down_proj"), ("q_proj", "v_proj", "lm_head")],
    "lora_dropout": [0.0, 0.05],
    "quant": [None, "nf4", "nf4-dq", "int8"],
    "optimizer": ["adamw", "adamw-8bit", "paged-adamw", "paged-adamw-8bit", "sgd",
                  "sgd-momentum", "adafactor", "lion", "adamw-in-backward"],
    "precision": ["fp32", "fp16-mixed", "bf16-mixed", "bf16-true"],
    "micro_batch": [1, 2, 4, 16],
    "seq_len": [128, 1024, 2048, 8192, 32768],
    "grad_accum": [1, 8],
    "grad_ckpt": [False, True],
    "longest_batch_repeats": [True, False],
    "compile": [None, False, True],
    "attention": ["sdpa", "eager", "flash"],
    "loss": [None, "standard", "chunked"],
    "gpus": [(1, "none"), (1, "zero3"), (2, "ddp"), (4, "zero1"), (8, "zero2"), (8, "zero3"),
             (64, "zero3")],
    "offload": ["none", "optimizer", "params+optimizer", "activations"],
    "framework": ["hf-trainer", "litgpt", "torchtune", "peft-accelerate", "fsdp-qlora",
                  "unsloth", "other"],
}


def sample_setups(count: int, seed: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """`count` (model slug, setup fields) pairs, the same for the same seed."""
    rng = random.Random(seed)
    slugs = SNAPSHOT_MODELS
    for index in range(count):
        slug = slugs[index % len(slugs)]
        fields = {key: rng.choice(values) for key, values in CHOICES.items()}
        n_gpus, sharding = fields.pop("gpus")
        fields["n_gpus"], fields["sharding"] = n_gpus, sharding
        if fields["method"] == "qlora" and fields["quant"] is None:
            fields["quant"] = rng.choice(["nf4", "nf4-dq", "int8"])
        if fields["method"] != "qlora":
            fields["quant"] = None
        sharded = sharding in ("zero1", "zero2", "zero3")
        offload_allowed = fields["offload"] in ("none", "activations") or (
            sharded and (fields["offload"] == "optimizer" or sharding == "zero3"))
        if not offload_allowed and rng.random() < 0.9:
            fields["offload"] = "none"  # keep a few refusals in the sample, not hundreds
        yield slug, fields


def fingerprint(slug: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Every figure of one estimate, or the text of the refusal."""
    record: dict[str, Any] = {"model": slug, "setup": {k: v for k, v in fields.items()}}
    try:
        setup = TrainingSetup(**fields)
        result = estimate(load_model(slug), setup)
    except (VramError, ValueError) as error:
        record["error"] = f"{type(error).__name__}: {error}"
        return record
    record["buckets"] = {
        bucket.name.value: [[item.key, item.bytes] for item in bucket.items]
        for bucket in result.buckets
    }
    record["peaks"] = [result.allocated_peak_bytes, result.reserved_peak_bytes,
                       result.device_peak_bytes, result.host_bytes, result.paged_bytes,
                       result.state_bytes]
    record["phase"] = result.phase.value
    record["moments"] = [[m.label, m.allocated_bytes, m.gradient_bytes, m.activation_bytes]
                         for m in result.moments]
    record["inference"] = result.inference.total_bytes
    record["params"] = [result.params.total, result.params.trainable, result.params.quantized]
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=None, help="default: standard output")
    args = parser.parse_args(argv)
    lines = [json.dumps(fingerprint(slug, fields), sort_keys=True, default=list)
             for slug, fields in sample_setups(args.count, args.seed)]
    text = "\n".join(lines) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
