"""The loss's idle blocks in the reserved figure (`overhead.idle_loss_bytes`, issue 21 item 6).

Golden values from `benchmarks/reserved_full_replay.txt` (Llama-3.1-8B full fine-tunes traced at
full depth and replayed through the allocator model) and the H200 3B step.
"""

from __future__ import annotations

import vram
from vram.memory.overhead import IDLE_LOSS_BLOCKS, idle_loss_bytes
from vram.units import MIB


def _estimate(model: str, **fields: object) -> vram.Estimate:
    setup = vram.TrainingSetup.model_validate(
        {"method": "full", "framework": "hf-trainer", "grad_ckpt": True, **fields})
    return vram.estimate(vram.load_model(model), setup)


def _idle_item_bytes(est: vram.Estimate) -> int:
    return sum(i.bytes for i in est.bucket("overhead").items if i.key == "overhead.idle_loss")


def test_the_term_is_two_blocks_only_past_its_three_conditions() -> None:
    block, largest, state = 8016 * MIB, 1002 * MIB, 30633 * MIB
    assert idle_loss_bytes(block, largest, state, True) == IDLE_LOSS_BLOCKS * block == 16032 * MIB
    assert idle_loss_bytes(block, largest, state, False) == 0  # no checkpointing
    assert idle_loss_bytes(block, block, state, True) == 0  # a parameter block as large
    assert idle_loss_bytes(block, largest, 2 * block - 1, True) == 0  # a state too small


def test_llama_8b_at_16k_tokens_reserves_what_the_replay_reserves() -> None:
    """bf16-true, fused AdamW, 4 x 4096 tokens: the replay reserves 89,614 MiB; the fitted
    slack alone gave 82,575 (-7.9 %), the two idle fp32 logits blocks give 90,637 (+1.1 %)."""
    est = _estimate("llama-3.1-8b", precision="bf16-true", optimizer="adamw",
                    micro_batch=4, seq_len=4096)
    assert est.reserved_peak_bytes // MIB == 90637
    assert est.reserved_peak_bytes == est.allocated_peak_bytes + 2 * 4 * 4096 * 128256 * 4
    replayed = 89614 * MIB
    assert abs(est.reserved_peak_bytes / replayed - 1) < 0.02
    # the overhead bucket still sums to device - allocated
    overhead = est.bucket("overhead").bytes
    assert est.device_peak_bytes == est.allocated_peak_bytes + overhead
    assert _idle_item_bytes(est) == est.reserved_peak_bytes - est.allocated_peak_bytes - next(
        i.bytes for i in est.bucket("overhead").items if i.key == "overhead.allocator")


def test_the_h200_3b_step_and_the_rows_it_leaves_alone() -> None:
    """Llama-3.2-3B bf16-true at 4096 tokens (measured 30,814 MiB reserved): two 2,004 MiB
    blocks over the allocated peak. Not for a 1B step whose logits block (1,002 MiB) is the
    embedding's fp32 gradient's size, nor without checkpointing, nor for LoRA (a small state)."""
    est = _estimate("llama-3.2-3b", precision="bf16-true", optimizer="adamw", seq_len=4096)
    assert est.reserved_peak_bytes - est.allocated_peak_bytes == 2 * 4096 * 128256 * 4
    assert _idle_item_bytes(_estimate("llama-3.2-1b", precision="bf16-mixed", micro_batch=4,
                                      seq_len=512)) == 0
    assert _idle_item_bytes(_estimate("llama-3.1-8b", precision="bf16-true", micro_batch=4,
                                      seq_len=4096, grad_ckpt=False)) == 0
    assert _idle_item_bytes(_estimate("llama-3.1-8b", method="lora", precision="bf16-true",
                                      micro_batch=4, seq_len=4096)) == 0


def test_only_the_pipeline_stage_that_runs_the_loss_holds_its_blocks() -> None:
    """Llama-3.1-8B bf16-mixed, 4 x 4096 tokens, 2 pipeline stages: the last stage (the head
    and the loss) gets the idle blocks; the first, whose stage model has no loss, none."""
    from vram.sharding.pipeline import stage_model, stage_plans
    from vram.step.estimate import _rank_peak

    model = vram.load_model("llama-3.1-8b")
    setup = vram.TrainingSetup(method="full", precision="bf16-mixed", micro_batch=4,
                               seq_len=4096, grad_ckpt=True, n_gpus=2, pp=2,
                               framework="torchtitan")
    first, last = stage_plans(setup, model.n_layers)
    assert (first.last, last.last) == (False, True)
    assert _rank_peak(stage_model(model, last), setup, None, last).idle_loss > 0
    step = _rank_peak(stage_model(model, first), setup, None, first)
    assert (step.idle_loss, step.loss_block) == (0, 0)
