"""Planning a run: fit my hardware, the largest batch and sequence, the levers that make it fit
with their price in time and quality, and what the whole run costs on every catalog GPU.

    >>> import vram
    >>> p = vram.plan(vram.load_model("llama-3.1-8b"), vram.TrainingSetup(micro_batch=4),
    ...               hardware=vram.Hardware(gpu="rtx-4090"), tokens=1e9)
    >>> p.fits, p.max_micro_batch.value, p.path_summary
"""

from vram.plan.calibration import MfuTable, default_mfu_table
from vram.plan.hardware import Hardware
from vram.plan.levers import LEVERS, LeverSpec
from vram.plan.planner import Lever, PathStep, Plan, RunOption, plan
from vram.plan.solve import Proof

__all__ = [
    "LEVERS",
    "Hardware",
    "Lever",
    "LeverSpec",
    "MfuTable",
    "PathStep",
    "Plan",
    "Proof",
    "RunOption",
    "default_mfu_table",
    "plan",
]
