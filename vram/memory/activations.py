"""Activation memory: the tensors autograd keeps from the forward pass for the backward pass.

The count follows what PyTorch really saves, op by op, not a rule of thumb:
- `nn.Linear` saves its input only when its weight trains (grad_W = xᵀ·grad_y); a frozen
  Linear saves nothing but the weight it already has (grad_x = grad_y·W).
- RMSNorm (HF `LlamaRMSNorm`, LitGPT `RMSNorm`) upcasts to fp32 and keeps that copy; it also keeps
  the normalized input when its weight trains. `nn.LayerNorm` keeps its input.
- SDPA's flash and memory-efficient kernels keep q, k, v, the output and a logsumexp; eager
  attention keeps the s×s probabilities (in fp32 in HF's softmax) and their 16-bit cast.
- SiLU/GELU keep their input; the gate product keeps both factors.
- Cross-entropy keeps log-softmax of the logits (fp32 when the stack upcasts them):
  `vram.memory.head`.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4)
give `s·b·h·(34 + 5·a·s/h)` bytes per GPT layer for one implementation; the terms below are the
same bookkeeping for the implementations people actually run. One layer's count is one function
per part (norms, Linear inputs, attention, MLP, dropout, LoRA branches), each returning its
`Term`, plus its forward and backward working sets; all read one frozen `LayerContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vram.memo import memoized, per_token_key
from vram.memory.attention import Kernel, attention_kernel, mask_bytes_per_sequence, needs_mask
from vram.memory.head import HeadActivations, head_activations
from vram.memory.params import is_targeted, leaves_bank_unquantized, targeted_roles
from vram.model.spec import MlpKind, ModelSpec, NormKind, Role, Stack
from vram.setup import Attention, Method, Offload, Quant, TrainingSetup
from vram.stacks.precision import PrecisionPolicy
from vram.stacks.profile import StackProfile, runs_transformers_code
from vram.units import FP32_BYTES as FP32

__all__ = [
    "ActivationPlan", "HeadActivations", "Kernel", "LayerActivations", "LayerContext",
    "MoeBackward", "Term", "attention_kernel", "experts_run_grouped", "head_activations",
    "layer_activations", "layer_context", "plan",
]


@dataclass(frozen=True, slots=True)
class Term:
    """One set of saved tensors of a layer, per token (attention scores: s per token)."""

    key: str
    label: str
    formula: str
    bytes_per_token: int
    #: Of what this part keeps, the bytes bitsandbytes' MatMul4Bit holds as ctx attributes
    #: (its inputs): checkpointing's saved-tensor hooks never see them.
    ctx_kept_per_token: int = 0


@dataclass(frozen=True, slots=True)
class MoeBackward:
    """Where an MoE layer's backward peaks: when the gate/up bank's gradient is written.

    Transformers 5 keeps each expert bank as one 3-D parameter. With bf16 weights its default
    `grouped_mm` writes the whole bank's gradient at once, after down_proj's bank gradient
    became `.grad`. The fp32 and autocast recipes run the eager per-expert loop: each expert
    indexes the bank (`gate_up_proj[e]`), so each expert's weight gradient arrives as a
    bank-sized `select_backward` tensor that autograd adds into the bank's gradient buffer, one
    expert after another (the trace, transformers/integrations/moe.py).
    """

    #: Saved tensors already freed at that moment, minus the activation gradients in flight
    #: (a negative number when more is in flight than freed).
    freed_minus_inflight_per_token: int
    #: The eager per-expert loop (True) or grouped_mm (False).
    loop: bool


@dataclass(frozen=True, slots=True)
class LayerActivations:
    """What one layer keeps, per token of the micro-batch, and the transients of its passes."""

    stack: str
    count: int
    terms: tuple[Term, ...]
    backward_transient_per_token: int = 0
    #: Whether the layer's backward peaks in its attention (after the MLP's tensors are
    #: freed) rather than in its MLP.
    backward_peak_in_attention: bool = False
    #: What a layer's forward holds beyond what it keeps: eager attention's scores and masked
    #: scores (with checkpointing, its probabilities too, which it then drops).
    forward_transient_per_token: int = 0
    #: An MoE layer whose expert banks train: per token, what its backward holds beyond what the
    #: layer saved when the gate/up bank's gradient is written (see `moe_bank_backward`).
    moe: MoeBackward | None = None
    #: Each term's texts as an estimate's line item: (key, label, formula). Made once per
    #: layer (its plan is remembered), not on every estimate that writes the terms out.
    item_texts: tuple[tuple[str, str, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "item_texts", tuple(
            (f"activations.{self.stack}.{term.key}",
             f"{term.label} × {self.count} {self.stack} layers",
             f"tokens × layers × ({term.formula})") for term in self.terms))

    @property
    def bytes_per_token(self) -> int:
        return sum(t.bytes_per_token for t in self.terms)

    @property
    def ctx_kept_per_token(self) -> int:
        """Bytes held by MatMul4Bit as ctx attributes: non-reentrant checkpointing keeps them."""
        return sum(t.ctx_kept_per_token for t in self.terms)


# --------------------------------------------------------------------------------------------
# What every part of a layer reads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LayerContext:
    """The facts of one layer under one setup that its parts share (read-only)."""

    model: ModelSpec
    stack: Stack
    setup: TrainingSetup
    profile: StackProfile
    n: PrecisionPolicy
    #: Every weight trains (full fine-tune).
    full: bool
    #: A Linear keeps its input when its weight trains, or when it is a bitsandbytes 4-bit
    #: layer.
    keeps_inputs: bool
    #: Frozen 4-bit Linears keep their inputs as MatMul4Bit ctx attributes.
    bnb_kept: bool
    #: The roles LoRA adapts (None: every Linear).
    roles: frozenset[Role] | None
    hidden: int
    #: Bytes of one activation element in the compute dtype (`e` in the formulas).
    e: int
    #: Widths per token: q (and the expanded k), k and v as projected, the attention output.
    q_out: int
    kv_out: int
    v_out: int
    o_width: int
    #: A parallel block with one shared norm (Phi, Falcon-7B) feeds attention and MLP the same
    #: tensor.
    shared_norm: bool
    kernel: Kernel
    #: The stack runs Transformers' modeling code.
    hf: bool

    @property
    def experts(self) -> int:
        """Expert MLPs each token runs (1 for a dense MLP)."""
        return self.stack.experts_per_token or 1


def layer_context(model: ModelSpec, stack: Stack, setup: TrainingSetup,
                  profile: StackProfile) -> LayerContext:
    n = profile.precision
    full = setup.method is Method.FULL
    return LayerContext(
        model=model, stack=stack, setup=setup, profile=profile, n=n, full=full,
        keeps_inputs=full or profile.quantized_linear_keeps_input,
        bnb_kept=not full and profile.quantized_linear_keeps_input,
        roles=targeted_roles(setup) if setup.trains_adapters else frozenset(),
        hidden=_hidden(stack), e=n.compute, q_out=stack.n_heads * stack.head_dim,
        kv_out=stack.n_kv_heads * stack.head_dim,
        v_out=stack.n_kv_heads * (stack.v_head_dim or stack.head_dim),
        o_width=stack.n_heads * (stack.v_head_dim or stack.head_dim),
        shared_norm=stack.parallel_residual and stack.n_norms == 1,
        kernel=attention_kernel(model, stack, setup, profile),
        hf=runs_transformers_code(profile),
    )


def _hidden(stack: Stack) -> int:
    for linear in stack.linears:
        if linear.role in (Role.Q, Role.QKV):
            return linear.d_in
    return stack.linears[0].d_in


# --------------------------------------------------------------------------------------------
# Norms and the Linear inputs they feed
# --------------------------------------------------------------------------------------------


def _norm_bytes_per_token(stack: Stack, n: PrecisionPolicy, profile: StackProfile, *,
                          weight_trains: bool) -> int:
    """One norm, per token.

    RMSNorm (HF LlamaRMSNorm, LitGPT RMSNorm) upcasts its input to fp32 and keeps that copy; a
    trained weight also needs the normalized input (16-bit in HF's Llama, fp32 in LitGPT and
    HF's Gemma, which multiply by the weight in fp32: the trace). Compiled, the norm is one
    fused kernel that keeps its input and 1/rms and recomputes the rest; matmul inputs and
    SDPA's tensors stay as they are (torchtune's cumulative table: compile saves 9.6 GB of
    38.7 GB of activations on Llama 3.2 3B, which is what the norms' fp32 copies weigh).
    `nn.LayerNorm` keeps its input and fp32 mean and rstd.
    """
    h = _hidden(stack)
    if profile.compiled:
        return n.residual * h + FP32
    if stack.norm_kind is NormKind.RMS:
        kept = FP32 * h
        if weight_trains:
            fp32_normalized = profile.norm_keeps_fp32_normalized or n.residual == FP32 or (
                stack.norm_scales_in_fp32 and runs_transformers_code(profile))
            kept += (FP32 if fp32_normalized else n.compute) * h
        return kept
    # under autocast LayerNorm is on CUDA's fp32 list (autocast_mode.h@v2.13.0 AT_FORALL_FP32):
    # it keeps the fp32 cast of a 16-bit residual, not the residual itself
    return (FP32 if n.autocast else n.residual) * h + 2 * FP32


def norms_term(c: LayerContext) -> Term:
    """Every norm of the layer (see `_norm_bytes_per_token`; weights train in a full
    fine-tune)."""
    one = _norm_bytes_per_token(c.stack, c.n, c.profile, weight_trains=c.full)
    norms = one * c.stack.n_norms
    return Term("norms", f"{c.stack.n_norms} norms", "n_norms × (4·h [+ normalized])", norms)


def _input_bytes_per_hidden_unit(n: PrecisionPolicy, n_linears: int) -> int:
    """Bytes per hidden unit kept as the input of the Linears that read one norm's output.

    Without autocast the Linears share one input tensor; under autocast (or with bnb's own
    cast on an upcast model) each call casts the fp32 input to 16 bits anew, and each cast
    copy is kept (autocast caches only leaf casts).
    """
    if n.input_copy_per_linear:
        return 2 * n_linears
    if n.autocast:
        return n.compute * n_linears
    return n.compute if n.residual == n.compute else n.residual


def linear_inputs_term(c: LayerContext) -> Term | None:
    """The inputs of the Linears that read the norms (attention in, MLP in), when they keep
    them: `nn.Linear` saves its input for grad_W = xᵀ·grad_y (torch/nn/functional.py linear),
    bitsandbytes' MatMul4Bit keeps it as `ctx.tensors` (bitsandbytes/autograd/_functions.py)."""
    if not c.keeps_inputs:
        return None
    stack, n, h = c.stack, c.n, c.hidden
    attn_in = [ln for ln in stack.linears if ln.role in (Role.Q, Role.K, Role.V, Role.QKV)]
    mlp_in = [ln for ln in stack.linears
              if ln.role in (Role.GATE, Role.UP, Role.GATE_UP) and ln.copies == 1]
    kept = _input_bytes_per_hidden_unit(n, len(attn_in)) * h
    # a shared norm's output is kept once, unless each Linear makes its own cast of it
    if not c.shared_norm or n.input_copy_per_linear or n.autocast:
        kept += _input_bytes_per_hidden_unit(n, max(1, len(mlp_in))) * h
    if stack.cross_attention:
        kept += _input_bytes_per_hidden_unit(n, 1) * h  # the cross-attention query's input
    return Term("linear_inputs", "Linear inputs (attention in, MLP in)",
                "e·h per norm output (one copy per call under autocast)", kept,
                ctx_kept_per_token=kept if c.bnb_kept else 0)


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """The dtypes and widths of one layer's attention tensors under its kernel."""

    kernel: Kernel
    #: Transformers' eager attention (its output needs a contiguous copy for o_proj).
    hf_eager: bool
    #: Width of k and of v as the kernel sees them (expanded to every query head, or not).
    kv_width: int
    v_width: int
    #: Bytes of q, k, v and the output as the kernel sees them; q·kᵀ runs in this dtype.
    qkv_bytes: int
    #: Bytes per score of the softmax output (explicit scores only).
    softmax_bytes: int
    #: Bytes per score of the probabilities' copy eager attention keeps (cast or dropped).
    probs_copy_bytes: int
    attn_dropout: bool


def attention_layout(c: LayerContext) -> AttentionLayout:
    """LitGPT and torchtune expand k/v in their own code before SDPA; HF repeats them on the
    masked (efficient-kernel) path and in its eager attention (`repeat_kv`). Falcon
    broadcasts instead, and torch.matmul folds the broadcast [batch, heads] into one batch
    dimension: a view for one sequence, a materialized (and kept) copy for more.

    HF's eager softmax runs in fp32 (upcast, or autocast's fp32 list) and keeps its output;
    with dropout on the probabilities the matmul with v keeps the dropped probabilities in the
    compute dtype; without, the cast back to e (none in fp32). PyTorch's math SDPA upcasts
    16-bit inputs to fp32 and keeps the fp32 probabilities for its matmul.
    """
    stack, n, setup, kernel = c.stack, c.n, c.setup, c.kernel
    # torch's nn.MultiheadAttention is the model's own code, whatever the stack
    hf_eager = c.hf and kernel is Kernel.EAGER and not stack.torch_multihead_attention
    expand = (c.profile.expands_kv and setup.attention is not Attention.FLASH) or (
        kernel is Kernel.EFFICIENT and stack.n_kv_heads < stack.n_heads) or (
        hf_eager and (not stack.eager_broadcasts_kv or setup.micro_batch > 1))
    qkv_bytes = n.attention if n.input_copy_per_linear else c.e
    softmax = FP32
    probs_copy = 0
    dropout = stack.attn_dropout > 0
    if kernel.explicit_scores:
        # the softmax's output: fp32 where the model upcasts (or autocast does), else q's dtype
        softmax = FP32 if (stack.softmax_upcast or n.autocast or kernel is Kernel.MATH) \
            else qkv_bytes
        if kernel is Kernel.EAGER:
            if n.autocast:
                probs_copy = 2  # the matmul with v casts the probabilities to 16 bits, kept
            elif dropout or qkv_bytes != softmax:
                probs_copy = qkv_bytes  # cast back to q's dtype, or dropped: kept by the matmul
    return AttentionLayout(kernel=kernel, hf_eager=hf_eager,
                           kv_width=c.q_out if expand else c.kv_out,
                           v_width=c.o_width if expand else c.v_out, qkv_bytes=qkv_bytes,
                           softmax_bytes=softmax, probs_copy_bytes=probs_copy,
                           attn_dropout=dropout)


def attention_term(c: LayerContext, a: AttentionLayout) -> Term:
    """q, k, v and the attention output, and what the kernel keeps beyond them: the s×s
    probabilities (eager, math) or a logsumexp per head (flash, efficient). HF's eager
    attention keeps no output of its own (its contiguous copy is o_proj's input): the trace.
    """
    stack, n, s, q_out = c.stack, c.n, c.setup.seq_len, c.q_out
    a_b = a.qkv_bytes
    attn = a_b * (q_out + a.kv_width + a.v_width) + (0 if a.hf_eager else a_b * c.o_width)
    if a.kernel.explicit_scores:
        per_score = a.softmax_bytes
        if a.attn_dropout:
            per_score += 1  # the mask
        if a.kernel is Kernel.EAGER:
            per_score += a.probs_copy_bytes
        if stack.attn_softcap and a.kernel is Kernel.EAGER:
            # tanh output of Gemma 2's soft-cap, in the dtype of the scores (16 bits under
            # autocast, even on an fp32 model)
            per_score += 2 if n.autocast else a_b
        attn += stack.n_heads * s * per_score
        label = f"{a.kernel.value} attention: q, k, v, output, s×s probabilities"
        formula = "e·(q + 2·kv + o) + a·s·(4 [+ e] [+ dropout mask])"
    else:
        attn += FP32 * stack.n_heads  # logsumexp per head
        label = f"{a.kernel.value} attention kernel: q, k, v, output, logsumexp"
        formula = "e·(q + 2·kv + o) + 4·a"
        if a.kernel is Kernel.EFFICIENT and needs_mask(c.model, c.setup, c.profile):
            # SDPA turns the boolean sliding-window mask into an additive bias in q's dtype on
            # every call, and the efficient kernel keeps that bias for its backward: one
            # [b, 1, s, s] tensor per layer.
            attn += s * a_b
            formula += " + s·e (the layer's attention bias)"
    # o_proj's input: the attention output itself after a fused kernel in HF (it is laid out
    # [b, s, heads, d] already); a contiguous copy after eager/math attention, and in LitGPT
    # and torchtune, which reshape the transposed output.
    # On an upcast QLoRA model o_proj's Linear4bit casts the fp32 output to 16 bits and keeps
    # that cast instead (the trace: six 16-bit h-wide copies per layer, o's among them).
    o_in = 2 if n.input_copy_per_linear else a_b
    o_cast = n.input_copy_per_linear and a_b != 2  # fp32 output: o_proj casts and keeps
    if c.keeps_inputs and (o_cast or a.kernel.explicit_scores or not c.hf):
        attn += o_in * c.o_width
    ctx_kept = o_in * c.o_width if c.bnb_kept else 0  # o_proj's input, kept by MatMul4Bit
    if stack.cross_attention:
        attn *= 2  # decoder layers of an encoder-decoder also attend to the encoder
    return Term("attention", label, formula, attn, ctx_kept_per_token=ctx_kept)


# --------------------------------------------------------------------------------------------
# MLP
# --------------------------------------------------------------------------------------------


def _activation_in_fp32(c: LayerContext) -> bool:
    """`gelu_new` as Transformers writes it, under autocast: it runs in fp32 (below)."""
    return c.stack.act_pow_fp32 and c.n.autocast and not (
        c.profile.fused_activations or c.profile.compiled)


def _activation_bytes(c: LayerContext, e: int, act_kept: int) -> int:
    """Bytes per I-wide unit the MLP activation keeps for backward. `gelu_new` under autocast:
    `torch.pow` is on CUDA's fp32 list (autocast_mode.h@v2.13.0 AT_FORALL_FP32), so pow keeps
    an fp32 copy of its input and tanh and 1 + tanh stay fp32; only 0.5·x keeps e bytes
    (transformers/activations.py@v5.24.0 NewGELUActivation)."""
    if _activation_in_fp32(c) and act_kept:
        return 3 * FP32 + e
    return act_kept * e


def mlp_term(c: LayerContext) -> Term:
    """What the activation keeps, act(gate) and up (kept by their product; gated MLPs), and the
    down projection's input when it keeps it, once per expert a token visits. MoE adds each
    expert's gathered input and scaled output, and the router's fp32 probabilities."""
    stack, n, profile, e = c.stack, c.n, c.profile, c.e
    inter = stack.intermediate_size
    experts = c.experts
    act_kept = 1 if profile.fused_activations or profile.compiled else stack.act_saved
    down_in = 2 if n.input_copy_per_linear else e  # bnb's own bf16 copy on upcast models
    down_kept = down_in * inter if c.keeps_inputs else 0
    if stack.act_output_is_down_input and down_kept and down_in == e:
        act_kept = 0  # ReLU's kept output is the tensor fc2 keeps (counted as down_kept)
    if _dense_banks_in_quantized_model(c):
        # the experts' banks stayed unquantized: plain frozen matmuls under autocast, whose
        # outputs are 16-bit and which keep no input (the weight's cast is kept instead)
        e = 2 if n.autocast else e
        down_kept = 0
    act_bytes = _activation_bytes(c, e, act_kept)
    if stack.mlp_kind is MlpKind.GATED:
        mlp = (act_bytes + 2 * e) * inter + down_kept
        formula = f"e·I·({act_kept} (activation) + 2 [+1 when down_proj keeps its input])"
    else:
        mlp = act_bytes * inter + down_kept
        formula = f"e·I·({act_kept} (activation) [+1 when fc2 keeps its input])"
    ctx_kept = down_in * inter * experts if c.bnb_kept and not \
        _dense_banks_in_quantized_model(c) else 0
    if stack.hidden_dropout > 0 and stack.mlp_inner_dropout:
        mlp += inter  # T5's dropout inside the feed-forward: its mask (its output is wo's input)
    mlp *= experts
    if stack.shared_expert_width:
        # the shared experts: one gated MLP on every token (DeepseekV2Moe.shared_experts)
        width = stack.shared_expert_width
        mlp += (act_bytes + 2 * e) * width + (down_in * width if c.keeps_inputs else 0)
        ctx_kept += down_in * width if c.bnb_kept else 0
        formula += " + shared experts' e·W·(act + 2 [+1])"
    if stack.n_experts:
        # MoE: each expert gathers its tokens (a copy) and scales its output by the router.
        mlp += experts * (2 * e * c.hidden) + FP32 * stack.n_experts
        formula += " × top-k + routing copies"
        if c.hf and not experts_run_grouped(c.setup, profile):
            # the eager loop's `final.index_add_(0, idx, out * w)`: index_add_'s derivative
            # reads `source` (expand_as), so each expert's weighted output is saved, in the
            # router weights' dtype (the residual's)
            mlp += experts * n.residual * c.hidden
            formula += " + weighted outputs (index_add_ keeps them)"
    return Term("mlp", f"MLP ({stack.mlp_kind.value})", formula, mlp,
                ctx_kept_per_token=ctx_kept)


def _dense_banks_in_quantized_model(c: LayerContext) -> bool:
    """QLoRA on an MoE whose expert banks bitsandbytes left unquantized (3-D parameters, see
    `vram.memory.params.leaves_bank_unquantized`)."""
    return c.setup.effective_quant is not Quant.NONE and any(
        leaves_bank_unquantized(linear, c.profile) for linear in c.stack.linears)


def mla_term(c: LayerContext) -> Term | None:
    """DeepSeek-V2's multi-head latent attention beyond q, k, v and the output
    (transformers/models/deepseek_v2/modeling_deepseek_v2.py@v5.24.0, DeepseekV2Attention):
    kv_a_layernorm on the latent keeps its fp32 copy (and the normalized latent when its
    weight trains); kv_b_proj keeps its input when it trains; v is a view of kv_b_proj's
    output, so the k_nope half of it stays alive too; the rotated shared k_pe."""
    stack = c.stack
    if not stack.kv_lora_rank:
        return None
    e = c.e
    latents = _latent_bytes_per_token(c, stack.kv_lora_rank)
    if stack.q_lora_rank:  # q_a_proj -> q_a_layernorm -> q_b_proj: the same again for q
        latents += _latent_bytes_per_token(c, stack.q_lora_rank)
    nope = stack.n_heads * (stack.head_dim - _rope_width(stack))
    rope = e * _rope_width(stack)
    return Term("mla", "latent attention: latent norms, their up-projections' inputs, "
                "k_nope half, k_pe", "Σ latents (4·r [+ e·r] [+ e·r]) + e·heads·d_nope + e·d_rope",
                latents + e * nope + rope)


def _latent_bytes_per_token(c: LayerContext, rank: int) -> int:
    """One MLA latent: its RMSNorm's fp32 copy (and the normalized latent when the norm's
    weight trains), and the up-projection's input when it keeps it."""
    kept = FP32 * rank
    if c.full:
        kept += (FP32 if c.n.residual == FP32 else c.e) * rank
    return kept + (c.e * rank if c.keeps_inputs else 0)


def _rope_width(stack: Stack) -> int:
    """MLA's rotary part of each q/k head: kv_a_proj_with_mqa's output beyond the latent."""
    kv_a = next(ln for ln in stack.linears if ln.role is Role.K)
    return kv_a.d_out - stack.kv_lora_rank


def dropout_term(c: LayerContext) -> Term | None:
    """Dropout on the two residual branches keeps a 1-byte mask each (CUDA's fused dropout)."""
    if c.stack.hidden_dropout <= 0:
        return None
    return Term("dropout", "dropout masks on the residual branches", "1 byte × h per dropout",
                2 * c.hidden)


def experts_run_grouped(setup: TrainingSetup, profile: StackProfile) -> bool:
    """Transformers' `grouped_mm` experts need bf16 operands: bf16 weights without autocast.
    Anything else runs the eager per-expert loop (transformers/integrations/moe.py)."""
    return runs_transformers_code(profile) and profile.precision.bf16_without_autocast


# --------------------------------------------------------------------------------------------
# LoRA branches
# --------------------------------------------------------------------------------------------


#: Linears that read the same input tensor.
_INPUT_GROUP: dict[Role, str] = {
    Role.Q: "attn_in", Role.K: "attn_in", Role.V: "attn_in", Role.QKV: "attn_in",
    Role.GATE: "mlp_in", Role.UP: "mlp_in", Role.GATE_UP: "mlp_in",
    Role.CROSS_K: "encoder_out", Role.CROSS_V: "encoder_out",
}


def _zero_pad_width(roles: frozenset[Role] | None, q_out: int, kv_out: int) -> int:
    """LitGPT's LoRAQKVLinear adapting some but not all of q, k, v scatters B's output into
    the fused width with `index_copy_`, whose backward keeps that output (its `source`): the
    selected slices' width per token (litgpt/lora.py LoRAQKVLinear.zero_pad; with all three
    selected it returns early). Learned from tracing LitGPT's own model code."""
    if roles is None:  # every Linear is adapted
        return 0
    widths = {Role.Q: q_out, Role.K: kv_out, Role.V: kv_out}
    selected = [role for role in widths if role in roles]
    if len(selected) == len(widths):
        return 0
    return sum(widths[role] for role in selected)


def _lora_branch_bytes_per_token(setup: TrainingSetup, lora_bytes: int, d_in: int,
                                 n: PrecisionPolicy) -> int:
    """PEFT / LitGPT LoRA branch of one Linear: `B(A(dropout(x)))`, per token.

    Dropout keeps its 1-byte mask (CUDA's fused kernel). lora_A's matmul keeps its input for
    A's gradient: under autocast, the 16-bit cast autocast makes of the dropped input (the
    dropped tensor itself, fp32 on an fp32 model, is not kept); without autocast, the dropped
    input in the adapter's dtype (PEFT casts the input to it first). A's output (rank r)
    feeds B, which keeps it. The trace showed the autocast case keeps only the cast.
    """
    r = setup.lora_rank
    kept = 2 if n.autocast else lora_bytes  # autocast's casts are 16-bit
    mask = d_in if setup.lora_dropout > 0 else 0
    return kept * d_in + mask + kept * r


def lora_term(c: LayerContext) -> Term | None:
    """Every adapted Linear's LoRA branch (see `_lora_branch_bytes_per_token`); without
    dropout and in the input's dtype, A reads the Linear's own input, kept once per input
    tensor."""
    setup, profile, e = c.setup, c.profile, c.e
    if not setup.trains_adapters:
        return None
    lora_bytes = profile.adapter_bytes
    experts = c.experts
    extra = 0
    fused_seen = False
    shared_inputs: set[str] = set()
    copies_input = setup.lora_dropout > 0 or lora_bytes != e
    for linear in c.stack.linears:
        if not is_targeted(linear, c.roles):
            continue
        tokens_share = experts if linear.copies > 1 else 1
        if profile.adapts_fused_slices and linear.role in (Role.Q, Role.K, Role.V):
            # LitGPT: one LoRAQKVLinear, one dropout for all selected slices.
            if fused_seen:
                extra += lora_bytes * setup.lora_rank
                continue
            fused_seen = True
        if copies_input:
            branch = _lora_branch_bytes_per_token(setup, lora_bytes, linear.d_in, c.n)
            extra += branch * tokens_share
            continue
        # No dropout, same dtype: A keeps the Linear's own input, once per input tensor
        # (and not at all when the base Linear keeps it already).
        group = _INPUT_GROUP.get(linear.role, linear.name)
        if group == "mlp_in" and c.shared_norm:
            group = "attn_in"  # one shared norm output feeds both
        if linear.copies > 1 and linear.role in (Role.GATE, Role.UP, Role.GATE_UP):
            group = "attn_in"  # experts read their gathered copy, counted with the MLP
            shared_inputs.add(group)
        if linear.role in (Role.CROSS_K, Role.CROSS_V):
            shared_inputs.add(group)  # the encoder output: one tensor for all layers
        if not c.keeps_inputs and group not in shared_inputs:
            extra += e * linear.d_in * tokens_share
        shared_inputs.add(group)
        extra += lora_bytes * setup.lora_rank * tokens_share
    if profile.adapts_fused_slices:
        extra += lora_bytes * _zero_pad_width(c.roles, c.q_out, c.kv_out)
    if not extra:
        return None
    return Term("lora", "LoRA branches (dropout output, mask, x·A)",
                "Σ targeted (b·d_in + d_in + b·r)", extra)


# --------------------------------------------------------------------------------------------
# Working sets beyond what a layer keeps
# --------------------------------------------------------------------------------------------


def forward_transient_per_token(c: LayerContext, a: AttentionLayout) -> int:
    """Eager/math attention's q·kᵀ scores and masked scores while the layer runs (with
    checkpointing, also the probabilities it then drops, and Falcon's previous layer's)."""
    if not a.kernel.explicit_scores:
        return 0
    stack, s = c.stack, c.setup.seq_len
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
    transient_per_token: int
    in_attention: bool


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
    softmax backward only the attention's tensors remain). The larger of the two is the
    layer's backward peak.
    """
    stack, e = c.stack, c.e
    mlp_transient = _mlp_backward_copies(c) * e * stack.intermediate_size * c.experts
    if _activation_in_fp32(c):
        # gelu_new in fp32 under autocast: its output's gradient arrives cast to fp32 and the
        # final product's MulBackward writes both factors' gradients in fp32 (the trace); a
        # trained down projection has just released its saved (16-bit) input
        released = e if c.keeps_inputs else 0
        mlp_transient = (3 * FP32 - released) * stack.intermediate_size * c.experts
    # A fused kernel's backward writes dq, dk and dv (and reads the output's gradient).
    attention_transient = 2 * e * (c.q_out + a.kv_width + a.v_width)
    if a.kernel.explicit_scores:
        # At the softmax's backward: the fp32 gradient of the probabilities and the softmax's
        # fp32 gradient output, while the 16-bit copy of the probabilities is already freed
        # (the trace: softmax, its gradient and the softmax backward's output, all fp32);
        # of the per-token gradients only the output's and v's exist yet.
        attention_transient = e * (c.o_width + a.v_width) + stack.n_heads * c.setup.seq_len * (
            2 * a.softmax_bytes - a.probs_copy_bytes)
    # With a norm of its own before the MLP (pre-norm blocks), that norm's backward has run
    # too; a parallel block's shared norm waits for both branches; post-norm blocks have run
    # both norms' backward (the one after the MLP and the one after the attention).
    mlp_norm = norms_per_token // stack.n_norms if stack.n_norms >= 2 else 0
    if stack.post_norm:
        mlp_norm = norms_per_token
    after_mlp = attention_transient - mlp_per_token - mlp_norm
    return BackwardPeak(max(mlp_transient, after_mlp), after_mlp > mlp_transient)


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
    if experts_run_grouped(c.setup, c.profile):
        gathered = c.experts * 2 * c.e * c.hidden  # each expert's gathered input and output
        mlp_transient = 2 * c.e * stack.intermediate_size * c.experts
        return MoeBackward(experts_saved - gathered - mlp_transient, loop=False)
    freed = experts_saved * 2 // stack.n_experts
    return MoeBackward(freed - c.n.residual * c.hidden, loop=True)


def layer_activations(
    model: ModelSpec, stack: Stack, setup: TrainingSetup, profile: StackProfile,
) -> LayerActivations:
    """Bytes one layer of `stack` keeps per token (attention scores per token × sequence)."""
    c = layer_context(model, stack, setup, profile)
    layout = attention_layout(c)
    norms = norms_term(c)
    mlp = mlp_term(c)
    parts = (norms, linear_inputs_term(c), attention_term(c, layout), mla_term(c), mlp,
             dropout_term(c), lora_term(c))
    peak = backward_peak(c, layout, mlp_per_token=mlp.bytes_per_token,
                         norms_per_token=norms.bytes_per_token)
    return LayerActivations(
        stack=stack.name, count=stack.count, terms=tuple(t for t in parts if t is not None),
        backward_transient_per_token=peak.transient_per_token,
        backward_peak_in_attention=peak.in_attention,
        forward_transient_per_token=forward_transient_per_token(c, layout),
        moe=moe_bank_backward(c, mlp.bytes_per_token),
    )


# Built on every estimate: not `frozen` (a frozen dataclass sets each field through
# `object.__setattr__`, four times slower to build); nothing assigns to it once built.
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
    head_saved_bytes: int
    head_peak_bytes: int
    head_kept_bytes: int
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
    checkpointed: int  # every layer's checkpointed input (0 without checkpointing)
    stored: int  # every layer's saved tensors (0 under checkpointing)
    previous_step: int
    moe: MoeBackward | None
    mask_per_sequence: int


def selective_kept_per_token(model: ModelSpec, stack: Stack, setup: TrainingSetup,
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
    layers = [layer_activations(model, stack, setup, profile) for stack in model.stacks]
    checkpointed = stored = 0
    if setup.grad_ckpt:
        checkpointed = sum(layer.count for layer in layers) * n.residual * model.hidden_size
        if setup.ckpt_selective:
            checkpointed += sum(
                stack.count * selective_kept_per_token(model, stack, setup, profile, n)
                for stack in model.stacks)
        if profile.checkpoint_keeps_ctx_attributes:
            checkpointed += sum(layer.count * layer.ctx_kept_per_token for layer in layers)
    else:
        stored = sum(layer.bytes_per_token * layer.count for layer in layers)
    return PlanPerToken(
        layers=layers, layer_max=max(layer.bytes_per_token for layer in layers),
        backward_transient=max(layer.backward_transient_per_token for layer in layers),
        forward_transient=max(layer.forward_transient_per_token for layer in layers),
        backward_peak_in_attention=max(
            layers, key=lambda layer: layer.bytes_per_token + layer.backward_transient_per_token,
        ).backward_peak_in_attention,
        checkpointed=checkpointed, stored=stored,
        previous_step=_previous_step_bytes_per_token(model, setup, profile, layers),
        moe=next((layer.moe for layer in layers if layer.moe is not None), None),
        mask_per_sequence=mask_bytes_per_sequence(model, setup, profile, n))


def plan(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> ActivationPlan:
    """Activation memory of one micro-batch: the per-token figures (remembered per model for
    setups equal but for the batch size) times its tokens."""
    tokens = setup.micro_batch * setup.seq_len
    key = per_token_key(setup)
    per = memoized(model, ("plan per token", *key),
                   lambda: _plan_per_token(model, setup, profile))
    # Liger's fused head sizes its chunks to the micro-batch; every other head is per token.
    head = memoized(model, ("head", *key, tokens if profile.fused_linear_loss else 0),
                    lambda: head_activations(model, setup, profile))
    assert head.kept_per_token is not None  # head_activations always decides it
    per_layer_max = per.layer_max * tokens
    checkpointed = per.checkpointed * tokens
    stored = per.stored * tokens
    recompute = per_layer_max if setup.grad_ckpt else 0
    offloaded = 0
    if setup.grad_ckpt and profile.offloads_checkpoints:
        offloaded, checkpointed = checkpointed, 0
    elif not setup.grad_ckpt and setup.offload is Offload.ACTIVATIONS:
        offloaded, stored = stored - per_layer_max, per_layer_max
    moe = per.moe
    return ActivationPlan(
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
        head_kept_bytes=head.kept_per_token * tokens, head_cast_bytes=head.cast_per_token * tokens,
        head_peak_bytes=head.loss_peak_per_token * tokens, offloaded_bytes=offloaded,
    )


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


