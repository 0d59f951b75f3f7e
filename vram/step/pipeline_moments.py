"""What a pipeline rank holds at every moment beyond one micro-batch's step
(`vram.sharding.pipeline`): the other micro-batches its schedule keeps in flight, and the
receive buffers PyTorch's stages preallocate.
"""

from __future__ import annotations

from vram.memory import activations as act
from vram.model.spec import ModelSpec
from vram.result import MomentId
from vram.setup import TrainingSetup
from vram.setup.layout import rank_seq_len
from vram.sharding.pipeline import SOURCE, StagePlan
from vram.stacks.profile import StackProfile
from vram.step.context import Moment
from vram.step.draft import ItemDraft


def with_pipeline(moments: list[Moment], stage: StagePlan, model: ModelSpec,
                  setup: TrainingSetup, plan: act.ActivationPlan, profile: StackProfile) -> None:
    """Add, in place, to every moment of one micro-batch's step the saved activations of the
    rank's other micro-batches in flight (not at the optimizer step: all are done by then),
    and to every moment the preallocated receive buffers."""
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
        if buffers:
            moment.activation_items.append(ItemDraft(
                key="activations.pipeline_buffers",
                label="pipeline receive buffers (one per micro-batch)",
                formula="receive buffers × batch × s × h × e (÷ tp under SP)",
                inputs={"buffers": stage.receive_buffers, "boundary_bytes": boundary},
                bytes=buffers,
                source="torch/distributed/pipelining/stage.py@v2.13.0 _create_act_recv_info, "
                       "_create_grad_recv_info"))
