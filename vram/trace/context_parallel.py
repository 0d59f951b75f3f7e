"""Context parallel in the trace: each rank holds `s / cp` tokens; attention sees them all.

Two kinds, each run on the fake process group with its real collectives:

* **ring** (`cp_kind="ring"`): PyTorch's own `context_parallel`
  (torch/distributed/tensor/experimental/_context_parallel/_attention.py@v2.13.0), as
  torchtitan applies it (torchtitan/distributed/context_parallel.py@v0.2.2) and Accelerate's
  `cp_size` does for the HF stacks. The input ids, labels and positions are sharded along the
  sequence with head-tail load balancing (`_HeadTailLoadBalancer`: rank r holds chunks r and
  2cp-1-r); SDPA's q, k, v become DTensors sharded on the sequence and the CUDA flash kernel
  (`aten._scaled_dot_product_flash_attention`, whose meta kernel runs on fake tensors) is
  dispatched to `_templated_ring_attention`. PyTorch 2.13's default rotation is
  `_RotateMethod.ALL_GATHER`: the first step all-gathers every rank's k and v at once (the
  whole sequence's k and v, in the model dtype, unexpanded under GQA: Transformers passes
  `enable_gqa`), the blocks are merged in fp32 (`_cp_options.convert_to_f32`); the backward
  keeps fp32 accumulators for dq, dk, dv and passes dk, dv round the ring by all-to-all.
* **ulysses** (`cp_kind="ulysses"`): DeepSpeed-Ulysses's all-to-all
  (deepspeed/sequence/layer.py@v0.19.5 `_SeqAllToAll`, `single_all_to_all`), which ms-swift's
  `sequence_parallel_size` and axolotl's Ulysses mode run: before attention q, k and v are
  exchanged so that each rank holds all `s` tokens of `heads / cp` heads (a contiguous copy
  of the input in the exchange order, the all-to-all's output buffer, and the copy back into
  the attention layout); the attention runs locally; its output is exchanged back. With fewer
  kv heads than ranks the kv heads are repeated to `cp` first (ms-swift's and DeepSpeed's
  uneven-head path).

The sequence is split in contiguous chunks for Ulysses; the positions follow the chunk.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

RING, ULYSSES = "ring", "ulysses"


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
           dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
           enable_gqa: bool = False) -> torch.Tensor:
    """SDPA as the CUDA flash kernel, on DTensors under `context_parallel` (what
    `scaled_dot_product_attention` dispatches to on a GPU for 16-bit, unmasked inputs)."""
    if attn_mask is not None:
        from vram.trace.build import TraceUnsupported

        raise TraceUnsupported("cp: ring attention takes no mask (PyTorch's CP: causal only)")
    out: torch.Tensor = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    return out


#: `context_parallel` replaces `F.<fn.__name__>`: the function must carry SDPA's name.
_flash.__name__ = "scaled_dot_product_attention"


@contextlib.contextmanager
def ring(mesh: Any, buffers: list[torch.Tensor]) -> Iterator[None]:
    """Inside: `buffers` (each [B, S]) hold this rank's `S / cp` tokens and SDPA is PyTorch's
    ring attention over `mesh`."""
    from torch.distributed.tensor.experimental import context_parallel

    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = _flash  # type: ignore[assignment]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers),
                              no_restore_buffers=set(buffers)):
            yield
    finally:
        functional.scaled_dot_product_attention = original


class _SeqAllToAll(torch.autograd.Function):
    """DeepSpeed-Ulysses's exchange for [B, H, S, D] tensors: scatter `scatter` (heads, dim 1)
    and gather the sequence (dim 2), or back. The backward is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, to_heads: bool) -> torch.Tensor:
        ctx.group, ctx.to_heads = group, to_heads
        return _exchange(x, group, to_heads)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return _exchange(grad, ctx.group, not ctx.to_heads), None, None


def _exchange(x: torch.Tensor, group: Any, to_heads: bool) -> torch.Tensor:
    """One all-to-all with DeepSpeed's copies (`pre_all2all_fun`, `torch.empty_like`,
    `post_all2all`): [B, H, s, D] -> [B, H/n, n*s, D] (`to_heads`), or back."""
    import torch.distributed as dist

    n = dist.get_world_size(group)
    b, h, s, d = x.shape
    if to_heads:  # split heads into n groups; send group j to rank j
        send = x.reshape(b, n, h // n, s, d).permute(1, 0, 2, 3, 4).contiguous()
    else:  # split the sequence into n chunks; send chunk j to rank j
        send = x.reshape(b, h, n, s // n, d).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    if to_heads:  # [n (source: its sequence chunk), B, H/n, s, D] -> [B, H/n, n*s, D]
        return received.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * s, d).contiguous()
    # [n (source: its heads), B, H, s/n, D] -> [B, n*H, s/n, D]
    return received.permute(1, 0, 2, 3, 4).reshape(b, n * h, s // n, d).contiguous()


@contextlib.contextmanager
def ulysses(group: Any) -> Iterator[None]:
    """Inside: SDPA on this rank's `S / cp` tokens exchanges q, k, v to all tokens of
    `H / cp` heads, runs the kernel the trace routes SDPA to, and exchanges the output back.
    Enter it inside `cuda_attention` (it wraps the routed SDPA)."""
    import torch.distributed as dist

    functional = torch.nn.functional
    inner = functional.scaled_dot_product_attention
    n = dist.get_world_size(group)

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:
        if attn_mask is not None:
            from vram.trace.build import TraceUnsupported

            raise TraceUnsupported("cp: the Ulysses trace takes no mask (causal only)")
        if k.shape[1] % n:  # fewer kv heads than ranks: repeat them (the uneven-head path)
            reps = n // k.shape[1] if n % k.shape[1] == 0 else q.shape[1] // k.shape[1]
            k, v = (t.repeat_interleave(reps, dim=1) for t in (k, v))
        q, k, v = (_SeqAllToAll.apply(t, group, True) for t in (q, k, v))
        out = inner(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa or k.shape[1] != q.shape[1])
        result: torch.Tensor = _SeqAllToAll.apply(out, group, False)
        return result

    functional.scaled_dot_product_attention = sdpa  # type: ignore[assignment]
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = inner


def shard_contiguous(tensors: list[torch.Tensor], n: int) -> list[torch.Tensor]:
    """Rank 0's contiguous chunk of each [B, S] tensor (Ulysses splits the sequence in order)."""
    return [t[:, : t.shape[1] // n].clone() for t in tensors]
