"""What the GPU holds beyond live tensors: allocator slack, the CUDA context, NCCL buffers.

`torch.cuda.max_memory_reserved()` exceeds the allocated peak by the caching allocator's
fragmentation; nvidia-smi adds the CUDA context (driver state, loaded kernels, cuBLAS
workspace: 0.3 to 1.3 GiB depending on driver, CUDA version and GPU; the Hugging Face
performance guide measures 1,343 MiB on a V100 with CUDA 11.2) and NCCL's buffers
(`vram.memory.nccl`).
"""

from __future__ import annotations

from vram.memory.nccl import nccl_items
from vram.memory.optimizer import OptimizerState
from vram.result import LineItem
from vram.setup import TrainingSetup
from vram.units import MIB

#: The CUDA context as nvidia-smi counts it: about 0.5 GiB with lazy module loading (CUDA >= 11.7),
#: 1.3 GiB without (HF's perf guide measures 1,343 MiB on a V100), plus cuBLAS/cuDNN workspaces.
#: 1 GiB sits between, on the side of caution for a fit verdict.
CUDA_CONTEXT_BYTES = 1024 * MIB

def allocator_slack_bytes(allocated_bytes: int, activation_bytes: int) -> int:
    """Reserved − allocated: blocks cached but not in use at the peak.

    The caching allocator rounds large requests up to 2 MiB segments and cannot reuse a freed
    block for a larger request, so slack grows with the churn of activations. No closed form
    exists; the constants (3 % of the allocated peak + 20 % of the activations) are set from
    published reserved and nvidia-smi peaks (Hugging Face's BERT-large runs, torchtune's
    reserved figures) and are the least certain numbers in the estimate.
    """
    return allocated_bytes * 3 // 100 + activation_bytes * 20 // 100


#: The loss's vocabulary-wide blocks the next step's loss takes anew: the upcast logits and
#: their log-softmax, both alive in its forward (`vram.memory.head`, HF's unchunked loss).
IDLE_LOSS_BLOCKS = 2


def idle_loss_bytes(block_bytes: int, largest_param_block_bytes: int, state_bytes: int,
                    checkpointed: bool) -> int:
    """The loss's blocks cached idle at the reserved peak: 2 × b·s·V·e (e: the loss's dtype).

    Step 1's optimizer state is created after its backward freed the loss's blocks; under
    checkpointing those are the largest free blocks then (the layers free one recomputed layer
    at a time), so a state at least their size lands in their segments, and from step 2 on the
    loss takes new segments for them, idle through the layers' backward and the optimizer step.
    Not where a block is no larger than the largest parameter (its gradient or state takes it
    whole every step), nor without checkpointing (the state lands in the stored activations).
    Source: the allocator model's replay (`benchmarks/reserved_full_replay.txt`: Llama-3.1-8B
    at 16k tokens holds 1.9-3.5 such blocks idle) and the H200 3B step (2.4 measured).
    """
    n = IDLE_LOSS_BLOCKS * block_bytes
    if not checkpointed or block_bytes <= largest_param_block_bytes or state_bytes < n:
        return 0
    return n


def idle_loss_item(extra: int, block_bytes: int) -> LineItem:
    """What the idle loss blocks add to the reserved figure beyond the fitted slack."""
    return LineItem.assemble(
        "overhead.idle_loss", "loss blocks cached idle (caching allocator)",
        f"{IDLE_LOSS_BLOCKS} × b·s·V·e − fitted slack", {"block_bytes": block_bytes}, extra,
        "caching-allocator replay of full fine-tunes; see vram.memory.overhead.idle_loss_bytes")


def cuda_context_bytes(setup: TrainingSetup | None = None) -> int:
    """The CUDA context as nvidia-smi counts it: the setup's `context_mib` when given (measured
    on the run's machine), else the constant (a GPU's own figure is applied by `vram.gpus`)."""
    if setup is not None and setup.context_mib is not None:
        return setup.context_mib * MIB
    return CUDA_CONTEXT_BYTES


def slack_item(slack: int) -> LineItem:
    return LineItem.assemble("overhead.allocator", "caching-allocator slack (fragmentation)",
                             "reserved − allocated", {}, slack,
                             "PyTorch CUDA caching allocator; see vram.memory.overhead")


def fixed_overhead_items(setup: TrainingSetup, paged: int,
                          state: OptimizerState) -> tuple[LineItem, ...]:
    """The overhead beside the allocator's slack (which follows the peak): the CUDA context,
    NCCL's buffers (a line per communicator, `vram.memory.nccl`) and paged optimizer state."""
    items = [
        LineItem(key="overhead.context", label="CUDA context, kernels and cuBLAS workspace",
                 formula="constant", inputs={}, bytes=cuda_context_bytes(setup),
                 source="nvidia-smi after a 1-element tensor (HF perf docs: 0.3–1.3 GiB)"),
    ]
    items.extend(nccl_items(setup))
    if paged:
        items.append(LineItem(
            key="overhead.paged", label="paged optimizer state (unified memory, on the GPU)",
            formula=state.formula, inputs={}, bytes=paged,
            source="bitsandbytes paged optimizers (cudaMallocManaged)"))
    return tuple(items)
