"""Under FSDP2 (`fully_shard`), what each moment holds unsharded, and the moments FSDP2 adds:
the last block's all-gather and the middle blocks' backward (`vram.sharding.fsdp2`).
"""

from __future__ import annotations

from vram.memory.weights import Stage
from vram.result import LineItem, MomentId, Phase
from vram.sharding import fsdp2
from vram.step.context import Moment, StepContext
from vram.step.draft import Alive, ItemGroup

#: What FSDP2 holds unsharded at each moment of the step (`vram.sharding.fsdp2`).
_FSDP2_IN_FLIGHT = {
    MomentId.LAST_LAYER_FORWARD: fsdp2.forward_block,
    MomentId.FORWARD_END: fsdp2.forward_end,
    MomentId.OUTPUT_CAST: fsdp2.after_forward,
    MomentId.LOSS: fsdp2.loss_backward,
    MomentId.FINAL_NORM_BACKWARD: fsdp2.loss_backward,
    MomentId.TOP_LAYER_BACKWARD: fsdp2.top_block_backward,
    MomentId.FIRST_LAYER_BACKWARD: fsdp2.first_block_backward,
    MomentId.EMBEDDING_BACKWARD: fsdp2.embedding_backward,
}


def with_fsdp2(c: StepContext, moments: list[Moment]) -> list[Moment]:
    """Under FSDP2, each moment with what is unsharded then, and one moment more: the last
    block's all-gather, with the blocks before it saved (three blocks' parameters alive)."""
    units = c.grads.fsdp2
    if units is None:
        return moments
    for moment in moments:
        in_flight = _FSDP2_IN_FLIGHT.get(moment.label)
        moment.in_flight_items = in_flight(units) if in_flight else []
    layers = max(1, c.model.n_layers)
    mask: list[Alive] = [i for i in c.forward_layers
                         if not isinstance(i, ItemGroup) and i.key == "activations.mask"]
    saved = sum(i.bytes for i in c.forward_layers if i not in mask) * (layers - 1) // layers
    gather = _gather_moment(c, units, mask, saved)
    return [gather, *_with_inner_blocks(c, units, moments)]


def _gather_moment(c: StepContext, units: fsdp2.Fsdp2Units, mask: list[Alive],
                   saved: int) -> Moment:
    """While the last block is all-gathered, with the blocks before it saved."""
    layers = max(1, c.model.n_layers)
    return Moment(Phase.FORWARD, MomentId.LAST_BLOCK_ALL_GATHER, c.accumulated_bytes, [
        *mask,
        *c.working[Stage.LAYERS_FORWARD],
        LineItem(key="activations.blocks_before_last", label="what the blocks before the last "
                 "keep for backward", formula="(layers − 1) / layers × the layers' saved tensors",
                 inputs={"layers": layers}, bytes=saved, source="see vram.memory.activations"),
        *c.previous], in_flight_items=fsdp2.forward_gather(units))


def _one_layer_kept(c: StepContext) -> LineItem:
    """What one layer keeps for its backward: its checkpointed input, or its saved tensors."""
    plan, layers = c.plan, max(1, c.model.n_layers)
    kept = plan.checkpointed_bytes // layers if c.setup.grad_ckpt else plan.layer_bytes_max
    return LineItem(key="activations.one_layer_kept", label="one more layer's kept tensors",
                    formula="checkpointed inputs / layers, or the largest layer's saved tensors",
                    inputs={"layers": layers}, bytes=kept, source="see vram.memory.activations")


def _with_inner_blocks(c: StepContext, units: fsdp2.Fsdp2Units,
                       moments: list[Moment]) -> list[Moment]:
    """Under FSDP2 the blocks between the top and the first differ from both: each has the next
    block down all-gathered beside it (the first has none left to prefetch) and the previous
    block's reduce-scatter buffer (the top has none). Live bytes in block k are linear in k, so
    the two ends of that run stand for it: the block below the top (one layer's kept tensors
    fewer than the top's backward, the top's gradients done) and the second block (one more
    than the first's, the second's gradients not yet done)."""
    layers = c.model.n_layers
    by_label = {m.label: m for m in moments}
    top = by_label.get(MomentId.TOP_LAYER_BACKWARD)
    first = by_label.get(MomentId.FIRST_LAYER_BACKWARD)
    if layers < 3 or top is None or first is None or c.bank is not None or units.separate:
        return moments  # the embedding and head units' layout is traced from two blocks
    kept = _one_layer_kept(c)
    done = 0 if c.in_backward else c.grads.per_layer
    inner = []
    if layers >= 4:
        layer_items = {id(i) for i in c.layers}
        mask = {id(i) for i in c.mask}
        rest = [i for i in top.activation_items if id(i) not in layer_items]
        below = sum(i.bytes for i in c.layers if id(i) not in mask) - kept.bytes
        inner.append(Moment(
            Phase.BACKWARD, MomentId.BLOCK_BELOW_TOP_BACKWARD, top.gradient_bytes + done, [
                *c.mask,
                LineItem(key="activations.layers_below_top", label="what the layers below "
                         "the top keep", formula="every layer's kept tensors − one layer's",
                         inputs={"layers": layers}, bytes=max(0, below),
                         source="see vram.memory.activations"), *rest],
            top.extra_gradient_items,
            in_flight_items=fsdp2.below_top_block_backward(units)))
    inner.append(Moment(
        Phase.BACKWARD, MomentId.SECOND_LAYER_BACKWARD, max(c.accumulated_bytes,
                                                           first.gradient_bytes - done),
        [*first.activation_items, kept], first.extra_gradient_items,
        in_flight_items=fsdp2.second_block_backward(units)))
    index = moments.index(first)
    return [*moments[:index], *inner, *moments[index:]]
