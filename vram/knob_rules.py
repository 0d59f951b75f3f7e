"""Behaviours that follow from a knob a person sets, not from the stack's name.

Each rule takes the knob when it is given and the stack's default (`vram.stack.STACKS`) when it
is None. Reentrant checkpointing's rule is `vram.stack.ckpt_reentrant`.
"""

from __future__ import annotations

from typing import Literal

from vram.setup import TrainingSetup

#: FSDP1 before PyTorch 2.2 kept frozen parameters unsharded through backward
#: (pytorch/pytorch#95805, fixed by #101982 in 2.2).
LAST_TORCH_WITH_FSDP1_FROZEN_BUG = (2, 1)


def effective_fsdp_version(setup: TrainingSetup,
                           stack_default: Literal[1, 2] | None) -> Literal[1, 2] | None:
    """The FSDP implementation: the `fsdp_version` knob, else the stack's (None: the stack
    shards with DeepSpeed ZeRO, not FSDP)."""
    return setup.fsdp_version if setup.fsdp_version is not None else stack_default


def torch_at_most(setup: TrainingSetup, version: tuple[int, int]) -> bool:
    """Whether the run's PyTorch is `version` or older; an unstated version is a current one."""
    if setup.torch_version is None:
        return False
    major, minor = (int(part) for part in setup.torch_version.split(".")[:2])
    return (major, minor) <= version


def fsdp1_keeps_frozen_unsharded(setup: TrainingSetup,
                                 stack_default: Literal[1, 2] | None) -> bool:
    """FSDP1 in PyTorch <= 2.1 did not reshard frozen parameters in backward
    (pytorch/pytorch#95805; fixed by #101982): LitGPT's 2023 FSDP LoRA peaks show it, and so
    would any FSDP1 run of that PyTorch, whatever the stack."""
    return effective_fsdp_version(setup, stack_default) == 1 and torch_at_most(
        setup, LAST_TORCH_WITH_FSDP1_FROZEN_BUG)
