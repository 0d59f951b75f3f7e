"""Fused linear cross-entropy in the trace: the head and the loss in one autograd node, as the
real kernels allocate and save.

The Triton kernels write their results in place into buffers the Python wrappers allocate, so
each emulation here makes exactly the wrappers' tensors (shape and dtype, on fake tensors) and
skips the kernels' arithmetic (an in-place write allocates nothing).

- Liger (the `loss` knob's `fused-linear`, the closed form's `vram.memory.head._fused_linear_head`):
  `LigerFusedLinearCrossEntropyFunction`, linkedin/Liger-Kernel
  src/liger_kernel/ops/fused_linear_cross_entropy.py@v0.3.0 (commit 793785f), lines 15-140
  (forward: `grad_weight`, `grad_input`, `loss_1d` allocated before the loop; per chunk of
  next_power_of_2(ceil(BT / ceil(V / H))) tokens the logits, their fp32 upcast, the cast back,
  `grad_logits_chunk = logits_chunk * alpha`, `grad_input[...] = grad_logits_chunk @ weight`,
  `addmm` into `grad_weight`), 143-189 (backward: scales the saved gradients in place when
  grad_output != 1) and 192-238 (saves `grad_input` and `grad_weight`). Called by
  src/liger_kernel/transformers/model/llama.py@v0.3.0 `lce_forward` lines 101-109 on
  `hidden_states[..., :-1, :].contiguous()` flattened to BT x H. Later releases by the
  `liger_version` knob (`vram.setup.liger`): no fp32 upcast from v0.5.0 (@v0.5.0 lines 64-77),
  `grad_logits_chunk = logits_chunk` from v0.5.3 (line 122), and from v0.6.2
  `grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()` (@v0.6.2 line 134,
  @v0.8.2 line 257; v0.8.1 on, an fp32 grad_weight over 16-bit logits on PyTorch >= 2.8 takes
  `addmm(out_dtype=torch.float32)` in place, @v0.8.2 lines 243-256).
- Cut Cross-Entropy, where the stack runs it (`fused_loss_is_cce`: unsloth, which first casts
  the hidden states to the head's dtype, unsloth_zoo/loss_utils.py@ce232d6c
  `fused_linear_cross_entropy`): `LinearCrossEntropyFunction`, apple/ml-cross-entropy
  cut_cross_entropy/cce.py@d42911f lines 48-162 (forward casts e and c to the autocast dtype,
  saves e, c, lse and the valid-token index), 164-235 (backward), 261-319
  (`cce_linear_cross_entropy`: `_build_flat_valids`, cut_cross_entropy/utils.py@d42911f lines
  28-49); cce_lse_forward.py@d42911f lines 170-200 (lse fp32 per valid token, logit_avg fp32
  per vocabulary entry); indexed_dot.py@d42911f line 123 (the fp32 negative dot);
  cce_backward.py@d42911f lines 385-521 (de = zeros_like(e), dc = zeros_like(c), locks, cast
  back to the inputs' dtypes).
"""

from __future__ import annotations

from typing import Any

import torch

from vram.setup.liger import (
    LIGER_ADDMM_OUT_DTYPE,
    LIGER_ALIASES_GRAD,
    LIGER_FP32_PRODUCT,
    LIGER_NO_UPCAST,
)

IGNORE_INDEX = -100
#: The release the emulation was first written from.
LIGER_V030 = (0, 3, 0)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def liger_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Liger's chunk: next_power_of_2(ceil(BT / ceil(V / H))) tokens (v0.3.0 lines 40-43)."""
    return _next_power_of_2(_cdiv(tokens, _cdiv(vocab, hidden)))


