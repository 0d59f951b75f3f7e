"""Every "the knob, else the stack's default" rule, in one place: one frozen record per setup.

A `TrainingSetup` field whose default is None means "what the stack does". `resolve(setup)`
fills each one in once: from the setup when the person set it, else from the stack's row
(`data/stacks.toml`: `defaults`, then `when_adapters` for LoRA/QLoRA, then
`when_sharded_qlora` for a sharded 4-bit base), else by the rule written here when the
default follows another knob (activation offload implies offloaded checkpoints; DeepSpeed's
engine has no FSDP version). `Resolved.run` is the setup as the run has it; the physics reads
it, never the stack table.

    >>> resolve(TrainingSetup(framework="torchtune", method="full")).run.compile
    True
    >>> resolve(TrainingSetup(framework="axolotl", grad_ckpt=True)).run.ckpt_reentrant
    True

A knob whose default is the stack's needs: its field (`vram.setup.training`), its default in
each stack's `defaults` (data), and the physics that reads `resolve(setup).run.<field>`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Literal, cast

from vram.memo import BoundedCache, cached_in
from vram.setup import Loss, Method, Offload, Precision, Sharding, TrainingSetup
from vram.setup.layout import shard_group
from vram.stacks.support import unsupported
from vram.stacks.table import StackRow, stack_row

#: FSDP chosen on a stack whose own sharding is DeepSpeed: PyTorch's current API,
#: `fully_shard` (torch/distributed/fsdp/__init__.py@v2.13.0 exports it beside the wrapper).
FSDP_VERSION_OUTSIDE_FSDP_STACKS: Literal[1, 2] = 2

#: FSDP1 before PyTorch 2.2 kept frozen parameters unsharded through backward
#: (pytorch/pytorch#95805, fixed by #101982 in 2.2).
LAST_TORCH_WITH_FSDP1_FROZEN_BUG = (2, 1)

#: bitsandbytes' MatMul4Bit kept its input A for backward (`ctx.tensors = (A, B)`) up to 0.43.0;
#: from 0.43.3 it keeps only the packed weight (`ctx.tensors = (None, B)`):
#: bitsandbytes/autograd/_functions.py@0.43.0 vs @0.43.3 (read in each wheel, 0.43.3 to 0.50.2;
#: benchmarks/GPU_H200.md finding 1). 0.43.1 and 0.43.2 were not read; they count as keeping.
LAST_BNB_KEEPING_MATMUL_INPUT = (0, 43, 2)
#: PyTorch 2.2.0 was released 2024-01-30 (pytorch/pytorch releases); bitsandbytes 0.43.3 on
#: 2024-07-30 (bitsandbytes CHANGELOG / PyPI). A run on PyTorch <= 2.1 used a bitsandbytes of
#: its time (<= 0.42.0, 2024-01-08), which kept the input.
LAST_TORCH_OF_BNB_KEEPING = (2, 1)

#: DeepSpeed's documented pure-bf16 config (bf16_master_weights_and_grads and
#: bf16_optimizer_states) runs under its `torch_autocast` section: DeepSpeed
#: blogs/core_api_update/README.md@20cfce004 "Example: Pure bf16 config with low-precision
#: master state" (`"torch_autocast": {"enabled": true}`); DeepSpeedExamples
#: training/bf16_master_weight/configs/bf16_full.json@ac3800b7 likewise. DeepSpeed's own
#: default is off (deepspeed/runtime/config.py get_torch_autocast_enabled), so a mixed recipe
#: under ZeRO runs its 16-bit model without it.
DEEPSPEED_PURE_BF16_AUTOCAST = True


@dataclass(frozen=True, slots=True)
class Resolved:
    """One setup as the run has it, and what follows from the resolved knobs."""

    #: The setup with every knob that defers to the stack filled in (never None there).
    run: TrainingSetup
    #: ZeRO sharding runs on DeepSpeed's engine (else FSDP's, or no ZeRO at all).
    deepspeed: bool
    #: FSDP2 (`fully_shard`) shards the run: ZeRO-3-style over 2+ GPUs with FSDP version 2.
    fsdp2: bool
    #: FSDP1 of PyTorch <= 2.1 keeps frozen parameters unsharded in backward.
    fsdp1_keeps_frozen_unsharded: bool
    #: bitsandbytes' 4-bit matmul keeps its input for backward (its version).
    bnb_keeps_matmul_input: bool
    #: The knob the stack cannot run, as a message (`vram.stacks.support`); None: it runs.
    unsupported: str | None = None

    @property
    def sharded_qlora(self) -> bool:
        return sharded_qlora(self.run)


def sharded_qlora(setup: TrainingSetup) -> bool:
    """QLoRA with its 4-bit base sharded (ZeRO-3 / FSDP full shard)."""
    return setup.method is Method.QLORA and setup.sharding is Sharding.ZERO3


def only_deepspeed_does(setup: TrainingSetup) -> bool:
    """ZeRO-1, and the optimizer's state offloaded without the parameters: FSDP has neither
    (its sharding strategies start at SHARD_GRAD_OP, and `CPUOffload(offload_params=True)`
    moves parameters and gradients with the step: torch/distributed/fsdp/api.py@v2.13.0)."""
    return setup.sharding is Sharding.ZERO1 or setup.offload is Offload.OPTIMIZER


def stack_defaults(setup: TrainingSetup, row: StackRow) -> dict[str, object]:
    """The row's defaults for this setup: `defaults`, then its LoRA/QLoRA recipes', then its
    sharded-QLoRA recipe's."""
    values = dict(row.defaults)
    if setup.trains_adapters:
        values.update(row.when_adapters)
    if sharded_qlora(setup):
        values.update(row.when_sharded_qlora)
    return values


