"""The dtypes activations take under a precision recipe and a stack (bytes per element).

    >>> numerics(TrainingSetup(precision="bf16-mixed")).residual
    4
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.setup import Precision, Sharding, TrainingSetup
from vram.stack import StackProfile

FP32 = 4


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
    """Activation dtypes of a precision recipe.

    With fp32 weights (fp32, autocast recipes, or QLoRA after prepare_model_for_kbit_training
    upcast the embedding and norms) the residual stream is fp32.
    """
    if profile is not None and profile.upcasts_frozen_to_fp32:
        # HF QLoRA after prepare_model_for_kbit_training: fp32 embeddings and norms, and
        # Linear4bit returns `out.to(input dtype)`, so activations stay fp32; each 4-bit Linear
        # casts its input to bf16 and MatMul4Bit keeps that copy. Only autocast brings the
        # attention back to 16 bits.
        # An fp32 recipe computes the 4-bit matmuls in fp32 too: no cast, shared inputs.
        mixed = setup.precision in (Precision.BF16_MIXED, Precision.FP16_MIXED)
        return Numerics(compute=4, residual=4, autocast=mixed, attention=2 if mixed else 4,
                        input_copy_per_linear=setup.precision is not Precision.FP32)
    if setup.precision is Precision.FP32:
        return Numerics(compute=4, residual=4, autocast=False, attention=4)
    if setup.precision is Precision.BF16_TRUE or zero_half_model(setup):
        return Numerics(compute=2, residual=2, autocast=False)
    return Numerics(compute=2, residual=4, autocast=True)


def zero_half_model(setup: TrainingSetup) -> bool:
    """DeepSpeed-style ZeRO with a mixed recipe runs a 16-bit model (fp32 master in the
    optimizer) rather than autocast over fp32 weights."""
    mixed = setup.precision in (Precision.BF16_MIXED, Precision.FP16_MIXED)
    return mixed and setup.sharding in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3)
