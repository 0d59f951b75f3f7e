"""The H200 steps' traced allocations replayed under other allocator settings.

    PYTHONPATH=. python benchmarks/reserved_alloc_conf.py [--cache DIR] \
        > benchmarks/reserved_alloc_conf.txt

Reads the traces `benchmarks/trace_reserved_h200.py` cached (one per distinct setup) and
replays each, build and three steps, under PyTorch's defaults and under a few
`PYTORCH_CUDA_ALLOC_CONF` settings the stacks use (`benchmarks/ALLOCATOR_FACTS.md`), printing
the reserved peak of each in MiB and its change against the defaults. The allocated peak is the
same under every setting but `expandable_segments` (which splits blocks at 512 B, not 1 MiB).
Two of the settings were also measured (`GPU_H200.md`, the `expandable_segments:True` rows).
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

from vram.memory.allocator import parse_alloc_conf, replay
from vram.trace.allocator import AllocationLog

MIB = 2**20
SETTINGS = (
    "",
    "expandable_segments:True",
    "expandable_segments:True,roundup_power2_divisions:16",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:[32:256,64:128,256:64,>:32]",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/vram_alloc_traces"))
    args = ap.parse_args()
    confs = [parse_alloc_conf(text) for text in SETTINGS]
    print("setting columns: " + " | ".join(text or "defaults" for text in SETTINGS))
    for path in sorted(args.cache.glob("*.pkl")):
        log: AllocationLog = pickle.loads(path.read_bytes())
        program = log.program()
        base = replay(program, confs[0]).reserved_peak_bytes
        cells = [f"{base / MIB:8.0f}"]
        for conf in confs[1:]:
            reserved = replay(program, conf).reserved_peak_bytes
            cells.append(f"{reserved / MIB:8.0f} ({100 * (reserved / base - 1):+5.1f}%)")
        print(" ".join(cells), path.stem)


if __name__ == "__main__":
    main()
