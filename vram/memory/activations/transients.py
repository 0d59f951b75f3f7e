"""A layer's working sets beyond what it keeps: the forward's attention scores, the
backward's gradient buffers, and an MoE layer's backward at its expert bank's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memory.activations.context import LayerContext, MoeBackward
from vram.memory.activations.kernel import (
    Kernel,
)
from vram.memory.activations.terms import (
    AttentionLayout,
    activation_in_fp32,
    expert_bytes,
    experts_run_grouped,
)
from vram.model.spec import MlpKind
from vram.units import FP32_BYTES as FP32


def forward_working_set_per_token(c: LayerContext, a: AttentionLayout) -> int:
    """What a layer's forward holds beyond what it keeps, at its largest: the attention's
    scores (`_attention_working_set`), a hybrid mixer's kernel workspace or, under expert
    parallel, the dispatch's buffer."""
    return max(_attention_working_set(c, a), mixer_workspace_per_token(c, backward=False),
               ep_dispatch_per_token(c))


def mixer_workspace_per_token(c: LayerContext, *, backward: bool) -> int:
    """A linear-attention or Mamba-2 mixer's fused kernel: its chunk states and the other
    tensors it allocates while it runs, beyond what it saves (`LayerStack.mixer_workspace`,
    read from fla's and mamba_ssm's source: `vram.model.families.workspace`). Without the
    kernels (`mixer_kernels` False), what transformers' PyTorch fallback's backward allocates
    (`MixerSaved.forward_fp32`, `backward_fp32`: Mamba-2's `segment_sum`, Jamba's loop)."""
    if not c.profile.mixer_kernels:
        fallback = c.stack.mixer_fallback
        return FP32 * (fallback.backward_fp32 if backward else fallback.forward_fp32)
    fwd, fwd_fp32, bwd, bwd_fp32 = c.stack.mixer_workspace
    return c.e * bwd + FP32 * bwd_fp32 if backward else c.e * fwd + FP32 * fwd_fp32


def ep_dispatch_per_token(c: LayerContext) -> int:
    """Expert parallel: the all-to-all's receive buffer, the rows routed to this rank's
    experts (top-k × capacity factor per token, hidden-wide), alive while `_permute` copies
    it into expert order (torchtitan/distributed/expert_parallel.py@03a1384
    `ExpertParallel._token_dispatch`: `all_to_all_single_autograd`, then `_permute`; the
    combine's `_unpermute` and all-to-all mirror it on the way back)."""
    if c.setup.ep == 1 or not c.stack.n_experts:
        return 0
    return int(c.e * c.hidden * c.routed_rows)


def _attention_working_set(c: LayerContext, a: AttentionLayout) -> int:
    """Eager/math attention's q·kᵀ scores and masked scores while the layer runs (with
    checkpointing, also the probabilities it then drops, and Falcon's previous layer's)."""
    if not a.kernel.explicit_scores:
        return 0
    stack, s = c.stack, c.score_columns
    # q·kᵀ and the masked scores; nn.MultiheadAttention adds no mask: q·kᵀ only
    score_copies = 1 if stack.torch_multihead_attention else 2
    score_bytes = 2 if c.n.autocast else a.qkv_bytes
    scores = stack.n_heads * s * score_copies * score_bytes
    kept_scores = stack.n_heads * s * (a.softmax_bytes + a.probs_copy_bytes)
    transient = scores + (kept_scores if c.setup.grad_ckpt else 0)
    if c.setup.grad_ckpt and stack.scores_live_through_softmax and a.kernel is Kernel.EAGER:
        # while the softmax runs: q·kᵀ, the masked scores (the mask is in the embeddings'
        # dtype, so fp32 over fp32 embeddings), the softmax's upcast of a 16-bit input
        # (softmax.int with a dtype casts first) and its output; the probabilities' 16-bit copy
        # comes after the upcast is freed (the trace, 16-bit base: 2 + 2 + 4 + 4 per score)
        masked = max(score_bytes, c.n.residual)
        upcast = a.softmax_bytes if a.softmax_bytes != masked else 0
        at_softmax = stack.n_heads * s * (score_bytes + masked + upcast + a.softmax_bytes)
        transient = max(transient, at_softmax)
    if stack.returns_attention_probs and a.kernel is Kernel.EAGER and c.setup.grad_ckpt:
        # the previous layer's, which checkpointing would otherwise have dropped
        transient += stack.n_heads * s * a.softmax_bytes
    return transient


@dataclass(frozen=True, slots=True)
class BackwardPeak:
    """A layer's backward above what it saved: in its MLP (first) and in its attention (after
    the MLP's saved tensors are freed; negative when less is in flight than was freed)."""

    mlp_per_token: int
    attention_per_token: int

    @property
    def transient_per_token(self) -> int:
        return max(self.mlp_per_token, self.attention_per_token)

    @property
    def in_attention(self) -> bool:
        return self.attention_per_token > self.mlp_per_token


