"""Can the exact trace run issue 22's model types? One short step of each, on fake tensors.

    PYTHONPATH=. .venv/bin/python benchmarks/family_trace_probe.py [--out FILE] [TYPE ...]

Each type's default config (`tests/data/families/<type>.json`, real widths) is traced with
`vram.trace.trace_step(..., n_layers=k)`: exactly `k` blocks, enough to hold every kind of block
the type has (its first period of `layer_types`, the dense and the MoE layers, a cross-attention
layer), batch 1 x 128 tokens, SDPA, `bf16-true` AdamW, for full fine-tuning, LoRA (q_proj,
v_proj) and QLoRA (nf4, emulated by `vram.trace.quant`), each with and without per-layer
checkpointing; and full fine-tuning in `bf16-mixed`, the recipe that runs MoE experts in fp32.
A row prints the allocated peak, or why the trace could not run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from pathlib import Path

from benchmarks.family_defaults import FIXTURES, TYPES
from vram.setup import TrainingSetup

#: Blocks traced per type: one of each kind of block the default config has.
N_LAYERS = {
    "qwen3_next": 4, "qwen3_5_text": 4, "qwen3_5": 4, "gemma3_text": 6, "gemma3": 6,
    "llama4_text": 4, "llama4": 4, "olmo3": 4, "exaone4": 4, "nemotron_h": 4, "jamba": 5,
    "deepseek_v3": 4, "mllama": 4, "smollm3": 4,
}
SETUPS = [
    ("full", "bf16-true", False), ("full", "bf16-true", True),
    ("lora", "bf16-true", False), ("lora", "bf16-true", True),
    ("qlora", "bf16-true", False), ("qlora", "bf16-true", True),
    ("full", "bf16-mixed", False),
]


def probe(model_type: str, method: str, precision: str, ckpt: bool) -> str:
    from vram.trace import trace_step

    config = json.loads((FIXTURES / f"{model_type}.json").read_text())
    setup = TrainingSetup(method=method, precision=precision, optimizer="adamw",  # type: ignore[arg-type]
                          micro_batch=1, seq_len=128, grad_ckpt=ckpt, attention="sdpa",  # type: ignore[arg-type]
                          framework="hf-trainer", lora_targets="q_proj,v_proj",  # type: ignore[arg-type]
                          lora_rank=8)
    start = time.perf_counter()
    try:
        result = trace_step(config, setup, n_layers=N_LAYERS.get(model_type, 2))
    except Exception as exc:  # every failure is a finding: keep its first line
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"FAIL {type(exc).__name__}: {text[:150]}"
    took = time.perf_counter() - start
    return (f"ok peak={result.allocated_peak_bytes / 2**30:.2f} GiB at {result.peak_at} "
            f"({took:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("types", nargs="*", default=list(TYPES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    # fake_tensor logs a traceback for every op its meta kernel refuses; the row says why
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    lines = []
    for model_type in args.types:
        for method, precision, ckpt in SETUPS:
            line = (f"{model_type:<17} {method:<5} {precision:<10} ckpt={ckpt!s:<5} "
                    f"{probe(model_type, method, precision, ckpt)}")
            lines.append(line)
            print(line, file=sys.stderr, flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
