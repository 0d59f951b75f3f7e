"""What CUDA libraries allocate through PyTorch's caching allocator.

cuBLAS: PyTorch gives every (cuBLAS handle, stream) pair a workspace from the caching allocator
at its first matmul and keeps it until `torch._C._cuda_clearCublasWorkspaces()`
(`aten/src/ATen/cuda/CublasHandlePool.cpp`, `getCurrentCUDABlasHandle` / `getNewWorkspace`).
Handles are per thread, and autograd runs a CUDA backward pass on its own device thread, so a
training step holds two: one for the forward pass and the optimizer (the main thread), one for
the backward pass. cuBLASLt shares the cuBLAS workspace (`TORCH_CUBLASLT_UNIFIED_WORKSPACE`,
on by default). The size, `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KIB:COUNT` pairs), defaults to
`:4096:8` (32 MiB) on sm90 (H100/H200) and `:4096:2:16:8` (8 MiB + 128 KiB) elsewhere
(`parseChosenWorkspaceSize`). On the H200 steps (`benchmarks/GPU_H200.md`) measured
`max_memory_allocated` exceeds the exact trace by 64.0-64.6 MiB on every dense row: the two
32 MiB workspaces.
"""

from __future__ import annotations

import re

from vram.units import MIB

KIB = 2**10

#: Default `CUBLAS_WORKSPACE_CONFIG` sizes: sm90, and every other compute capability.
CUBLAS_WORKSPACE_SM90_BYTES = 32 * MIB  # 4096 KiB x 8
CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 * KIB * 2 + 16 * KIB * 8
#: Threads that hold a cuBLAS handle during a training step: main (forward, optimizer) and
#: autograd's device thread (backward).
STEP_BLAS_THREADS = 2


def cublas_workspace_bytes(capability: tuple[int, int] = (9, 0), config: str | None = None) -> int:
    """One cuBLAS workspace: `CUBLAS_WORKSPACE_CONFIG` if set (sum of SIZE x COUNT KiB), else
    the default of the compute capability (`parseChosenWorkspaceSize`)."""
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if not pairs:
            return 4096 * KIB  # PyTorch warns and falls back to 4 MiB
        return sum(int(size) * KIB * int(count) for size, count in pairs)
    return CUBLAS_WORKSPACE_SM90_BYTES if capability == (9, 0) else CUBLAS_WORKSPACE_DEFAULT_BYTES

