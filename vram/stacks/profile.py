"""A stack's row applied to one setup: the behaviours the physics reads (`StackProfile`).

`profile_for` is the one place where a row meets a setup: a few behaviours apply only to
QLoRA, or to a sharded QLoRA base, or follow the precision recipe; every knob that defers to
the stack is read resolved (`vram.stacks.resolve`). A profile depends on no batch shape: the
estimate keeps one per structure of setup.

    >>> profile_for(TrainingSetup(method="qlora", framework="litgpt")).quantizes_head
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.setup import Experts, Loss, Method, TrainingSetup
from vram.stacks.precision import PrecisionPolicy, precision_policy
from vram.stacks.resolve import resolve
from vram.stacks.table import stack_row
from vram.units import Dtype


@dataclass(frozen=True, slots=True)
class StackProfile:
    """A stack's behaviours for one setup: what the estimate reads (see `StackRow`)."""

    unties_head: bool
    quantizes_head: bool
    #: QLoRA runs `prepare_model_for_kbit_training` (an fp32 upcast of the non-quantized
    #: parameters, and a stack may cast some back: `kbit_recasts_16bit`).
    kbit_prepared: bool
    #: ... and the embedding, norms and head stay fp32 after it.
    upcasts_frozen_to_fp32: bool
    #: Bytes of the LoRA branch's input (the adapter dtype as it computes).
    adapter_bytes: int
    upcasts_logits: bool
    chunked_loss: bool
    #: The loss fuses the head and cross-entropy per chunk of tokens (Liger): see
    #: `vram.memory.head._fused_linear_head`.
    fused_linear_loss: bool
    #: That fused loss is Cut Cross-Entropy (`vram.memory.head._cce_head`), not Liger's.
    fused_loss_is_cce: bool
    fused_optimizer: bool
    expands_kv: bool
    norm_keeps_fp32_input: bool
    adapts_fused_slices: bool
    quantized_linear_keeps_input: bool
    norm_keeps_fp32_normalized: bool
    fsdp_keeps_frozen_unsharded: bool
    fused_activations: bool
    #: torch.compile of the model: the layers' saved set (`compile`).
    compiled: bool
    #: torch.compile of the loss: the logits and cross-entropy (`compile_loss`).
    compiled_loss: bool
    #: Checkpointing is non-reentrant: tensors an autograd Function keeps as ctx attributes
    #: (bitsandbytes' inputs) stay alive for every layer; reentrant checkpointing's forward
    #: keeps no graph at all.
    checkpoint_keeps_ctx_attributes: bool
    #: Checkpointed layer inputs live in CPU memory (`ckpt_offload`).
    offloads_checkpoints: bool
    #: QLoRA quantizes MoE expert banks (see `StackRow.quantizes_expert_banks`).
    quantizes_expert_banks: bool
    #: 'all-linear' reaches PEFT as module names (see `StackRow.all_linear_by_module_name`).
    all_linear_by_module_name: bool
    keeps_logits: bool
    keeps_previous_graph: bool
    #: A VLM's language model fills a KV cache in the forward (see `StackRow`).
    leaves_text_cache_on: bool
    #: bitsandbytes dequantizes to fp16 and casts to the compute dtype: two full copies.
    dequantizes_via_fp16: bool
    casts_output_to_fp32: bool
    #: The stack scales images into the pixel bounds before the processor (`StackRow`).
    resizes_images_before_processor: bool
    #: Hybrid layers run fla's / mamba_ssm's / causal-conv1d's kernels, not transformers'
    #: PyTorch fallback (`mixer_kernels`).
    mixer_kernels: bool
    #: The layers' input (the embedding's output) requires grad: a full fine-tune trains the
    #: embedding; under LoRA/QLoRA only where the stack calls `enable_input_require_grads`
    #: (`StackRow.input_grad_only_with_ckpt`). False: what runs before the first trainable
    #: tensor keeps nothing (`vram.memory.activations.lead`).
    input_requires_grad: bool
    #: The dtype of each kind of tensor in this run.
    precision: PrecisionPolicy
    #: FSDP2 (`fully_shard`) shards the run (see `vram.sharding.fsdp2`).
    fsdp2: bool
    #: Sequence parallel splits the hidden-wide activations (norms, dropouts, the residual
    #: stream) over this many tensor-parallel ranks (1: none, or no tensor parallel).
    seq_split: int = 1
    #: Tensor parallel with the logits split by vocabulary into the loss (`loss_parallel`).
    loss_parallel: bool = False
    #: Tensor parallel with the logits gathered whole before the loss.
    gathers_logits: bool = False


