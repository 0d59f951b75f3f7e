"""What a LoRA branch keeps for backward: the dropped-out input, the rank-wide middle, and
the zero-padded output of a fused projection's slices.
"""

from __future__ import annotations

from vram.memory.activations.context import LayerContext, Term
from vram.model.lora_reach import EVERY_LINEAR, Roles, module_adapted
from vram.model.spec import Role
from vram.setup import TrainingSetup
from vram.stacks.precision import PrecisionPolicy

#: Linears that read the same input tensor.
_INPUT_GROUP: dict[Role, str] = {
    Role.Q: "attn_in", Role.K: "attn_in", Role.V: "attn_in", Role.QKV: "attn_in",
    Role.GATE: "mlp_in", Role.UP: "mlp_in", Role.GATE_UP: "mlp_in",
    Role.CROSS_K: "encoder_out", Role.CROSS_V: "encoder_out",
}


def _zero_pad_width(roles: Roles, q_out: int, kv_out: int) -> int:
    """LitGPT's LoRAQKVLinear adapting some but not all of q, k, v scatters B's output into
    the fused width with `index_copy_`, whose backward keeps that output (its `source`): the
    selected slices' width per token (litgpt/lora.py LoRAQKVLinear.zero_pad; with all three
    selected it returns early). Learned from tracing LitGPT's own model code."""
    if roles is EVERY_LINEAR:
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
        if not module_adapted(linear, c.reach, profile):
            continue  # an expert bank's adapter keeps no branch: `expert_lora_term`
        tokens_share = experts if linear.is_bank else 1
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
        if linear.is_bank and linear.role in (Role.GATE, Role.UP, Role.GATE_UP):
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
