"""Time the exact trace and print the figures quoted in benchmarks/TRACE_NOTES.md.

    .venv/bin/python benchmarks/trace_bench.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vram.setup import TrainingSetup
from vram.trace import trace_step

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"


def load(name: str) -> dict[str, object]:
    return json.loads((MODELS / f"{name}.json").read_text())


def show(label: str, config: dict[str, object], setup: TrainingSetup) -> None:
    start = time.perf_counter()
    result = trace_step(config, setup)
    took = time.perf_counter() - start
    print(f"{label}: {took:.2f} s  peak={result.allocated_peak_bytes} phase={result.phase} "
          f"buckets={result.buckets} paged={result.paged_bytes}")


def main() -> None:
    start = time.perf_counter()
    import transformers  # noqa: F401  (import cost, paid once per process)

    print(f"import transformers: {time.perf_counter() - start:.2f} s")
    warm = TrainingSetup(method="full", optimizer="adamw", precision="bf16-true",
                         micro_batch=1, seq_len=2048)
    show("warm-up llama-3.2-1b", load("llama-3.2-1b"), warm)
    show("llama-3.1-70b full bf16-true adamw b1 s2048", load("llama-3.1-70b-instruct"), warm)
    show("llama-3.1-8b full bf16-true adamw b1 s2048", load("llama-3.1-8b-instruct"), warm)
    base = {"method": "full", "optimizer": "adamw", "precision": "bf16-true", "micro_batch": 1,
            "seq_len": 512, "attention": "sdpa", "framework": "other"}
    show("(a) llama-3.2-1b full bf16-true adamw b1 s512 sdpa",
         load("llama-3.2-1b"), TrainingSetup(**base))
    show("(b) same + grad_ckpt", load("llama-3.2-1b"), TrainingSetup(**base, grad_ckpt=True))
    show("(c) llama-3.1-8b lora r16 q,v bf16-true adamw b2 s2048 sdpa ckpt",
         load("llama-3.1-8b-instruct"),
         TrainingSetup(method="lora", lora_rank=16, lora_targets="q_proj,v_proj",
                       optimizer="adamw", precision="bf16-true", micro_batch=2, seq_len=2048,
                       attention="sdpa", grad_ckpt=True, framework="other"))


if __name__ == "__main__":
    main()
