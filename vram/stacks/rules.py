"""Behaviours that follow from a knob a person sets, not from the stack's name.

Each rule takes the knob when it is given and the stack's default (`vram.stacks.table.STACKS`) when it
is None. Reentrant checkpointing's rule is `vram.stacks.table.ckpt_reentrant`.
"""

from __future__ import annotations

from typing import Literal

from vram.setup.training import Offload, Precision, Sharding, TrainingSetup

#: FSDP1 before PyTorch 2.2 kept frozen parameters unsharded through backward
#: (pytorch/pytorch#95805, fixed by #101982 in 2.2).
LAST_TORCH_WITH_FSDP1_FROZEN_BUG = (2, 1)


#: FSDP chosen on a stack whose own sharding is DeepSpeed: PyTorch's current API,
#: `fully_shard` (torch/distributed/fsdp/__init__.py@v2.13.0 exports it beside the wrapper).
FSDP_VERSION_OUTSIDE_FSDP_STACKS: Literal[1, 2] = 2


def only_deepspeed_does(setup: TrainingSetup) -> bool:
    """ZeRO-1, and the optimizer's state offloaded without the parameters: FSDP has neither
    (its sharding strategies start at SHARD_GRAD_OP, and `CPUOffload(offload_params=True)`
    moves parameters and gradients with the step: torch/distributed/fsdp/api.py@v2.13.0)."""
    return setup.sharding is Sharding.ZERO1 or setup.offload is Offload.OPTIMIZER


def effective_fsdp_version(setup: TrainingSetup,
                           stack_default: Literal[1, 2] | None) -> Literal[1, 2] | None:
    """The FSDP implementation: None when DeepSpeed's ZeRO engine shards (the
    `sharding_engine` knob, else the stack's), else the `fsdp_version` knob, else the stack's."""
    if setup.sharding_engine == "deepspeed" or (
            setup.sharding_engine is None and setup.fsdp_version is None
            and only_deepspeed_does(setup)):
        return None
    version = setup.fsdp_version if setup.fsdp_version is not None else stack_default
    if version is None and setup.sharding_engine == "fsdp":
        return FSDP_VERSION_OUTSIDE_FSDP_STACKS
    return version


#: ZeRO stages DeepSpeed's engine runs (FSDP has no stage 1).
ZERO_STAGES = (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3)


def runs_deepspeed_engine(setup: TrainingSetup, stack_default: Literal[1, 2] | None) -> bool:
    """ZeRO through DeepSpeed's engine: ZeRO sharding with no FSDP version (the knob, else the
    stack's)."""
    return (setup.sharding in ZERO_STAGES
            and effective_fsdp_version(setup, stack_default) is None)


#: DeepSpeed's documented pure-bf16 config (bf16_master_weights_and_grads and
#: bf16_optimizer_states) runs under its `torch_autocast` section: DeepSpeed
#: blogs/core_api_update/README.md@20cfce004 "Example: Pure bf16 config with low-precision
#: master state" (`"torch_autocast": {"enabled": true}`); DeepSpeedExamples
#: training/bf16_master_weight/configs/bf16_full.json@ac3800b7 likewise. DeepSpeed's own
#: default is off (deepspeed/runtime/config.py get_torch_autocast_enabled), so a mixed recipe
#: under ZeRO runs its 16-bit model without it.
DEEPSPEED_PURE_BF16_AUTOCAST = True


def torch_autocast(setup: TrainingSetup, deepspeed_engine: bool) -> bool:
    """torch.autocast over a 16-bit model: the knob, else on for bf16-true under DeepSpeed's
    ZeRO engine (its documented low-precision config), else off."""
    if setup.torch_autocast is not None:
        return setup.torch_autocast
    return (DEEPSPEED_PURE_BF16_AUTOCAST and deepspeed_engine
            and setup.precision is Precision.BF16_TRUE)


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


#: bitsandbytes' MatMul4Bit kept its input A for backward (`ctx.tensors = (A, B)`) up to 0.43.0;
#: from 0.43.3 it keeps only the packed weight (`ctx.tensors = (None, B)`):
#: bitsandbytes/autograd/_functions.py@0.43.0 vs @0.43.3 (read in each wheel, 0.43.3 to 0.50.2;
#: benchmarks/GPU_H200.md finding 1). 0.43.1 and 0.43.2 were not read; they count as keeping.
LAST_BNB_KEEPING_MATMUL_INPUT = (0, 43, 2)
#: PyTorch 2.2.0 was released 2024-01-30 (pytorch/pytorch releases); bitsandbytes 0.43.3 on
#: 2024-07-30 (bitsandbytes CHANGELOG / PyPI). A run on PyTorch <= 2.1 used a bitsandbytes of
#: its time (<= 0.42.0, 2024-01-08), which kept the input.
LAST_TORCH_OF_BNB_KEEPING = (2, 1)


def effective_bnb_version(setup: TrainingSetup, stack_default: str | None) -> str | None:
    """The bitsandbytes version: the knob, else the one the stack pins (None: a current one)."""
    return setup.bitsandbytes_version or stack_default


def bnb_keeps_matmul_input(setup: TrainingSetup, stack_default: str | None) -> bool:
    """Whether bitsandbytes' 4-bit matmul keeps its input for backward: by the version (the
    knob, else the stack's pin); with neither, a run on PyTorch <= 2.1 used a bitsandbytes of
    its time (<= 0.42, keeps it) and any later run a current one (>= 0.43.3, does not)."""
    version = effective_bnb_version(setup, stack_default)
    if version is not None:
        parts = tuple(int(part) for part in version.split("."))
        return parts <= LAST_BNB_KEEPING_MATMUL_INPUT
    return torch_at_most(setup, LAST_TORCH_OF_BNB_KEEPING)
