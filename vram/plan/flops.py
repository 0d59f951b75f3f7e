"""Training FLOPs per token: the matmul count of a step, divided by the tokens it trains.

    6N per token for a full fine-tune (forward 2N, backward 4N: input and weight gradients),
    about 4N for LoRA/QLoRA (the frozen base's forward and input gradients, plus the
    adapters' own 6 x adapter params), +2N (one more forward) under full checkpointing,
    plus attention's sequence term 12 x layers x d_attn x seq (forward 4 x L x d x s:
    QK^T and AV; the backward twice that), as PaLM (Chowdhery et al. 2022, appendix B),
    nanoGPT's `estimate_mfu` and llm-analysis count it (causal masking is not halved).

N here counts the weights that multiply every token (MoE experts by their top-k share, the
output head even when tied), not the embedding lookup.
"""

from __future__ import annotations

from enum import StrEnum

from vram.model.architecture import HeadKind, ModelSpec
from vram.setup import Method, TrainingSetup


class Recompute(StrEnum):
    """How much of the forward a checkpointed step runs again."""

    NONE = "none"
    #: torchtitan's per-op policy keeps every other matmul's output: about half a forward.
    SELECTIVE = "selective"
    FULL = "full"


#: Fraction of the forward's matmuls run again in the backward.
RECOMPUTED_FORWARD: dict[Recompute, float] = {
    Recompute.NONE: 0.0,
    Recompute.SELECTIVE: 0.5,
    Recompute.FULL: 1.0,
}


def matmul_params_per_token(model: ModelSpec) -> float:
    """Weights that multiply each token: linears (MoE experts by top-k share) and the head."""
    layers = sum(
        stack.count * sum(lin.d_in * lin.d_out * lin.copies * lin.token_fraction
                          for lin in stack.linears)
        for stack in model.stacks
    )
    head = model.vocab_size * model.hidden_size if model.head_kind is HeadKind.LM else 0
    return float(layers + head)


def attention_flops_per_token_forward(model: ModelSpec, seq_len: int) -> float:
    """4 x d_attn x context per layer (QK^T and AV, 2 FLOPs per multiply-add each)."""
    total = 0.0
    for stack in model.stacks:
        context = min(seq_len, model.sliding_window or seq_len)
        total += stack.count * 4.0 * stack.n_heads * stack.head_dim * context
    return total


def flops_per_token(model: ModelSpec, setup: TrainingSetup, trainable_params: int,
                    recompute: Recompute | None = None) -> float:
    """Training FLOPs per token of `setup` (see the module docstring for the count)."""
    n = matmul_params_per_token(model)
    attention = attention_flops_per_token_forward(model, setup.seq_len)
    if recompute is None:
        recompute = Recompute.FULL if setup.grad_ckpt else Recompute.NONE
    # full: forward 2N, backward 4N (input and weight gradients); LoRA: the frozen base's
    # forward 2N and input gradients 2N, and the adapters train fully (6 per parameter)
    full = setup.method is Method.FULL
    matmuls = 6.0 * n if full else 4.0 * n + 6.0 * trainable_params
    # attention has no weights: forward 1x, backward 2x, whatever is trained
    total = matmuls + 3.0 * attention
    return total + RECOMPUTED_FORWARD[recompute] * (2.0 * n + attention)


def checkpointing_compute(model: ModelSpec, setup: TrainingSetup, trainable_params: int,
                          ) -> float:
    """What full gradient checkpointing adds to a step's compute, as a fraction: the forward
    run again in the backward (+2N per token) against the step without it, about +33 % for a
    full fine-tune (2N over 6N) and +50 % for LoRA (2N over 4N), whatever the setup's own
    `grad_ckpt` (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost")."""
    without = flops_per_token(model, setup, trainable_params, Recompute.NONE)
    with_ckpt = flops_per_token(model, setup, trainable_params, Recompute.FULL)
    return with_ckpt / without - 1.0
