"""Time `estimate()`, `fit()` over the catalog, `plan()` over the catalog with every lever, a
10,000-setup sweep, and a `validate` run over the shared cases.

    .venv/bin/python benchmarks/speed.py [../shared/validation/cases.csv] > benchmarks/speed.txt

Targets (issue 10): estimate() median <= 0.12 ms; fit() over the catalog <= 1 ms; plan() for
a 70B setup over the whole catalog with every lever <= 50 ms; 10,000 setups <= 1 s. The sweep
is timed twice: full estimates (`estimate`), and the peaks alone (`estimate_peaks`, the same
figures without the breakdown, what a sweep over setups compares). When fitcheck-llm is
installed in this venv its estimate is timed in the same run.

Times are CPU time of this process (`time.process_time`), medians of repeated runs: the
machine is shared, and wall-clock time there measures the other processes as much as this one.
Each figure is measured in ROUNDS rounds and the median round is printed with the range; CPU
time still grows with the load (two cores shared by many processes share caches and
hyperthreads), so the load average is printed beside it.
`estimate()` is timed warm (the per-model cache of the batch-independent part filled, as in a
sweep, a fit or a plan) and cold (a fresh model object each call, an empty cache).
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import vram
from vram.plan import default_mfu_table

SETUPS = {
    "8B QLoRA, 2k tokens": ("llama-3.1-8b", vram.TrainingSetup()),
    "70B full, 8 GPUs ZeRO-3": ("llama-3.1-70b", vram.TrainingSetup(
        method="full", n_gpus=8, sharding="zero3", grad_ckpt=True)),
    "Mixtral LoRA, 32k tokens": ("mixtral-8x7b-v0.1", vram.TrainingSetup(
        method="lora", seq_len=32768, grad_ckpt=True, attention="flash")),
    "T0 3B full fp32": ("t0_3b", vram.TrainingSetup(method="full", precision="fp32")),
}
PLAN_70B = ("llama-3.1-70b", vram.TrainingSetup(method="full", n_gpus=8, sharding="zero3",
                                                grad_ckpt=True))


def median_seconds(call: Callable[[], object], runs: int, warmup: int = 10) -> float:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        start = time.process_time()
        call()
        samples.append(time.process_time() - start)
    return statistics.median(samples)


#: Rounds of every measurement; the median round is reported, with the range.
ROUNDS = 3


def rounds(measure: Callable[[], float]) -> str:
    """`measure()` ROUNDS times: "median (min-max)" in its unit."""
    samples = sorted(measure() for _ in range(ROUNDS))
    return f"{statistics.median(samples):.3f} ({samples[0]:.3f}-{samples[-1]:.3f})"


def fitcheck_line() -> str:
    """fitcheck-llm's estimate of the first setup (8B QLoRA NF4, r16, 2,048 tokens, batch 1, on
    an A100 80GB), timed like ours, when fitcheck-llm is installed in this venv. Its model
    config is built from the same config.json fields, so no Hub access is needed."""
    try:
        from fitcheck import __version__ as fitcheck_version  # type: ignore[import-not-found]
        from fitcheck.config_parser import ModelConfig  # type: ignore[import-not-found]
        from fitcheck.estimator import TrainingConfig  # type: ignore[import-not-found]
        from fitcheck.estimator import estimate as fitcheck_estimate
        from fitcheck.gpu_db import get_gpu  # type: ignore[import-not-found]
    except ImportError:
        return "fitcheck-llm: not installed in this venv (no side-by-side figure)"
    ours = vram.load_model("llama-3.1-8b")
    config = ModelConfig(
        name="meta-llama/Llama-3.1-8B", num_params=ours.n_params,
        hidden_size=ours.hidden_size, num_layers=32, num_attention_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=ours.vocab_size, head_dim=128,
        tie_word_embeddings=False)
    training = TrainingConfig(precision="bf16", quantization="nf4", lora_rank=16,
                              batch_size=1, seq_len=2048)
    gpu = get_gpu("a100-80")
    ms = rounds(lambda: median_seconds(
        lambda: fitcheck_estimate(config, training, gpu), 2000, 100) * 1e3)
    return f"fitcheck-llm {fitcheck_version} estimate(), 8B QLoRA, 2k tokens, ms: {ms}"


def sweep_setups(n: int, seed: int = 0) -> list[vram.TrainingSetup]:
    """n distinct single-GPU setups: methods, optimizers, precisions, batches, sequences."""
    rng = random.Random(seed)
    setups: set[vram.TrainingSetup] = set()
    while len(setups) < n:
        method = rng.choice(["full", "lora", "qlora"])
        setups.add(vram.TrainingSetup(
            method=method, optimizer=rng.choice(["adamw", "adamw-8bit", "paged-adamw-8bit"]),
            precision=rng.choice(["bf16-mixed", "bf16-true"]),
            micro_batch=rng.randint(1, 64), seq_len=rng.choice([512, 1024, 2048, 4096, 8192]),
            grad_ckpt=rng.random() < 0.5, lora_rank=rng.choice([8, 16, 32, 64])))
    return sorted(setups, key=lambda s: s.model_dump_json())


def main() -> None:
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print(f"times: CPU time of this process (time.process_time), median of {ROUNDS} rounds "
          "(range in brackets)")
    print("estimate() per call, the median over 2000 calls in each round, ms")
    for label, (slug, setup) in SETUPS.items():
        model = vram.load_model(slug)
        warm = rounds(lambda m=model, s=setup: median_seconds(
            lambda: vram.estimate(m, s), 2000, 100) * 1e3)
        copies = iter([model.model_copy() for _ in range(ROUNDS * 400)])
        cold = rounds(lambda c=copies, s=setup: median_seconds(
            lambda: vram.estimate(next(c), s), 300, 100) * 1e3)
        print(f"  {label:<28} warm {warm}   cold {cold}")
    print(f"  {fitcheck_line()}")

    model = vram.load_model("llama-3.1-8b")
    gpus = vram.load_gpus()
    fit_ms = rounds(lambda: median_seconds(
        lambda: vram.fit(model, vram.TrainingSetup(), gpus), 200) * 1e3)
    print(f"fit() over the catalog ({len(gpus)} GPUs), 8B QLoRA, ms: {fit_ms}")

    default_mfu_table()  # the calibration is read once per process
    slug, setup = PLAN_70B
    big = vram.load_model(slug)
    last = vram.plan(big, setup, tokens=1e9)
    plan_ms = rounds(lambda: median_seconds(
        lambda: vram.plan(big, setup, tokens=1e9), 20, 2) * 1e3)
    print(f"plan() 70B full over the catalog, every lever, ms: {plan_ms} "
          f"({last.estimates} estimates, {len(last.levers)} levers, {len(last.options)} "
          "options)")
    mine = vram.Hardware(gpu="h100-sxm", count=8)
    last = vram.plan(big, setup, hardware=mine, tokens=1e9)
    plan_ms = rounds(lambda: median_seconds(
        lambda: vram.plan(big, setup, hardware=mine, tokens=1e9), 20, 2) * 1e3)
    print(f"plan() 70B full on 8x H100 (path needed), every lever, ms: {plan_ms} "
          f"({last.estimates} estimates)")

    setups = sweep_setups(10_000)

    def sweep(call: Callable[[vram.ModelSpec, vram.TrainingSetup], object]) -> float:
        sweep_model = model.model_copy()  # an empty cache: the sweep fills it as it goes
        start = time.process_time()
        for each in setups:
            call(sweep_model, each)
        return time.process_time() - start

    print("sweep: 10,000 distinct 8B setups, estimate(), s: "
          f"{rounds(lambda: sweep(vram.estimate))}")
    print("sweep: the same 10,000, estimate_peaks() (the same peaks, no breakdown), s: "
          f"{rounds(lambda: sweep(vram.estimate_peaks))}")

    cases = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/validation/cases.csv")
    if cases.exists():
        runs = []
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "vram", "validate", str(cases)],
                           check=True, capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            runs.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        print(f"python -m vram validate {cases} (whole process CPU, median of 5): "
              f"{statistics.median(runs):.2f} s")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
