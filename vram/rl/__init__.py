"""RL post-training memory: the policy, reference, reward and critic models and the rollout
engine, phase by phase.

    >>> import vram, vram.rl
    >>> model = vram.load_model("qwen2.5-7b-instruct")
    >>> setup = vram.rl.RLSetup(algo="grpo", num_generations=8, prompt_len=512,
    ...                         completion_len=1024, batch=8)
    >>> vram.rl.estimate(model, setup, gpu_memory_bytes=80 * 2**30).device_peak_bytes
"""

from __future__ import annotations

import numbers

from vram.errors import InputError
from vram.gpus import MAX_MEMORY_BYTES
from vram.model.architecture import ModelSpec
from vram.rl.advice import advise
from vram.rl.estimate import estimate as _estimate
from vram.rl.result import ModelRole, PhaseEstimate, PhaseName, RLBucket, RLEstimate
from vram.rl.setup import MAX_SEQUENCES, Algo, Engine, Reference, RLSetup, Rollout, max_batch
from vram.rl.stacks import RL_STACKS, RLDefault, rl_default


def estimate(model: ModelSpec, setup: RLSetup, gpu_memory_bytes: int,
             *, with_advice: bool = True) -> RLEstimate:
    """Per-GPU memory of one RL step, both phases, with advice unless `with_advice` is off."""
    memory = gpu_memory_bytes
    if isinstance(memory, bool) or not isinstance(memory, numbers.Integral) or not (
            0 < memory < MAX_MEMORY_BYTES):
        raise InputError("gpu_memory_bytes", f"{gpu_memory_bytes!r}: the GPU's memory in bytes, "
                         f"an integer above 0 and below 2**50 (as a GPU list's memory_bytes)")
    gpu_memory_bytes = int(memory)
    result = _estimate(model, setup, gpu_memory_bytes)
    if setup.uses_engine and setup.rollout in (Rollout.COLOCATE, Rollout.SHARED):
        peaks = {level: (result if level == setup.sleep else _estimate(
            model, setup.model_copy(update={"sleep": level}), gpu_memory_bytes)
        ).device_peak_bytes for level in (0, 1, 2)}
        result = result.model_copy(update={"peak_by_sleep": peaks})
    return advise(model, result) if with_advice else result


__all__ = [
    "MAX_SEQUENCES", "RL_STACKS", "Algo", "Engine", "ModelRole", "PhaseEstimate", "PhaseName",
    "RLBucket", "RLDefault", "RLEstimate", "RLSetup", "Reference", "Rollout", "estimate",
    "max_batch", "rl_default",
]
