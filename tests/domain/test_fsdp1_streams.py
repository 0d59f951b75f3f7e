"""FSDP1's all-gather streams' cached blocks (`vram.sharding.fsdp1`), by hand.

Llama 2 7B (h 4096, ffn 11008, 32 layers, vocab 32,000, untied) in bf16 on 2 GPUs, FSDP1
FULL_SHARD: the root unit (embedding + head) all-gathered is 2 x 32,000 x 4,096 x 2 B; a block
is 4 x 4,096^2 + 3 x 4,096 x 11,008 weights and 2 norms (the final norm spread over the blocks,
as the norms group is), 2 B each. The unshard stream's pool holds the root and three blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vram import TrainingSetup, estimate, load_model
from vram.io.validate import report_lines, run_cases
from vram.result import Estimate

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "fsdp1_lora" / "configs"
ROOT_7B = 2 * 32_000 * 4_096 * 2
BLOCK_7B = (4 * 4_096 * 4_096 + 3 * 4_096 * 11_008) * 2 + (2 * 32 * 4_096 + 4_096) * 2 // 32
ROOT_70B = 2 * 32_000 * 8_192 * 2
#: One 70B block's weights: q and o 8,192^2, k and v 8,192 x 1,024, gate, up, down 8,192 x 28,672.
_MATRICES_70B = (8_192 * 8_192,) * 2 + (8_192 * 1_024,) * 2 + (8_192 * 28_672,) * 3


def _nf4_dq(numel: int) -> int:
    """Packed 4-bit codes, a uint8 absmax per 64 values, an fp32 scale per 256 absmax."""
    blocks = -(-numel // 64)
    return numel // 2 + blocks + 4 * -(-blocks // 256)


def _setup(**changes: object) -> TrainingSetup:
    base: dict[str, object] = {
        "method": "lora", "precision": "bf16-true", "n_gpus": 2, "sharding": "zero3",
        "fsdp_version": 1, "framework": "fsdp-qlora", "grad_ckpt": True, "seq_len": 512}
    return TrainingSetup.model_validate({**base, **changes})


def _items(result: Estimate) -> dict[str, int]:
    return {i.key: i.bytes for b in result.buckets for i in b.items}


def test_the_root_and_three_blocks_beyond_the_gathered_layers() -> None:
    """929 MB for the 7B: 524,288,000 + 3 x 404,766,976 - the two gathered layers counted."""
    result = estimate(load_model(str(CONFIGS / "llama-2-7b.json")), _setup())
    items = _items(result)
    assert (ROOT_7B, BLOCK_7B) == (524_288_000, 404_766_976)
    assert items["overhead.fsdp1_streams"] == ROOT_7B + 3 * BLOCK_7B - items["weights.gathered"]
    # in the reserved figure, apart from the allocator's slack; not in the allocated one
    assert result.reserved_peak_bytes - result.allocated_peak_bytes == (
        items["overhead.fsdp1_streams"] + items["overhead.allocator"])


def test_cpu_offload_adds_the_roots_shard_copy() -> None:
    """Llama 2 70B QLoRA, params on the CPU: the root's shard (1,048,576,000 / 2 B) is copied
    in on the pre-unshard stream; a block is its packed nf4-dq codes and scales."""
    setup = _setup(method="qlora", quant="nf4-dq", offload="params+optimizer", micro_batch=2,
                   seq_len=2048)
    items = _items(estimate(load_model(str(CONFIGS / "llama-2-70b.json")), setup))
    block = sum(_nf4_dq(n) for n in _MATRICES_70B) + (2 * 80 * 8_192 + 8_192) * 2 // 80
    assert block == 441_430_220
    assert items["overhead.fsdp1_streams"] == (
        ROOT_70B + 3 * block + ROOT_70B // 2 - items["weights.gathered"])


@pytest.mark.parametrize("changes", [
    {"fsdp_version": 2},  # fully_shard: its buffers are traced moment by moment (fsdp2)
    {"sharding_engine": "deepspeed", "fsdp_version": None},  # DeepSpeed's ZeRO-3
    {"n_gpus": 1, "sharding": "none"},
    {"sharding": "zero2"},  # SHARD_GRAD_OP: not modelled here
])
def test_only_fsdp1_full_shard_has_them(changes: dict[str, object]) -> None:
    result = estimate(load_model(str(CONFIGS / "llama-2-7b.json")), _setup(**changes))
    assert "overhead.fsdp1_streams" not in _items(result)


def test_validate_reads_the_fsdp1_lora_cases_as_recorded() -> None:
    """`vram validate benchmarks/fsdp1_lora/cases.csv` is its validation.txt (a lock)."""
    cases = CONFIGS.parent
    lines = report_lines(run_cases(cases / "cases.csv"))
    assert "\n".join(lines) + "\n" == (cases / "validation.txt").read_text(encoding="utf-8")


def test_frozen_weights_left_unsharded_already_fill_the_pool() -> None:
    """FSDP1 on PyTorch 2.1 keeps every frozen weight unsharded in backward (pytorch#95805,
    `weights.unsharded_frozen`, 13.5 GB for the 7B in bf16): the root and the blocks are among
    them, counted live; nothing more is cached."""
    setup = _setup(framework="litgpt", torch_version="2.1.0")
    items = _items(estimate(load_model(str(CONFIGS / "llama-2-7b.json")), setup))
    assert items["weights.unsharded_frozen"] > ROOT_7B + 3 * BLOCK_7B
    assert "overhead.fsdp1_streams" not in items
