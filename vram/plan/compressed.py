"""What compression buys on one GPU: the largest micro-batch, the longest sequence and the
largest (Llama-shaped) model that fit it, with some buckets stored smaller and as they are.

The searches are the planner's (`vram.plan.solve.largest_fitting`: each answer proved by two
estimates, one that fits and the one just past it); the peak they compare is the what-if's
(`vram.step.what_if`), on the GPU as `vram.fit` counts it (its own CUDA context).

    >>> limits = compressed_limits(model, setup, {BucketName.OPTIMIZER: Fraction(4)}, gpu)
    >>> limits.micro_batch.value, limits.micro_batch_before.value
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from vram.gpus import Gpu, context_difference
from vram.model.architecture import ModelSpec, model_from_param_count
from vram.plan.solve import Proof, largest_fitting
from vram.setup import MAX_MICRO_BATCH, MAX_SEQ_LEN, TrainingSetup
from vram.step.estimate import estimate
from vram.step.what_if import Ratios, what_if

#: The model-size search moves in steps of this many parameters (a tenth of a billion) up to
#: MAX_MODEL_STEPS of them (10 trillion).
MODEL_STEP = 100_000_000
MAX_MODEL_STEPS = 100_000


class CompressedLimits(BaseModel):
    """On one GPU: the largest micro-batch, sequence and model (in MODEL_STEP parameters)
    with the buckets compressed, and the same without (`*_before`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    usable_bytes: int
    micro_batch: Proof
    micro_batch_before: Proof
    seq_len: Proof
    seq_len_before: Proof
    model_steps: Proof
    model_steps_before: Proof

    @property
    def model_params(self) -> int:
        return self.model_steps.value * MODEL_STEP

    @property
    def model_params_before(self) -> int:
        return self.model_steps_before.value * MODEL_STEP


def _peak(ratios: Ratios) -> Callable[[ModelSpec, TrainingSetup], int]:
    memo: dict[tuple[int, TrainingSetup], int] = {}

    def peak(model: ModelSpec, setup: TrainingSetup) -> int:
        key = (id(model), setup)
        if key not in memo:
            memo[key] = what_if(estimate(model, setup), ratios).device_peak_bytes
        return memo[key]

    return peak


def _limits(model: ModelSpec, setup: TrainingSetup, ratios: Ratios, usable: int,
            ) -> tuple[Proof, Proof, Proof]:
    peak = _peak(ratios)
    batch = largest_fitting(
        lambda b: peak(model, setup.model_copy(update={"micro_batch": b})), usable,
        setup.micro_batch, MAX_MICRO_BATCH)
    seq = largest_fitting(
        lambda s: peak(model, setup.model_copy(update={"seq_len": s})), usable,
        setup.seq_len, MAX_SEQ_LEN)
    models: dict[int, ModelSpec] = {}

    def model_peak(steps: int) -> int:
        sized = models.setdefault(steps, model_from_param_count(steps * MODEL_STEP))
        return peak(sized, setup)

    start = max(1, round(estimate(model, setup).params.total / MODEL_STEP))
    size = largest_fitting(model_peak, usable, start, MAX_MODEL_STEPS)
    return batch, seq, size


def compressed_limits(model: ModelSpec, setup: TrainingSetup, ratios: Ratios,
                      gpu: Gpu) -> CompressedLimits:
    """The largest batch, sequence and model that fit one `gpu` per GPU of `setup`, with
    `ratios` applied and without."""
    usable = gpu.memory_bytes - context_difference(gpu, setup)
    batch, seq, size = _limits(model, setup, ratios, usable)
    batch0, seq0, size0 = _limits(model, setup, {}, usable)
    return CompressedLimits(gpu=gpu.id, usable_bytes=usable, micro_batch=batch,
                            micro_batch_before=batch0, seq_len=seq, seq_len_before=seq0,
                            model_steps=size, model_steps_before=size0)
