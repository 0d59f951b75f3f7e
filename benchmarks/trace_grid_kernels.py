"""Hold the hybrids' closed form with the mixer kernels to the trace that emulates them
(issue 22).

    PYTHONPATH=. .venv/bin/python benchmarks/trace_grid_kernels.py [--out FILE]
        [--only FIELD=V1,V2 ...]

With `mixer_kernels` true the closed form counts what fla's `chunk_gated_delta_rule`,
mamba_ssm's `mamba_split_conv1d_scan_combined` and causal-conv1d's `causal_conv1d_fn` save and
allocate (`vram.model.families.parts`, `workspace`; Jamba's `selective_scan_fn` too), and the
CPU trace runs stand-in autograd Functions with the same saved sets and workspace
(`vram.trace.mixer_kernels`) in place of transformers' PyTorch fallback. Both read the same
kernel source independently: this checks the closed form's kernel terms against that reading,
and around them every tensor of the layer that is not the kernel's. It is not a GPU
measurement. The families and configs are `trace_grid_hybrid.py`'s; with the kernels Jamba's
rows run at full length (no Python loop over the tokens).
"""

from __future__ import annotations

import functools

from benchmarks.trace_grid import covering_main
from benchmarks.trace_grid_hybrid import compare as compare_hybrid
from benchmarks.trace_grid_hybrid import grid

#: (family, method, grad_ckpt, seq_len): LoRA / full, checkpointing on and off.
ROWS: list[tuple[str, str, bool, int]] = [
    ("qwen3.5-gdn", "lora", False, 512), ("qwen3.5-gdn", "full", False, 512),
    ("qwen3.5-gdn", "lora", True, 1024), ("qwen3.5-default", "lora", False, 512),
    ("nemotron-h", "lora", False, 512), ("nemotron-h", "full", True, 1024),
    ("nemotron-h-default", "lora", True, 512),
    ("granite4-h", "full", True, 1024), ("granite4-h", "lora", False, 512),
    ("falcon-h1", "full", False, 512), ("falcon-h1", "lora", True, 1024),
    ("lfm2-conv", "lora", False, 1024), ("lfm2-conv", "full", True, 2048),
    ("jamba", "lora", False, 2048), ("jamba", "full", True, 1024),
    ("jamba-default", "lora", False, 512), ("qwen3-next", "lora", False, 512),
]


#: the hybrid grid's comparison, with the kernels emulated in the trace
compare = functools.partial(compare_hybrid, mixer_kernels=True)


def main() -> None:
    covering_main(grid(ROWS), compare, len(ROWS))


if __name__ == "__main__":
    main()
