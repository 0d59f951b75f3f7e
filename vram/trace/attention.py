"""Attention as a CUDA GPU runs it, inside a step traced on CPU fake tensors.

Two things differ between the CPU the trace runs on and the CUDA GPU it stands for:

1. **The causal mask.** transformers skips the s x s mask for SDPA when nothing is padded and
   the positions are one plain sequence per row (`_ignore_causal_mask_sdpa`, then SDPA gets
   `attn_mask=None, is_causal=True`). Its packed-sequence check
   (`masking_utils.find_packed_sequence_indices`) must read the position ids; on fake tensors it
   cannot (`is_tracing` is true for a FakeTensor), so it answers "maybe packed" and a
   `[B, 1, S, S]` mask is built, and converted to a 16-bit additive mask (`where`) by every SDPA
   call. The trace's inputs are never packed (position ids `0..S-1`), so during the trace the
   check answers what it answers on a GPU: not packed. The position-diff and cumsum tensors it
   allocates on a GPU are still allocated. Models that build a mask on purpose keep it (Falcon
   always does, to add ALiBi; sliding-window layers with S >= window; padding).

2. **The SDPA kernel.** On CPU, `torch.nn.functional.scaled_dot_product_attention` picks the CPU
   flash kernel or the math fallback by CPU rules. During the trace every call is routed
   through `sdpa`, which picks the kernel by PyTorch's CUDA rules (torch 2.13 default order:
   flash, memory-efficient, math; cuDNN comes after math, so it never runs unless chosen):

   * flash (`_scaled_dot_product_flash_attention`): no `attn_mask`, fp16/bf16, equal q/k/v head
     dims <= 256, last dims contiguous, equal head counts or `enable_gqa` with kv heads
     dividing q heads. It returns `out` (allocated `[B, S, H, D]`, handed back as a
     `[B, H, S, D]` view) and `logsumexp` fp32 `[B, H, S]`; autograd saves q, k, v, out and
     logsumexp (and an RNG seed/offset of a few bytes). Backward allocates dq, dk, dv.
   * memory-efficient (`_scaled_dot_product_efficient_attention`): also takes an `attn_mask`
     (a boolean one is first turned into a q-dtype additive bias, s x s, and its last dim padded
     to a multiple of 16) but needs equal head counts (no GQA); fp32 too; head dims % 8 == 0.
     Saves q, k, v, the bias, out and logsumexp fp32 `[B, H, ceil(S/32)*32]`.
   * otherwise math (`_scaled_dot_product_attention_math`), the same composite code on CPU and
     CUDA: 16-bit inputs upcast to fp32, s x s scores and `_safe_softmax` kept for backward.
     It is run as is, forced with `sdpa_kernel(MATH)` so the CPU flash kernel is not used.

   Flash and memory-efficient run as `fused_sdpa`, a custom op whose fake kernel allocates
   exactly what the CUDA kernel returns (out + logsumexp), registered with an autograd formula
   that saves q, k, v, out, logsumexp (+ bias) and whose backward allocates dq, dk, dv and
   nothing s x s. k/v are never expanded by the op: with `enable_gqa` flash reads the shared kv
   heads; a `repeat_kv` done by the model before the call is real and stays.

With `setup.attention == "flash"` (flash-attn 2 in HF), every call is the flash kernel: a mask
passed in is dropped (flash-attn takes causal and sliding windows as kernel arguments, and there
is no padding), and fewer kv heads than q heads are read as GQA/MQA, unexpanded.

Workspaces inside one kernel (the flash backward's fp32 `dq_accum` and, for GQA, its expanded
dk/dv before the head sum) are not in the live count, as for every other op the tracker counts;
the tracker's allocation log (for the caching allocator model) has the flash backward's
(`flash_backward_scratch`). The efficient backward's `delta` is in neither.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from vram.trace.tracker import KERNEL_SCRATCH, math_sdpa

FLASH, EFFICIENT, MATH = "flash", "efficient", "math"

_original_sdpa = torch.nn.functional.scaled_dot_product_attention


def _math_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                    is_causal: bool, scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Out and logsumexp on real tensors (for the op's real kernel; the trace uses the fake one)."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    scores = (q.float() @ k.float().transpose(-2, -1)) * s
    if bias is not None:
        scores = scores + bias.float()[..., : scores.shape[-1]]
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = scores.logsumexp(-1)
    out = (scores - lse[..., None]).exp() @ v.float()
    return out.to(q.dtype), lse


def _lse_len(q_len: int, kernel: str) -> int:
    return -(-q_len // 32) * 32 if kernel == EFFICIENT else q_len


@torch.library.custom_op("vram_trace::fused_sdpa", mutates_args=())
def fused_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
               is_causal: bool, scale: float | None,
               kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """CUDA flash / memory-efficient SDPA forward: (out, logsumexp fp32)."""
    out, lse = _math_reference(q, k, v, bias, is_causal, scale)
    b, h, s, d = out.shape
    buf = out.new_empty(b, s, h, d)
    buf.copy_(out.transpose(1, 2))
    full = lse.new_zeros(b, h, _lse_len(s, kernel))
    full[..., :s] = lse
    return buf.transpose(1, 2), full


@fused_sdpa.register_fake
def _fused_sdpa_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     bias: torch.Tensor | None, is_causal: bool, scale: float | None,
                     kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, s = q.shape[0], q.shape[1], q.shape[2]
    out = q.new_empty(b, s, h, v.shape[-1]).transpose(1, 2)
    lse = q.new_empty(b, h, _lse_len(s, kernel), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("vram_trace::fused_sdpa_backward", mutates_args=())
def fused_sdpa_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, bias: torch.Tensor | None,
                        is_causal: bool, scale: float | None,
                        kernel: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of `fused_sdpa` (real kernel: autograd through the math reference)."""
    with torch.enable_grad():
        lq, lk, lv = (t.detach().float().requires_grad_(True) for t in (q, k, v))
        ref, _ = _math_reference(lq, lk, lv, bias, is_causal, scale)
        dq, dk, dv = torch.autograd.grad(ref, (lq, lk, lv), grad.float())
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@fused_sdpa_backward.register_fake
def _fused_sdpa_backward_fake(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                              bias: torch.Tensor | None, is_causal: bool, scale: float | None,
                              kernel: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    q, k, v, bias, is_causal, scale, kernel = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bias)
    ctx.args = (is_causal, scale, kernel)


