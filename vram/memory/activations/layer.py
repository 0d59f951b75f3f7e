"""One layer stack's activations: each part's term, its forward and backward working sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from vram.memory.activations.context import MoeBackward, Term, layer_context
from vram.memory.activations.kernel import Kernel
from vram.memory.activations.lora import lora_term
from vram.memory.activations.terms import (
    attention_layout,
    attention_term,
    dropout_term,
    expert_lora_term,
    linear_inputs_term,
    mixer_term,
    mla_term,
    mlp_term,
    norms_term,
    qk_norm_term,
)
from vram.memory.activations.transients import (
    backward_peak,
    forward_working_set_per_token,
    moe_bank_backward,
)
from vram.model.lora_reach import Roles
from vram.model.spec import LayerStack, Mixer, ModelSpec
from vram.setup import TrainingSetup
from vram.stacks.profile import StackProfile


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
    #: The backward's transients in the MLP and in the attention (`BackwardPeak`); the larger
    #: is `backward_transient_per_token`.
    backward_mlp_per_token: int = 0
    backward_attention_per_token: int = 0
    #: What a layer's forward holds beyond what it keeps: eager attention's scores and masked
    #: scores (with checkpointing, its probabilities too, which it then drops).
    forward_transient_per_token: int = 0
    #: An MoE layer whose expert banks train: per token, what its backward holds beyond what the
    #: layer saved when the gate/up bank's gradient is written (see `moe_bank_backward`).
    moe: MoeBackward | None = None
    #: Layers of this stack before the first trainable one, which keep nothing and are not
    #: in `count` (`vram.memory.activations.lead`).
    before_first_trainable: int = 0
    #: Each term's texts as an estimate's line item: (key, label, formula). Made once per
    #: layer (its plan is remembered), not on every estimate that writes the terms out.
    item_texts: tuple[tuple[str, str, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lead = self.before_first_trainable
        frozen = f" ({lead} before the first adapter keep nothing)" if lead else ""
        object.__setattr__(self, "item_texts", tuple(
            (f"activations.{self.stack}.{term.key}",
             f"{term.label} × {self.count} {self.stack} layers{frozen}",
             f"tokens × layers × ({term.formula})") for term in self.terms))

    @property
    def bytes_per_token(self) -> int:
        return sum(t.bytes_per_token for t in self.terms)

    @property
    def fixed_bytes(self) -> int:
        """Bytes one layer keeps whatever the tokens (`Term.fixed_bytes`)."""
        return sum(t.fixed_bytes for t in self.terms)

    def bytes_for(self, tokens: int) -> int:
        """What one layer keeps for `tokens` tokens."""
        return self.bytes_per_token * tokens + self.fixed_bytes

    @property
    def ctx_kept_per_token(self) -> int:
        """Bytes held by MatMul4Bit as ctx attributes: non-reentrant checkpointing keeps them."""
        return sum(t.ctx_kept_per_token for t in self.terms)


def layer_activations(
    model: ModelSpec, stack: LayerStack, setup: TrainingSetup, profile: StackProfile,
    roles: Roles | None = None,
) -> LayerActivations:
    """Bytes one layer of `stack` keeps per token (attention scores per token × sequence);
    `roles`: what LoRA adapts, when not the setup's targets (`layer_context`)."""
    c = layer_context(model, stack, setup, profile, roles)
    layout = attention_layout(c)
    attends = stack.mixer is Mixer.ATTENTION or stack.parallel_ssm
    if not attends:  # no scores to hold: the mixer's kernel is fused
        layout = replace(layout, kernel=Kernel.FLASH)
    norms = norms_term(c)
    mlp = mlp_term(c)
    parts = (norms, linear_inputs_term(c), qk_norm_term(c),
             attention_term(c, layout) if attends else None,
             mixer_term(c), mla_term(c), mlp, dropout_term(c), lora_term(c),
             expert_lora_term(c))
    peak = backward_peak(c, layout, mlp_per_token=mlp.bytes_per_token,
                         norms_per_token=norms.bytes_per_token)
    return LayerActivations(
        stack=stack.name, count=stack.count, terms=tuple(t for t in parts if t is not None),
        backward_transient_per_token=peak.transient_per_token,
        backward_peak_in_attention=peak.in_attention,
        backward_mlp_per_token=peak.mlp_per_token,
        backward_attention_per_token=peak.attention_per_token,
        forward_transient_per_token=forward_working_set_per_token(c, layout),
        moe=moe_bank_backward(c, mlp.bytes_per_token),
    )
