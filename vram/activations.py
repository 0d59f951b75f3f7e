"""Activation memory: the tensors autograd keeps from the forward pass for the backward pass.

The count follows what PyTorch really saves, op by op, not a rule of thumb:
- `nn.Linear` saves its input only when its weight trains (grad_W = xᵀ·grad_y); a frozen
  Linear saves nothing but the weight it already has (grad_x = grad_y·W).
- RMSNorm (HF `LlamaRMSNorm`, LitGPT `RMSNorm`) upcasts to fp32 and keeps that copy; it also keeps
  the normalized input when its weight trains. `nn.LayerNorm` keeps its input.
- SDPA's flash and memory-efficient kernels keep q, k, v, the output and a logsumexp; eager
  attention keeps the s×s probabilities (in fp32 in HF's softmax) and their 16-bit cast.
- SiLU/GELU keep their input; the gate product keeps both factors.
- Cross-entropy keeps log-softmax of the logits (fp32 when the stack upcasts them).

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4)
give `s·b·h·(34 + 5·a·s/h)` bytes per GPT layer for one implementation; the terms below are the
same bookkeeping for the implementations people actually run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from vram.architecture import MlpKind, ModelSpec, NormKind, Role, Stack
from vram.params import head_targeted, is_targeted, targeted_roles
from vram.setup import Attention, Method, Offload, Precision, Sharding, TrainingSetup
from vram.stack import StackProfile, runs_transformers_code

FP32 = 4
#: torchtune's CEWithChunkedOutputLoss splits the output projection and loss in 8 chunks.
TORCHTUNE_CHUNKS = 8


@dataclass(frozen=True, slots=True)
class Term:
    """Bytes per token (or per token × sequence for attention scores) of one saved tensor set."""

    key: str
    label: str
    formula: str
    bytes: int


@dataclass(slots=True)
class LayerActivations:
    """What one layer keeps, per micro-batch, and the transient peak of its backward."""

    stack: str
    count: int
    terms: list[Term] = field(default_factory=list)
    backward_transient: int = 0
    #: Whether the layer's backward peaks in its attention (after the MLP's tensors are
    #: freed) rather than in its MLP.
    backward_peak_in_attention: bool = False
    #: What a layer's forward holds beyond what it keeps: eager attention's scores and masked
    #: scores (with checkpointing, its probabilities too, which it then drops).
    forward_transient: int = 0
    #: Bytes held by bitsandbytes' MatMul4Bit as ctx attributes (its inputs): checkpointing's
    #: saved-tensor hooks never see them, so non-reentrant checkpointing keeps them too.
    ctx_kept: int = 0
    #: An MoE layer whose expert banks train: per token, what its backward holds beyond what the
    #: layer saved when the gate/up bank's gradient is written (see `moe_bank_backward`).
    moe: MoeBackward | None = None

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.terms)


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

    #: Per token: saved tensors already freed at that moment, minus the activation gradients
    #: in flight (a negative number when more is in flight than freed).
    freed_minus_inflight: int
    #: The eager per-expert loop (True) or grouped_mm (False).
    loop: bool


@dataclass(frozen=True, slots=True)
class Numerics:
    compute: int  # bytes of a 16-bit or fp32 activation
    residual: int  # bytes of the residual stream (fp32 when the weights are fp32)
    autocast: bool
    #: bytes of q, k, v and the attention output as the attention kernel sees them
    attention: int = 2
    #: every Linear casts its input itself and keeps that copy (bitsandbytes' Linear4bit
    #: `x.to(compute_dtype)` on an upcast model)
    input_copy_per_linear: bool = False


def numerics(setup: TrainingSetup, profile: StackProfile | None = None) -> Numerics:
    """Activation dtypes of a precision recipe.

    With fp32 weights (fp32, autocast recipes, or QLoRA after prepare_model_for_kbit_training
    upcast the embedding and norms) the residual stream is fp32.
    """
    if profile is not None and profile.upcasts_frozen_to_fp32:
        # HF QLoRA after prepare_model_for_kbit_training: fp32 embeddings and norms, and
        # Linear4bit returns `out.to(input dtype)`, so activations stay fp32; each 4-bit Linear
        # casts its input to bf16 and MatMul4Bit keeps that copy. Only autocast brings the
        # attention back to 16 bits.
        # An fp32 recipe computes the 4-bit matmuls in fp32 too: no cast, shared inputs.
        mixed = setup.precision in (Precision.BF16_MIXED, Precision.FP16_MIXED)
        return Numerics(compute=4, residual=4, autocast=mixed, attention=2 if mixed else 4,
                        input_copy_per_linear=setup.precision is not Precision.FP32)
    if setup.precision is Precision.FP32:
        return Numerics(compute=4, residual=4, autocast=False, attention=4)
    if setup.precision is Precision.BF16_TRUE or zero_half_model(setup):
        return Numerics(compute=2, residual=2, autocast=False)
    return Numerics(compute=2, residual=4, autocast=True)


def zero_half_model(setup: TrainingSetup) -> bool:
    """DeepSpeed-style ZeRO with a mixed recipe runs a 16-bit model (fp32 master in the
    optimizer) rather than autocast over fp32 weights."""
    mixed = setup.precision in (Precision.BF16_MIXED, Precision.FP16_MIXED)
    return mixed and setup.sharding in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3)


def _norm_bytes(stack: Stack, n: Numerics, profile: StackProfile, *, weight_trains: bool) -> int:
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
    return n.residual * h + 2 * FP32


def _hidden(stack: Stack) -> int:
    for linear in stack.linears:
        if linear.role in (Role.Q, Role.QKV):
            return linear.d_in
    return stack.linears[0].d_in


def _consumers_input_bytes(n: Numerics, n_linears: int) -> int:
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


class Kernel(StrEnum):
    """The attention kernel a step really runs (it decides whether s×s scores are kept)."""

    FLASH = "flash"  # FlashAttention (flash-attn 2, or SDPA's flash kernel): O(s)
    EFFICIENT = "memory-efficient"  # SDPA's efficient kernel: O(s), accepts a mask
    MATH = "math"  # SDPA's fallback: s×s probabilities in fp32
    EAGER = "eager"  # the model's own softmax(q·kᵀ)·v


def attention_kernel(model: ModelSpec, stack: Stack, setup: TrainingSetup,
                     profile: StackProfile) -> Kernel:
    """Which kernel runs, following PyTorch's CUDA dispatch and each stack's code.

    - Gemma 2's soft-capping rules SDPA out: Transformers refuses `sdpa` for it
      (Gemma2PreTrainedModel._supports_sdpa = False) and LitGPT computes scores itself; only
      flash-attn 2 soft-caps in a fused kernel.
    - HF's Falcon always passes a 4-D mask and k/v with fewer heads and no `enable_gqa`, so
      CUDA's flash and efficient kernels refuse it and SDPA falls back to math.
    - A sliding window shorter than the sequence needs a mask: SDPA's efficient kernel, with
      k/v repeated to every head first (HF's repeat_kv).
    - fp32 rules flash out; the efficient kernel then runs, except for grouped k/v passed
      unexpanded (HF with enable_gqa), which only math accepts.
    """
    if setup.attention is Attention.EAGER:
        return Kernel.EAGER
    if setup.attention is Attention.FLASH:
        return Kernel.FLASH
    if stack.attn_softcap:
        return Kernel.EAGER
    hf = runs_transformers_code(profile)
    if hf and model.family == "falcon":
        return Kernel.MATH
    grouped = stack.n_kv_heads < stack.n_heads
    if _needs_mask(model, setup, profile):
        return Kernel.EFFICIENT  # masked, k/v repeated: any dtype
    if numerics(setup, profile).attention == FP32:
        # Flash needs 16-bit inputs; the efficient kernel takes fp32 but not grouped k/v, which
        # HF passes unexpanded (enable_gqa) when no mask is needed.
        return Kernel.MATH if hf and grouped else Kernel.EFFICIENT
    return Kernel.FLASH


def _needs_mask(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> bool:
    """HF passes an explicit mask when a sliding window is shorter than the sequence."""
    return runs_transformers_code(profile) and bool(
        model.sliding_window and model.sliding_window < setup.seq_len)


def layer_activations(
    model: ModelSpec, stack: Stack, setup: TrainingSetup, profile: StackProfile,
) -> LayerActivations:
    """Bytes one layer of `stack` keeps per token (attention scores per token × sequence)."""
    n = numerics(setup, profile)
    full = setup.method is Method.FULL
    # A Linear keeps its input when its weight trains, or when it is a bitsandbytes 4-bit layer.
    keeps_inputs = full or profile.quantized_linear_keeps_input
    roles = targeted_roles(setup) if setup.trains_adapters else frozenset()
    h = _hidden(stack)
    e = n.compute
    s = setup.seq_len
    q_out = stack.n_heads * stack.head_dim
    kv_out = stack.n_kv_heads * stack.head_dim
    out = LayerActivations(stack=stack.name, count=stack.count)
    lora_bytes = profile.adapter_bytes

    # --- norms and the inputs of the Linears that read them ---------------------------------
    attn_in = [ln for ln in stack.linears if ln.role in (Role.Q, Role.K, Role.V, Role.QKV)]
    mlp_in = [ln for ln in stack.linears
              if ln.role in (Role.GATE, Role.UP, Role.GATE_UP) and ln.copies == 1]
    # A parallel block with one shared norm (Phi, Falcon-7B) feeds attention and MLP the same
    # tensor.
    shared_norm = stack.parallel_residual and stack.n_norms == 1
    norms = _norm_bytes(stack, n, profile, weight_trains=full) * stack.n_norms
    out.terms.append(Term("norms", f"{stack.n_norms} norms", "n_norms × (4·h [+ normalized])",
                          norms))
    bnb_kept = not full and profile.quantized_linear_keeps_input
    if keeps_inputs:
        kept = _consumers_input_bytes(n, len(attn_in)) * h
        # a shared norm's output is kept once, unless each Linear makes its own cast of it
        if not shared_norm or n.input_copy_per_linear or n.autocast:
            kept += _consumers_input_bytes(n, max(1, len(mlp_in))) * h
        if stack.cross_attention:
            kept += _consumers_input_bytes(n, 1) * h  # the cross-attention query's input
        out.terms.append(Term("linear_inputs", "Linear inputs (attention in, MLP in)",
                              "e·h per norm output (one copy per call under autocast)", kept))
        if bnb_kept:
            out.ctx_kept += kept

    # --- attention ---------------------------------------------------------------------------
    kernel = attention_kernel(model, stack, setup, profile)
    # LitGPT and torchtune expand k/v in their own code before SDPA; HF repeats them on the
    # masked (efficient-kernel) path and in its eager attention (`repeat_kv`). Falcon
    # broadcasts instead, and torch.matmul folds the broadcast [batch, heads] into one batch
    # dimension: a view for one sequence, a materialized (and kept) copy for more.
    hf = runs_transformers_code(profile)
    hf_eager = hf and kernel is Kernel.EAGER
    expand = (profile.expands_kv and setup.attention is not Attention.FLASH) or (
        kernel is Kernel.EFFICIENT and stack.n_kv_heads < stack.n_heads) or (
        hf_eager and (not stack.eager_broadcasts_kv or setup.micro_batch > 1))
    kv_width = q_out if expand else kv_out
    a_b = n.attention if n.input_copy_per_linear else e
    # q, k, v and the attention output; HF's eager attention keeps no output of its own (its
    # contiguous copy is o_proj's input, below): the trace, per layer
    attn = a_b * (q_out + 2 * kv_width) + (0 if hf_eager else a_b * q_out)
    probs_copy = 0  # bytes per score of the 16-bit probabilities eager attention keeps
    softmax = FP32
    if kernel in (Kernel.EAGER, Kernel.MATH):
        # s×s per head. HF's eager softmax runs in fp32 (upcast, or autocast's fp32 list) and
        # keeps its output; with dropout on the probabilities it keeps the 1-byte mask and the
        # dropped probabilities in the compute dtype (the matmul's input); without, the cast
        # back to e (none in fp32). PyTorch's math SDPA upcasts 16-bit inputs to fp32 and keeps
        # the fp32 probabilities for its matmul.
        q_bytes = a_b  # the dtype q·kᵀ is computed in
        # the softmax's output: fp32 where the model upcasts (or autocast does), else q's dtype
        softmax = FP32 if (stack.softmax_upcast or n.autocast or kernel is Kernel.MATH) \
            else q_bytes
        per_score = softmax
        dropout = stack.attn_dropout > 0
        if dropout:
            per_score += 1  # the mask
        if kernel is Kernel.EAGER:
            if n.autocast:
                probs_copy = 2  # the matmul with v casts the probabilities to 16 bits, kept
            elif dropout or q_bytes != softmax:
                probs_copy = q_bytes  # cast back to q's dtype, or dropped: kept by the matmul
            per_score += probs_copy
        if stack.attn_softcap and kernel is Kernel.EAGER:
            # tanh output of Gemma 2's soft-cap, in the dtype of the scores (16 bits under
            # autocast, even on an fp32 model)
            per_score += 2 if n.autocast else q_bytes
        attn += stack.n_heads * s * per_score
        label = f"{kernel.value} attention: q, k, v, output, s×s probabilities"
        formula = "e·(q + 2·kv + o) + a·s·(4 [+ e] [+ dropout mask])"
    else:
        attn += FP32 * stack.n_heads  # logsumexp per head
        label = f"{kernel.value} attention kernel: q, k, v, output, logsumexp"
        formula = "e·(q + 2·kv + o) + 4·a"
        if kernel is Kernel.EFFICIENT and _needs_mask(model, setup, profile):
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
    if keeps_inputs and (o_cast or kernel in (Kernel.EAGER, Kernel.MATH) or not hf):
        attn += o_in * q_out
    if bnb_kept:
        out.ctx_kept += o_in * q_out  # o_proj's input, kept by its MatMul4Bit
    if stack.cross_attention:
        attn *= 2  # decoder layers of an encoder-decoder also attend to the encoder
    out.terms.append(Term("attention", label, formula, attn))

    # --- MLP ---------------------------------------------------------------------------------
    inter = stack.intermediate_size
    experts = stack.experts_per_token or 1
    act_kept = 1 if profile.fused_activations or profile.compiled else stack.act_saved
    if stack.mlp_kind is MlpKind.GATED:
        # What the activation keeps, act(gate) and up (kept by their product), and the
        # product when down_proj keeps its input.
        down_in = 2 if n.input_copy_per_linear else e  # bnb's own bf16 copy on upcast models
        mlp = (act_kept + 2) * e * inter + (down_in * inter if keeps_inputs else 0)
        if bnb_kept:
            out.ctx_kept += down_in * inter * experts
        formula = f"e·I·({act_kept} (activation) + 2 [+1 when down_proj keeps its input])"
    else:
        down_in = 2 if n.input_copy_per_linear else e
        mlp = act_kept * e * inter + (down_in * inter if keeps_inputs else 0)
        if bnb_kept:
            out.ctx_kept += down_in * inter * experts
        formula = f"e·I·({act_kept} (activation) [+1 when fc2 keeps its input])"
    if stack.hidden_dropout > 0:
        mlp += inter  # T5's dropout inside the feed-forward: its mask (its output is wo's input)
    mlp *= experts
    if stack.n_experts:
        # MoE: each expert gathers its tokens (a copy) and scales its output by the router.
        mlp += experts * (2 * e * h) + FP32 * stack.n_experts
        formula += " × top-k + routing copies"
        if runs_transformers_code(profile) and not experts_run_grouped(setup, profile):
            # the eager loop's `final.index_add_(0, idx, out * w)`: index_add_'s derivative
            # reads `source` (expand_as), so each expert's weighted output is saved, in the
            # router weights' dtype (the residual's)
            mlp += experts * n.residual * h
            formula += " + weighted outputs (index_add_ keeps them)"
    out.terms.append(Term("mlp", f"MLP ({stack.mlp_kind.value})", formula, mlp))
    if stack.hidden_dropout > 0:
        out.terms.append(Term("dropout", "dropout masks on the residual branches",
                              "1 byte × h per dropout", 2 * h))

    # --- LoRA branches -----------------------------------------------------------------------
    if setup.trains_adapters:
        extra = 0
        fused_seen = False
        shared_inputs: set[str] = set()
        copies_input = setup.lora_dropout > 0 or lora_bytes != e
        for linear in stack.linears:
            if not is_targeted(linear, roles):
                continue
            tokens_share = experts if linear.copies > 1 else 1
            if profile.adapts_fused_slices and linear.role in (Role.Q, Role.K, Role.V):
                # LitGPT: one LoRAQKVLinear, one dropout for all selected slices.
                if fused_seen:
                    extra += lora_bytes * setup.lora_rank
                    continue
                fused_seen = True
            if copies_input:
                branch = _lora_branch_bytes(setup, lora_bytes, linear.d_in, n)
                extra += branch * tokens_share
                continue
            # No dropout, same dtype: A keeps the Linear's own input, once per input tensor
            # (and not at all when the base Linear keeps it already).
            group = _INPUT_GROUP.get(linear.role, linear.name)
            if group == "mlp_in" and shared_norm:
                group = "attn_in"  # one shared norm output feeds both
            if linear.copies > 1 and linear.role in (Role.GATE, Role.UP, Role.GATE_UP):
                group = "attn_in"  # experts read their gathered copy, counted with the MLP
                shared_inputs.add(group)
            if linear.role in (Role.CROSS_K, Role.CROSS_V):
                shared_inputs.add(group)  # the encoder output: one tensor for all layers
            if not keeps_inputs and group not in shared_inputs:
                extra += e * linear.d_in * tokens_share
            shared_inputs.add(group)
            extra += lora_bytes * setup.lora_rank * tokens_share
        if profile.adapts_fused_slices:
            extra += lora_bytes * _zero_pad_width(roles, q_out, kv_out)
        if extra:
            out.terms.append(Term("lora", "LoRA branches (dropout output, mask, x·A)",
                                  "Σ targeted (b·d_in + d_in + b·r)", extra))

    # --- forward working set of one layer ----------------------------------------------------
    if kernel in (Kernel.EAGER, Kernel.MATH):
        scores = stack.n_heads * s * 2 * (2 if n.autocast else q_bytes)  # q·kᵀ, + mask
        kept_scores = stack.n_heads * s * (softmax + probs_copy)
        out.forward_transient = scores + (kept_scores if setup.grad_ckpt else 0)
        if stack.returns_attention_probs and kernel is Kernel.EAGER and setup.grad_ckpt:
            # the previous layer's, which checkpointing would otherwise have dropped
            out.forward_transient += stack.n_heads * s * softmax

    # --- backward transient of one layer -----------------------------------------------------
    # The MLP's backward runs first, with everything the layer saved still alive; by the
    # attention's backward the MLP's saved tensors are gone (the trace: at an eager layer's
    # softmax backward only the attention's tensors remain). The larger of the two is the
    # layer's backward peak above what it saved.
    mlp_transient = 2 * e * inter * experts
    # A fused kernel's backward writes dq, dk and dv (and reads the output's gradient).
    attention_transient = 2 * e * (q_out + 2 * kv_width)
    if kernel in (Kernel.EAGER, Kernel.MATH):
        # At the softmax's backward: the fp32 gradient of the probabilities and the softmax's
        # fp32 gradient output, while the 16-bit copy of the probabilities is already freed
        # (the trace: softmax, its gradient and the softmax backward's output, all fp32);
        # of the per-token gradients only the output's and v's exist yet.
        attention_transient = e * (q_out + kv_width) + stack.n_heads * s * (
            2 * softmax - probs_copy)
    # With a norm of its own before the MLP (pre-norm blocks), that norm's backward has run
    # too; a parallel block's shared norm waits for both branches.
    mlp_norm = norms // stack.n_norms if stack.n_norms >= 2 else 0
    after_mlp = attention_transient - mlp - mlp_norm
    out.backward_transient = max(mlp_transient, after_mlp)
    out.backward_peak_in_attention = after_mlp > mlp_transient
    if stack.n_experts and full and runs_transformers_code(profile):
        experts_saved = mlp - FP32 * stack.n_experts  # what the experts keep, all of them
        gathered = experts * 2 * e * h  # each expert's gathered input and scaled output
        out.moe = moe_bank_backward(setup, profile, stack, n, experts_saved, gathered,
                                    mlp_transient)
    return out


def experts_run_grouped(setup: TrainingSetup, profile: StackProfile) -> bool:
    """Transformers' `grouped_mm` experts need bf16 operands: bf16 weights without autocast.
    Anything else runs the eager per-expert loop (transformers/integrations/moe.py)."""
    bf16_weights = setup.precision is Precision.BF16_TRUE or (
        zero_half_model(setup) and setup.precision is Precision.BF16_MIXED)  # no autocast
    return runs_transformers_code(profile) and bf16_weights


def moe_bank_backward(setup: TrainingSetup, profile: StackProfile, stack: Stack, n: Numerics,
                      experts_saved: int, gathered: int, mlp_transient: int) -> MoeBackward:
    """Per token, at the gate/up bank's gradient write (see `MoeBackward`; found by the trace).

    grouped_mm: the experts' saved tensors are freed but the gathered input and the scaled
    output; the gradient of the gate/up output ([tokens·top-k, 2·I]) is in flight.
    Eager loop: the peak comes at the second expert processed (the bank buffer holds the first
    one's gradient, the second's arrives), when the other E − 2 experts' saved tensors are still
    alive, and the gradient of the layer's input is being gathered ([tokens, h]).
    """
    if experts_run_grouped(setup, profile):
        return MoeBackward(experts_saved - gathered - mlp_transient, loop=False)
    freed = experts_saved * 2 // stack.n_experts
    return MoeBackward(freed - n.residual * _hidden(stack), loop=True)


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


def _lora_branch_bytes(setup: TrainingSetup, lora_bytes: int, d_in: int, n: Numerics) -> int:
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


@dataclass(frozen=True, slots=True)
class HeadActivations:
    """The final norm, the logits and the loss, per token."""

    saved: int  # alive at the end of the forward (the head's output and what it keeps)
    loss_peak: int  # the most alive while the loss runs forward and backward
    formula: str
    label: str
    #: Alive while the layers run their backward (None until `head_activations` sets it).
    kept: int | None = None
    #: Alive right after the training stack casts the model's output (0: no cast).
    cast: int = 0


def head_activations(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                     ) -> HeadActivations:
    """Logits and loss per token, and what of them the layers' backward still sees.

    Once the loss and the head have run their backward, their saved tensors are freed; what
    remains is the gradient of the last hidden state, and the logits themselves where the
    training loop still holds them (LitGPT). The trace showed HF's logits gone by then.
    """
    head = _head_activations(model, setup, profile)
    if head.kept is not None:
        return head
    n = numerics(setup, profile)
    grad_hidden = n.compute * model.hidden_size
    logits = n.compute * model.vocab_size if profile.keeps_logits else 0
    return replace(head, kept=grad_hidden + logits)


def _head_activations(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                      ) -> HeadActivations:
    """Logits and loss per token.

    HF: logits (e·V) → `.float()` (4·V) → log_softmax kept (4·V); backward holds the kept
    log-probabilities, their gradient and the logits' gradient at once (12·V bytes).
    LitGPT: chunked head and chunked cross-entropy in 16 bits: logits (2·V) and their
    log-softmax (2·V) alive, the gradients replace them chunk by chunk.
    torchtune's chunked loss upcasts per chunk: 16-bit logits + fp32 log-probabilities.
    """
    n = numerics(setup, profile)
    vocab = model.vocab_size
    if model.head_kind.value == "classifier":
        return HeadActivations(saved=0, loss_peak=0, formula="a few values per sequence",
                               label="classification head", kept=0)
    full = setup.method is Method.FULL
    norm = (FP32 + (n.compute if full else 0)) * model.hidden_size
    if full or (profile.quantizes_head and profile.quantized_linear_keeps_input):
        norm += n.compute * model.hidden_size  # the lm_head input
    elif head_targeted(setup):
        norm += (profile.adapter_bytes + 1) * model.hidden_size
    logits = (2 if n.autocast else n.compute) * vocab  # autocast: the head matmul is 16-bit
    if profile.casts_output_to_fp32 and n.compute != FP32 and not profile.compiled:
        return _fabric_head(norm, vocab, n.compute, setup, profile.chunked_loss)
    if profile.compiled:
        # A compiled cross-entropy keeps the 16-bit logits and a logsumexp per token. Its
        # backward frees each chunk's logits as it writes that chunk's gradient, so chunked
        # losses peak at one extra chunk (torchtune: 8 chunks); unchunked at a full copy.
        saved = norm + logits + FP32
        extra = logits // TORCHTUNE_CHUNKS if profile.chunked_loss else logits
        return HeadActivations(saved, saved + extra, "16-bit logits + logsumexp (compiled)",
                               "logits and compiled cross-entropy")
    if profile.chunked_loss and not profile.upcasts_logits:
        saved = norm + 2 * logits
        return HeadActivations(saved, saved + logits // 4,
                               "16-bit logits + 16-bit log-softmax, in chunks",
                               "logits and chunked cross-entropy")
    if profile.chunked_loss:
        saved = norm + logits + FP32 * vocab
        return HeadActivations(saved, saved + logits,
                               "16-bit logits + fp32 log-softmax per chunk",
                               "logits and chunked fp32 cross-entropy")
    if model.final_softcap:
        norm += logits  # tanh(logits / cap) is kept for its backward (Gemma 2)
    up = FP32 * vocab if profile.upcasts_logits else logits
    # The loss's forward still runs inside autocast (its cached casts alive): the 16-bit
    # logits, their fp32 copy and the log-softmax (the trace: 10 bytes per token and entry).
    loss_forward = norm + (logits if up != logits else 0) + 2 * up
    loss_peak = norm + 3 * up + (logits if profile.keeps_logits else 0)
    return HeadActivations(loss_forward, max(loss_peak, loss_forward),
                           "logits (e·V) → fp32 (4·V) → log-softmax (4·V); backward 3 × 4·V",
                           "logits and cross-entropy (fp32)")


#: LitGPT's fine-tuning scripts run the lm_head on 128-token chunks (lm_head_chunk_size=128).
LITGPT_HEAD_CHUNK = 128


def _fabric_head(norm: int, vocab: int, e: int, setup: TrainingSetup,
                 chunked: bool) -> HeadActivations:
    """LitGPT under Lightning Fabric: `_FabricModule.forward` passes the model's output through
    the precision plugin's `convert_output`, which casts floating tensors to the default dtype
    (fp32) (lightning/fabric/wrappers.py; plugins/precision/half.py, bitsandbytes.py). The
    logits the loss sees are fp32 copies of the e-byte chunks, and the loss runs in fp32.

    Per token: at the head, the previous step's fp32 logits (the loop still holds them, unless
    that step was shorter: `longest_batch_repeats`) and the new e-byte chunks; right after
    the cast, the new fp32 copies too; in the loss, the fp32 logits and their fp32
    log-softmax, plus one chunk's nll gradient and log-softmax gradient; in the layers'
    backward, the fp32 logits the loop keeps.
    """
    new, f32 = e * vocab, FP32 * vocab
    s = setup.seq_len
    share = min(LITGPT_HEAD_CHUNK, s) / s if chunked else 1.0
    previous = f32 if setup.longest_batch_repeats else 0  # the loop still holds them
    at_head = norm + previous + new
    loss = norm + 2 * f32 + int(2 * f32 * share)
    return HeadActivations(
        saved=at_head, loss_peak=loss, kept=norm + f32, cast=at_head + f32,
        formula="e·V (new logits) + 4·V (previous step's) → 4·V cast; loss 2 × 4·V + a chunk",
        label="logits cast to fp32 by Fabric, chunked fp32 cross-entropy" if chunked
        else "logits cast to fp32 by Fabric, fp32 cross-entropy")


@dataclass(frozen=True, slots=True)
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


def plan(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> ActivationPlan:
    """Activation memory of one micro-batch."""
    n = numerics(setup, profile)
    tokens = setup.micro_batch * setup.seq_len
    layers = [layer_activations(model, stack, setup, profile) for stack in model.stacks]
    head = head_activations(model, setup, profile)
    assert head.kept is not None  # head_activations always decides it
    per_layer_max = max(layer.bytes for layer in layers) * tokens
    transient = max(layer.backward_transient for layer in layers) * tokens
    offloaded = 0
    if setup.grad_ckpt:
        checkpointed = sum(layer.count for layer in layers) * n.residual * model.hidden_size
        if profile.checkpoint_keeps_ctx_attributes:
            checkpointed += sum(layer.count * layer.ctx_kept for layer in layers)
        checkpointed *= tokens
        stored = 0
        recompute = per_layer_max
        if setup.offload is Offload.ACTIVATIONS:
            offloaded = checkpointed
            checkpointed = 0
    else:
        checkpointed = 0
        stored = sum(layer.bytes * layer.count for layer in layers) * tokens
        recompute = 0
        if setup.offload is Offload.ACTIVATIONS:
            offloaded = stored - per_layer_max
            stored = per_layer_max
    moe = next((layer.moe for layer in layers if layer.moe is not None), None)
    return ActivationPlan(
        moe_freed_minus_inflight_bytes=None if moe is None else moe.freed_minus_inflight * tokens,
        moe_loop=moe is not None and moe.loop,
        mask_bytes=_mask_bytes(model, setup, profile, n),
        previous_step_bytes=_previous_step_bytes(model, setup, profile, layers) * tokens,
        layers=layers, head=head, tokens=tokens, checkpointed_bytes=checkpointed,
        stored_layers_bytes=stored, recompute_bytes=recompute, layer_bytes_max=per_layer_max,
        backward_transient_bytes=transient, head_saved_bytes=head.saved * tokens,
        forward_transient_bytes=max(layer.forward_transient for layer in layers) * tokens,
        backward_peak_in_attention=max(
            layers, key=lambda layer: layer.bytes + layer.backward_transient,
        ).backward_peak_in_attention,
        head_kept_bytes=head.kept * tokens, head_cast_bytes=head.cast * tokens,
        head_peak_bytes=head.loss_peak * tokens, offloaded_bytes=offloaded,
    )


def _previous_step_bytes(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
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
    kept = sum(layer.count * layer.ctx_kept for layer in layers)
    if profile.quantizes_head:
        kept += numerics(setup, profile).compute * model.hidden_size
    return kept


def _mask_bytes(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                n: Numerics) -> int:
    """HF materializes a [batch, 1, s, s] additive causal mask in the compute dtype when the
    kernel needs one (eager, math), and a second one for sliding-window layers (Gemma 2)."""
    hf = runs_transformers_code(profile)
    causal = [st for st in model.stacks if st.causal]
    if not hf or not causal:
        return 0
    kernels = {attention_kernel(model, st, setup, profile) for st in causal}
    s = setup.seq_len
    if not kernels & {Kernel.EAGER, Kernel.MATH}:
        # A fused kernel needs no mask, except a sliding window: HF then builds a boolean
        # [batch, 1, s, s] mask (SDPA turns it into each layer's bias, counted per layer).
        if Kernel.EFFICIENT in kernels and _needs_mask(model, setup, profile):
            return setup.micro_batch * s * s
        return 0
    masks = 2 if model.sliding_window and model.sliding_window < s else 1
    return masks * setup.micro_batch * s * s * n.compute
