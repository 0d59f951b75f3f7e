"""The closed form against the exact trace of rank 0 of a tensor- and a context-parallel run
(the CI sample of benchmarks/trace_grid_parallel.py: model state within 1 %, the allocated
peak within 5 %)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.trace_grid import relative_error
from vram import TrainingSetup, estimate, load_model
from vram.model.catalog import load_config
from vram.trace.parallel import ParallelSpec, trace_parallel

pytestmark = pytest.mark.trace

MODEL = "tinyllama-1.1b"  # 32 query / 4 kv heads, untied: tp 2 gives each rank whole heads
BASE: dict[str, Any] = {"method": "full", "precision": "bf16-true", "grad_ckpt": True,
                        "attention": "sdpa", "optimizer": "adamw", "framework": "torchtitan"}


@pytest.mark.parametrize(("fields", "spec"), [
    ({"n_gpus": 2, "tp": 2, "sequence_parallel": True, "seq_len": 4096},
     ParallelSpec(tp=2, sequence_parallel=True)),
    ({"n_gpus": 2, "cp": 2, "cp_kind": "ring", "sharding": "zero3", "fsdp_version": 2,
      "seq_len": 8192}, ParallelSpec(cp=2)),
])
def test_parallel_rank_zero_agrees_with_the_closed_form(fields: dict[str, Any],
                                                          spec: ParallelSpec) -> None:
    setup = TrainingSetup(**BASE, **fields)
    traced, _ = trace_parallel(load_config(MODEL), setup, spec)
    ours = estimate(load_model(MODEL), setup)
    state = {item.key: item.bytes for bucket in ours.buckets for item in bucket.items}
    weights = sum(b for k, b in state.items()
                  if k.startswith("weights.") and not k.startswith("weights.fsdp2_"))
    optimizer = sum(b for k, b in state.items() if k.startswith("optimizer."))
    assert abs(relative_error(weights, traced.bucket_max["weights"])) <= 0.01
    assert abs(relative_error(optimizer, traced.bucket_max["optimizer"])) <= 0.01
    assert abs(relative_error(ours.allocated_peak_bytes, traced.allocated_peak_bytes)) <= 0.05
