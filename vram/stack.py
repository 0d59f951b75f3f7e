"""What each training stack really does, where stacks differ in ways that change memory.

The same setup costs different memory in Hugging Face Trainer + PEFT, LitGPT and torchtune,
because each makes its own choices about dtypes, tied heads, quantized layers and the loss.
Each choice here names the source it was read from.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.knob_rules import checkpoint_is_reentrant, fsdp_keeps_frozen_unsharded
from vram.setup import Framework, Method, Precision, Sharding, TrainingSetup


@dataclass(frozen=True, slots=True)
class StackProfile:
    """Stack behaviours that change bytes; derived from the setup, never typed by a user."""

    #: LitGPT always builds a separate lm_head, copying the tied embedding into it
    #: (litgpt/model.py GPT.__init__; scripts/convert_hf_checkpoint.py).
    unties_head: bool
    #: LitGPT's BitsandbytesPrecision swaps every nn.Linear for Linear4bit, lm_head included
    #: (lightning/fabric/plugins/precision/bitsandbytes.py); HF and torchtune keep it 16-bit.
    quantizes_head: bool
    #: peft.prepare_model_for_kbit_training casts every non-quantized parameter to fp32
    #: (peft/utils/other.py); TRL skips it for sharded QLoRA (trl/trainer/sft_trainer.py).
    upcasts_frozen_to_fp32: bool
    #: Bytes per LoRA adapter parameter. PEFT upcasts adapters to fp32 by default
    #: (get_peft_model(autocast_adapter_dtype=True)); LitGPT and torchtune keep the model dtype.
    adapter_bytes: int
    #: HF computes the loss on `logits.float()` (transformers/loss/loss_utils.py ForCausalLMLoss).
    upcasts_logits: bool
    #: The loss is computed in chunks (LitGPT fine-tuning: lm_head_chunk_size=128 +
    #: chunked_cross_entropy; torchtune CEWithChunkedOutputLoss).
    chunked_loss: bool
    #: The optimizer step allocates no full-size temporaries: fused kernels
    #: (torch.optim.AdamW(fused=True): torchtune's recipes, HF Trainer's default
    #: `adamw_torch_fused` on recent PyTorch) or a per-parameter loop (HF's old `adamw_hf`).
    #: Plain torch.optim.AdamW on CUDA takes the foreach path, whose sqrt(v) is a full copy
    #: (LitGPT's fine-tuning scripts, hand-written loops).
    fused_optimizer: bool
    #: The key/value heads are expanded to all query heads before attention (a copy).
    expands_kv: bool
    #: Norms upcast their input to fp32 and keep that copy for backward (HF and LitGPT RMSNorm).
    norm_keeps_fp32_input: bool
    #: LoRA on a fused qkv adapts the selected slices (LitGPT LoRAQKVLinear) rather than the
    #: whole fused module (PEFT can only target whole modules).
    adapts_fused_slices: bool
    #: bitsandbytes' MatMul4Bit keeps its input for backward (`ctx.tensors = (A, B)` in
    #: bitsandbytes/autograd/_functions.py) although only B is needed; torchao's NF4 linear
    #: (torchtune) keeps only the weight.
    quantized_linear_keeps_input: bool
    #: LitGPT's RMSNorm multiplies by `weight.float()`, so a trained norm keeps its normalized
    #: input in fp32 (litgpt/model.py RMSNorm.forward).
    norm_keeps_fp32_normalized: bool
    #: FSDP1 in PyTorch <= 2.1 kept frozen parameters unsharded through the whole backward
    #: (pytorch/pytorch#95805; fixed by #101982): LitGPT's published FSDP LoRA peaks show it.
    fsdp_keeps_frozen_unsharded: bool
    #: The stack's MLP activation is a fused kernel whatever the config says (LitGPT calls
    #: F.gelu(approximate=...) and F.silu), rather than Transformers' Python formulas.
    fused_activations: bool
    #: torch.compile fuses pointwise ops and recomputes them in backward (min-cut partitioner).
    compiled: bool
    #: Checkpointing is non-reentrant (Transformers 5 passes use_reentrant=False; LitGPT and
    #: torchtune use non-reentrant wrappers): tensors an autograd Function keeps as ctx
    #: attributes (bitsandbytes' inputs) stay alive for every layer. PEFT's recipes for sharded
    #: QLoRA (DeepSpeed ZeRO-3, FSDP: docs/source/accelerate/{deepspeed,fsdp}.md) pass
    #: use_reentrant=True, whose checkpointed forward keeps no graph at all.
    checkpoint_keeps_ctx_attributes: bool
    #: The output logits stay referenced by the training loop through backward (LitGPT keeps
    #: `logits`; HF Trainer and torchtune drop them before backward).
    keeps_logits: bool
    #: LitGPT's fine-tuning loop keeps `logits` and `loss` bound from one iteration to the next
    #: (litgpt/finetune/lora.py fit()), so the previous step's autograd graph lives through the
    #: next forward and loss. Backward frees its saved tensors but not what an autograd
    #: Function holds as ctx attributes: bitsandbytes' MatMul4Bit inputs survive a step.
    keeps_previous_graph: bool
    #: Lightning's BitsandbytesPrecision quantizes from an fp16 copy
    #: (`weight.to(dtype=torch.half)`), so bitsandbytes dequantizes to fp16 and casts to the
    #: compute dtype: two full copies of the weight while a matmul starts.
    dequantizes_via_fp16: bool
    #: Lightning Fabric casts a module's floating outputs to the default dtype (fp32) in
    #: `_FabricModule.forward` (precision plugin `convert_output`): LitGPT's logits are fp32.
    casts_output_to_fp32: bool


def runs_transformers_code(profile: StackProfile) -> bool:
    """Whether the model code is Transformers' own (HF Trainer, PEFT, accelerate) rather than
    LitGPT's or torchtune's reimplementation: attention dispatch and masks follow it."""
    return not (profile.adapts_fused_slices or profile.fused_activations)


def profile_for(setup: TrainingSetup) -> StackProfile:
    """The stack profile of a setup."""
    framework = setup.framework
    litgpt = framework is Framework.LITGPT
    torchtune = framework is Framework.TORCHTUNE
    hf_like = not (litgpt or torchtune)
    qlora = setup.method is Method.QLORA
    sharded_qlora = qlora and setup.sharding is Sharding.ZERO3
    adapter_bytes = 4 if hf_like or setup.precision is not Precision.BF16_TRUE else 2
    zero_mixed = setup.sharding in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3) and (
        setup.precision in (Precision.BF16_MIXED, Precision.FP16_MIXED))
    if zero_mixed:
        adapter_bytes = 2  # the engine casts the whole model, adapters included
    if setup.precision is Precision.FP32:
        adapter_bytes = 4
    return StackProfile(
        unties_head=litgpt,
        quantizes_head=litgpt and qlora,
        upcasts_frozen_to_fp32=hf_like and qlora and not sharded_qlora,
        adapter_bytes=adapter_bytes,
        upcasts_logits=not litgpt,
        chunked_loss=setup.effective_loss.value == "chunked",
        fused_optimizer=torchtune or framework is Framework.HF_TRAINER,
        expands_kv=litgpt,
        norm_keeps_fp32_input=True,
        adapts_fused_slices=litgpt,
        keeps_logits=litgpt,
        keeps_previous_graph=litgpt,
        casts_output_to_fp32=litgpt,
        dequantizes_via_fp16=litgpt and qlora and setup.precision is not Precision.FP16_MIXED,
        checkpoint_keeps_ctx_attributes=not checkpoint_is_reentrant(setup),
        norm_keeps_fp32_normalized=litgpt,
        fsdp_keeps_frozen_unsharded=fsdp_keeps_frozen_unsharded(setup),
        compiled=setup.effective_compile,
        fused_activations=litgpt or torchtune,
        quantized_linear_keeps_input=qlora and not torchtune,
    )