def _fsdp_version(setup: TrainingSetup, stack: Literal[1, 2] | None) -> Literal[1, 2] | None:
    """The FSDP implementation: None when DeepSpeed's ZeRO engine shards (the
    `sharding_engine` knob, else the stack's), else the `fsdp_version` knob, else the stack's."""
    if setup.sharding_engine == "deepspeed" or (
            setup.sharding_engine is None and setup.fsdp_version is None
            and only_deepspeed_does(setup)):
        return None
    version = setup.fsdp_version if setup.fsdp_version is not None else stack
    if version is None and setup.sharding_engine == "fsdp":
        return FSDP_VERSION_OUTSIDE_FSDP_STACKS
    return version


def _sharding_engine(setup: TrainingSetup,
                     version: Literal[1, 2] | None) -> Literal["deepspeed", "fsdp"] | None:
    """Who runs ZeRO sharding: DeepSpeed's engine when no FSDP version applies."""
    if not setup.sharding.shards_optimizer:
        return None
    return "deepspeed" if version is None else "fsdp"


def _ckpt_offload(setup: TrainingSetup, stack: bool) -> bool:
    """Checkpointed layer inputs offloaded to CPU: the knob, else activation offload
    (`offload="activations"`), else the stack's. Without checkpointing: no."""
    if not setup.grad_ckpt:
        return False
    if setup.ckpt_offload is not None:
        return setup.ckpt_offload
    return setup.offload is Offload.ACTIVATIONS or stack


def _compile_loss(setup: TrainingSetup, compiled_model: bool, stack: bool, loss: Loss,
                  row: StackRow) -> bool:
    """torch.compile of the loss: the knob, else with a compiled model the stack's fact (the
    loss compiled with it, or left eager: torchtitan@9dec370), else eager. A stack whose
    recipes drop `compile_loss`'s result leaves an unchunked loss eager, except in its
    single-device LoRA recipe (torchtune: `StackRow.drops_compiled_unchunked_loss`)."""
    if setup.compile_loss is not None:
        return setup.compile_loss
    kept = setup.trains_adapters and setup.n_gpus == 1
    dropped = row.drops_compiled_unchunked_loss and loss is Loss.STANDARD and not kept
    return compiled_model and stack and not dropped


def _torch_autocast(setup: TrainingSetup, deepspeed: bool) -> bool:
    """torch.autocast over a 16-bit model: the knob, else on for bf16-true under DeepSpeed's
    ZeRO engine (its documented low-precision config), else off."""
    if setup.torch_autocast is not None:
        return setup.torch_autocast
    return DEEPSPEED_PURE_BF16_AUTOCAST and deepspeed and setup.precision is Precision.BF16_TRUE


def torch_at_most(setup: TrainingSetup, version: tuple[int, int]) -> bool:
    """Whether the run's PyTorch is `version` or older; an unstated version is a current one."""
    if setup.torch_version is None:
        return False
    major, minor = (int(part) for part in setup.torch_version.split(".")[:2])
    return (major, minor) <= version


def _bnb_keeps_matmul_input(run: TrainingSetup) -> bool:
    """Whether bitsandbytes' 4-bit matmul keeps its input for backward: by the version (the
    knob, else the stack's pin); with neither, a run on PyTorch <= 2.1 used a bitsandbytes of
    its time (<= 0.42, keeps it) and any later run a current one (>= 0.43.3, does not)."""
    if run.bitsandbytes_version is not None:
        parts = tuple(int(part) for part in run.bitsandbytes_version.split("."))
        return parts <= LAST_BNB_KEEPING_MATMUL_INPUT
    return torch_at_most(run, LAST_TORCH_OF_BNB_KEEPING)


def _resolve(setup: TrainingSetup) -> Resolved:
    row = stack_row(setup.framework)
    stack = stack_defaults(setup, row)
    filled = {name: value for name, value in stack.items() if getattr(setup, name) is None}
    version = _fsdp_version(setup, cast("Literal[1, 2] | None", stack["fsdp_version"]))
    engine = _sharding_engine(setup, version)
    deepspeed = engine == "deepspeed"
    filled.update(
        fsdp_version=version,
        sharding_engine=engine,
        ckpt_offload=_ckpt_offload(setup, bool(stack["ckpt_offload"])),
        torch_autocast=_torch_autocast(setup, deepspeed),
        compile_loss=_compile_loss(setup, bool(filled.get("compile", setup.compile)),
                                   bool(stack["compile_loss"]),
                                   cast("Loss", filled.get("loss", setup.loss)), row),
    )
    run = setup.model_copy(update=filled)
    return Resolved(
        run=run,
        deepspeed=deepspeed,
        fsdp2=setup.sharding is Sharding.ZERO3 and shard_group(setup) > 1 and version == 2,
        fsdp1_keeps_frozen_unsharded=version == 1 and torch_at_most(
            setup, LAST_TORCH_WITH_FSDP1_FROZEN_BUG),
        bnb_keeps_matmul_input=_bnb_keeps_matmul_input(run),
        unsupported=unsupported(run, row),
    )


#: Resolved setups kept (a setup and its filled-in copy, about 3 KB each): a sweep's distinct
#: setups, and a bound by bytes as every cache has (`vram.memo.BoundedCache`).
_RESOLVED: BoundedCache[tuple[str, Hashable], Any] = BoundedCache(
    max_entries=4096, max_bytes=16 * 2**20, kind=lambda key: key[0])


@cached_in(_RESOLVED)
def resolve(setup: TrainingSetup) -> Resolved:
    """The setup as the run has it (`Resolved.run`) and what follows; one per distinct setup."""
    return _resolve(setup)