def _backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: Any) -> tuple[Any, ...]:
    q, k, v, out, lse, bias = ctx.saved_tensors
    dq, dk, dv = fused_sdpa_backward(grad_out, q, k, v, out, lse, bias, *ctx.args)
    return dq, dk, dv, None, None, None, None


fused_sdpa.register_autograd(_backward, setup_context=_setup_context)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def flash_backward_scratch(args: Any) -> list[int]:
    """Scratch of the flash-attention 2 backward kernel, in allocation order (PyTorch's copy of
    FA2, `pytorch_flash::mha_bwd` in aten/src/ATen/native/transformers/cuda/flash_attn/
    flash_api.cpp, read in an annotated copy): `softmax_d` fp32 `[B, H, round128(S)]`; the fp32
    dq accumulator `[B, round128(S), H, round32(D)]` (`loop = true` there, always); with fewer
    kv heads (GQA), dk and dv expanded to every query head before their head sum. The
    memory-efficient kernel's backward scratch is not modelled."""
    q, k = args[1], args[2]
    if args[-1] != FLASH:
        return []
    b, h, s, d = q.shape
    s_round = _round_up(s, 128)
    sizes = [b * h * s_round * 4, b * s_round * h * _round_up(d, 32) * 4]
    if k.shape[1] != h:
        sizes += [b * k.shape[2] * h * d * q.element_size()] * 2
    return sizes


KERNEL_SCRATCH[torch.ops.vram_trace.fused_sdpa_backward.default] = flash_backward_scratch


def cuda_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any,
                enable_gqa: bool) -> str:
    """The SDPA backend PyTorch's CUDA dispatcher picks for these inputs (sm80/sm90)."""
    dense = q.dim() == k.dim() == v.dim() == 4
    same_batch = q.shape[0] == k.shape[0] == v.shape[0]
    same_heads = q.shape[-3] == k.shape[-3] == v.shape[-3]
    gqa = (enable_gqa and k.shape[-3] == v.shape[-3] and k.shape[-3] > 0
           and q.shape[-3] % k.shape[-3] == 0)
    strides = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    d, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    if not (dense and same_batch and strides):
        return MATH
    if (attn_mask is None and q.dtype in (torch.float16, torch.bfloat16)
            and d == dk == dv and d <= 256 and (same_heads or gqa)):
        return FLASH
    if (same_heads and q.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and d == dk and d % 8 == 0 and dv % 8 == 0):
        return EFFICIENT
    return MATH


