"""Pipeline parallel: which blocks a stage holds, and how many micro-batches it keeps (issue 23).

The blocks are split evenly over `pp x v` model chunks (`v = pp_virtual`); rank `r` holds
chunks `r, r + pp, ...` (the looped layout of Megatron's and PyTorch's interleaved schedules),
the first chunk the embedding, the last the final norm, the head and the loss. The
micro-batches are the gradient accumulation steps (`grad_accum`): every micro-batch of a step
runs through the pipeline before the optimizer steps.

What a rank holds of its micro-batches' activations at once (Narayanan et al. 2021, SS2.2;
PyTorch's schedules, torch/distributed/pipelining/schedules.py@v2.13.0):

* GPipe (`ScheduleGPipe`): every forward before any backward: all `m`;
* 1F1B (`Schedule1F1B`, Megatron's default): `pp - r` forwards before the first backward,
  so `min(pp - r, m)`; the first stage holds the most, the last one;
* interleaved 1F1B (`ScheduleInterleaved1F1B`, `v` chunks per rank): `(pp - r - 1) * 2 +
  (v - 1) * pp` warm-up chunk-forwards and the steady one, each chunk `L / (pp v)` blocks
  (torch's `_get_1f1b_rank_ops` warm-up; Megatron's estimator rounds it to the factor
  `1 + (pp - 1) / (pp v)` on `pp` micro-batches: megatron/training/theoretical_memory_usage.py
  @core_v0.19.0 #L341-L364).

PyTorch's `PipelineStage` also preallocates, for every micro-batch, a buffer for the
activation it receives (every chunk but the first) and for the gradient it receives (every
chunk but the last), alive for the step (torch/distributed/pipelining/stage.py@v2.13.0
#L1291, #L1428, #L1596; the trace shows them at setup): torchtitan's pipeline. DeepSpeed's
engine keeps `min(stages - stage_id, micro_batches)` pipe buffers instead
(deepspeed/runtime/pipe/schedule.py@v0.19.5 TrainSchedule.num_pipe_buffers): not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from vram.errors import VramError
from vram.memo import memoized
from vram.model.spec import HeadKind, ModelSpec
from vram.setup import PipelineSchedule, TrainingSetup

SOURCE = "torch/distributed/pipelining/schedules.py@v2.13.0"


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One pipeline rank: its chunks' blocks and what its schedule keeps."""

    rank: int
    first: bool  # holds the first chunk (the embedding)
    last: bool  # holds the last chunk (the final norm, the head, the loss)
    blocks: int  # the blocks of all its chunks
    #: Micro-batches of this rank's blocks whose saved activations are alive at once (a
    #: fraction under the interleaved schedule: chunk-forwards in flight / chunks per rank).
    in_flight: Fraction
    #: Boundary tensors preallocated by PyTorch's stages (receive buffers, one per
    #: micro-batch per chunk and direction).
    receive_buffers: int


def schedule_of(setup: TrainingSetup) -> PipelineSchedule:
    """The schedule: the setup's, else interleaved with virtual stages, else 1F1B."""
    if setup.pp_schedule is not None:
        return setup.pp_schedule
    return PipelineSchedule.INTERLEAVED if setup.pp_virtual > 1 else PipelineSchedule.ONE_F_ONE_B


def _in_flight(schedule: PipelineSchedule, pp: int, rank: int, m: int, v: int) -> Fraction:
    if schedule is PipelineSchedule.GPIPE:
        return Fraction(m)
    if schedule is PipelineSchedule.ONE_F_ONE_B:
        return Fraction(min(pp - rank, m))
    chunk_forwards = min((pp - rank - 1) * 2 + (v - 1) * pp + 1, m * v)
    return Fraction(chunk_forwards, v)


def _chunk_blocks(n_layers: int, chunks: int) -> list[int]:
    base, extra = divmod(n_layers, chunks)
    return [base + (1 if c < extra else 0) for c in range(chunks)]


def stage_plans(setup: TrainingSetup, n_layers: int) -> list[StagePlan]:
    """Every pipeline rank of the run (`pp` of them)."""
    pp, v, m = setup.pp, setup.pp_virtual, setup.grad_accum
    chunks = pp * v
    if n_layers < chunks:
        raise VramError(f"pp: {chunks} pipeline chunks need at least {chunks} blocks "
                        f"(the model has {n_layers})")
    sizes = _chunk_blocks(n_layers, chunks)
    schedule = schedule_of(setup)
    plans = []
    for rank in range(pp):
        mine = [rank + j * pp for j in range(v)]
        receives = sum((c != 0) + (c != chunks - 1) for c in mine) * m
        plans.append(StagePlan(
            rank=rank, first=0 in mine, last=chunks - 1 in mine,
            blocks=sum(sizes[c] for c in mine),
            in_flight=_in_flight(schedule, pp, rank, m, v), receive_buffers=receives))
    return plans


def stage_model(model: ModelSpec, stage: StagePlan) -> ModelSpec:
    """The part of `model` one pipeline rank holds: its blocks, the embedding on the first
    chunk's rank, the final norm and the head on the last chunk's (a tied head becomes its own
    copy there, as Megatron's last stage keeps the word embeddings)."""
    return memoized(model, ("pp stage", stage.blocks, stage.first, stage.last),
                    lambda: _stage_model(model, stage))


def _stage_model(model: ModelSpec, stage: StagePlan) -> ModelSpec:
    if len(model.stacks) != 1:
        raise VramError("pp: pipeline stages of models with several block stacks "
                        "(encoder-decoder) are not modelled")
    stack = model.stacks[0].model_copy(update={"count": stage.blocks})
    update: dict[str, object] = {
        "name": f"{model.name} (pipeline rank {stage.rank})", "stacks": (stack,),
        "embedding_params": model.embedding_params if stage.first else 0,
        "embedding_extra_params": model.embedding_extra_params if stage.first else 0,
        "extra_params": model.extra_params if stage.last else 0,
    }
    if not stage.last:
        update["head_kind"] = HeadKind.CLASSIFIER  # no logits, no loss on this rank
        update["tied_embeddings"] = True  # and no head of its own
    elif not stage.first:
        update["tied_embeddings"] = False  # the last stage's own head matrix
    return model.model_copy(update=update)


def peak_stages(plans: list[StagePlan]) -> list[StagePlan]:
    """The ranks that can hold the peak: the one with the most micro-batches in flight (the
    first) and the one with the loss (the last); a middle rank holds fewer micro-batches than
    the first and neither the embedding nor the loss."""
    first = max(plans, key=lambda p: (p.in_flight, p.first))
    last = next(p for p in plans if p.last)
    return [first] if first is last else [first, last]