def runs_transformers_code(profile: StackProfile) -> bool:
    """Whether the model code is Transformers' own (HF Trainer, PEFT, accelerate) rather than
    LitGPT's or torchtune's reimplementation: attention dispatch and masks follow it."""
    return not (profile.adapts_fused_slices or profile.fused_activations)


def runs_grouped_experts(setup: TrainingSetup, profile: StackProfile) -> bool:
    """Transformers' MoE experts run `grouped_mm` (its default in any dtype: the knob
    `experts_implementation`; transformers/modeling_utils.py@v5.24.0
    `get_correct_experts_implementation`): each 3-D bank is one matmul in the bank's own dtype,
    which autocast does not cast (transformers/integrations/moe.py@v5.24.0 `_grouped_mm`)."""
    return runs_transformers_code(profile) and setup.experts_implementation is Experts.GROUPED_MM


def profile_for(setup: TrainingSetup) -> StackProfile:
    """The stack's row applied to `setup`: the one place where behaviours depend on the
    method, the sharding or the precision."""
    row = stack_row(setup.framework)
    resolved = resolve(setup)
    run = resolved.run
    qlora = setup.method is Method.QLORA
    prepared = row.kbit_upcast and qlora and (row.kbit_upcast_sharded
                                              or not resolved.sharded_qlora)
    upcasts = prepared and not row.kbit_recasts_16bit
    precision = precision_policy(run, fp32_adapters=row.fp32_adapters, upcasts_frozen=upcasts,
                                 deepspeed_engine=resolved.deepspeed,
                                 torch_autocast=bool(run.torch_autocast),
                                 fsdp2=resolved.fsdp2)
    return StackProfile(
        unties_head=row.unties_head,
        quantizes_head=row.quantizes_head and qlora,
        kbit_prepared=prepared,
        upcasts_frozen_to_fp32=upcasts,
        adapter_bytes=precision.adapter_inputs,
        upcasts_logits=row.upcasts_logits,
        chunked_loss=run.loss is Loss.CHUNKED and not row.chunked_loss_fuses_head,
        fused_linear_loss=run.loss is Loss.FUSED_LINEAR or (
            run.loss is Loss.CHUNKED and row.chunked_loss_fuses_head),
        fused_loss_is_cce=row.fused_loss_is_cce,
        fused_optimizer=row.fused_optimizer,
        expands_kv=row.expands_kv,
        norm_keeps_fp32_input=row.norm_keeps_fp32_input,
        adapts_fused_slices=row.adapts_fused_slices,
        quantized_linear_keeps_input=(row.quantized_linear_keeps_input and qlora
                                      and resolved.bnb_keeps_matmul_input),
        norm_keeps_fp32_normalized=row.norm_keeps_fp32_normalized,
        fsdp_keeps_frozen_unsharded=resolved.fsdp1_keeps_frozen_unsharded,
        fused_activations=row.fused_activations,
        compiled=bool(run.compile),
        compiled_loss=bool(run.compile_loss),
        checkpoint_keeps_ctx_attributes=not run.ckpt_reentrant,
        offloads_checkpoints=bool(run.ckpt_offload),
        mixer_kernels=bool(run.mixer_kernels),
        quantizes_expert_banks=row.quantizes_expert_banks,
        all_linear_by_module_name=row.all_linear_by_module_name,
        keeps_logits=row.keeps_logits,
        leaves_text_cache_on=row.leaves_text_cache_on,
        keeps_previous_graph=row.keeps_previous_graph,
        # Quantized from fp16, an fp16 compute dtype needs no second copy.
        dequantizes_via_fp16=(row.quantizes_from_fp16 and qlora
                              and precision.sixteen_bit is not Dtype.FP16),
        casts_output_to_fp32=row.casts_output_to_fp32,
        resizes_images_before_processor=row.resizes_images_before_processor,
        input_requires_grad=(not setup.trains_adapters or setup.grad_ckpt
                             or not row.input_grad_only_with_ckpt),
        precision=precision,
        fsdp2=resolved.fsdp2,
        seq_split=setup.tp if setup.tp > 1 and run.sequence_parallel else 1,
        loss_parallel=setup.tp > 1 and row.loss_parallel,
        gathers_logits=setup.tp > 1 and not row.loss_parallel,
    )
