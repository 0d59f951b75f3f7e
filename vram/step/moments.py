"""The candidate peaks of one training step, in step order (see `vram.step.estimate`): the
last layer's forward, the end of the forward, the loss, the top and the first layer's
backward, the embedding's backward and the optimizer step. Each is a small function of the
`StepContext`; FSDP2 adds its own (`vram.step.fsdp2_moments`).
"""

from __future__ import annotations

from vram.memory import activations as act
from vram.memory import fp8
from vram.memory.gradients import GradientPart
from vram.memory.vision import VisionPlan
from vram.memory.weights import Stage
from vram.model.spec import ModelSpec
from vram.result import LineItem, MomentId, Phase
from vram.setup import TrainingSetup
from vram.stacks.profile import StackProfile
from vram.step.context import HEAD_SOURCE, Moment, StepContext, step_context
from vram.step.draft import Alive, ItemDraft
from vram.step.fsdp2_moments import with_fsdp2


def step_moments(model: ModelSpec, setup: TrainingSetup, profile: StackProfile,
                 plan: act.ActivationPlan, grads: GradientPart,
                 working: dict[Stage, list[LineItem]], step_temp: int,
                 vision: VisionPlan | None = None) -> list[Moment]:
    """The candidate peaks of one step (see the module docstring), in step order. `profile`
    is the stack's (the state part's, built once per setup); `working` holds the weight
    copies alive at each stage; `vision`, a VLM's images."""
    c = step_context(model, setup, profile, plan, grads, working, step_temp, vision)
    # Order matters for ties: the allocator reaches a peak at its first moment.
    return _with_fp8_casts(c, with_fsdp2(c, [
        *_last_layer_forward(c), _forward_end(c), *_output_cast(c), _loss(c),
        *_final_norm_backward(c), _top_layer_backward(c), _first_layer_backward(c),
        *_vision_backward(c), _embedding_backward(c), _optimizer_step(c)]))


_LAYER_BACKWARD = frozenset({MomentId.TOP_LAYER_BACKWARD, MomentId.BLOCK_BELOW_TOP_BACKWARD,
                             MomentId.SECOND_LAYER_BACKWARD, MomentId.FIRST_LAYER_BACKWARD})


def _with_fp8_casts(c: StepContext, moments: list[Moment]) -> list[Moment]:
    """Under torchao float8, every layer-backward moment with the casts alive above the bf16
    layer's peak (`vram.memory.fp8`)."""
    if c.setup.fp8 not in fp8.TORCHAO_EAGER:
        return moments
    casts = fp8.layer_backward_cast_bytes(c.model, c.setup, c.plan.tokens,
                                          compiled=c.profile.compiled)
    if casts:
        for moment in moments:
            if moment.label in _LAYER_BACKWARD:
                moment.activation_items.append(ItemDraft(
                    key="activations.fp8_casts", label="float8 casts in the layer's backward",
                    formula="max(8 t I + W, 9 W − 7.5 t I)",
                    inputs={"tokens": c.plan.tokens, "recipe": c.setup.fp8.value},
                    bytes=casts, source=fp8.SOURCE))
    return moments


def _last_layer_forward(c: StepContext) -> list[Moment]:
    """Inside the last layer's forward: every layer's saved tensors, and the running layer's
    attention scores (eager/math attention materializes s × s scores). None without scores."""
    plan = c.plan
    if not plan.forward_transient_bytes:
        return []
    return [Moment(Phase.FORWARD, MomentId.LAST_LAYER_FORWARD, c.accumulated_bytes, [
        *c.forward_layers, *c.working[Stage.LAYERS_FORWARD],
        ItemDraft(key="activations.layer_forward", label="attention scores of the layer running",
                  formula="heads × s × (q·kᵀ + masked scores [+ probabilities, checkpointed])",
                  inputs={"tokens": plan.tokens}, bytes=plan.forward_transient_bytes,
                  source="eager/math attention materializes s × s scores"),
        *c.previous, *c.vision, *c.text_cache])]


