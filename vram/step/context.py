"""What the candidate moments of one step read, built once per estimate (`StepContext`), and
the `Moment`: what is alive at one point of the step beyond weights and optimizer state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

from vram.memory import activations as act
from vram.memory.gradients import GradientPart
from vram.memory.optimizer import steps_in_backward
from vram.memory.text_cache import text_cache_items
from vram.memory.vision import VisionPlan
from vram.memory.weights import Stage
from vram.model.spec import ModelSpec
from vram.result import LineItem, MomentId, Phase
from vram.setup import Offload, TrainingSetup
from vram.stacks.profile import StackProfile
from vram.step.draft import Alive, ItemDraft, ItemGroup

_bytes_of: Callable[[Alive], int] = attrgetter("bytes")


@dataclass(slots=True)
class Moment:
    """What is alive at one point of the step, beyond weights and optimizer state."""

    phase: Phase
    label: MomentId
    gradient_bytes: int
    activation_items: list[Alive] = field(default_factory=list)
    #: Gradients that exist only in this moment (a unit's whole gradients before reduction).
    extra_gradient_items: list[Alive] = field(default_factory=list)
    #: Parameters that exist only in this moment (DeepSpeed ZeRO-3's gathered ones).
    weight_items: list[LineItem] = field(default_factory=list)
    #: What FSDP2 holds unsharded at this moment (`vram.sharding.fsdp2`): gathered parameters
    #: (`weights.*`) and unsharded gradients and reduce buffers (`gradients.*`).
    in_flight_items: list[LineItem] = field(default_factory=list)

    # (sums over `map(_bytes_of, ...)`: no generator frame; estimate() is on the hot path)
    @property
    def weight_bytes(self) -> int:
        return sum(map(_bytes_of, self.weight_items))

    @property
    def in_flight_bytes(self) -> int:
        return sum(map(_bytes_of, self.in_flight_items))

    @property
    def gradients_total(self) -> int:
        return self.gradient_bytes + sum(map(_bytes_of, self.extra_gradient_items))

    @property
    def activation_bytes(self) -> int:
        return sum(map(_bytes_of, self.activation_items))

    def figures(self) -> tuple[int, int, int, int]:
        """(gradients_total, activation_bytes, in_flight_bytes, weight_bytes): the four
        properties above in one call (`_step_peak` reads all four of every moment)."""
        return (self.gradient_bytes + sum(map(_bytes_of, self.extra_gradient_items)),
                sum(map(_bytes_of, self.activation_items)),
                sum(map(_bytes_of, self.in_flight_items)),
                sum(map(_bytes_of, self.weight_items)))


# Built on every estimate: not frozen (see `vram.step.draft.ItemDraft`).
@dataclass(slots=True)
class StepContext:
    """What every candidate moment of the step reads (built once by `step_moments`)."""

    model: ModelSpec
    setup: TrainingSetup
    #: The stack's behaviours for this setup (the state part's, built once per setup).
    profile: StackProfile
    plan: act.ActivationPlan
    grads: GradientPart
    #: The weight working copies alive at each stage (see `working_items`).
    working: dict[Stage, list[LineItem]]
    step_temp_bytes: int
    #: The optimizer steps inside backward (one parameter's gradient at a time).
    in_backward: bool
    #: Gradients accumulated over earlier micro-batches, alive through the whole step.
    accumulated_bytes: int
    #: What the layers keep for backward, as the loss and the backward see it.
    layers: list[Alive]
    #: The causal mask as the backward sees it (none unless checkpointing recomputes with it).
    mask: list[Alive]
    #: The same during the forward (with the causal mask, which backward may have freed).
    forward_layers: list[Alive]
    #: The previous step's bitsandbytes inputs, still held in the forward (LitGPT's loop).
    previous: list[Alive]
    #: An MoE layer's bank gradient write, a candidate for a layer's backward peak.
    bank: BankWrite | None
    #: The inputs of the head's items (one dict: `ItemDraft.line_item` copies it).
    head_inputs: dict[str, int]
    #: A tied embedding's gradient waiting in autograd's buffer through the backward.
    tied_pending: list[Alive]
    #: The unit in backward holding its gradients whole (sharded gradients).
    reducing: list[Alive]
    #: A vision-language model's images: what the tower and projector keep until their
    #: backward (after the language model's), and the pixel values, alive through the step.
    vision_plan: VisionPlan | None = None
    vision: list[Alive] = field(default_factory=list)
    pixels: list[Alive] = field(default_factory=list)
    #: The KV cache a VLM's language model fills in the forward, alive until the loss's
    #: forward ends (`vram.memory.text_cache`).
    text_cache: list[Alive] = field(default_factory=list)

HEAD_SOURCE = "see vram.memory.head.head_activations"


def step_context(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                 plan: act.ActivationPlan,
                  grads: GradientPart, working: dict[Stage, list[LineItem]],
                  step_temp: int, vision: VisionPlan | None = None) -> StepContext:
    in_backward = steps_in_backward(setup)
    previous: list[Alive] = [ItemDraft(
        key="activations.previous_step", label="previous step's bitsandbytes inputs",
        formula="tokens × Σ layers × MatMul4Bit inputs (ctx attributes outlive backward)",
        inputs={"tokens": plan.tokens}, bytes=plan.previous_step_bytes,
        source="litgpt/finetune/lora.py fit() keeps `loss` and `logits` until reassigned",
    )] if plan.previous_step_bytes else []
    saved = saved_layer_items(model, setup, plan)  # the same in the forward and the backward
    mask = mask_items(setup, plan, forward=False)
    return StepContext(
        model=model, setup=setup, profile=profile, plan=plan, grads=grads, working=working,
        step_temp_bytes=step_temp, in_backward=in_backward,
        accumulated_bytes=grads.total if setup.grad_accum > 1 and not in_backward else 0,
        layers=mask + saved, mask=mask,
        forward_layers=mask_items(setup, plan, forward=True) + saved, previous=previous,
        bank=bank_write(model, setup, profile, plan, grads) if not in_backward else None,
        head_inputs={"tokens": plan.tokens, "vocab": model.vocab_size},
        tied_pending=tied_pending(grads, model.vocab_size),
        reducing=reducing(grads, setup),
        vision_plan=vision,
        vision=[*vision.saved, vision.pixels] if vision else [],
        pixels=[vision.pixels] if vision else [],
        text_cache=list(text_cache_items(model, setup, profile)),
    )


@dataclass(frozen=True, slots=True)
class BankWrite:
    """An MoE layer's backward when its gate/up expert bank's gradient is written (see
    `activations.MoeBackward`): bank-sized gradient buffers, and the layer's gradients made
    already. With sharded gradients both are whole: the layer is not reduced yet."""

    buffers: int  # bank-sized gradient tensors alive (not .grad yet)
    done_in_layer: int  # the layer's gradients already made (down_proj's bank, grouped_mm)
    casts_released: int  # autocast's bf16 copies of the experts already through backward
    loop: bool

    def item(self, saved: int, plan: act.ActivationPlan) -> ItemDraft:
        freed = plan.moe_freed_minus_inflight_bytes or 0
        if self.loop:
            formula = ("saved − 2/E of the experts' + gradient of the layer's input + "
                       "gate/up bank buffer + the next expert's bank-sized select_backward + "
                       "its weight gradient + down bank buffer")
            source = "transformers eager experts loop: autograd sums select_backward per expert"
        else:
            formula = ("saved − the experts' (but gathered inputs and outputs) + gradient of "
                       "the gate/up output + the gate/up bank gradient")
            source = "transformers grouped_mm experts: the bank's gradient in one tensor"
        return ItemDraft(
            key="activations.backward", label="an MoE layer's backward, at its bank gradient",
            formula=formula, inputs={"tokens": plan.tokens},
            bytes=max(0, saved - freed + self.buffers - self.casts_released), source=source)


def bank_write(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
               plan: act.ActivationPlan, grads: GradientPart) -> BankWrite | None:
    """The MoE candidate for a layer's backward peak, when expert banks train in HF code."""
    if plan.moe_freed_minus_inflight_bytes is None or not grads.bank_gate_up:
        return None
    if not plan.moe_loop:  # grouped_mm: down_proj's bank gradient is .grad already
        return BankWrite(grads.bank_gate_up, grads.bank_down, 0, loop=False)
    experts = max(1, grads.bank_experts)
    buffers = 2 * grads.bank_gate_up + grads.bank_gate_up // experts + grads.bank_down
    casts = 0
    if profile.precision.casts_weights:
        # autocast casts each expert's slice (not a leaf: never cached) and the Linear keeps
        # the cast; the two experts through backward have dropped theirs
        bank_params = max(sum(ln.weight_params for ln in st.linears if ln.is_bank)
                          for st in model.stacks)  # one layer's banks
        casts = 2 * bank_params * 2 // experts
    return BankWrite(buffers, 0, casts, loop=True)


