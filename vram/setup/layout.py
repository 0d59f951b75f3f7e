"""How the GPUs of a run are laid out: data x tensor x pipeline x context parallel (issue 23).

`n_gpus` is every GPU of the run. Tensor (`tp`), pipeline (`pp`) and context (`cp`) parallel
ranks multiply, and what is left is data parallel: `dp = n_gpus / (tp pp cp)`. The ZeRO/FSDP
sharding spans the data- *and* context-parallel ranks, as torchtitan's "fsdp" mesh flattens
`dp_shard` and `cp` (torchtitan/distributed/parallel_dims.py@v0.2.2) and Accelerate's
`dp_shard_cp` does: a context-parallel rank holds a different part of the same sequences, so
its gradients are summed with the others' like a data-parallel rank's. Expert parallel borrows
its ranks from that group (torchtitan job_config.py@v0.2.2 #L454-L470: EP within
dp_shard x cp; axolotl docs/nd_parallelism.qmd@v0.18.0: `ep x dp_shard = world`).

    >>> from vram.setup import TrainingSetup
    >>> shard_group(TrainingSetup(n_gpus=64, tp=8, pp=4, sharding="zero3"))
    2
"""

from __future__ import annotations

import math
from typing import Protocol

from vram.setup.enums import Attention, ContextParallel, Fp8Recipe, Method, PipelineSchedule


class Layout(Protocol):
    """The fields of `TrainingSetup` the layout reads (this module is imported by it)."""

    @property
    def n_gpus(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def capacity_factor(self) -> float: ...
    @property
    def sequence_parallel(self) -> bool | None: ...
    @property
    def pp_schedule(self) -> PipelineSchedule | None: ...
    @property
    def pp_virtual(self) -> int: ...
    @property
    def cp_kind(self) -> ContextParallel | None: ...
    @property
    def fp8(self) -> Fp8Recipe: ...
    @property
    def method(self) -> Method: ...
    @property
    def attention(self) -> Attention: ...
    @property
    def seq_len(self) -> int: ...


def model_parallel(setup: Layout) -> int:
    """The GPUs one copy of the model's state is spread over by tp, pp and cp."""
    return setup.tp * setup.pp * setup.cp


def shard_group(setup: Layout) -> int:
    """The GPUs that share (DDP) or shard (ZeRO/FSDP) the model state: data x context parallel
    (`n_gpus / (tp pp)`; every GPU when tp = pp = 1)."""
    return max(1, setup.n_gpus // (setup.tp * setup.pp))


def rank_seq_len(setup: Layout) -> int:
    """The tokens of each sequence one context-parallel rank holds: `s / cp`."""
    return setup.seq_len // setup.cp


def data_parallel(setup: Layout) -> int:
    """The data-parallel replicas: `n_gpus / (tp pp cp)`."""
    return max(1, setup.n_gpus // model_parallel(setup))


def gpu_step(setup: Layout) -> int:
    """The GPU counts this layout runs on are the multiples of `tp pp lcm(cp, ep)`: tp x pp x
    cp must divide the count, and ep the count / (tp pp) (`check_layout`). 1 without tp, pp,
    cp or ep: any count."""
    return setup.tp * setup.pp * math.lcm(setup.cp, setup.ep)


def seq_step(setup: Layout) -> int:
    """The sequence lengths this layout runs are the multiples of cp: each context-parallel
    rank holds `s / cp` tokens (`check_layout`). 1 without cp: any length."""
    return setup.cp


def check_layout(setup: Layout) -> None:
    """The layout's rules, each `ValueError` naming the fields (`TrainingSetup._consistent`)."""
    ranks = model_parallel(setup)
    if setup.n_gpus % ranks:
        raise ValueError(f"tp × pp × cp = {setup.tp} × {setup.pp} × {setup.cp} = {ranks} "
                         f"must divide gpus ({setup.n_gpus})")
    group = shard_group(setup)
    if group % setup.ep:
        raise ValueError(f"ep: {setup.ep} must divide the {group} data- and context-parallel "
                         f"GPUs (gpus ÷ tp ÷ pp)")
    if setup.capacity_factor != 1.0 and setup.ep == 1:
        raise ValueError("capacity_factor: routing imbalance moves rows between GPUs only "
                         "under expert parallel; set ep above 1 (one GPU's experts compute "
                         "tokens × top-k rows whatever the routing)")
    if setup.sequence_parallel and setup.tp == 1:
        raise ValueError("sequence_parallel: splits the sequence over the TP ranks; "
                         "set tp above 1")
    if setup.cp_kind is not None and setup.cp == 1:
        raise ValueError("cp_kind: set cp above 1 to choose how the sequence is split")
    if setup.cp > 1 and setup.attention is Attention.EAGER:
        # PyTorch's context_parallel dispatches the fused SDPA kernels only
        # (torch/distributed/tensor/experimental/_context_parallel/_attention.py@v2.13.0
        # `_sdpa_handler`); ring-flash-attn and Ulysses wrap flash attention
        raise ValueError("attention: context parallel splits SDPA or flash attention; eager "
                         "attention's s x s scores are not split")
    if setup.cp > 1 and setup.seq_len % setup.cp:
        raise ValueError(f"seq_len: {setup.seq_len} tokens do not split evenly over cp "
                         f"({setup.cp})")
    _check_pipeline(setup)
    if setup.fp8 is not Fp8Recipe.NONE and setup.method is Method.QLORA:
        # LLaMA-Factory refuses it (src/llamafactory/hparams/parser.py@v0.9.5 #L403)
        raise ValueError("fp8: float8 training runs the matmuls of 16-bit weights, not of a "
                         "4-bit base (method qlora)")


def _check_pipeline(setup: Layout) -> None:
    schedule = setup.pp_schedule
    if schedule is not None and setup.pp == 1:
        raise ValueError(f"pp_schedule: {schedule.value} schedules pipeline stages; set pp "
                         "above 1")
    if setup.pp_virtual > 1 and (setup.pp == 1 or schedule not in (
            None, PipelineSchedule.INTERLEAVED)):
        raise ValueError("pp_virtual: virtual stages are the interleaved schedule's "
                         "(pp above 1, pp_schedule interleaved)")
    if schedule is PipelineSchedule.INTERLEAVED and setup.pp_virtual < 2:
        raise ValueError("pp_virtual: the interleaved schedule runs 2 or more model chunks "
                         "per rank")
