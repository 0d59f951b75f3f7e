"""The activations of a whole step (`ActivationPlan`): every layer stack's, the head's,
checkpointing, offload and the previous step's, as the moments of the step read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memo import memoized, per_token_key
from vram.memory.activations.context import MoeBackward
from vram.memory.activations.kernel import (
    attention_kernel,
    mask_bytes_per_sequence,
)
from vram.memory.activations.layer import LayerActivations, layer_activations
from vram.memory.activations.lead import keeping_layers
from vram.memory.head import HeadActivations, head_activations
from vram.model.spec import LayerStack, ModelSpec
from vram.setup import Offload, TrainingSetup
from vram.setup.layout import rank_seq_len
from vram.stacks.precision import PrecisionPolicy
from vram.stacks.profile import StackProfile
from vram.units import FP32_BYTES as FP32


# Built on every estimate: not frozen (see `vram.step.draft.ItemDraft`).
@dataclass(slots=True)
class ActivationPlan:
    """Activation bytes for the whole micro-batch at the moments that can be the peak."""

    layers: list[LayerActivations]
    head: HeadActivations
    tokens: int
    checkpointed_bytes: int  # saved layer inputs under checkpointing
    stored_layers_bytes: int  # all layers' saved tensors (0 under checkpointing)
    recompute_bytes: int  # one layer recomputed in backward (checkpointing)
    layer_bytes_max: int  # the largest layer's saved tensors
    backward_transient_bytes: int
    #: The largest layer's forward working set beyond what it keeps (see LayerActivations).
    forward_transient_bytes: int
    #: The layer with the largest backward peaks in its attention, not its MLP.
    backward_peak_in_attention: bool
    #: The largest layer backward's transients in its MLP and in its attention (the first
    #: layer's backward is the larger of the two moments: `vram.step.moments`).
    backward_mlp_transient_bytes: int
    backward_attention_transient_bytes: int
    head_saved_bytes: int
    head_peak_bytes: int
    head_kept_bytes: int
    #: The final norm's backward at its largest (`vram.memory.head.final_norm_backward_per_token`).
    head_norm_backward_bytes: int
    head_cast_bytes: int
    offloaded_bytes: int
    #: The 4-D causal masks HF builds once per forward for eager/math attention (b × s × s).
    mask_bytes: int = 0
    #: What the previous step's graph still holds during this forward (LitGPT's loop).
    previous_step_bytes: int = 0
    #: An MoE model whose expert banks train: at a layer's gate/up bank gradient write, the
    #: layer's saved tensors already freed minus the activation gradients in flight (None
    #: without trained banks; see `MoeBackward`).
    moe_freed_minus_inflight_bytes: int | None = None
    moe_loop: bool = False
    #: An MoE model whose first layer is dense (DeepSeek's, ERNIE's, GLM-4.5's first layers):
    #: that layer's saved tensors and backward buffers, for the first layer's backward, where
    #: no expert bank is written (None: the first layer is like the largest).
    dense_first_layer: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class PlanPerToken:
    """What `plan` multiplies by the micro-batch's tokens (the masks: by its sequences). It
    depends on the setup but the batch size, of which only "one sequence or more" matters
    (`vram.memo.per_token_key`), so a sweep over batch sizes computes it once."""

    layers: list[LayerActivations]
    layer_max: int  # the largest layer's saved tensors
    backward_transient: int
    forward_transient: int
    backward_peak_in_attention: bool
    backward_mlp_transient: int
    backward_attention_transient: int
    checkpointed: int  # every layer's checkpointed input (0 without checkpointing)
    stored: int  # every layer's saved tensors (0 under checkpointing)
    previous_step: int
    moe: MoeBackward | None
    mask_per_sequence: int
    #: See `ActivationPlan.dense_first_layer`: that layer.
    dense_first_layer: LayerActivations | None = None
    #: Σ layers × what each keeps whatever the tokens (`LayerActivations.fixed_bytes`), with
    #: every layer's tensors kept (0 under checkpointing); and whether any layer has such.
    stored_fixed: int = 0
    any_fixed: bool = False


def selective_kept_per_token(model: ModelSpec, stack: LayerStack, setup: TrainingSetup,
                             profile: StackProfile, n: PrecisionPolicy) -> int:
    """Per token and layer, what selective (per-op) checkpointing keeps beside the block's
    input: the outputs of the 1st, 3rd, 5th, ... matmul of the block and the fused attention
    kernel's output and logsumexp (torchtitan/models/llama3/parallelize.py@dfb1a6ad9
    `_op_sac_save_list`; torchtitan/distributed/activation_checkpoint.py@dfb1a6ad9
    `_apply_op_sac`: "Save all compute/comm ops, except every second mm"). The eager
    softmax is not on the list: it is recomputed."""
    matmul_outputs = [linear.d_out * linear.copies * linear.token_fraction
                      for linear in stack.linears]
    kept = sum(width for index, width in enumerate(matmul_outputs) if index % 2 == 0)
    attention = 0
    if not attention_kernel(model, stack, setup, profile).explicit_scores:
        attention = n.compute * stack.n_heads * stack.head_dim + FP32 * stack.n_heads
    return int(n.compute * kept) + attention


def _plan_per_token(model: ModelSpec, setup: TrainingSetup,
                    profile: StackProfile) -> PlanPerToken:
    n = profile.precision
    every = [layer_activations(model, stack, setup, profile) for stack in model.stacks]
    # what keeps its saved set: not what runs before the first trainable tensor (`lead`)
    layers, first = keeping_layers(model, setup, profile, every)
    checkpointed = stored = 0
    if setup.grad_ckpt:
        # each layer's input: the residual stream, split by sequence parallel
        checkpointed = (sum(layer.count for layer in layers) * n.residual * model.hidden_size
                        // profile.seq_split)
        if setup.ckpt_selective:
            checkpointed += sum(
                stack.count * selective_kept_per_token(model, stack, setup, profile, n)
                for stack in model.stacks)
        if profile.checkpoint_keeps_ctx_attributes:
            checkpointed += sum(layer.count * layer.ctx_kept_per_token for layer in layers)
    else:
        stored = sum(layer.bytes_per_token * layer.count for layer in layers)
    any_fixed = any(layer.fixed_bytes for layer in layers)
    stored_fixed = 0 if setup.grad_ckpt else sum(layer.fixed_bytes * layer.count
                                                  for layer in layers)
    moe = next((layer.moe for layer in layers if layer.moe is not None), None)
    return PlanPerToken(
        dense_first_layer=first if moe is not None and first.moe is None else None,
        stored_fixed=stored_fixed, any_fixed=any_fixed,
        layers=layers, layer_max=max(layer.bytes_per_token for layer in layers),
        backward_transient=max(layer.backward_transient_per_token for layer in layers),
        forward_transient=max(layer.forward_transient_per_token for layer in every),
        backward_peak_in_attention=max(
            layers, key=lambda layer: layer.bytes_per_token + layer.backward_transient_per_token,
        ).backward_peak_in_attention,
        backward_mlp_transient=max(layer.backward_mlp_per_token for layer in layers),
        backward_attention_transient=max(
            layer.backward_attention_per_token for layer in layers),
        checkpointed=checkpointed, stored=stored,
        previous_step=_previous_step_bytes_per_token(model, setup, profile, layers),
        moe=moe,
        mask_per_sequence=mask_bytes_per_sequence(model, setup, profile, n))


def plan(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> ActivationPlan:
    """Activation memory of one micro-batch: the per-token figures (remembered per model for
    setups equal but for the batch size) times its tokens: on this GPU, `s / cp` of each
    sequence under context parallel (every layer's saved tensors and the loss are per token;
    what the attention kernel holds of the other ranks' keys and values is a transient:
    `vram.sharding.context_parallel`)."""
    tokens = setup.micro_batch * rank_seq_len(setup)
    key = per_token_key(setup)
    per = memoized(model, ("plan per token", *key),
                   lambda: _plan_per_token(model, setup, profile))
    # Liger's fused head sizes its chunks to the micro-batch; every other head is per token.
    head = memoized(model, ("head", *key, tokens if profile.fused_linear_loss else 0),
                    lambda: head_activations(logits_model(model, setup, profile), setup,
                                             profile))
    assert head.kept_per_token is not None  # head_activations always decides it
    per_layer_max = per.layer_max * tokens if not per.any_fixed else max(
        layer.bytes_for(tokens) for layer in per.layers)
    checkpointed = per.checkpointed * tokens
    stored = per.stored * tokens + per.stored_fixed
    recompute = per_layer_max if setup.grad_ckpt else 0
    offloaded = 0
    if setup.grad_ckpt and profile.offloads_checkpoints:
        offloaded, checkpointed = checkpointed, 0
    elif not setup.grad_ckpt and setup.offload is Offload.ACTIVATIONS:
        offloaded, stored = stored - per_layer_max, per_layer_max
    moe = per.moe
    dense_first = per.dense_first_layer
    return ActivationPlan(
        dense_first_layer=None if dense_first is None else (
            dense_first.bytes_for(tokens), dense_first.backward_transient_per_token * tokens),
        moe_freed_minus_inflight_bytes=None if moe is None
        else moe.freed_minus_inflight_per_token * tokens,
        moe_loop=moe is not None and moe.loop,
        mask_bytes=per.mask_per_sequence * setup.micro_batch,
        previous_step_bytes=per.previous_step * tokens,
        layers=per.layers, head=head, tokens=tokens, checkpointed_bytes=checkpointed,
        stored_layers_bytes=stored, recompute_bytes=recompute, layer_bytes_max=per_layer_max,
        backward_transient_bytes=per.backward_transient * tokens,
        head_saved_bytes=head.saved_per_token * tokens,
        forward_transient_bytes=per.forward_transient * tokens,
        backward_peak_in_attention=per.backward_peak_in_attention,
        backward_mlp_transient_bytes=per.backward_mlp_transient * tokens,
        backward_attention_transient_bytes=per.backward_attention_transient * tokens,
        head_kept_bytes=head.kept_per_token * tokens, head_cast_bytes=head.cast_per_token * tokens,
        head_peak_bytes=head.loss_peak_per_token * tokens, offloaded_bytes=offloaded,
        head_norm_backward_bytes=head.norm_backward_per_token * tokens,
    )


def logits_model(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> ModelSpec:
    """The model whose vocabulary the loss sees: a tensor-parallel rank's own shard of it
    (`vram.sharding.tensor_parallel.tp_local`), or all of it when the stack gathers the logits
    before the loss (Transformers' `colwise_gather_output`, torchtune's replicated output)."""
    if not profile.gathers_logits:
        return model
    return memoized(model, ("gathered logits", setup.tp), lambda: model.model_copy(
        update={"vocab_size": model.vocab_size * setup.tp}))


def _previous_step_bytes_per_token(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                         layers: list[LayerActivations]) -> int:
    """Per token: the bitsandbytes inputs the previous step's graph still holds while the next
    forward runs (LitGPT keeps `loss` bound until it is reassigned; backward releases saved
    tensors, not ctx attributes): every layer's MatMul4Bit inputs and the lm_head chunks'
    input. Reentrant checkpointing builds no forward graph, so it holds nothing."""
    if not profile.keeps_previous_graph or not profile.quantized_linear_keeps_input:
        return 0
    if not setup.longest_batch_repeats:
        return 0
    if setup.grad_ckpt and not profile.checkpoint_keeps_ctx_attributes:
        return 0
    kept = sum(layer.count * layer.ctx_kept_per_token for layer in layers)
    if profile.quantizes_head:
        kept += profile.precision.compute * model.hidden_size
    return kept