def tied_pending(grads: GradientPart, vocab: int) -> list[Alive]:
    if not grads.tied:
        return []
    return [ItemDraft(
        key="activations.tied_grad_pending", label="the head's gradient of the tied embedding",
        formula="vocab × hidden × grad bytes (in autograd's input buffer, not yet a .grad)",
        inputs={"vocab": vocab}, bytes=grads.tied,
        source="autograd InputBuffer: a leaf used twice gets one .grad when both arrive")]


def reducing(grads: GradientPart, setup: TrainingSetup) -> list[Alive]:
    """With sharded gradients, the unit in backward holds its gradients whole until they are
    reduce-scattered."""
    if not grads.unsharded_unit or grads.fsdp2 is not None:
        return []
    return [ItemDraft(
        key="gradients.unsharded_unit", label="whole gradients of the unit being reduced",
        formula="one layer's gradients before reduce-scatter",
        inputs={"gpus": setup.n_gpus}, bytes=grads.unsharded_unit,
        source="FSDP / ZeRO-2,3 reduce-scatter after each unit's backward",
    )]


def mask_items(setup: TrainingSetup, plan: act.ActivationPlan, *,
                forward: bool) -> list[Alive]:
    """The causal mask the layers share, beside what they keep (`saved_layer_items`)."""
    return [ItemDraft(
        key="activations.mask", label="causal attention mask (eager/math attention)",
        formula="batch × s × s × e (one per window kind)", inputs={"seq": setup.seq_len},
        bytes=plan.mask_bytes, source="transformers masking_utils: a 4-D additive mask",
    )] if plan.mask_bytes and (forward or setup.grad_ckpt) else []