def _forward_end(c: StepContext) -> Moment:
    """The end of the forward: every saved activation, the head's output and what it keeps,
    and a VLM language model's KV cache (the model's output holds it through the loss's
    forward; the backward starts without it, so the loss moment has none)."""
    plan = c.plan
    return Moment(Phase.FORWARD, MomentId.FORWARD_END, c.accumulated_bytes, [
        *c.forward_layers, *c.working[Stage.FORWARD],
        ItemDraft(key="activations.head", label=plan.head.label, formula=plan.head.formula,
                  inputs=c.head_inputs, bytes=plan.head_saved_bytes, source=HEAD_SOURCE),
        *c.previous, *c.vision, *c.text_cache])


def _output_cast(c: StepContext) -> list[Moment]:
    """Right after a stack casts the model's output to fp32 (Lightning Fabric); none else."""
    plan = c.plan
    if not plan.head_cast_bytes:
        return []
    return [Moment(Phase.FORWARD, MomentId.OUTPUT_CAST, c.accumulated_bytes, [
        *c.forward_layers,
        ItemDraft(key="activations.head", label=plan.head.label, formula=plan.head.formula,
                  inputs=c.head_inputs, bytes=plan.head_cast_bytes,
                  source="lightning/fabric/wrappers.py _FabricModule.forward convert_output"),
        *c.previous, *c.vision, *c.text_cache])]


def _loss(c: StepContext) -> Moment:
    """The loss's forward and backward: logits, log-softmax and their gradients at their
    largest, with every layer's saved tensors still alive. A fused linear loss is at its
    largest in its forward (its chunk loop; `vram.memory.head._fused_linear_head`); Cut
    Cross-Entropy in its backward."""
    plan = c.plan
    liger = c.profile.fused_linear_loss and not c.profile.fused_loss_is_cce
    phase = Phase.FORWARD if liger else Phase.BACKWARD
    return Moment(phase, MomentId.LOSS, c.accumulated_bytes, [
        *c.layers, *c.working[Stage.LOSS],
        ItemDraft(key="activations.loss", label="logits, loss and their gradients",
                  formula=plan.head.formula, inputs=c.head_inputs, bytes=plan.head_peak_bytes,
                  source=HEAD_SOURCE), *c.vision])


def _final_norm_backward(c: StepContext) -> list[Moment]:
    """The final RMSNorm's backward: the loss's and the head's tensors are freed, every
    layer's saved tensors still alive, the head's gradient done (as at the top layer's
    backward) and the norm's fp32 temporaries at their largest
    (`vram.memory.head.final_norm_backward_per_token`). It decides the step's peak where the
    loss is small: a fused linear loss, or a long context."""
    plan = c.plan
    if plan.head_norm_backward_bytes == 0:
        return []
    grads = c.grads
    head_grads = grads.head if c.in_backward else max(c.accumulated_bytes, grads.head)
    return [Moment(Phase.BACKWARD, MomentId.FINAL_NORM_BACKWARD, head_grads, [
        *c.layers, *c.working[Stage.FINAL_NORM],
        ItemDraft(key="activations.final_norm", label="the final norm's backward",
                  formula="6 × 4·H: the fp32 input and five fp32 temporaries",
                  inputs=c.head_inputs, bytes=plan.head_norm_backward_bytes,
                  source=HEAD_SOURCE), *c.tied_pending, *c.vision])]


def _top_layer_backward(c: StepContext) -> Moment:
    """The top layer's backward: the head's gradient exists while every layer's activations
    are still held (under checkpointing, the top layer is recomputed). An MoE layer with
    trained banks peaks at its bank's gradient write, not at its MLP's start; its attention's
    backward can still be larger."""
    grads, plan, setup = c.grads, c.plan, c.setup
    # The layer in backward holds its gradients whole (the reduce item) when they are sharded.
    layer_grads = 0 if grads.unsharded_unit else grads.per_layer
    # Optimizer-in-backward keeps one parameter's gradient at a time (the head's is largest).
    top_grads = grads.head if c.in_backward else max(c.accumulated_bytes,
                                                     grads.head + layer_grads)
    head_left = ItemDraft(key="activations.head_left", label="logits kept into backward",
                          formula="what the loss leaves for the layers' backward",
                          inputs=c.head_inputs, bytes=plan.head_kept_bytes, source=HEAD_SOURCE)
    top = Moment(Phase.BACKWARD, MomentId.TOP_LAYER_BACKWARD, top_grads, [
        *c.layers, *c.working[Stage.TOP_LAYER], head_left,
        _backward_item(setup, plan), *c.tied_pending, *c.vision], c.reducing)
    if c.bank is None:
        return top
    return with_bank_write(top, plan, Moment(
        Phase.BACKWARD, MomentId.TOP_LAYER_BACKWARD,
        max(c.accumulated_bytes, grads.head + c.bank.done_in_layer), [
            *c.layers, *c.working[Stage.TOP_LAYER], head_left,
            c.bank.item(plan.recompute_bytes if setup.grad_ckpt else 0, plan),
            *c.tied_pending, *c.vision]))


