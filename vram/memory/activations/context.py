"""What every part of a layer reads (`LayerContext`, built once per layer stack), and the
`Term` each part returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.memory.activations.kernel import (
    Kernel,
    attention_kernel,
)
from vram.model.lora_reach import LoraReach, Roles, lora_reach
from vram.model.spec import LayerStack, ModelSpec, Role
from vram.setup import Method, TrainingSetup
from vram.stacks.precision import PrecisionPolicy
from vram.stacks.profile import StackProfile, runs_transformers_code


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
    #: Bytes per layer whatever the tokens (PEFT's bank-sized copy of an adapted expert bank).
    fixed_bytes: int = 0


@dataclass(frozen=True, slots=True)
class MoeBackward:
    """Where an MoE layer's backward peaks: when the gate/up bank's gradient is written.

    Transformers 5 keeps each expert bank as one 3-D parameter. Its default experts
    implementation, `grouped_mm` (any dtype on CUDA: `vram.trace.moe`), writes the whole bank's
    gradient at once, after down_proj's bank gradient became `.grad`. The eager experts loop
    (`experts_implementation="eager"`) indexes the bank per expert (`gate_up_proj[e]`), so each
    expert's weight gradient arrives as a bank-sized `select_backward` tensor that autograd adds
    into the bank's gradient buffer, one expert after another (the trace, the H200 runs,
    transformers/integrations/moe.py@v5.24.0).
    """

    #: Saved tensors already freed at that moment, minus the activation gradients in flight
    #: (a negative number when more is in flight than freed).
    freed_minus_inflight_per_token: int
    #: The eager per-expert loop (True) or grouped_mm (False).
    loop: bool


@dataclass(frozen=True, slots=True)
class LayerContext:
    """The facts of one layer under one setup that its parts share (read-only)."""

    model: ModelSpec
    stack: LayerStack
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
    #: What LoRA adapts: nn.Linear roles, expert banks, the router (`vram.model.lora_reach`).
    reach: LoraReach
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
    def score_columns(self) -> int:
        """Keys each query's explicit scores span: the sequence, and one sink logit per head
        where the layer has sinks (gpt-oss concatenates them before its softmax)."""
        return self.setup.seq_len + (1 if self.stack.attention_sinks else 0)

    @property
    def roles(self) -> Roles:
        """The nn.Linear roles LoRA adapts (`EVERY_LINEAR`, or roles; none without adapters)."""
        return self.reach.roles

    def bank_grad(self, *roles: Role) -> bool:
        """Whether an expert bank of these roles gets a weight gradient: every bank in a full
        fine-tune, the banks LoRA adapts (`vram.model.lora_reach`) otherwise."""
        return self.full or any(self.reach.banks.get(role, 0) for role in roles)

    @property
    def experts(self) -> int:
        """Expert MLPs each token runs (1 for a dense MLP)."""
        return self.stack.experts_per_token or 1

    @property
    def routed_rows(self) -> float:
        """Rows this rank's routed experts compute per token of its own: top-k, times the
        capacity factor under expert parallel (balanced routing: 1; `capacity_factor`)."""
        return self.experts * self.setup.capacity_factor


def layer_context(model: ModelSpec, stack: LayerStack, setup: TrainingSetup,
                  profile: StackProfile, roles: Roles | None = None) -> LayerContext:
    """The layer's facts; `roles` overrides what LoRA adapts in it (a vision tower's Linears
    are matched by their own names: `vram.memory.vision`)."""
    n = profile.precision
    full = setup.method is Method.FULL
    # a vision tower's own roles carry no expert banks and no router
    reach = lora_reach(model, setup, profile) if roles is None else LoraReach(roles)
    return LayerContext(
        model=model, stack=stack, setup=setup, profile=profile, n=n, full=full,
        keeps_inputs=full or profile.quantized_linear_keeps_input,
        bnb_kept=not full and profile.quantized_linear_keeps_input,
        reach=reach,
        hidden=hidden_width(stack), e=n.compute, q_out=stack.n_heads * stack.head_dim,
        kv_out=stack.n_kv_heads * stack.head_dim,
        v_out=stack.n_kv_heads * (stack.v_head_dim or stack.head_dim),
        o_width=stack.n_heads * (stack.v_head_dim or stack.head_dim),
        shared_norm=stack.parallel_residual and stack.n_norms == 1,
        kernel=attention_kernel(model, stack, setup, profile),
        hf=runs_transformers_code(profile),
    )


def hidden_width(stack: LayerStack) -> int:
    for linear in stack.linears:
        if linear.role in (Role.Q, Role.QKV):
            return linear.d_in
    return stack.linears[0].d_in
