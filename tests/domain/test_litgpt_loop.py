"""LitGPT-specific memory, each pinned to what LitGPT's own code keeps.

The figures were found by tracing LitGPT's model and training loop (litgpt 0.4.0 / 0.5.3,
`litgpt/lora.py`, `litgpt/finetune/lora.py`) on fake tensors, and they close the gap to
LitGPT's published QLoRA peaks (benchmarks/ACCURACY.md).
"""

from __future__ import annotations

from vram import TrainingSetup, estimate, load_model
from vram.memory.activations import layer_activations, plan
from vram.memory.weights import Stage, working_items
from vram.model.params import param_groups
from vram.sharding.shards import shards_of
from vram.stacks.profile import profile_for

LLAMA3_8B = "meta-llama-3-8b"


def _litgpt(**kw: object) -> TrainingSetup:
    base: dict[str, object] = {
        "framework": "litgpt", "method": "qlora", "quant": "nf4", "optimizer": "paged-adamw",
        "precision": "bf16-true", "lora_rank": 32, "lora_targets": "q_proj,v_proj",
        "micro_batch": 2, "seq_len": 512}
    base.update(kw)
    return TrainingSetup(**base)  # type: ignore[arg-type]


def _item(result: object, key: str) -> int:
    for bucket in result.buckets:  # type: ignore[attr-defined]
        for item in bucket.items:
            if item.key == key:
                return int(item.bytes)
    raise KeyError(key)


def test_previous_step_keeps_every_matmul4bit_input() -> None:
    """`logits` and `loss` stay bound into the next iteration, so the previous graph lives
    through the next forward; backward freed its saved tensors but not bitsandbytes'
    `ctx.tensors`. Llama-3-8B, 2 × 512 tokens: per layer the inputs of qkv (h), o (q_out),
    gate/up (h) and down (I), plus ln_f's output read by the quantized lm_head chunks."""
    spec = load_model(LLAMA3_8B)
    setup = _litgpt()
    tokens = 2 * 512
    per_layer = 2 * (4096 + 4096 + 4096 + 14336)
    expected = tokens * (32 * per_layer + 2 * 4096)
    assert plan(spec, setup, profile_for(setup)).previous_step_bytes == expected
    result = estimate(spec, setup)
    assert _item(result, "activations.previous_step") == expected
    assert result.phase.value == "forward"


def test_previous_step_is_litgpt_and_bitsandbytes_only() -> None:
    spec = load_model(LLAMA3_8B)
    for setup in (_litgpt(method="lora", quant="none", optimizer="adamw"),
                  _litgpt(framework="hf-trainer"), _litgpt(framework="torchtune")):
        assert plan(spec, setup, profile_for(setup)).previous_step_bytes == 0


def test_lightning_dequantizes_through_fp16() -> None:
    """Lightning quantizes `weight.to(torch.half)`, so bitsandbytes dequantizes to fp16 and
    casts to bf16: both copies of the largest matrix (LitGPT's NF4 lm_head) coexist."""
    spec = load_model(LLAMA3_8B)
    head = 128256 * 4096
    assert _item(estimate(spec, _litgpt()), "activations.dequant") == 4 * head
    hf = TrainingSetup(method="qlora", quant="nf4", precision="bf16-mixed")
    biggest = 14336 * 4096  # HF keeps the head in 16 bits: the MLP matrices are the largest
    profile = profile_for(hf)
    groups = param_groups(spec, hf, profile)

    def dequant(stage: Stage) -> int:
        items = working_items(spec, hf, profile, groups, shards_of(hf), stage)
        return sum(i.bytes for i in items if i.key == "activations.dequant")

    assert dequant(Stage.TOP_LAYER) == dequant(Stage.LAYERS_FORWARD) == 2 * biggest
    # from the end of the forward through the loss no quantized Linear runs (the trace)
    assert dequant(Stage.FORWARD) == dequant(Stage.LOSS) == 0


def test_zero_pad_keeps_lora_b_output_for_a_subset_of_qkv() -> None:
    """LoRAQKVLinear scatters B's output (q and v slices: 4096 + 1024 wide) into the fused
    width with `index_copy_`, which keeps it for backward; with q, k and v all adapted
    `zero_pad` returns early and keeps nothing."""
    spec = load_model(LLAMA3_8B)
    stack = spec.stacks[0]

    def lora_term(targets: str) -> int:
        setup = _litgpt(method="lora", quant="none", optimizer="adamw", lora_targets=targets)
        layer = layer_activations(spec, stack, setup, profile_for(setup))
        return next(t.bytes_per_token for t in layer.terms if t.key == "lora")

    qv, qkv = lora_term("q_proj,v_proj"), lora_term("q_proj,k_proj,v_proj")
    # Same dropout, mask and x·A for both (one fused LoRA); k adds r more values of A's output.
    assert qv - qkv == 2 * (4096 + 1024) - 2 * 32


def test_a_single_longest_batch_has_no_previous_step_to_keep() -> None:
    """lit-gpt's 2023 scripts put the longest sample in the first step only: nothing of an
    equally long previous step is alive then (no MatMul4Bit inputs, no fp32 logits)."""
    spec = load_model(LLAMA3_8B)
    repeats, single = _litgpt(), _litgpt(longest_batch_repeats=False)
    assert plan(spec, single, profile_for(single)).previous_step_bytes == 0
    tokens, vocab = 2 * 512, 128256
    head_repeats = plan(spec, repeats, profile_for(repeats)).head_saved_bytes
    head_single = plan(spec, single, profile_for(single)).head_saved_bytes
    assert head_repeats - head_single == 4 * vocab * tokens  # the previous fp32 logits


def test_fabric_casts_the_logits_to_fp32() -> None:
    """`_FabricModule.forward` runs `convert_output` (default dtype, fp32): the loss holds the
    fp32 logits, their fp32 log-softmax and one 128-token chunk's two fp32 gradients."""
    spec = load_model(LLAMA3_8B)
    setup = _litgpt(method="lora", quant="none", optimizer="adamw", micro_batch=1)
    head = plan(spec, setup, profile_for(setup)).head
    vocab = 128256
    norm = 4 * 4096  # RMSNorm's fp32 input
    assert head.loss_peak_per_token == norm + 2 * 4 * vocab + int(2 * 4 * vocab * 128 / 512)
    assert head.cast_per_token == norm + 4 * vocab + 2 * vocab + 4 * vocab
