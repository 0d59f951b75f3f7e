"""What FSDP2 holds unsharded around the end of the forward (vram.sharding.fsdp2), read in PyTorch
2.13.0 and measured by the sharded trace: the last block's all-gather buffer lives through the
head and the loss (inside the root's forward) and is freed by the root's post-forward
(torch/distributed/fsdp/_fully_shard/_fsdp_state.py@v2.13.0 _post_forward #L333-L342)."""

from __future__ import annotations

import pytest

from vram import TrainingSetup, estimate, load_model
from vram.result import LineItem
from vram.sharding.fsdp2 import (
    Fsdp2Units,
    after_forward,
    below_top_block_backward,
    first_block_backward,
    forward_end,
    loss_backward,
    second_block_backward,
    top_block_backward,
)

ROOT, BLOCK, GRADS, HEAD, LAYERS = 1_000, 100, 60, 10, 4


def _units(*, reshards: bool) -> Fsdp2Units:
    return Fsdp2Units(block_params=BLOCK, block_grads=GRADS, block_reduce=2 * GRADS,
                      root_params=ROOT, head_grad=HEAD, n_layers=LAYERS, reshards=reshards)


def _total(items: list[LineItem]) -> int:
    return sum(item.bytes for item in items)


@pytest.mark.parametrize("reshards", [True, False])
def test_the_last_blocks_buffer_lives_to_the_roots_post_forward(reshards: bool) -> None:
    u = _units(reshards=reshards)
    kept = 0 if reshards else LAYERS * BLOCK
    assert _total(forward_end(u)) == ROOT + BLOCK + kept  # the head and the loss's forward
    assert _total(after_forward(u)) == ROOT + kept  # an output cast after the root returned


def test_without_resharding_backward_holds_every_block_and_no_buffer() -> None:
    """The head's gradient waits unsharded from the head's backward on, not at the loss's
    (the logits' gradient is at its largest before the head's backward runs)."""
    u = _units(reshards=False)
    assert _total(loss_backward(u)) == ROOT + LAYERS * BLOCK
    assert _total(top_block_backward(u)) == ROOT + LAYERS * BLOCK + HEAD + GRADS
    assert _total(loss_backward(_units(reshards=True))) == ROOT + BLOCK  # the top's prefetch


def test_mistral_loss_backward_holds_one_block_less_than_the_forward_end() -> None:
    """Mistral 7B over 4 ranks, bf16, blocks kept gathered: at the end of the forward 32 blocks
    and the last one's all-gather buffer beside the root, at the loss's backward 32 (the trace:
    14,255.3 MiB gathered in `forward / ... / last:after`, 13,838.5 at `backward / head`; the
    buffer is `uint8[437075968]`: 218,112,000 bf16 parameters and 212,992 fp32 LoRA ones)."""
    setup = TrainingSetup(framework="hf-trainer", sharding="zero3", fsdp_version=2, n_gpus=4,
                          fsdp_reshard_after_forward=False, precision="bf16-true",
                          method="lora", lora_targets="q_proj,v_proj", lora_rank=16,
                          lora_base_16bit=False, grad_ckpt=True, micro_batch=2, seq_len=1024)
    moments = {m.label: m for m in estimate(load_model("mistral-7b-v0.1"), setup).moments}
    # The closed form's block is 256 bytes larger than the traced buffer: the final norm
    # (4,096 bf16) is counted with the blocks' norms, spread over the 32 blocks.
    buffer = 437_075_968 + 2 * 4096 // 32  # the frozen head has no gradient waiting
    assert moments["end of forward"].in_flight_bytes - moments["the loss"].in_flight_bytes \
        == buffer


def _mlp_transient(method: str, **fields: object) -> int:
    """One layer's backward peak above its saved tensors (Mistral 7B, 1 × 1,024 tokens, bf16)."""
    from vram.memory import activations as act
    from vram.stacks.profile import profile_for

    setup = TrainingSetup(method=method, precision="bf16-true", micro_batch=1, seq_len=1024,
                          lora_targets="q_proj,v_proj", **fields)  # type: ignore[arg-type]
    return act.plan(load_model("mistral-7b-v0.1"), setup, profile_for(setup)) \
        .backward_transient_bytes


def test_a_gated_mlp_whose_down_projection_saved_nothing_backs_up_three_wide_tensors() -> None:
    """At `act(gate) · up`'s backward the product's gradient and both inputs' gradients are
    alive (the sharded trace of a LoRA block: 3 × [1024, 14336] beside gate, act and up). A
    trained down projection saved the product, released just before: two more than saved."""
    wide = 2 * 14_336 * 1024  # one [tokens, I] bf16 tensor
    assert _mlp_transient("lora") == 3 * wide
    assert _mlp_transient("full") == 2 * wide


@pytest.mark.parametrize("reshards", [True, False])
def test_the_blocks_between_hold_the_next_one_down_and_a_reduce_buffer(reshards: bool) -> None:
    """The second block's backward has the first block beside it (prefetched, or kept), which
    the first's has not; the block below the top has the top's reduce-scatter buffer, which
    the top's has not (and without resharding the top block is resharded by then)."""
    u = _units(reshards=reshards)
    reduce_buffer = 2 * GRADS
    assert _total(second_block_backward(u)) == _total(first_block_backward(u)) + BLOCK
    below_top = _total(top_block_backward(u)) + reduce_buffer - (0 if reshards else BLOCK)
    assert _total(below_top_block_backward(u)) == below_top


def test_mistral_second_layer_moment_is_the_first_with_one_more_block_and_layer() -> None:
    """Mistral 7B over 2 ranks, bf16, resharding, no checkpointing: the second block's backward
    holds the first block's parameters (436,224,000 bytes in bf16, and the final norm's share)
    and its saved tensors more, and the second block's own sharded gradients less."""
    setup = TrainingSetup(framework="hf-trainer", sharding="zero3", fsdp_version=2, n_gpus=2,
                          fsdp_reshard_after_forward=True, precision="bf16-true",
                          method="full", grad_ckpt=False, micro_batch=1, seq_len=1024)
    result = estimate(load_model("mistral-7b-v0.1"), setup)
    moments = {m.label: m for m in result.moments}
    first, second = moments["the first layer's backward"], moments["the second layer's backward"]
    assert second.in_flight_bytes - first.in_flight_bytes == 436_224_000 + 2 * 4096 // 32
    assert first.gradient_bytes - second.gradient_bytes == 436_224_000 // 2 + 2 * 4096 // 32 // 2
    # the first layer's saved tensors at 1,024 tokens (norms, linear inputs, attention, MLP)
    assert second.activation_bytes - first.activation_bytes == 205_651_968
