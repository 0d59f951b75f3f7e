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

from dataclasses import dataclass, field

from vram.architecture import MlpKind, ModelSpec, NormKind, Role, Stack
from vram.params import head_targeted, is_targeted, targeted_roles
from vram.setup import Attention, Method, Offload, Precision, TrainingSetup
from vram.stack import StackProfile

FP32 = 4


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

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.terms)


@dataclass(frozen=True, slots=True)
class Numerics:
    compute: int  # bytes of a 16-bit or fp32 activation
    residual: int  # bytes of the residual stream (fp32 when the weights are fp32)
    autocast: bool


def numerics(setup: TrainingSetup) -> Numerics:
    """Activation dtypes of a precision recipe."""
    if setup.precision is Precision.FP32:
        return Numerics(compute=4, residual=4, autocast=False)
    if setup.precision is Precision.BF16_TRUE:
        return Numerics(compute=2, residual=2, autocast=False)
    return Numerics(compute=2, residual=4, autocast=True)


def _norm_bytes(stack: Stack, n: Numerics, *, weight_trains: bool) -> int:
    """One norm, per token: RMSNorm keeps an fp32 copy of its input (+ normalized x if trained);
    LayerNorm keeps its input and fp32 mean/rstd."""
    h_norm = stack.n_heads * 0 + _hidden(stack)
    if stack.norm_kind is NormKind.RMS:
        kept = FP32 * h_norm
        if weight_trains:
            kept += (FP32 if n.residual == FP32 else n.compute) * h_norm
        return kept
    return n.residual * h_norm + 2 * FP32


def _hidden(stack: Stack) -> int:
    for linear in stack.linears:
        if linear.role in (Role.Q, Role.QKV):
            return linear.d_in
    return stack.linears[0].d_in


def _consumers_input_bytes(n: Numerics, n_linears: int) -> int:
    """Bytes per hidden unit kept as Linear inputs after a norm when the Linears train.

    Without autocast the Linears share one input tensor; under autocast each call casts the
    fp32 input to 16 bits anew, and each cast copy is kept (autocast caches only leaf casts).
    """
    if n.autocast:
        return n.compute * n_linears
    return n.compute if n.residual == n.compute else n.residual


def layer_activations(
    model: ModelSpec, stack: Stack, setup: TrainingSetup, profile: StackProfile,
) -> LayerActivations:
    """Bytes one layer of `stack` keeps per token (attention scores per token × sequence)."""
    n = numerics(setup)
    full = setup.method is Method.FULL
    roles = targeted_roles(setup) if setup.trains_adapters else frozenset()
    h = _hidden(stack)
    e = n.compute
    s = setup.seq_len
    q_out = stack.n_heads * stack.head_dim
    kv_out = stack.n_kv_heads * stack.head_dim
    out = LayerActivations(stack=stack.name, count=stack.count)
    lora_bytes = profile.adapter_bytes if not n.autocast else e

    def lora_extra(linear_d_in: int, linear_d_out: int) -> int:
        """PEFT/LitGPT LoRA branch: dropout output + its mask, then the rank-r activation."""
        r = setup.lora_rank
        if setup.lora_dropout > 0:
            return lora_bytes * linear_d_in + linear_d_in + lora_bytes * r
        return lora_bytes * linear_d_in + lora_bytes * r

    # --- norms and the inputs of the Linears that follow them -------------------------------
    attn_linears = [ln for ln in stack.linears if ln.role in (Role.Q, Role.K, Role.V, Role.QKV)]
    mlp_in = [ln for ln in stack.linears if ln.role in (Role.GATE, Role.UP, Role.GATE_UP)
              and ln.copies == 1]
    if not mlp_in:
        mlp_in = [ln for ln in stack.linears if ln.role is Role.UP and ln.copies == 1]
    norms = _norm_bytes(stack, n, weight_trains=full) * stack.n_norms
    out.terms.append(Term("norms", f"{stack.n_norms} norms", "n_norms × (4·h [+ e·h])", norms))
    if full:
        kept = _consumers_input_bytes(n, len(attn_linears)) * h
        kept += _consumers_input_bytes(n, max(1, len(mlp_in))) * h
        out.terms.append(Term("linear_inputs", "Linear inputs (attention in, MLP in)",
                              "e·h per Linear input (one copy per call under autocast)", kept))

    # --- attention -------------------------------------------------------------------------
    expand = profile.expands_kv and setup.attention is not Attention.FLASH
    kv_width = q_out if expand else kv_out
    qkv = e * (q_out + 2 * kv_width)
    attn = qkv + e * q_out  # q, k, v and the attention output
    if setup.attention is Attention.EAGER or (stack.attn_softcap and profile.expands_kv):
        # Scores are s×s per head: fp32 softmax output + its 16-bit cast (HF eager_attention).
        per_token_scores = stack.n_heads * s * (FP32 + (e if e != FP32 else 0))
        if stack.attn_softcap:
            per_token_scores += stack.n_heads * s * e  # tanh output of the soft-cap
        attn += per_token_scores
        label = "eager attention: q, k, v, output, s×s probabilities"
        formula = "e·(q + 2·kv + o) + a·s·(4 + e)"
    else:
        attn += FP32 * stack.n_heads  # logsumexp per head
        label = "fused attention (SDPA/flash): q, k, v, output, logsumexp"
        formula = "e·(q + 2·kv + o) + 4·a"
    if full or is_targeted(_role_linear(stack, Role.O), roles):
        attn += e * q_out  # the contiguous copy that feeds o_proj
    if stack.cross_attention:
        attn *= 2  # decoder layers of an encoder-decoder also attend to the encoder
    out.terms.append(Term("attention", label, formula, attn))

    # --- MLP ---------------------------------------------------------------------------------
    inter = stack.intermediate_size
    experts = stack.experts_per_token or 1
    if stack.mlp_kind is MlpKind.GATED:
        mlp = 3 * e * inter  # gate output, act(gate), up output
        down_trains = full or any(
            is_targeted(ln, roles) for ln in stack.linears if ln.role is Role.DOWN)
        if down_trains:
            mlp += e * inter
        formula = "e·I·(3 [+1 when down_proj trains])"
    else:
        mlp = e * inter  # activation input
        if full or any(is_targeted(ln, roles) for ln in stack.linears if ln.role is Role.DOWN):
            mlp += e * inter
        formula = "e·I·(1 [+1 when fc2 trains])"
    mlp *= experts
    if stack.n_experts:
        # MoE: each expert gathers its tokens (a copy) and scales its output by the router.
        mlp += experts * (2 * e * h) + FP32 * stack.n_experts
        formula += " × top-k + routing copies"
    out.terms.append(Term("mlp", f"MLP ({stack.mlp_kind.value})", formula, mlp))

    # --- LoRA branches -----------------------------------------------------------------------
    if setup.trains_adapters:
        extra = 0
        seen_fused_input = False
        for linear in stack.linears:
            if not is_targeted(linear, roles):
                continue
            if profile.adapts_fused_slices and linear.role in (Role.Q, Role.K, Role.V):
                # LitGPT: one LoRAQKVLinear with one dropout for all selected slices.
                if seen_fused_input:
                    extra += lora_bytes * setup.lora_rank
                    continue
                seen_fused_input = True
            extra += lora_extra(linear.d_in, linear.d_out) * (
                experts if linear.copies > 1 else 1)
        if extra:
            out.terms.append(Term("lora", "LoRA branches (dropout output, mask, x·A)",
                                  "Σ targeted (b·d_in + d_in + b·r)", extra))

    # --- backward transient of one layer -----------------------------------------------------
    out.backward_transient = 2 * e * inter * experts + 2 * e * (q_out + 2 * kv_width)
    if setup.attention is Attention.EAGER:
        out.backward_transient += stack.n_heads * s * (FP32 + e)
    return out