def _mlp_backward_copies(c: LayerContext) -> int:
    """[tokens, I] tensors a layer's MLP backward adds above what it saved. At a gated MLP's
    product `act(gate) · up`, autograd holds the product's gradient while MulBackward writes
    both of its inputs' gradients: three. When the down projection saved its input (the
    product: its weight trains), that saved tensor was released with the projection's node just
    before, so two more than after the forward; a frozen, unquantized down projection (LoRA)
    saved nothing, so three (the sharded trace: gate, act, up, the product's gradient and the
    two MulBackward outputs alive in a LoRA block's recomputed backward). bitsandbytes keeps
    its input as a ctx attribute, not released then; fused kernels and MoE banks back-propagate
    their own way: both keep two."""
    stack, profile = c.stack, c.profile
    plain_gated = (stack.mlp_kind is MlpKind.GATED and not stack.n_experts
                   and not (profile.fused_activations or profile.compiled))
    return 3 if plain_gated and not c.keeps_inputs else 2


def backward_peak(c: LayerContext, a: AttentionLayout, *, mlp_per_token: int,
                  norms_per_token: int) -> BackwardPeak:
    """A layer's backward peak above what it saved.

    The MLP's backward runs first, with everything the layer saved still alive; by the
    attention's backward the MLP's saved tensors are gone (the trace: at an eager layer's
    softmax backward only the attention's tensors remain). Both are kept: the layer's
    backward peak is the larger of the two moments, each with the gradient it writes then.
    """
    stack, e = c.stack, c.e
    mlp_transient = (_mlp_backward_copies(c) * expert_bytes(c) * stack.intermediate_size
                     * c.experts)
    if activation_in_fp32(c):
        # gelu_new in fp32 under autocast: its output's gradient arrives cast to fp32 and the
        # final product's MulBackward writes both factors' gradients in fp32 (the trace); a
        # trained down projection has just released its saved (16-bit) input
        released = e if c.keeps_inputs else 0
        mlp_transient = (3 * FP32 - released) * stack.intermediate_size * c.experts
    if c.profile.seq_split > 1:
        # Sequence parallel: the MLP's output gradient arrives split over the sequence and is
        # all-gathered whole (the backward of `RowwiseParallel(output_layouts=Shard(1))`)
        # before the down projection's backward writes the product's gradient: e·h + e·I,
        # above the later MulBackward's copies when I / tp is small (the trace, Mistral 7B,
        # tp 8 + SP, 8k: three gathered `s h` tensors at the MLP's backward, 455.4 MB; this
        # moment 455.3 MB; torchtitan/models/llama3/infra/parallelize.py@v0.2.2 apply_tp)
        mlp_transient = max(mlp_transient, e * c.hidden + e * stack.intermediate_size * c.experts)
    # A fused kernel's backward writes dq, dk and dv (and reads the output's gradient); a
    # hybrid mixer's kernel, its workspace (the two run apart in a parallel layer)
    attention_transient = max(2 * e * (c.q_out + a.kv_width + a.v_width),
                              mixer_workspace_per_token(c, backward=True))
    if a.kernel.explicit_scores:
        # At the softmax's backward: the fp32 gradient of the probabilities and the softmax's
        # fp32 gradient output, while the 16-bit copy of the probabilities is already freed
        # (the trace: softmax, its gradient and the softmax backward's output, all fp32);
        # of the per-token gradients only the output's and v's exist yet.
        attention_transient = e * (c.o_width + a.v_width) + stack.n_heads * c.score_columns * (
            2 * a.softmax_bytes - a.probs_copy_bytes)
    # With a norm of its own before the MLP (pre-norm blocks), that norm's backward has run
    # too; a parallel block's shared norm waits for both branches; post-norm blocks have run
    # both norms' backward (the one after the MLP and the one after the attention).
    mlp_norm = norms_per_token // stack.n_norms if stack.n_norms >= 2 else 0
    if stack.post_norm:
        mlp_norm = norms_per_token
    after_mlp = attention_transient - mlp_per_token - mlp_norm
    return BackwardPeak(mlp_transient, after_mlp)


def moe_bank_backward(c: LayerContext, mlp_per_token: int) -> MoeBackward | None:
    """Per token, at the gate/up bank's gradient write (see `MoeBackward`; found by the trace),
    for an MoE layer whose banks train in Transformers' code.

    grouped_mm: the experts' saved tensors are freed but the gathered input and the scaled
    output; the gradient of the gate/up output ([tokens·top-k, 2·I]) is in flight.
    Eager loop: the peak comes at the second expert processed (the bank buffer holds the first
    one's gradient, the second's arrives), when the other E − 2 experts' saved tensors are still
    alive, and the gradient of the layer's input is being gathered ([tokens, h]).
    """
    stack = c.stack
    if not (stack.n_experts and c.full and c.hf):
        return None
    experts_saved = mlp_per_token - FP32 * stack.n_experts  # what the experts keep, all of them
    if experts_run_grouped(c):
        eb = expert_bytes(c)
        gathered = c.experts * 2 * eb * c.hidden  # each expert's gathered input and output
        mlp_transient = 2 * eb * stack.intermediate_size * c.experts
        return MoeBackward(experts_saved - gathered - mlp_transient, loop=False)
    freed = experts_saved * 2 // stack.n_experts
    return MoeBackward(freed - c.n.residual * c.hidden, loop=True)
