"""Stack behaviours that follow from a knob a person sets, not from the stack's name.

Each rule takes the knob when it is given and falls back to the stack's default when it is
None, so a setup that leaves a knob to its stack estimates as before.
"""

from __future__ import annotations

from vram.setup import Framework, Method, Sharding, TrainingSetup

#: FSDP1 before PyTorch 2.2 kept frozen parameters unsharded through backward
#: (pytorch/pytorch#95805, fixed by #101982 in 2.2).
LAST_TORCH_WITH_FSDP1_FROZEN_BUG = (2, 1)


def stack_checkpoints_reentrant(setup: TrainingSetup) -> bool:
    """The stack's default `use_reentrant`: PEFT's recipes for sharded QLoRA (DeepSpeed
    ZeRO-3, FSDP: peft docs/source/accelerate/{deepspeed,fsdp}.md) pass use_reentrant=True;
    Transformers 5 passes False, and LitGPT and torchtune use non-reentrant wrappers."""
    hf_like = setup.framework not in (Framework.LITGPT, Framework.TORCHTUNE)
    sharded_qlora = setup.method is Method.QLORA and setup.sharding is Sharding.ZERO3
    return hf_like and sharded_qlora


def checkpoint_is_reentrant(setup: TrainingSetup) -> bool:
    """Whether checkpointing is reentrant: the `ckpt_reentrant` knob, else the stack's.

    Reentrant checkpointing runs the checkpointed forward under no_grad, so tensors an
    autograd Function keeps as ctx attributes (bitsandbytes' MatMul4Bit `ctx.tensors`) are not
    kept; non-reentrant checkpointing keeps them for every layer."""
    if setup.ckpt_reentrant is not None:
        return setup.ckpt_reentrant
    return stack_checkpoints_reentrant(setup)


def effective_fsdp_version(setup: TrainingSetup) -> int:
    """The FSDP implementation: the `fsdp_version` knob, else the stack's. torchtune's recipes
    shard with `fully_shard` (FSDP2, torchtune/training/_distributed.py `shard_model`, v0.3+);
    Lightning Fabric's FSDPStrategy (LitGPT) and Accelerate's FSDP plugin default to the
    `FullyShardedDataParallel` wrapper (FSDP1)."""
    if setup.fsdp_version is not None:
        return setup.fsdp_version
    return 2 if setup.framework is Framework.TORCHTUNE else 1


def torch_at_most(setup: TrainingSetup, version: tuple[int, int]) -> bool:
    """Whether the run's PyTorch is `version` or older; an unstated version is a current one."""
    if setup.torch_version is None:
        return False
    major, minor = (int(part) for part in setup.torch_version.split(".")[:2])
    return (major, minor) <= version


def fsdp_keeps_frozen_unsharded(setup: TrainingSetup) -> bool:
    """FSDP1 in PyTorch <= 2.1 did not reshard frozen parameters in backward
    (pytorch/pytorch#95805; fixed by #101982): LitGPT's 2023 FSDP LoRA peaks show it."""
    return effective_fsdp_version(setup) == 1 and torch_at_most(
        setup, LAST_TORCH_WITH_FSDP1_FROZEN_BUG)
