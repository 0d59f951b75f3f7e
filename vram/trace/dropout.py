"""Dropout as CUDA runs it, for tensors that are fake CPU tensors.

On CPU, `F.dropout` multiplies by a noise tensor in the input's dtype and keeps that noise for
backward (2 bytes per value in 16 bits). On CUDA, PyTorch takes the fused `native_dropout`
kernel, which keeps a 1-byte boolean mask (aten/src/ATen/native/Dropout.cpp,
`is_fused_kernel_acceptable`). The trace stands in for a GPU, so it routes dropout to
`native_dropout`: the mask it keeps is the one a GPU keeps.

Dropout called from inside an ATen composite (SDPA's math path, `_scaled_dot_product_attention_
math`, drops its probabilities with `at::dropout`) never reaches `F.dropout`; for the same reason
the `aten::dropout` composite is given the fused kernel too while the step runs (a `torch.library`
registration, removed on exit).
"""

from __future__ import annotations

import contextlib
import warnings
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


def _aten_dropout(input: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """`aten::dropout` as CUDA dispatches it (Dropout.cpp `dropout`: the fused kernel)."""
    return fused_dropout(input, p, train)


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """Inside: `torch.nn.functional.dropout` (and `nn.Dropout`) and `aten::dropout` called from
    other composites keep a 1-byte mask."""
    torch.nn.functional.dropout = fused_dropout
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel"
        warnings.simplefilter("ignore")
        library.impl("dropout", _aten_dropout, "CompositeImplicitAutograd")
    try:
        yield
    finally:
        library._destroy()
        torch.nn.functional.dropout = _original_dropout