def saved_layer_items(model: ModelSpec, setup: TrainingSetup, plan: act.ActivationPlan,
                       ) -> list[Alive]:
    tokens = plan.tokens
    if setup.grad_ckpt:
        if not plan.checkpointed_bytes:
            return []
        return [ItemDraft(
            key="activations.checkpoints", label="checkpointed layer inputs",
            formula="layers × tokens × h × residual bytes",
            inputs={"layers": model.n_layers, "tokens": tokens, "h": model.hidden_size},
            bytes=plan.checkpointed_bytes,
            source="torch.utils.checkpoint keeps each layer's input",
        )]
    if setup.offload is Offload.ACTIVATIONS:
        return [ItemDraft(key="activations.kept", label="one layer kept on the GPU",
                          formula="largest layer", inputs={}, bytes=plan.stored_layers_bytes,
                          source="activation offloading")]
    layers = plan.layers
    # One group: the per-term items (and their f-strings) are built for the peak only.
    return [ItemGroup(
        plan.stored_layers_bytes,  # tokens × Σ layers × Σ terms, as the items below
        lambda: [
            LineItem.assemble(
                key, label, formula,
                {"tokens": tokens, "layers": layer.count,
                 "per_token_bytes": term.bytes_per_token},
                (term.bytes_per_token * tokens + term.fixed_bytes) * layer.count,
                "autograd saved tensors; see vram.memory.activations",
            )
            for layer in layers
            for term, (key, label, formula) in zip(layer.terms, layer.item_texts, strict=True)
        ])]