def _role_linear(stack: Stack, role: Role):  # type: ignore[no-untyped-def]
    for linear in stack.linears:
        if linear.role is role:
            return linear
    return stack.linears[0]


@dataclass(frozen=True, slots=True)
class HeadActivations:
    """The final norm, the logits and the loss, per token."""

    saved: int  # kept from forward into backward
    loss_peak: int  # the most alive while the loss runs forward and backward
    formula: str
    label: str


def head_activations(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                     ) -> HeadActivations:
    """Logits and loss per token.

    HF: logits (e·V) → `.float()` (4·V) → log_softmax kept (4·V); backward holds the kept
    log-probabilities, their gradient and the logits' gradient at once (12·V bytes).
    LitGPT: chunked head and chunked cross-entropy in 16 bits: logits (2·V) and their
    log-softmax (2·V) alive, the gradients replace them chunk by chunk.
    torchtune's chunked loss upcasts per chunk: 16-bit logits + fp32 log-probabilities.
    """
    n = numerics(setup)
    vocab = model.vocab_size
    if model.head_kind.value == "classifier":
        return HeadActivations(saved=0, loss_peak=0, formula="a few values per sequence",
                               label="classification head")
    full = setup.method is Method.FULL
    norm = (FP32 + (n.compute if full else 0)) * model.hidden_size
    if full:
        norm += n.compute * model.hidden_size  # the lm_head input
    elif head_targeted(setup):
        norm += (profile.adapter_bytes + 1) * model.hidden_size
    logits = n.compute * vocab
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
    up = FP32 * vocab if profile.upcasts_logits else logits
    saved = norm + up + (logits if profile.keeps_logits else 0)
    loss_peak = norm + 3 * up + (logits if profile.keeps_logits else 0)
    return HeadActivations(saved, max(loss_peak, norm + logits + 2 * up),
                           "logits (e·V) → fp32 (4·V) → log-softmax (4·V); backward 3 × 4·V",
                           "logits and cross-entropy (fp32)")


@dataclass(frozen=True, slots=True)
class ActivationPlan:
    """Activation bytes for the whole micro-batch at the moments that can be the peak."""

    layers: list[LayerActivations]
    head: HeadActivations
    tokens: int
    checkpointed_bytes: int  # saved layer inputs under checkpointing
    stored_layers_bytes: int  # all layers' saved tensors (0 under checkpointing)
    recompute_bytes: int  # one layer recomputed in backward (checkpointing)
    backward_transient_bytes: int
    head_saved_bytes: int
    head_peak_bytes: int
    offloaded_bytes: int


def plan(model: ModelSpec, setup: TrainingSetup, profile: StackProfile) -> ActivationPlan:
    """Activation memory of one micro-batch."""
    n = numerics(setup)
    tokens = setup.micro_batch * setup.seq_len
    layers = [layer_activations(model, stack, setup, profile) for stack in model.stacks]
    head = head_activations(model, setup, profile)
    per_layer_max = max(layer.bytes for layer in layers) * tokens
    transient = max(layer.backward_transient for layer in layers) * tokens
    offloaded = 0
    if setup.grad_ckpt:
        checkpointed = sum(layer.count for layer in layers) * n.residual * model.hidden_size
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
    return ActivationPlan(
        layers=layers, head=head, tokens=tokens, checkpointed_bytes=checkpointed,
        stored_layers_bytes=stored, recompute_bytes=recompute,
        backward_transient_bytes=transient, head_saved_bytes=head.saved * tokens,
        head_peak_bytes=head.loss_peak * tokens, offloaded_bytes=offloaded,
    )