def _autocast_dtype(default: torch.dtype) -> torch.dtype:
    """`torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else x.dtype`: the trace
    autocasts on the CPU key (`vram.trace.cuda_autocast`), so that is the one read here."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return default


class LigerFusedLinearCrossEntropy(torch.autograd.Function):
    """Liger's fused linear cross-entropy at v0.3.0, and its later chunk loops by the version
    (`vram.setup.liger`; see the module's docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                target: torch.Tensor, liger: tuple[int, int, int] = LIGER_V030,
                addmm_out_dtype: bool = True) -> torch.Tensor:
        dtype = _autocast_dtype(x.dtype)
        bt, hidden = x.shape
        chunk = liger_chunk_tokens(bt, weight.shape[0], hidden)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        grad_input = torch.zeros_like(x)
        loss_1d = torch.zeros(bt, dtype=torch.float32, device=x.device)
        total = (target != IGNORE_INDEX).sum()
        for start in range(0, bt, chunk):
            end = min(start + chunk, bt)
            x_chunk = x[start:end]
            logits_chunk = x_chunk @ weight.t()
            loss_slice = loss_1d[start:end]
            # `.sum().item()` on the chunk's targets: every label counts (no ignored ones)
            alpha = (end - start) / total
            if liger < LIGER_NO_UPCAST:  # up to v0.4.2 the kernel runs on an fp32 copy
                logits_chunk = logits_chunk.float().contiguous()
                # liger_cross_entropy_kernel: loss and the logits' gradient, written in place
                logits_chunk = logits_chunk.to(dtype)
            loss_1d[start:end] = loss_slice * alpha
            # v0.5.3 on: `grad_logits_chunk = logits_chunk` (scaled inside the kernel)
            grad_logits_chunk = logits_chunk * alpha if liger < LIGER_ALIASES_GRAD \
                else logits_chunk
            grad_input[start:end] = grad_logits_chunk @ weight
            if grad_weight is not None:
                _accumulate_head_grad(grad_weight, grad_logits_chunk, x_chunk, liger,
                                      addmm_out_dtype)
        loss = torch.sum(loss_1d)
        ctx.save_for_backward(grad_input.detach(),
                              grad_weight.detach() if grad_weight is not None else None)
        return loss

    @staticmethod
    def backward(ctx: Any, *grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # grad_output is 1.0 at the end of a step: `element_mul_kernel` is skipped, and in any
        # case it scales the saved gradients in place (lines 146-189): nothing is allocated
        grad_input, grad_weight = ctx.saved_tensors
        return grad_input, grad_weight, None, None, None


def _accumulate_head_grad(grad_weight: torch.Tensor, grad_logits: torch.Tensor,
                          x_chunk: torch.Tensor, liger: tuple[int, int, int],
                          addmm_out_dtype: bool) -> None:
    """The chunk's share of the head's gradient, as each version adds it."""
    if liger >= LIGER_FP32_PRODUCT and not (
            liger >= LIGER_ADDMM_OUT_DTYPE and addmm_out_dtype
            and grad_weight.dtype == torch.float32 and grad_logits.dtype != torch.float32):
        # v0.6.2 line 134 / v0.8.2 line 257: the product (autocast's dtype) and its fp32 copy
        grad_weight += torch.mm(grad_logits.t(), x_chunk).float()
        return
    # v0.3.0 hands addmm the chunk's e-byte gradient and the input as they are; a fp32 input
    # (autocast on an fp32 model) fails there, and v0.6.0 casts the gradient to the input's
    # dtype (lines 126-135): that cast, where it applies; v0.8.1's addmm(out_dtype=fp32)
    # writes in place as well
    mat1 = grad_logits.t()
    if mat1.dtype != x_chunk.dtype:
        mat1 = mat1.to(x_chunk.dtype)
    with torch.autocast("cpu", enabled=False):
        torch.addmm(grad_weight, mat1, x_chunk.to(grad_weight.dtype)
                    if x_chunk.dtype != grad_weight.dtype else x_chunk, out=grad_weight)
    del mat1


def liger_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
               liger: tuple[int, int, int] = LIGER_V030, addmm_out_dtype: bool = True,
               ) -> torch.Tensor:
    """`lce_forward` (llama.py@v0.3.0 lines 101-109): the shifted hidden states copied
    contiguous, flattened, through the fused function."""
    shift_hidden = hidden[..., :-1, :].contiguous().view(-1, hidden.shape[-1])
    shift_labels = labels[..., 1:].contiguous().view(-1)
    loss: torch.Tensor = LigerFusedLinearCrossEntropy.apply(shift_hidden, weight, shift_labels,
                                                            liger, addmm_out_dtype)
    return loss


