"""Time one `estimate()` and a `validate` run over the shared cases.

    .venv/bin/python benchmarks/speed.py [../shared/validation/cases.csv]

Targets (issue 2): one estimate under 1 ms; validate over the shared cases under 2 s.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import vram

SETUPS = {
    "8B QLoRA, 2k tokens": ("llama-3.1-8b", vram.TrainingSetup()),
    "70B full, 8 GPUs ZeRO-3": ("llama-3.1-70b", vram.TrainingSetup(
        method="full", n_gpus=8, sharding="zero3", grad_ckpt=True)),
    "Mixtral LoRA, 32k tokens": ("mixtral-8x7b-v0.1", vram.TrainingSetup(
        method="lora", seq_len=32768, grad_ckpt=True, attention="flash")),
    "T0 3B full fp32": ("t0_3b", vram.TrainingSetup(method="full", precision="fp32")),
}


def time_estimate(model: vram.ModelSpec, setup: vram.TrainingSetup, runs: int = 2000) -> float:
    for _ in range(100):
        vram.estimate(model, setup)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        vram.estimate(model, setup)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    print("estimate() median over 2000 calls")
    for label, (slug, setup) in SETUPS.items():
        median = time_estimate(vram.load_model(slug), setup)
        print(f"  {label:<28} {median * 1e3:7.3f} ms")
    cases = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/validation/cases.csv")
    if cases.exists():
        runs = []
        for _ in range(5):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "vram", "validate", str(cases)],
                           check=True, capture_output=True)
            runs.append(time.perf_counter() - start)
        print(f"python -m vram validate {cases} (whole process, median of 5): "
              f"{statistics.median(runs):.2f} s")


if __name__ == "__main__":
    main()
