"""How fast a setup trains: tokens per second per GPU, from FLOPs, the GPU's rate and an MFU.

    seconds per token = FLOPs per token / (dense bf16 FLOP/s x MFU x measured speed factors)
                        + host-link transfers of CPU offload, spread over the step's tokens

The MFU (model FLOPs utilization) is calibrated per method and GPU class on published
measured throughputs (`data/throughput.csv`, `vram.plan.calibration`). The speed factors of
single knobs are measured, not guessed: pytorch/torchtune README.md@bd2a0fc7 ('Optimization
flags' table, Llama 3.2 3B on an A100) changes one knob per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from vram.gpus import Gpu
from vram.model.architecture import ModelSpec
from vram.plan.flops import Recompute, flops_per_token
from vram.result import Estimate
from vram.setup import Loss, Offload, Optimizer, Sharding, TrainingSetup
from vram.stacks.resolve import resolve


class GpuClass(StrEnum):
    """GPUs that reach a similar MFU.

    Desktop cards (consumer and workstation) run other clocks, power limits and memory than
    datacenter parts. Among datacenter parts, those with more than `COMPUTE_HEAVY_FLOP_PER_BYTE`
    dense bf16 FLOPs per byte of memory bandwidth (H100, B200, L40S, L4) spend a larger share
    of the step in memory-bound work (norms, activations, the optimizer step): torchtitan
    measured 33-39 % MFU for Llama 3.1 8B on H100s
    (benchmarks/llama3_h100_202412_torchtitan.md@b5bcd76c) where A100 runs reach 50-60 %.
    """

    DESKTOP = "desktop"
    DATACENTER = "datacenter"
    COMPUTE_HEAVY = "compute-heavy"


COMPUTE_HEAVY_FLOP_PER_BYTE = 250.0


def gpu_class(gpu: Gpu) -> GpuClass:
    if gpu.segment != "datacenter":
        return GpuClass.DESKTOP
    if gpu.bf16_dense_tflops and gpu.memory_bandwidth_gbps:
        flop_per_byte = gpu.bf16_dense_tflops * 1e3 / gpu.memory_bandwidth_gbps
        if flop_per_byte > COMPUTE_HEAVY_FLOP_PER_BYTE:
            return GpuClass.COMPUTE_HEAVY
    return GpuClass.DATACENTER


#: torchtune 'Optimization flags' (README.md@bd2a0fc7): tokens/s before / after one change.
#: 8-bit AdamW: 7301 -> 6960 tokens/s (bitsandbytes' quantize/dequantize per step).
EIGHT_BIT_OPTIMIZER_TIME = 7301 / 6960
#: Optimizer step fused into the backward: 7210 -> 7309 tokens/s.
OPTIMIZER_IN_BACKWARD_TIME = 7210 / 7309
#: Chunked cross-entropy: 8998 -> 9174 tokens/s.
CHUNKED_LOSS_TIME = 8998 / 9174
#: Activation offloading (overlapped on a side stream): 7309 -> 7301 tokens/s.
ACTIVATION_OFFLOAD_TIME = 7309 / 7301
#: torch.compile: torchtune 7075 -> 8998 (README 'Optimization flags'); torchtitan
#: 5762 -> 6667 and 5605 -> 6514 (benchmarks/llama3_h100_202412_torchtitan.md@b5bcd76c,
#: Tables 1 and 3). The geometric mean of the three.
COMPILE_SPEEDUP = math.prod((8998 / 7075, 6667 / 5762, 6514 / 5605)) ** (1 / 3)
#: PCIe 4.0 x16 moves 31.5 GB/s each way; about 80 % of it is reached by pinned copies.
HOST_LINK_BYTES_PER_S = 25e9

OPTIMIZER_TIME: dict[Optimizer, float] = {
    Optimizer.ADAMW_8BIT: EIGHT_BIT_OPTIMIZER_TIME,
    Optimizer.PAGED_ADAMW_8BIT: EIGHT_BIT_OPTIMIZER_TIME,
    Optimizer.ADAMW_IN_BACKWARD: OPTIMIZER_IN_BACKWARD_TIME,
}


@dataclass(frozen=True, slots=True)
class Workload:
    """What the time model needs to know about one run on one GPU type."""

    model: ModelSpec
    setup: TrainingSetup
    gpu: Gpu
    trainable_params: int
    recompute: Recompute | None = None
    #: Saved activations one micro-step sends to host memory (activation offload).
    offloaded_activation_bytes: int = 0

    @property
    def flops_per_token(self) -> float:
        return flops_per_token(self.model, self.setup, self.trainable_params, self.recompute)

    @property
    def tokens_per_micro_step(self) -> int:
        return self.setup.micro_batch * self.setup.seq_len

    @property
    def tokens_per_step_per_gpu(self) -> int:
        return self.tokens_per_micro_step * self.setup.grad_accum


def offloaded_activations(setup: TrainingSetup, result: Estimate) -> int:
    """Activation bytes a micro-step sends to host memory: the estimate's host bytes when
    the offload is of activations (nothing else then lives on the host)."""
    return result.host_bytes if setup.offload is Offload.ACTIVATIONS else 0


def time_multiplier(setup: TrainingSetup) -> float:
    """Measured slow-downs (>1) and speed-ups (<1) of single knobs, multiplied."""
    factor = OPTIMIZER_TIME.get(setup.optimizer, 1.0)
    if resolve(setup).run.loss is Loss.CHUNKED:
        factor *= CHUNKED_LOSS_TIME
    if setup.offload is Offload.ACTIVATIONS:
        factor *= ACTIVATION_OFFLOAD_TIME
    if resolve(setup).run.compile:
        factor /= COMPILE_SPEEDUP
    return factor


def peak_flops(gpu: Gpu) -> float | None:
    """Dense bf16 FLOP/s from the catalog, or None when the catalog has no figure."""
    return gpu.bf16_dense_tflops * 1e12 if gpu.bf16_dense_tflops else None


def offload_bytes_per_step(work: Workload) -> float:
    """Bytes one GPU moves over its host link per optimizer step under CPU offload.

    Optimizer offload (ZeRO-Offload, Ren et al. 2021): the gradient shard goes down (fp32,
    4 B) and the updated 16-bit shard comes up (2 B). Parameter offload (ZeRO-Infinity) also
    fetches the 16-bit weight shard for the forward and again for the backward, every micro-step.
    """
    setup = work.setup
    if setup.offload not in (Offload.OPTIMIZER, Offload.PARAMS_OPTIMIZER):
        return 0.0
    shards = setup.n_gpus if setup.sharding is not Sharding.NONE else 1
    moved = 6.0 * work.trainable_params / shards
    if setup.offload is Offload.PARAMS_OPTIMIZER:
        moved += 2 * 2.0 * work.model.n_params / shards * setup.grad_accum
    return moved


def seconds_per_token(work: Workload, mfu: float) -> float | None:
    """Seconds one GPU spends per token it trains, or None when the GPU has no FLOP/s figure.

    Activation offload copies on a side stream, so a micro-step takes the longer of its
    compute and its copies (each saved byte goes down in the forward and up in the backward).
    Optimizer and parameter offload add their host-link time once per optimizer step.
    """
    peak = peak_flops(work.gpu)
    if peak is None:
        return None
    compute = work.flops_per_token * time_multiplier(work.setup) / (peak * mfu)
    micro = work.tokens_per_micro_step
    copies = 2.0 * work.offloaded_activation_bytes / HOST_LINK_BYTES_PER_S / micro
    transfer = offload_bytes_per_step(work) / HOST_LINK_BYTES_PER_S
    return max(compute, copies) + transfer / work.tokens_per_step_per_gpu