class CutCrossEntropy(torch.autograd.Function):
    """Apple's Cut Cross-Entropy at d42911f (see the module's docstring)."""

    @staticmethod
    def forward(ctx: Any, e: torch.Tensor, c: torch.Tensor,  # type: ignore[override]
                valids: torch.Tensor) -> torch.Tensor:
        ctx.e_dtype, ctx.c_dtype = e.dtype, c.dtype
        ctx.e_grad, ctx.c_grad = e.requires_grad, c.requires_grad
        if torch.is_autocast_enabled("cpu"):  # cce.py lines 71-73
            dtype = torch.get_autocast_dtype("cpu")
            e, c = e.to(dtype), c.to(dtype)
        tokens = valids.numel()
        lse = e.new_full((tokens,), -float("inf"), dtype=torch.float32)
        locks = e.new_zeros((_cdiv(tokens, 128),), dtype=torch.int32)  # uint32 in the source
        # filter_eps="auto" (the default) asks the forward for each entry's mean logit
        logit_avg = e.new_zeros((c.shape[0],), dtype=torch.float32)
        del locks
        neg_dot = e.new_zeros((tokens,), dtype=torch.float32)
        nll = neg_dot.add_(lse)
        ctx.save_for_backward(e, c, lse, valids, logit_avg)
        loss = nll.mean()
        return loss

    @staticmethod
    def backward(ctx: Any, *grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        e, c, lse, _valids, logit_avg = ctx.saved_tensors
        vocab_ordering = torch.argsort(logit_avg).to(torch.int32)  # sort_logit_avg
        de = torch.zeros_like(e) if ctx.e_grad else None
        dc = torch.zeros_like(c) if ctx.c_grad else None
        d_chunks = _cdiv(c.shape[1], 64)
        de_locks = e.new_zeros((_cdiv(lse.numel(), 128), d_chunks), dtype=torch.int32) \
            if de is not None else None
        dc_locks = c.new_zeros((_cdiv(c.shape[0], 128), d_chunks), dtype=torch.int32) \
            if dc is not None else None
        # _cce_backward_kernel writes de and dc in place
        del vocab_ordering, de_locks, dc_locks
        if dc is not None:
            dc = dc.to(dtype=ctx.c_dtype)
        if de is not None:
            de = de.to(dtype=ctx.e_dtype)
        return de, dc, None


def _flat_valids(labels: torch.Tensor) -> torch.Tensor:
    """`_build_flat_valids(targets, ignore_index, shift=1)` (utils.py@d42911f lines 28-49):
    the shifted targets' mask, `nonzero()` (int64, one row per index), `.to(int32)`, then
    `.sum(1)` of the strided indices (int64). Every label counts here; `nonzero` has no fake
    kernel with a known size, so its output is made at that size."""
    shifted = labels[..., 1:]
    mask = shifted != IGNORE_INDEX
    count = shifted.numel()
    rows = torch.empty((count, shifted.dim()), dtype=torch.int64, device=labels.device)
    del mask
    valids = rows.to(torch.int32).sum(1)
    return valids


def cce_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`linear_cross_entropy(hidden, weight, labels, shift=1)` (cce.py@d42911f lines 261-319)."""
    valids = _flat_valids(labels.contiguous())
    e = hidden.contiguous().flatten(0, -2)
    loss: torch.Tensor = CutCrossEntropy.apply(e, weight, valids)
    return loss


def fused_linear_loss(hf: Any, ids: torch.Tensor, labels: torch.Tensor, *, cce: bool,
                      liger: tuple[int, int, int] = LIGER_V030,
                      addmm_out_dtype: bool = True) -> torch.Tensor:
    """The causal model's last hidden states through the fused head and loss (the model's
    `lm_head` never runs on its own): Cut Cross-Entropy where the stack runs it, else Liger's.
    """
    hidden = hf.base_model(input_ids=ids, use_cache=False).last_hidden_state
    weight = hf.get_output_embeddings().weight
    if cce:  # unsloth_zoo/loss_utils.py@ce232d6c fused_linear_cross_entropy: to the head's dtype
        return cce_loss(hidden.to(weight.dtype), weight, labels)
    return liger_loss(hidden, weight, labels, liger, addmm_out_dtype)
