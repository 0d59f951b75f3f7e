"""The closed form held to the exact trace of rank 0 of an FSDP2 run (issue 9).

The grid (`benchmarks/trace_grid_sharded.py`, output in `benchmarks/trace_grid_sharded.txt`)
traces FSDP2 (`fully_shard` per block and on the root) over 2-8 ranks of a fake process group;
this sample runs the same comparison in CI: model state within 1 %, activations, what FSDP2 has
in flight and the allocated peak within 5 %.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks.trace_grid_sharded import TOLERANCE, compare, trace

SAMPLE: list[object] = [
    # LoRA under the bf16 policy (fp32 shards, fp32 reduce), a tied embedding (the root unit
    # holds it for both ends)
    ("qwen2-gqa", {"n_gpus": 8, "fsdp_reshard_after_forward": True, "precision": "bf16-mixed",
                   "method": "lora", "grad_ckpt": False, "micro_batch": 1, "seq_len": 4096}),
    # full fine-tune resharding after forward, an untied head: the peak is in the backward of
    # a middle block, with the next block down prefetched beside it (the first has none)
    ("mistral-gqa", {"n_gpus": 4, "fsdp_reshard_after_forward": True,
                     "precision": "bf16-true", "method": "full", "grad_ckpt": False,
                     "micro_batch": 1, "seq_len": 1024}),
]


#: Where each setup peaks (the moment whose activations are compared).
PEAK_AT = ["backward / head", "backward / model.layers / mid"]


@pytest.mark.trace
@pytest.mark.parametrize(("family", "fields", "peak_at"),
                         [(*setup, at) for setup, at in zip(SAMPLE, PEAK_AT, strict=True)])
def test_closed_form_agrees_with_the_sharded_trace(family: str, fields: dict[str, object],
                                                   peak_at: str) -> None:
    traced = trace(family, fields)
    assert traced["peak_at"] == peak_at
    row = compare(family, fields, traced)
    failures = {k: f"{100 * v:+.1f}%" for k, v in row.errors.items()
                if abs(v) > TOLERANCE[k]}
    assert not failures, failures
