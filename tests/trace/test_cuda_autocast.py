"""The trace's autocast casts what CUDA's autocast casts (vram/trace/cuda_autocast.py).

CUDA's lists at torch 2.13 (torch/include/ATen/autocast_mode.h): layer_norm in AT_FORALL_FP32,
softmax in AT_FORALL_FP32_SET_OPT_DTYPE (fp32 unless a dtype is passed), linear in
AT_FORALL_LOWER_PRECISION_FP. CPU autocast leaves the first two in the input's dtype.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from vram.trace.cuda_autocast import (  # noqa: E402
    FP32,
    FP32_APPEND_DTYPE,
    FP32_SET_OPT_DTYPE,
    LOWER_PRECISION_FP,
    PROMOTE,
    _overload,
    cuda_autocast,
)

BF16 = torch.bfloat16


def _dtypes(x: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.dtype]:
    with torch.autocast("cpu", dtype=BF16):
        return {
            "layer_norm": F.layer_norm(x, (x.shape[-1],)).dtype,
            "softmax": torch.softmax(x, -1).dtype,
            "softmax(dtype=bf16)": F.softmax(x, -1, dtype=BF16).dtype,
            "log_softmax": F.log_softmax(x, -1).dtype,
            "pow": x.pow(3.0).dtype,
            "sum": x.sum().dtype,
            "linear(fp32 input)": F.linear(x.float(), weight).dtype,
        }


def test_the_trace_autocast_follows_cuda_lists() -> None:
    x = torch.randn(4, 8, dtype=BF16)
    weight = torch.randn(8, 8)
    with cuda_autocast():
        assert _dtypes(x, weight) == {
            "layer_norm": torch.float32, "softmax": torch.float32,
            "softmax(dtype=bf16)": BF16, "log_softmax": torch.float32, "pow": torch.float32,
            "sum": torch.float32, "linear(fp32 input)": BF16}


def test_outside_the_trace_cpu_autocast_is_itself_again() -> None:
    x = torch.randn(4, 8, dtype=BF16)
    with cuda_autocast():
        pass
    assert _dtypes(x, torch.randn(8, 8)) == {
        "layer_norm": BF16, "softmax": BF16, "softmax(dtype=bf16)": BF16,
        "log_softmax": BF16, "pow": BF16, "sum": BF16, "linear(fp32 input)": BF16}


def test_autograd_saves_the_fp32_input_a_gpu_saves() -> None:
    """Falcon's LayerNorm on a bf16 residual: a GPU keeps the fp32 cast for backward."""
    x = torch.randn(4, 8, dtype=BF16, requires_grad=True)
    saved: list[torch.dtype] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.dtype)
        return t

    with cuda_autocast(), torch.autocast("cpu", dtype=BF16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.layer_norm(x, (8,))
    assert saved and set(saved) == {torch.float32}


def test_every_listed_op_exists_in_this_torch() -> None:
    """The lists are torch 2.13's; a torch that renames an op fails here, not silently."""
    names = (*LOWER_PRECISION_FP, *FP32, *FP32_SET_OPT_DTYPE, *PROMOTE,
             *FP32_APPEND_DTYPE, *FP32_APPEND_DTYPE.values())
    assert [name for name in names if _overload(name) is None] == []
