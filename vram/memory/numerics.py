"""The dtypes activations take under a precision recipe and a stack (bytes per element).

    >>> numerics(TrainingSetup(precision="bf16-mixed")).residual
    4
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.setup.training import TrainingSetup
from vram.stacks.precision import runs_half_model
from vram.stacks.table import StackProfile, profile_for
from vram.units import FP32_BYTES

#: Bytes of an fp32 activation (the activation modules import it from here).
FP32 = FP32_BYTES


@dataclass(frozen=True, slots=True)
class Numerics:
    compute: int  # bytes of a 16-bit or fp32 activation
    residual: int  # bytes of the residual stream (fp32 when the weights are fp32)
    autocast: bool
    #: bytes of q, k, v and the attention output as the attention kernel sees them
    attention: int = 2
    #: every Linear casts its input itself and keeps that copy (bitsandbytes' Linear4bit
    #: `x.to(compute_dtype)` on an upcast model)
    input_copy_per_linear: bool = False


def numerics(setup: TrainingSetup, profile: StackProfile | None = None) -> Numerics:
    """Activation dtypes of a run, as its precision record states them (`vram.stacks.precision`):
    fp32 weights (fp32, autocast recipes, or QLoRA after prepare_model_for_kbit_training
    upcast the embedding and norms) keep an fp32 residual stream."""
    policy = (profile if profile is not None else profile_for(setup)).precision
    return Numerics(compute=policy.compute, residual=policy.residual, autocast=policy.autocast,
                    attention=policy.attention,
                    input_copy_per_linear=policy.input_copy_per_linear)


def zero_half_model(setup: TrainingSetup) -> bool:
    """DeepSpeed-style ZeRO with a mixed recipe runs a 16-bit model (`vram.stacks.precision`)."""
    return runs_half_model(setup)
