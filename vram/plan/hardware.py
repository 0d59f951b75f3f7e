"""My hardware: a GPU type, how many per node and how many nodes; and one run on it.

The verdict holds the device peak's band (what nvidia-smi shows) against the memory the
driver reports, as `vram.fit` does: a sure fit when the band's high bound is within it. The
setup on N GPUs keeps the person's sharding, or shards fully (ZeRO-3/FSDP) when they gave
none, as `vram.fit` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from vram.errors import VramError
from vram.gpus import Gpu
from vram.model.architecture import ModelSpec
from vram.result import Estimate
from vram.setup import TrainingSetup
from vram.step.bounds import DeviceBand
from vram.step.estimate import estimate


class Hardware(BaseModel):
    """`count` GPUs of type `gpu` (a catalog id) in each of `nodes` nodes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: Annotated[str, Field(min_length=1, max_length=64)]
    count: Annotated[int, Field(strict=True, ge=1, le=64)] = 1
    nodes: Annotated[int, Field(strict=True, ge=1, le=64)] = 1

    @property
    def total(self) -> int:
        return self.count * self.nodes


def find_gpu(gpu_id: str, gpus: Sequence[Gpu], field: str = "gpu") -> Gpu:
    """The catalog GPU with this id; an unknown id names the ones that exist."""
    wanted = gpu_id.strip().lower()
    for gpu in gpus:
        if gpu.id == wanted:
            return gpu
    allowed = ", ".join(g.id for g in gpus)
    raise VramError(f"{field}: unknown GPU {gpu_id!r}; allowed: {allowed}")


class Estimator:
    """`estimate` for one model, remembering each setup's result: the planner asks for the
    same setup from several places (solvers, levers, the path, the catalog)."""

    def __init__(self, model: ModelSpec) -> None:
        self.model = model
        self._results: dict[TrainingSetup, Estimate] = {}

    def __call__(self, setup: TrainingSetup) -> Estimate:
        found = self._results.get(setup)
        if found is None:
            found = estimate(self.model, setup)
            self._results[setup] = found
        return found

    def peak(self, setup: TrainingSetup) -> int:
        return self(setup).device_peak_bytes

    def band(self, setup: TrainingSetup) -> DeviceBand:
        """The device peak and its band (`vram.step.bounds`)."""
        result = self(setup)
        return DeviceBand.of(result.device_peak_bytes, result.bounds)

    def high(self, setup: TrainingSetup) -> int:
        """The band's high bound: what a sure fit is proved on."""
        return self(setup).bounds.device_high_bytes

    @property
    def calls(self) -> int:
        return len(self._results)
