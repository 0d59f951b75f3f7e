"""What `vram.rl.estimate` returns: two phases of per-GPU buckets, the models, and advice."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from vram.result import LineItem
from vram.rl.setup import RLSetup
from vram.step.bounds import FitVerdict, judge

NonNegativeInt = Annotated[int, Field(ge=0)]


class RLBucket(StrEnum):
    WEIGHTS = "weights"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    ROLLOUT_WEIGHTS = "rollout_weights"
    KV_CACHE = "kv_cache"
    OVERHEAD = "overhead"


RL_BUCKETS: tuple[RLBucket, ...] = tuple(RLBucket)


class PhaseName(StrEnum):
    GENERATION = "generation"
    TRAINING = "training"


class PhaseEstimate(BaseModel):
    """One phase on one GPU of its group: every line item, by bucket."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: PhaseName
    gpu_group: str
    items: tuple[tuple[RLBucket, LineItem], ...]

    @property
    def buckets(self) -> dict[str, int]:
        totals = {bucket.value: 0 for bucket in RL_BUCKETS}
        for bucket, item in self.items:
            totals[bucket.value] += item.bytes
        return totals

    @property
    def device_peak_bytes(self) -> int:
        return sum(item.bytes for _, item in self.items)


class ModelRole(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    role: str
    method: str
    bytes: NonNegativeInt
    note: str = ""


class KvReport(BaseModel):
    """What the rollout asks of the engine's KV pool, in vLLM blocks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sequences: NonNegativeInt
    tokens_per_sequence: NonNegativeInt
    blocks_needed: NonNegativeInt
    needed_bytes: NonNegativeInt
    pool_bytes: NonNegativeInt
    pool_blocks: NonNegativeInt
    sequences_at_once: NonNegativeInt


class RLEstimate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str
    setup: RLSetup
    gpu_memory_bytes: NonNegativeInt
    generation: PhaseEstimate
    training: PhaseEstimate
    host_bytes: NonNegativeInt
    models: tuple[ModelRole, ...]
    kv: KvReport | None = None
    #: Problems that stop or slow the run, each naming the field to change.
    warnings: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()
    #: The training GPUs' peak at each sleep level (0, 1, 2), where the engine is colocated.
    peak_by_sleep: dict[int, int] = Field(default_factory=dict)
    #: How far the device band reaches below and above the peak: the policy's SFT estimate's
    #: band (`vram.step.bounds`), in bytes, at `bounds_rate`.
    band_below_bytes: NonNegativeInt = 0
    band_above_bytes: NonNegativeInt = 0
    bounds_rate: float = 0.9

    @property
    def peak_phase(self) -> PhaseName:
        if self.generation.gpu_group != self.training.gpu_group:
            # Separate GPU groups: the peak that fails first relative to its own group.
            return max((self.generation, self.training),
                       key=lambda p: p.device_peak_bytes).name
        if self.generation.device_peak_bytes > self.training.device_peak_bytes:
            return PhaseName.GENERATION
        return PhaseName.TRAINING

    @property
    def device_peak_bytes(self) -> int:
        return max(self.generation.device_peak_bytes, self.training.device_peak_bytes)

    @property
    def device_low_bytes(self) -> int:
        return max(0, self.device_peak_bytes - self.band_below_bytes)

    @property
    def device_high_bytes(self) -> int:
        return self.device_peak_bytes + self.band_above_bytes

    @property
    def verdict(self) -> FitVerdict:
        """The band against the GPU's memory: fits, borderline (with its chance), or not."""
        return judge(self.device_low_bytes, self.device_peak_bytes, self.device_high_bytes,
                     self.gpu_memory_bytes, self.bounds_rate)

    @property
    def fits(self) -> bool:
        """A sure fit: the band's high bound is within the GPU's memory."""
        return self.device_high_bytes <= self.gpu_memory_bytes

    def to_json(self) -> dict[str, object]:
        """The `python -m vram rl --json` object (design.md)."""

        def phase(p: PhaseEstimate) -> dict[str, object]:
            return {"gpu_group": p.gpu_group, "buckets": p.buckets,
                    "device_peak_bytes": p.device_peak_bytes,
                    "items": [{"bucket": b.value, "key": i.key, "label": i.label,
                               "formula": i.formula, "bytes": i.bytes, "source": i.source}
                              for b, i in p.items]}

        return {
            "model": self.model_name, "algo": self.setup.algo.value,
            "phases": {"generation": phase(self.generation), "training": phase(self.training)},
            "peak_phase": self.peak_phase.value, "device_peak_bytes": self.device_peak_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes, "fits": self.fits,
            "device_low_bytes": self.device_low_bytes,
            "device_high_bytes": self.device_high_bytes,
            "verdict": self.verdict.verdict.value,
            "fit_probability": round(self.verdict.probability, 4),
            "host_bytes": self.host_bytes,
            "models": [m.model_dump() for m in self.models],
            "kv": self.kv.model_dump() if self.kv else None,
            "warnings": list(self.warnings), "advice": list(self.advice),
            "peak_by_sleep": {str(level): peak for level, peak in self.peak_by_sleep.items()},
        }
