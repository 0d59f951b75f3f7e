"""What runs before the first trainable tensor keeps nothing for backward.

Autograd records an op, and keeps its saved tensors, only when one of its inputs requires grad
(torch/csrc/autograd/function.h@v2.13.0 `compute_requires_grad`; a custom Function's ctx is
dropped with its output when none does). Under LoRA and QLoRA the embedding is frozen, so the
hidden state requires grad only from the first adapter's output on, unless the stack makes the
embedding's output require grad (`StackProfile.input_requires_grad`: transformers' and PEFT's
checkpointing call `enable_input_require_grads`). Then every layer before the first layer
holding a trainable tensor keeps nothing (a hybrid whose first layers are Mamba, Gated
DeltaNet or convolution blocks LoRA'd on its attention: Nemotron-H, Jamba, Qwen3.5, LFM2), and
in that first layer so do the parts before its adapters: the input norm, the q/k norm of a
projection not adapted, a parallel mixer whose projections are not adapted (Falcon-H1).

Keyed to the setup's targets and the model's layer order (`LayerStack.positions`); a
vision-language model (image tokens from a trained tower) and an encoder-decoder keep every
layer, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vram.memory.activations.context import Term
from vram.memory.activations.layer import LayerActivations
from vram.model.lora_reach import LoraReach, bank_rank_factor, lora_reach, module_adapted
from vram.model.spec import FUSED_PARTS, LayerStack, ModelSpec, Role
from vram.setup import TrainingSetup
from vram.stacks.profile import StackProfile

#: The Linears that read a layer's input norm on its mixing side (attention or mixer), and
#: those that write its output.
_MIXING_IN = frozenset({Role.Q, Role.K, Role.V, Role.QKV, Role.MIXER_IN})
_MIXING_OUT = frozenset({Role.O, Role.MIXER_OUT})
_MLP_IN = frozenset({Role.GATE, Role.UP, Role.GATE_UP})
_MLP = _MLP_IN | {Role.DOWN, Role.ROUTER}

@dataclass(frozen=True, slots=True)
class FrozenLead:
    """Where the first trainable layer is: its stack, and per stack the layers before it."""

    before: tuple[int, ...]
    first: int


def layer_positions(model: ModelSpec) -> list[tuple[int, ...]]:
    """Each stack's layer indices: as the family interleaved them, else one stack after
    another."""
    if all(stack.positions for stack in model.stacks):
        return [stack.positions for stack in model.stacks]
    positions, start = [], 0
    for stack in model.stacks:
        positions.append(tuple(range(start, start + stack.count)))
        start += stack.count
    return positions


def _trains(stack: LayerStack, reach: LoraReach, profile: StackProfile) -> bool:
    """Whether a layer of `stack` holds a tensor LoRA trains: an adapted Linear, an adapted
    expert bank, or the router's adapter."""
    return any(module_adapted(linear, reach, profile) or bank_rank_factor(linear, reach, profile)
               or (linear.role is Role.ROUTER and reach.router) for linear in stack.linears)


def frozen_lead(model: ModelSpec, setup: TrainingSetup,
                profile: StackProfile) -> FrozenLead | None:
    """The layers before the first trainable one (None: every layer keeps its saved set)."""
    if profile.input_requires_grad or model.vision is not None or model.is_encoder_decoder:
        return None
    reach = lora_reach(model, setup, profile)
    positions = layer_positions(model)
    starts = [where[0] for stack, where in zip(model.stacks, positions, strict=True)
              if _trains(stack, reach, profile)]
    if not starts:
        return None
    p = min(starts)
    return FrozenLead(before=tuple(sum(1 for i in where if i < p) for where in positions),
                      first=next(i for i, where in enumerate(positions) if p in where))


def _adapted_roles(stack: LayerStack, reach: LoraReach, profile: StackProfile) -> set[Role]:
    """The roles of `stack`'s adapted Linears, a fused projection's parts included."""
    roles: set[Role] = set()
    for linear in stack.linears:
        if module_adapted(linear, reach, profile):
            roles |= {linear.role, *FUSED_PARTS.get(linear.role, frozenset())}
    return roles