def _first_layer_backward(c: StepContext) -> Moment:
    """Late backward: every gradient exists but the embedding's and the one being written
    (whole until it becomes .grad); one layer's activations remain.

    The layer's backward has two moments, and both happen: its MLP's (first, every saved
    tensor alive, the MLP's transients, the layer's largest gradient being written: a whole
    expert bank for MoE) and its attention's (the MLP's saved tensors freed, the attention's
    transients, the largest attention projection's gradient being written). The peak is the
    larger. With gradient accumulation the gradient being written is a new tensor beside the
    accumulated one, so a large bank's gradient can make the MLP's moment the larger even where
    the attention's transients are (choosing one moment by the transients alone made the
    estimate fall as the sequence grew, issue 25). An MoE model whose first layer is dense
    holds that layer's own tensors and its largest gradient, and no bank."""
    plan, grads = c.plan, c.grads
    if plan.dense_first_layer is not None:
        dense_layer, transient = plan.dense_first_layer
        return _late_layer_moment(c, Stage.FIRST_LAYER, dense_layer, transient,
                                  grads.largest_in_first_layer)
    first_layer = plan.recompute_bytes if c.setup.grad_ckpt else plan.layer_bytes_max
    mlp = _late_layer_moment(c, Stage.FIRST_LAYER, first_layer,
                             plan.backward_mlp_transient_bytes, grads.largest_in_layer)
    attention = _late_layer_moment(c, Stage.FIRST_ATTENTION, first_layer,
                                   plan.backward_attention_transient_bytes,
                                   grads.largest_in_attention)
    if c.bank is not None:  # the bank's gradient write stands for the MLP's moment
        mlp = Moment(
            Phase.BACKWARD, MomentId.FIRST_LAYER_BACKWARD,
            max(c.accumulated_bytes, grads.total - grads.pending
                - grads.per_layer + c.bank.done_in_layer - grads.vision), [
                *c.working[Stage.FIRST_LAYER], *c.mask, c.bank.item(first_layer, plan),
                *c.tied_pending, *c.vision])
    return max(mlp, attention, key=lambda m: m.gradients_total + m.activation_bytes)


def _late_layer_moment(c: StepContext, stage: Stage, layer_bytes: int, transient_bytes: int,
                       written_bytes: int) -> Moment:
    """The first layer's backward at one of its moments: the layer's saved tensors
    (`layer_bytes`), the moment's transients and the gradient being written
    (`_first_layer_backward`)."""
    grads, plan = c.grads, c.plan
    building = 0 if grads.unsharded_unit or c.in_backward else written_bytes
    late_grads = grads.head if c.in_backward else max(
        c.accumulated_bytes, grads.total - grads.pending - building - grads.vision
        - (grads.per_layer if grads.unsharded_unit else 0))
    return Moment(Phase.BACKWARD, MomentId.FIRST_LAYER_BACKWARD, late_grads, [
        *c.working[stage], *c.mask,
        ItemDraft(key="activations.backward", label="first layer's activations and gradients",
                  formula="one layer's saved tensors + its backward buffers + the gradient "
                         "being written", inputs={"tokens": plan.tokens},
                  bytes=layer_bytes + transient_bytes + building,
                  source="per-layer backward"), *c.tied_pending, *c.vision], c.reducing)


def _embedding_backward(c: StepContext) -> Moment:
    """The embedding's gradient is built last (embedding_dense_backward), as a new tensor that
    becomes an untied embedding's .grad or is added (in place) into a tied one's."""
    grads = c.grads
    embedding_grads = grads.total - grads.pending
    vocab = c.model.vocab_size
    return Moment(Phase.BACKWARD, MomentId.EMBEDDING_BACKWARD, 0 if c.in_backward else max(
        c.accumulated_bytes, embedding_grads), [
        ItemDraft(key="activations.embedding_grad", label="embedding gradient being built",
                  formula="vocab × hidden × grad bytes", inputs={"vocab": vocab},
                  bytes=grads.embedding, source="aten embedding_dense_backward"),
        *_tp_embedding_output_grad(c), *c.tied_pending, *c.pixels])