def _as_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What SDPA makes of a mask before the efficient kernel: additive, last dim % 16 == 0."""
    if mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), -math.inf,
                                                                          dtype=dtype))
    last = mask.shape[-1]
    if last % 16:
        padded = mask.new_zeros(*mask.shape[:-1], -(-last // 16) * 16)
        padded[..., :last] = mask
        mask = padded[..., :last]
    return mask


def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
         dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
         enable_gqa: bool = False, *, flash_only: bool = False) -> torch.Tensor:
    """`scaled_dot_product_attention` with CUDA's kernel choice and memory (module docstring)."""
    if torch.is_autocast_enabled("cpu"):  # SDPA is a lower-precision autocast op on CUDA too
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(dtype) if t.is_floating_point() else t
                             for t in (query, key, value))
        if isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(dtype)
    if flash_only:
        kernel = FLASH
        attn_mask = None
        is_causal = is_causal or query.shape[-2] > 1
    else:
        kernel = cuda_kernel(query, key, value, attn_mask, enable_gqa)
    if kernel == MATH:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH), math_sdpa():
            result: torch.Tensor = _original_sdpa(
                query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return result
    bias = _as_bias(attn_mask, query.dtype) if attn_mask is not None else None
    with torch.autocast("cpu", enabled=False):
        out, _lse = fused_sdpa(query, key, value, bias, bool(is_causal), scale, kernel)
    return out


@contextlib.contextmanager
def cuda_attention(attention: str) -> Iterator[None]:
    """Inside: HF's packed-sequence check answers as on a GPU, and SDPA runs as CUDA runs it.

    `attention` is the setup's kernel: "eager" changes only the mask check (eager scores are
    real), "sdpa" routes SDPA through `sdpa`, "flash" through `sdpa(..., flash_only=True)`
    and has HF build the masks of flash-attn 2 (none without padding) for SDPA-built models.
    """
    from transformers import masking_utils

    original_find = masking_utils.find_packed_sequence_indices

    def not_packed(position_ids: torch.Tensor) -> None:
        original_find(position_ids)  # allocates what it allocates on a GPU
        return None

    def routed(*args: Any, **kwargs: Any) -> torch.Tensor:
        return sdpa(*args, flash_only=attention == "flash", **kwargs)

    masks = masking_utils.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    original_mask = masks["sdpa"]
    masking_utils.find_packed_sequence_indices = not_packed
    if attention != "eager":
        torch.nn.functional.scaled_dot_product_attention = routed
    if attention == "flash":  # an SDPA-built model (Falcon) gets the masks flash-attn 2 gets
        masks["sdpa"] = masking_utils.flash_attention_mask
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original_find
        torch.nn.functional.scaled_dot_product_attention = _original_sdpa
        masks["sdpa"] = original_mask


#: The HF attention implementation `register_fused` adds (a name without "flash": transformers
#: treats those as hub kernels to download).
FUSED = "vram_fused"


def fused_attention_forward(module: Any, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: Any, dropout: float = 0.0,
                            scaling: float | None = None, is_causal: bool | None = None,
                            **_kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF attention interface for `attention="flash"`: flash-attn 2 as HF calls it.

    As `flash_attention_2`: no mask is built (transformers builds none for an implementation
    without a mask function, as flash-attn 2 needs none without padding), kv heads stay
    unexpanded, soft-capping and sliding windows are kernel arguments, and the output comes
    back `[B, S, H, D]`. The kernel is `fused_sdpa` with the flash layout (out + logsumexp).
    """
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out, _lse = fused_sdpa(query, key, value, None, bool(causal and query.shape[-2] > 1),
                           scaling, FLASH)
    return out.transpose(1, 2), None


def register_fused() -> str:
    """Register `FUSED` with transformers' attention interface (idempotent); return its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(FUSED, fused_attention_forward)
    return FUSED
