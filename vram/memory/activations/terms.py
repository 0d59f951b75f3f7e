"""One function per part of a layer, each returning the bytes per token autograd keeps for
it: norms and the Linear inputs they feed, attention, the MLP (dense or experts), MLA's latent,
dropout masks.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memory.activations.context import LayerContext, Term, hidden_width
from vram.memory.activations.kernel import (
    Kernel,
    needs_mask,
)
from vram.model.lora_reach import bank_rank_factor, is_bank_parameter
from vram.model.spec import LayerStack, MixerSaved, MlpKind, NormKind, Role
from vram.setup import Attention
from vram.stacks.precision import PrecisionPolicy
from vram.stacks.profile import StackProfile, runs_grouped_experts, runs_transformers_code
from vram.units import FP32_BYTES as FP32


def _norm_bytes_per_token(stack: LayerStack, n: PrecisionPolicy, profile: StackProfile, *,
                          weight_trains: bool, width: int | None = None) -> int:
    """One norm, per token.

    RMSNorm (HF LlamaRMSNorm, LitGPT RMSNorm) upcasts its input to fp32 and keeps that copy; a
    trained weight also needs the normalized input (16-bit in HF's Llama, fp32 in LitGPT and
    HF's Gemma, which multiply by the weight in fp32: the trace). Compiled, the norm is one
    fused kernel that keeps its input and 1/rms and recomputes the rest; matmul inputs and
    SDPA's tensors stay as they are (torchtune's cumulative table: compile saves 9.6 GB of
    38.7 GB of activations on Llama 3.2 3B, which is what the norms' fp32 copies weigh).
    `nn.LayerNorm` keeps its input and fp32 mean and rstd.
    """
    h = hidden_width(stack) if width is None else width
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
    fine-tune). Sequence parallel runs the norms on `1 / tp` of the tokens (torchtitan's
    `SequenceParallel` on both norms: Korthikanti et al. 2022, SS4.2.2)."""
    one = _norm_bytes_per_token(c.stack, c.n, c.profile, weight_trains=c.full)
    norms = one * c.stack.n_norms // c.profile.seq_split
    return Term("norms", f"{c.stack.n_norms} norms", "n_norms × (4·h [+ normalized])", norms)


def qk_norm_term(c: LayerContext) -> Term | None:
    """The RMSNorms on q and k (Qwen3, Gemma 3, OLMo 2/3, EXAONE 4, Apertus: `LayerStack.qk_norm`),
    per head or over the whole projection: each keeps what a hidden-size norm keeps (its fp32
    copy of the input, and the normalized input when its weight trains), over q's and k's
    widths (transformers/models/qwen3/modeling_qwen3.py@v5.24.0 Qwen3Attention: `q_norm(
    q_proj(x).view(*shape))`; the trace: fp32 [b, s, heads, d] copies of q and k)."""
    stack = c.stack
    if not stack.qk_norm:
        return None
    width = c.q_out + c.kv_out
    kept = _norm_bytes_per_token(stack, c.n, c.profile, weight_trains=c.full, width=width)
    return Term("qk_norm", "q and k norms", "4·(q + kv) [+ normalized, weight trained]", kept)


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
    attn_in = [ln for ln in stack.linears
               if ln.role in (Role.Q, Role.K, Role.V, Role.QKV, Role.MIXER_IN)]
    mlp_in = [ln for ln in stack.linears
              if ln.role in (Role.GATE, Role.UP, Role.GATE_UP) and not ln.is_bank]
    kept = _input_bytes_per_hidden_unit(n, len(attn_in)) * h
    # a shared norm's output is kept once, unless each Linear makes its own cast of it
    if not c.shared_norm or n.input_copy_per_linear or n.autocast:
        kept += _input_bytes_per_hidden_unit(n, max(1, len(mlp_in))) * h
    if stack.cross_attention:
        kept += _input_bytes_per_hidden_unit(n, 1) * h  # the cross-attention query's input
    return Term("linear_inputs", "Linear inputs (attention in, MLP in)",
                "e·h per norm output (one copy per call under autocast)", kept,
                ctx_kept_per_token=kept if c.bnb_kept else 0)


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
    stack, n, s, q_out = c.stack, c.n, c.score_columns, c.q_out
    a_b = a.qkv_bytes
    attn = a_b * (q_out + a.kv_width + a.v_width) + (0 if a.hf_eager else a_b * c.o_width)
    if a.kernel.explicit_scores:
        per_score = a.softmax_bytes
        if a.attn_dropout:
            per_score += 1  # the mask
            if a.kernel is Kernel.MATH:
                # SDPA's math path drops the fp32 probabilities (at::dropout: CUDA's fused
                # native_dropout, a bool mask) and its matmul with v keeps the dropped copy
                # (aten/src/ATen/native/transformers/attention.cpp@v2.13.0
                # _scaled_dot_product_attention_math)
                per_score += a.softmax_bytes
        if a.kernel is Kernel.EAGER:
            per_score += a.probs_copy_bytes
        if stack.attn_softcap and a.kernel is Kernel.EAGER:
            # tanh output of Gemma 2's soft-cap, in the dtype of the scores (16 bits under
            # autocast, even on an fp32 model)
            per_score += 2 if n.autocast else a_b
        attn += stack.n_heads * s * per_score
        if stack.attention_sinks and a.kernel is Kernel.EAGER:
            # gpt-oss subtracts each row's max before its softmax: max keeps its int64 index
            attn += 8 * stack.n_heads
        label = f"{a.kernel.value} attention: q, k, v, output, s×s probabilities"
        formula = "e·(q + 2·kv + o) + a·s·(4 [+ e] [+ dropout mask])"
    else:
        attn += FP32 * stack.n_heads  # logsumexp per head
        label = f"{a.kernel.value} attention kernel: q, k, v, output, logsumexp"
        formula = "e·(q + 2·kv + o) + 4·a"
        if a.kernel is Kernel.EFFICIENT and needs_mask(c.model, c.setup, c.profile, stack):
            # SDPA turns the boolean sliding-window mask into an additive bias in q's dtype on
            # every call, and the efficient kernel keeps that bias for its backward: one
            # [b, 1, s, s] tensor per layer.
            attn += s * a_b
            formula += " + s·e (the layer's attention bias)"
    if stack.qkv_view_kept:
        # v is a view of the fused qkv output: its q and k thirds stay alive with it, beside
        # the rotated q and k the kernel keeps (the trace of Qwen2.5-VL's vision blocks)
        attn += a_b * (q_out + c.kv_out)
        formula += " + e·(q + kv) (the fused qkv output, kept by v's view)"
    # o_proj's input: the attention output itself after a fused kernel in HF (it is laid out
    # [b, s, heads, d] already); a contiguous copy after eager/math attention, and in LitGPT
    # and torchtune, which reshape the transposed output.
    # On an upcast QLoRA model o_proj's Linear4bit casts the fp32 output to 16 bits and keeps
    # that cast instead (the trace: six 16-bit h-wide copies per layer, o's among them).
    o_in = 2 if n.input_copy_per_linear else a_b
    o_cast = n.input_copy_per_linear and a_b != 2  # fp32 output: o_proj casts and keeps
    if c.keeps_inputs and (o_cast or a.kernel.explicit_scores or not c.hf
                           or stack.attention_output_copied):
        attn += o_in * c.o_width
    ctx_kept = o_in * c.o_width if c.bnb_kept else 0  # o_proj's input, kept by MatMul4Bit
    if stack.cross_attention:
        attn *= 2  # decoder layers of an encoder-decoder also attend to the encoder
    return Term("attention", label, formula, attn, ctx_kept_per_token=ctx_kept)


def mixer_term(c: LayerContext) -> Term | None:
    """What a linear-attention, state-space or convolution mixer keeps for its backward beyond
    its input projection's input: with the kernels, what they save and what the PyTorch code
    around them keeps (`LayerStack.mixer_saved`, set by the family from the kernels'
    `save_for_backward` and the modeling file: docs/hybrid-layers.md); without them
    (`mixer_kernels` false), what transformers' PyTorch fallback keeps
    (`LayerStack.mixer_fallback`)."""
    if not c.profile.mixer_kernels and c.stack.mixer_fallback != MixerSaved():
        return saved_term(c, c.stack.mixer_fallback, "PyTorch fallback's")
    if c.stack.mixer_saved == MixerSaved():
        return None
    return saved_term(c, c.stack.mixer_saved, "kernel's")


def saved_term(c: LayerContext, f: MixerSaved, path: str) -> Term:
    """A mixer's saved set (`MixerSaved`) over one sequence of T tokens, padded to its chunk,
    per token: the weights' terms in a full fine-tune, the inner Linears' inputs when they
    keep them (bitsandbytes' MatMul4Bit as ctx attributes under QLoRA)."""
    t = c.setup.seq_len
    chunks = -(-t // f.chunk)
    elems = t * f.token + f.sequence + (t * f.trained if c.full else 0)
    fp32 = (t * f.token_fp32 + chunks * (f.chunk * f.padded_fp32 + f.chunk_fp32)
            + f.sequence_fp32 + (t * f.trained_fp32 if c.full else 0))
    inputs = c.e * f.linear_inputs if c.keeps_inputs else 0
    kept = -(-(c.e * elems + FP32 * fp32) // t) + inputs
    return Term("mixer", f"{c.stack.mixer.value} {path} saved tensors",
                "e·(saved elements) + 4·(fp32 elements), chunk-padded", kept,
                ctx_kept_per_token=inputs if c.bnb_kept else 0)


def activation_in_fp32(c: LayerContext) -> bool:
    """`gelu_new` as Transformers writes it, under autocast: it runs in fp32 (below)."""
    return c.stack.act_pow_fp32 and c.n.autocast and not (
        c.profile.fused_activations or c.profile.compiled)


def _activation_bytes(c: LayerContext, e: int, act_kept: int) -> int:
    """Bytes per I-wide unit the MLP activation keeps for backward. `gelu_new` under autocast:
    `torch.pow` is on CUDA's fp32 list (autocast_mode.h@v2.13.0 AT_FORALL_FP32), so pow keeps
    an fp32 copy of its input and tanh and 1 + tanh stay fp32; only 0.5·x keeps e bytes
    (transformers/activations.py@v5.24.0 NewGELUActivation)."""
    if c.stack.act_xielu and act_kept:
        return _xielu_bytes(c, e)
    if activation_in_fp32(c) and act_kept:
        return 3 * FP32 + e
    return act_kept * e


def _xielu_bytes(c: LayerContext, e: int) -> int:
    """transformers' Python xIELU (`LayerStack.act_xielu`), per I-wide unit: its input x (e), the
    1-byte mask `x > 0` its `where` keeps, α_p·x (kept by `· x`), expm1's output (kept by its
    own backward) and, when α_n trains, expm1 − x (kept by `· α_n`). α_p and α_n come out of
    softplus, which autocast runs in fp32 as it does expm1 (autocast_mode.h@v2.13.0
    AT_FORALL_FP32), and are (1,)-shaped, so under autocast those products are fp32; without
    autocast everything is in x's dtype (the trace)."""
    p = FP32 if c.n.autocast else e
    return e + 1 + p + p + (p if c.full else 0)


def experts_run_grouped(c: LayerContext) -> bool:
    """Transformers' experts run `grouped_mm`, not the eager loop (`runs_grouped_experts`)."""
    return runs_grouped_experts(c.setup, c.profile)


def expert_bytes(c: LayerContext) -> int:
    """Bytes per element of the routed experts' tensors. Transformers 5's `grouped_mm`, which
    autocast does not cover, runs a 3-D bank in the bank's own dtype (it casts the input to the
    bank's: transformers/integrations/moe.py@v5.24.0 `_grouped_mm`), so fp32 banks under
    autocast compute in fp32; the eager loop's `F.linear` is autocast's (16 bits). Experts as
    nn.Linear modules compute like the rest."""
    if not (c.hf and any(is_bank_parameter(linear, c.profile) for linear in c.stack.linears)):
        return c.e
    if experts_run_grouped(c):
        return c.n.weights if c.full else c.n.frozen_weights
    return 2 if c.n.autocast else c.e


def mlp_term(c: LayerContext) -> Term:
    """What the activation keeps, act(gate) and up (kept by their product; gated MLPs), and the
    down projection's input when it keeps it, once per expert a token visits. MoE adds each
    expert's gathered input (kept when its bank needs a gradient) and scaled output, and the
    router's fp32 probabilities; routed experts compute in `expert_bytes`."""
    stack, n, profile = c.stack, c.n, c.profile
    inter = stack.intermediate_size
    experts = c.experts
    act_kept = 1 if profile.fused_activations or profile.compiled else stack.act_saved
    down_in = 2 if n.input_copy_per_linear else c.e  # bnb's own bf16 copy on upcast models
    down_kept = down_in * inter if c.keeps_inputs else 0
    e = c.e
    banks = stack.n_experts > 0 and any(is_bank_parameter(ln, profile) for ln in stack.linears)
    if banks:
        # 3-D banks: not bitsandbytes layers; the down bank keeps its input for its gradient
        e = expert_bytes(c)
        down_in = e
        down_kept = e * inter if c.bank_grad(Role.DOWN) else 0
    if stack.act_output_is_down_input and down_kept and down_in == e:
        act_kept = 0  # ReLU's kept output is the tensor fc2 keeps (counted as down_kept)
    act_bytes = _activation_bytes(c, e, act_kept)
    if stack.mlp_kind is MlpKind.GATED:
        mlp = (act_bytes + 2 * e) * inter + down_kept
        formula = f"e·I·({act_kept} (activation) + 2 [+1 when down_proj keeps its input])"
    else:
        mlp = act_bytes * inter + down_kept
        formula = f"e·I·({act_kept} (activation) [+1 when fc2 keeps its input])"
    ctx_kept = down_in * inter * experts if c.bnb_kept and not banks else 0
    if stack.hidden_dropout > 0 and stack.mlp_inner_dropout:
        mlp += inter  # T5's dropout inside the feed-forward: its mask (its output is wo's input)
    mlp = int(mlp * c.routed_rows) if stack.n_experts else mlp * experts
    if stack.shared_expert_width:
        # the shared experts: one gated MLP of nn.Linear on every token (DeepseekV2Moe)
        width, shared_in = stack.shared_expert_width, 2 if n.input_copy_per_linear else c.e
        mlp += (_activation_bytes(c, c.e, act_kept) + 2 * c.e) * width
        mlp += shared_in * width if c.keeps_inputs else 0
        ctx_kept += shared_in * width if c.bnb_kept else 0
        formula += " + shared experts' e·W·(act + 2 [+1])"
    if stack.n_experts:
        # MoE: each expert gathers its tokens (a copy, which a trained bank's matmul keeps for
        # its weight gradient) and scales its output by the router (the product keeps it).
        gathered = e * c.hidden if c.bank_grad(Role.GATE_UP, Role.UP) else 0
        mlp += int(c.routed_rows * gathered) + experts * e * c.hidden + FP32 * stack.n_experts
        formula += " × top-k [× capacity factor] + routing copies"
        if c.setup.ep > 1:
            # expert parallel: the dispatched rows' permutation (torchtitan's `_permute`
            # indexes the received rows; index's backward keeps the int64 indices)
            mlp += int(EP_INDEX_BYTES * c.routed_rows)
            formula += " + 8·top-k·cf (EP permutation indices)"
        if c.hf and not experts_run_grouped(c):
            # the eager loop's `final.index_add_(0, idx, out * w)`: index_add_'s derivative
            # reads `source` (expand_as), so each expert's weighted output is saved, in the
            # router weights' dtype (the residual's)
            mlp += experts * n.residual * c.hidden
            formula += " + weighted outputs (index_add_ keeps them)"
    return Term("mlp", f"MLP ({stack.mlp_kind.value})", formula, mlp,
                ctx_kept_per_token=ctx_kept)


def expert_lora_term(c: LayerContext) -> Term | None:
    """LoRA on the expert banks (PEFT `ParamWrapper`), per layer whatever the tokens: each
    forward parametrizes an adapted bank as `baddbmm(W, B, A)` (one adapter) in the bank's own
    dtype, a bank-sized copy the experts' matmuls keep for their backward, and casts the factors
    to that dtype (peft/tuners/lora/layer.py@v0.21.2 `_LoraFactorsProxy`, `get_delta_factors`);
    an adapted router gets `W + ΔW` (`_LoraParameterProxy`) beside its ΔW. The bank's input and
    the down bank's input are then kept per token (`mlp_term`)."""
    reach, profile = c.reach, c.profile
    if not (reach.banks or reach.router) or c.full:
        return None
    w = profile.precision.frozen_weights
    casts = w != profile.precision.adapters  # factors already in the bank's dtype: no copy
    fixed = 0
    for linear in c.stack.linears:
        factor = bank_rank_factor(linear, reach, profile)
        if factor:
            rank = c.setup.lora_rank * factor
            fixed += w * linear.weight_params
            fixed += w * rank * linear.copies * (linear.d_in + linear.d_out) if casts else 0
        elif linear.role is Role.ROUTER and reach.router:
            fixed += 2 * w * linear.weight_params  # ΔW in the router's dtype, and W + ΔW
    if not fixed:
        return None
    return Term("expert_lora", "LoRA on expert banks: bank-sized adapted copies",
                "Σ adapted banks (E·in·out + r·E·(in + out)) × weight bytes, per layer", 0,
                fixed_bytes=fixed)


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


def _rope_width(stack: LayerStack) -> int:
    """MLA's rotary part of each q/k head: kv_a_proj_with_mqa's output beyond the latent."""
    kv_a = next(ln for ln in stack.linears if ln.role is Role.K)
    return kv_a.d_out - stack.kv_lora_rank


#: An int64 permutation index per dispatched row (torchtitan/models/common/moe/utils.py
#: `_permute`, called by expert_parallel.py@03a1384 `ExpertParallel._token_dispatch`).
EP_INDEX_BYTES = 8


def dropout_term(c: LayerContext) -> Term | None:
    """Dropout on the two residual branches keeps a 1-byte mask each (CUDA's fused dropout)."""
    if c.stack.hidden_dropout <= 0:
        return None
    return Term("dropout", "dropout masks on the residual branches", "1 byte × h per dropout",
                2 * c.hidden // c.profile.seq_split)