def _tp_embedding_output_grad(c: StepContext) -> list[Alive]:
    """Under tensor parallel the vocabulary-parallel embedding's backward reads its output's
    gradient whole over the rank's tokens: `RowwiseParallel` (output `Shard(1)` under
    sequence parallel, reduce-scattered in the forward) all-gathers it in the backward into a
    new `b s h` tensor, alive while `embedding_dense_backward` builds the full-vocabulary
    gradient (the parallel grid's traces: TP 4 and 8 + SP at 8k, +67 MB at the embedding's
    backward)."""
    if c.setup.tp == 1:
        return []
    return [ItemDraft(
        key="activations.embedding_output_grad", label="the embedding output's gradient, "
        "gathered over the sequence", formula="tokens × hidden × compute bytes",
        inputs={"tokens": c.plan.tokens, "hidden": c.model.hidden_size},
        bytes=c.plan.tokens * c.model.hidden_size * c.profile.precision.compute,
        source="torch/distributed/tensor/parallel/style.py@v2.13.0 RowwiseParallel; "
               "torchtitan/models/llama3/infra/parallelize.py@v0.2.2 apply_tp")]


def _optimizer_step(c: StepContext) -> Moment:
    """The optimizer step: every gradient, and the step's temporaries."""
    items: list[Alive] = []
    if c.step_temp_bytes:
        items.append(ItemDraft(
            key="activations.optimizer_temp", label="optimizer step temporaries",
            formula="one state-sized list (foreach AdamW's sqrt(v))", inputs={},
            bytes=c.step_temp_bytes, source="torch/optim/adamw.py _multi_tensor_adamw"))
    return Moment(Phase.OPTIMIZER_STEP, MomentId.OPTIMIZER_STEP,
                  0 if c.in_backward else c.grads.total, [*items, *c.pixels])


def _vision_backward(c: StepContext) -> list[Moment]:
    """A VLM's vision tower in backward, after every language-model layer's and the
    projector's: what the tower kept, a block recomputed (checkpointing) and its gradient
    buffers, at its top block: every gradient exists but the embedding's and the vision
    side's. None when the vision side keeps nothing (frozen, no adapters)."""
    vision = c.vision_plan
    if vision is None or not vision.keeps:
        return []
    grads = c.grads
    return [Moment(Phase.BACKWARD, MomentId.VISION_BACKWARD, grads.head if c.in_backward else
                   max(c.accumulated_bytes, grads.total - grads.pending - grads.vision), [
        *c.working[Stage.FIRST_LAYER], *vision.tower_saved, vision.pixels,
        ItemDraft(key="activations.vision_backward", label="a vision block's backward"
                  + (" (recomputed)" if c.setup.grad_ckpt else ""),
                  formula="tower tokens × (one block's saved tensors under checkpointing + its "
                          "gradient buffers)", inputs={"tower_tokens": vision.tower_tokens},
                  bytes=vision.backward_bytes, source="per-layer backward, in the tower"),
        *c.tied_pending], c.reducing)]


def with_bank_write(dense: Moment, plan: act.ActivationPlan, bank: Moment) -> Moment:
    """A layer's backward with trained MoE banks: the bank's gradient write replaces the MLP's
    start as a candidate; the attention's backward (when it is larger) stays one."""
    if not plan.backward_peak_in_attention:
        return bank
    return max(dense, bank, key=lambda m: m.gradients_total + m.activation_bytes)


def _backward_item(setup: TrainingSetup, plan: act.ActivationPlan) -> ItemDraft:
    return ItemDraft(
        key="activations.backward", label="backward of the top layer"
        + (" (recomputed)" if setup.grad_ckpt else ""),
        formula="one layer's activations (checkpointing) + its gradient buffers",
        inputs={"tokens": plan.tokens},
        bytes=plan.recompute_bytes + plan.backward_transient_bytes,
        source="per-layer backward; checkpointing recomputes one layer",
    )
