"""DeepSpeed ZeRO-3's all-gather stream's cached blocks (`vram.sharding.deepspeed_streams`), by
hand.

Every partitioned parameter here is bf16 (2 B). DeepSpeed's defaults (zero/config.py@v0.18.4):
stage3_max_reuse_distance 1e9 keeps the forward's last 5e8 values gathered to the top of the
backward, stage3_prefetch_bucket_size 5e7 more are prefetched (max_live_parameters 1e9 leaves
room), and a coalesced prefetch all-gathers into one flat buffer of the bucket's values beside
the parameters copied out of it. All of it is allocated on the all-gather stream under
`overlap_comm` (on by default for ZeRO-3).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vram import TrainingSetup, estimate, load_model
from vram.result import Estimate

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "fsdp1_lora" / "configs"
KEPT = 500_000_000  # stage3_max_reuse_distance / 2
PREFETCH = 50_000_000  # stage3_prefetch_bucket_size
WINDOW = (KEPT + PREFETCH) * 2  # the most gathered at once, bf16
FLAT = PREFETCH * 2  # one coalesced prefetch's flat buffer, bf16
KEY = "overhead.zero3_allgather_stream"


def _items(result: Estimate) -> dict[str, int]:
    return {i.key: i.bytes for b in result.buckets for i in b.items}


def _setup(**changes: object) -> TrainingSetup:
    """Llama 2 7B full fine-tuning, 1 × 512 tokens, checkpointed, DeepSpeed ZeRO-3 on 8 GPUs."""
    base: dict[str, object] = {
        "method": "full", "optimizer": "adamw", "precision": "bf16-mixed", "micro_batch": 1,
        "seq_len": 512, "grad_ckpt": True, "framework": "deepspeed", "sharding": "zero3",
        "n_gpus": 8}
    return TrainingSetup.model_validate({**base, **changes})


def _seven_b(**changes: object) -> Estimate:
    return estimate(load_model(str(CONFIGS / "llama-2-7b.json")), _setup(**changes))


def test_the_whole_window_when_the_reserved_peak_holds_nothing_gathered() -> None:
    """The 7B's reserved peak is its optimizer step (the flattened gradient and its fp32 cast),
    where no parameter is gathered: the pool's 1.1 GB window and 0.1 GB flat buffer stay
    cached beside it, 1,200,000,000 B, in the reserved figure, not the allocated one."""
    result = _seven_b()
    items = _items(result)
    assert result.phase == "optimizer step"
    assert items[KEY] == WINDOW + FLAT == 1_200_000_000
    assert "weights.gathered" not in items
    assert result.reserved_peak_bytes - result.allocated_peak_bytes == (
        items[KEY] + items["overhead.allocator"])
    without = _seven_b(zero_overlap_comm=False)
    assert without.allocated_peak_bytes == result.allocated_peak_bytes
    assert result.reserved_peak_bytes - without.reserved_peak_bytes == items[KEY]


def test_only_the_flat_buffer_when_the_peak_counts_the_window_live() -> None:
    """peft-104's setup (Llama 2 70B LoRA, 8 × 2,048 tokens, 8 GPUs): the reserved peak is the
    top layer's backward, where the 1.1 GB window is counted gathered; the pool adds the
    prefetch's flat buffer, 100,000,000 B."""
    setup = TrainingSetup.model_validate({
        "method": "lora", "lora_rank": 8, "lora_targets": "all-linear", "optimizer": "adamw",
        "precision": "bf16-mixed", "micro_batch": 8, "seq_len": 2048, "grad_ckpt": True,
        "attention": "flash", "n_gpus": 8, "sharding": "zero3", "framework": "hf-trainer",
        "sharding_engine": "deepspeed"})
    items = _items(estimate(load_model(str(CONFIGS / "llama-2-70b.json")), setup))
    assert items["weights.gathered"] == WINDOW
    assert items[KEY] == FLAT


def test_one_gpu_with_the_shards_in_host_memory_copies_them_in_on_the_stream() -> None:
    """NoGatherHandle copies a host shard to the GPU under the all-gather stream."""
    assert _items(_seven_b(n_gpus=1, offload="params+optimizer"))[KEY] > 0


@pytest.mark.parametrize("changes", [
    {"zero_overlap_comm": False},  # the all-gathers run on the compute stream
    {"n_gpus": 1},  # the gathered parameter is the shard: no all-gather
    {"sharding_engine": "fsdp", "framework": "hf-trainer"},  # FSDP1's streams instead
    {"sharding": "zero2"},  # parameters are not partitioned
])
def test_only_deepspeed_zero3_with_overlap_comm_has_it(changes: dict[str, object]) -> None:
    assert KEY not in _items(_seven_b(**changes))


def test_a_4bit_base_packs_four_codes_per_counted_element() -> None:
    """DeepSpeed counts its live window in stored elements (`ds_numel`), and a sharded QLoRA
    base stores its 4-bit codes four to a bf16 element: the forward's last 5e8 elements are
    2e9 weights. Llama 2 7B nf4 (its 6.48e9 layer weights are 1.62e9 elements), ZeRO-3 on 2
    GPUs: the window kept to the top of the backward is 5e8 + 5e7 elements (1.1 GB of packed
    codes and their scales), not 5.5e8 weights (about 0.3 GB)."""
    from vram.memory.weights import deepspeed_elements
    from vram.model.params import ParamGroup, Storage

    nf4 = ParamGroup("linears", "w", 6_476_005_376, Storage.NF4, False, 3_339_000_000)
    assert deepspeed_elements(nf4) == 1_619_001_344
    dense = ParamGroup("embedding", "e", 131_072_000, Storage.BF16, False, 262_144_000)
    assert deepspeed_elements(dense) == 131_072_000
    setup = TrainingSetup.model_validate({
        "method": "qlora", "quant": "nf4", "optimizer": "adamw", "precision": "bf16-mixed",
        "micro_batch": 1, "seq_len": 512, "grad_ckpt": True, "framework": "hf-trainer",
        "sharding": "zero3", "sharding_engine": "deepspeed", "n_gpus": 2})
    gathered = _items(estimate(load_model("llama-2-7b"), setup))["weights.gathered"]
    # 5.5e8 elements x 2.21 B: 2 B of codes + 0.25 B of fp32 absmax per 4 codes for the
    # Linears, 2 B for the bf16 embedding and head, pooled over the partitioned values
    assert 5.5e8 * 2.2 < gathered < 5.5e8 * 2.25
