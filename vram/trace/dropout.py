"""Dropout as CUDA runs it, for tensors that are fake CPU tensors.

On CPU, `F.dropout` multiplies by a noise tensor in the input's dtype and keeps that noise for
backward (2 bytes per value in 16 bits). On CUDA, PyTorch takes the fused `native_dropout`
kernel, which keeps a 1-byte boolean mask (aten/src/ATen/native/Dropout.cpp,
`is_fused_kernel_acceptable`). The trace stands in for a GPU, so it routes dropout to
`native_dropout`: the mask it keeps is the one a GPU keeps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_original_dropout = torch.nn.functional.dropout


def fused_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
                  inplace: bool = False) -> torch.Tensor:
    """`F.dropout` through the fused kernel CUDA uses (output + boolean mask)."""
    if not training or p == 0.0:
        return input
    output: torch.Tensor = torch.native_dropout(input, p, True)[0]
    if inplace:
        return input.copy_(output)
    return output


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """Inside: `torch.nn.functional.dropout` (and `nn.Dropout`) keep a 1-byte mask."""
    torch.nn.functional.dropout = fused_dropout
    try:
        yield
    finally:
        torch.nn.functional.dropout = _original_dropout
