"""What a pipeline rank holds at every moment beyond one micro-batch's step
(`vram.sharding.pipeline`): the other micro-batches its schedule keeps in flight, the
receive buffers PyTorch's stages preallocate, and, under FSDP2, the gradients it accumulates
unsharded.

FSDP2 under PyTorch's pipelining: for every micro-batch but the last the stage runs
`set_requires_gradient_sync(False)` and `set_reshard_after_backward(False)`
(torch/distributed/pipelining/stage.py@v2.13.0 #L844-L848); FSDP2 then keeps each
parameter's gradient unsharded, accumulated in the reduce dtype
(torch/distributed/fsdp/_fully_shard/_fsdp_param.py@v2.13.0 `to_accumulated_grad_if_needed`:
fp32 under a bf16 policy), and reduce-scatters them after the last micro-batch (#L1173-L1176).
So through the backward the rank holds every gradient of its stage whole, in fp32, instead of
its shard (the trace of Llama 3.1 70B, tp 8, pp 4, dp 2: 9.1 GB unsharded on each stage).
"""

from __future__ import annotations

from vram.memory import activations as act
from vram.model.params import ParamGroup
from vram.model.spec import ModelSpec
from vram.result import LineItem, MomentId
from vram.setup import TrainingSetup
from vram.setup.layout import rank_seq_len
from vram.sharding import fsdp2
from vram.sharding.pipeline import SOURCE, StagePlan
from vram.stacks.profile import StackProfile
from vram.step.context import Moment
from vram.step.draft import ItemDraft


def with_pipeline(moments: list[Moment], stage: StagePlan, model: ModelSpec,
                  setup: TrainingSetup, plan: act.ActivationPlan, profile: StackProfile,
                  groups: list[ParamGroup]) -> None:
    """Add, in place, to every moment of one micro-batch's step the saved activations of the
    rank's other micro-batches in flight (not at the optimizer step: all are done by then),
    to every moment the preallocated receive buffers, and under FSDP2 the unsharded
    accumulated gradients to every moment of the backward and the forward (from the first
    micro-batch's backward on: the steady state)."""
    saved = plan.checkpointed_bytes + plan.stored_layers_bytes
    others = int(saved * (stage.in_flight - 1))
    boundary = (setup.micro_batch * rank_seq_len(setup) * model.hidden_size
                * profile.precision.compute // profile.seq_split)
    buffers = stage.receive_buffers * boundary
    for moment in moments:
        if others > 0 and moment.label is not MomentId.OPTIMIZER_STEP:
            moment.activation_items.append(ItemDraft(
                key="activations.pipeline_in_flight",
                label="the other micro-batches in flight on this pipeline rank",
                formula="(micro-batches in flight - 1) × the rank's saved activations",
                inputs={"in_flight": f"{float(stage.in_flight):g}", "saved": saved},
                bytes=others, source=SOURCE))
        if profile.fsdp2 and setup.grad_accum > 1 and moment.label is not \
                MomentId.OPTIMIZER_STEP:
            _accumulate_unsharded(moment, profile, groups)
        if buffers:
            moment.activation_items.append(ItemDraft(
                key="activations.pipeline_buffers",
                label="pipeline receive buffers (one per micro-batch)",
                formula="receive buffers × batch × s × h × e (÷ tp under SP)",
                inputs={"buffers": stage.receive_buffers, "boundary_bytes": boundary},
                bytes=buffers,
                source="torch/distributed/pipelining/stage.py@v2.13.0 _create_act_recv_info, "
                       "_create_grad_recv_info"))


def _accumulate_unsharded(moment: Moment, profile: StackProfile,
                          groups: list[ParamGroup]) -> None:
    """The stage's gradients whole in the reduce dtype, in place of the sharded ones."""
    whole = sum(g.n_params * fsdp2.reduce_bytes(g, profile) for g in groups if g.trainable)
    moment.gradient_bytes = 0
    moment.in_flight_items = [
        *(i for i in moment.in_flight_items if not i.key.startswith("gradients.")),
        LineItem.assemble(
            "gradients.pipeline_unsharded", "gradients accumulated unsharded over micro-batches",
            "trainable params × reduce dtype bytes (no sync before the last micro-batch)",
            {"trainable_params": sum(g.n_params for g in groups if g.trainable)}, whole,
            "torch/distributed/pipelining/stage.py@v2.13.0 #L844-L848; "
            "_fsdp_param.py@v2.13.0 to_accumulated_grad_if_needed")]