def _kept_fractions(stack: LayerStack, roles: set[Role]) -> dict[str, tuple[int, int]]:
    """Of each term of the first trainable layer, the fraction (numerator, denominator) that
    runs after its first adapter: by where that adapter is.

    - On the mixing side's input (q, k, v, a mixer's in_proj): the input norm ran before (a
      pre-norm layer's first of `n_norms`); a q or k norm keeps on an adapted projection's
      output only; a mixer beside the attention (Falcon-H1) keeps only when adapted itself;
      a parallel block's MLP (and its own norm) only when adapted.
    - On its output (o_proj, out_proj): the whole mixing side ran before.
    - Only in the MLP: the norms before it too (all but a post-norm or sandwich layer's last),
      and the attention branch's residual dropout.
    A latent-attention (MLA) layer drops its input norm only."""
    n_norms, post = stack.n_norms, stack.post_norm or not stack.input_norm
    mlp_adapted = bool(roles & _MLP)
    if roles & _MIXING_IN or stack.kv_lora_rank:
        q_out, kv_out = stack.n_heads * stack.head_dim, stack.n_kv_heads * stack.head_dim
        kept = {"norms": (n_norms - (0 if post else 1), n_norms),
                "qk_norm": ((q_out if Role.Q in roles else 0)
                            + (kv_out if Role.K in roles else 0), q_out + kv_out)}
        if stack.kv_lora_rank:
            return {"norms": kept["norms"]}
        if stack.parallel_ssm and Role.MIXER_IN not in roles:
            kept["mixer"] = (0, 1)
    elif roles & _MIXING_OUT:
        kept = {"norms": (n_norms - (0 if post else 1), n_norms), "qk_norm": (0, 1),
                "attention": (0, 1), "mixer": (0, 1)}
    else:
        before_mlp = n_norms - 1 if post or n_norms >= 4 else n_norms
        return {"norms": (n_norms - before_mlp, n_norms), "qk_norm": (0, 1),
                "attention": (0, 1), "mixer": (0, 1), "dropout": (1, 2)}
    if stack.parallel_residual and not mlp_adapted:
        kept["mlp"] = (0, 1)
        if n_norms >= 2:
            kept["norms"] = (kept["norms"][0] - 1, n_norms)
    return kept


def _first_adapters_masks(stack: LayerStack, reach: LoraReach, profile: StackProfile,
                          roles: set[Role]) -> int:
    """Per token, the LoRA dropout masks of the first layer's first adapters: their input needs
    no gradient, so their dropout keeps no mask (1 byte × d_in each, counted in `lora_term`;
    LitGPT's fused qkv drops once for all its slices)."""
    first = next((group for group in (_MIXING_IN, _MIXING_OUT, _MLP_IN, frozenset({Role.DOWN}))
                  if roles & group), frozenset())
    if first is _MIXING_IN and stack.parallel_residual:
        first = first | _MLP_IN  # the MLP reads the layer's input too
    masks, fused_seen = 0, False
    for linear in stack.linears:
        parts = {linear.role, *FUSED_PARTS.get(linear.role, frozenset())}
        if linear.is_bank or not module_adapted(linear, reach, profile) or not parts & first:
            continue
        if profile.adapts_fused_slices and linear.role in (Role.Q, Role.K, Role.V):
            if fused_seen:
                continue
            fused_seen = True
        masks += linear.d_in
    return masks


def _first_layer_terms(layer: LayerActivations, stack: LayerStack, roles: set[Role],
                       masks: int) -> tuple[Term, ...]:
    """The first trainable layer's terms, less what runs before its first adapter
    (`_kept_fractions`) and its first adapters' dropout masks (`masks` per token)."""
    fractions = _kept_fractions(stack, roles) if stack.n_norms else {}
    kept: list[Term] = []
    for term in layer.terms:
        numerator, denominator = fractions.get(term.key, (1, 1))
        per_token = term.bytes_per_token * max(numerator, 0) // denominator
        if term.key == "lora":
            per_token -= min(masks, per_token)
        if per_token:
            kept.append(replace(term, bytes_per_token=per_token))
    return tuple(kept)


def keeping_layers(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                   layers: list[LayerActivations],
                   ) -> tuple[list[LayerActivations], LayerActivations]:
    """The layers that keep their saved sets, one entry per stack (the first trainable layer
    apart where it keeps less), and the first trainable layer's own (the stack of the model's
    first layer when every layer keeps)."""
    lead = frozen_lead(model, setup, profile)
    if lead is None:
        return layers, layers[model.stacks.index(model.first_stack)]
    reach = lora_reach(model, setup, profile)
    stack = model.stacks[lead.first]
    roles = _adapted_roles(stack, reach, profile)
    masks = _first_adapters_masks(stack, reach, profile, roles) if setup.lora_dropout > 0 else 0
    kept: list[LayerActivations] = []
    first = layers[lead.first]
    for index, layer in enumerate(layers):
        count = layer.count - lead.before[index]
        if index == lead.first:
            terms = _first_layer_terms(layer, stack, roles, masks)
            if terms != layer.terms:
                first = replace(layer, stack=f"first adapted {layer.stack}", count=1,
                                terms=terms)
                kept.append(first)
                count -= 1
        if count:
            kept.append(replace(layer, count=count, before_first_trainable=lead.before[index]))
    return kept, first
