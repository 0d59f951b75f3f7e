"""How long the caching allocator model takes to replay a 70B training step.

    PYTHONPATH=. nice -n 10 python benchmarks/replay_speed.py [--cache PATH] \
        > benchmarks/replay_speed.txt

llama-3.1-70b, full fine-tune, bf16-true, fused AdamW (HF Trainer), batch 1, seq 2048, traced at
its full depth (80 blocks) from the build on (`vram.trace.allocator.trace_allocations`: minutes
on a CPU; cached at `--cache`), then the build and three steps replayed through
`vram.memory.allocator` five times. The target (issue 21): under 5 s per replay.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from pathlib import Path

from vram import TrainingSetup
from vram.memory.allocator import replay
from vram.model.catalog import load_config
from vram.trace.allocator import AllocationLog, trace_allocations

MODEL = "llama-3.1-70b"
SETUP = TrainingSetup(method="full", optimizer="adamw", precision="bf16-true", micro_batch=1,
                      seq_len=2048, framework="hf-trainer")
GIB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/vram_replay_70b.pkl"))
    args = ap.parse_args()
    if args.cache.exists():
        log: AllocationLog = pickle.loads(args.cache.read_bytes())
        traced = "cached"
    else:
        start = time.perf_counter()
        log = trace_allocations(load_config(MODEL), SETUP)
        traced = f"{time.perf_counter() - start:.0f} s"
        args.cache.write_bytes(pickle.dumps(log))
    program = log.program()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        result = replay(program)
        times.append(time.perf_counter() - start)
    print(f"{MODEL} full bf16-true AdamW(fused) b1 s2048: {log.n_layers} blocks, trace {traced}")
    print(f"events={len(program)} reserved_gib={result.reserved_peak_bytes / GIB:.2f} "
          f"allocated_gib={result.allocated_peak_bytes / GIB:.2f}")
    print(f"replay_s min={min(times):.2f} median={statistics.median(times):.2f} "
          f"max={max(times):.2f}")


if __name__ == "__main__":
    main()
