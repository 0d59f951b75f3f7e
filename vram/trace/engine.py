"""The machinery every trace shares: a tracker that keeps host scalars apart, the labels that
mark the segments of a step, the loss, the optimizer step, and running the steps.

`vram.trace.step` (one GPU), `vram.trace.sharded` (FSDP2 on a fake process group) and
`vram.trace.rl_step` (TRL's losses) build on these public names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vram.setup import Loss, TrainingSetup
from vram.setup.liger import liger_release
from vram.stacks.profile import profile_for
from vram.stacks.resolve import resolve, torch_at_most
from vram.trace.attention import cuda_attention
from vram.trace.build import Built
from vram.trace.cuda_autocast import cuda_autocast
from vram.trace.dropout import cuda_dropout
from vram.trace.fused_loss import fused_linear_loss
from vram.trace.mixer_kernels import emulated_mixer_kernels
from vram.trace.moe import cuda_grouped_mm
from vram.trace.tracker import SegmentPeak, StorageTracker

CHUNKS = 8
#: The phases a tracker labels (`StorageTracker.phase`).
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer step"


@dataclass
class RawTrace:
    """The outcome of tracing one depth."""

    n_layers: int
    peaks: dict[tuple[str, ...], SegmentPeak]
    timeline: list[tuple[int, int, str]]
    paged_bytes: int
    params_total: int
    params_trainable: int
    seconds: float
    notes: list[str] = field(default_factory=list)


class HostScalarTracker(StorageTracker):
    """Leaves out 0-dim tensors made by an optimizer: torch keeps step counters on the host."""

    in_optimizer = False

    def register(self, tensor: torch.Tensor, origin: str = "") -> None:
        if self.in_optimizer and tensor.dim() == 0:
            return
        super().register(tensor, origin)


def _roles(index: int, count: int) -> str:
    roles = []
    if index == 0:
        roles.append("first")
    if index == count - 1:
        roles.append("last")
    return "+".join(roles) or "mid"


def install_labels(built: Built, tracker: StorageTracker, *,
                    label_before_hooks: bool = False) -> None:
    """Hooks that tell the tracker which block runs, in the forward and the backward pass.
    With `label_before_hooks`, a block's label is set before its other forward pre-hooks run (FSDP2
    all-gathers a block's parameters in one: that belongs to the block)."""
    for stack, blocks in built.layer_lists:
        for index, block in enumerate(blocks):
            label = _roles(index, len(blocks))

            def pre(_m: nn.Module, _a: Any, stack: str = stack, label: str = label) -> None:
                if tracker.phase == FORWARD:
                    tracker.set_segment(stack, label)

            def post(_m: nn.Module, _a: Any, out: Any, stack: str = stack,
                     label: str = label) -> None:
                if tracker.phase != FORWARD:
                    return
                tracker.set_segment(stack, label + ":after")
                first = out[0] if isinstance(out, tuple) else out
                if isinstance(first, torch.Tensor) and first.requires_grad:

                    def on_grad(_g: torch.Tensor) -> None:
                        tracker.set_segment(stack, label)

                    first.register_hook(on_grad)

            block.register_forward_pre_hook(pre, prepend=label_before_hooks)
            block.register_forward_hook(post)
    _label_embedding_backward(built, tracker)


def _label_embedding_backward(built: Built, tracker: StorageTracker) -> None:
    """A segment of its own for the input embedding's backward (its gradient is built after
    the first block's backward, and with tied weights summed with the head's)."""
    get = getattr(built.hf, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    if not isinstance(embedding, nn.Module):
        return

    def post(_m: nn.Module, _a: Any, out: Any) -> None:
        if tracker.phase == FORWARD and isinstance(out, torch.Tensor) and out.requires_grad:

            def on_grad(_g: torch.Tensor) -> None:
                tracker.set_segment("embed")

            out.register_hook(on_grad)

    embedding.register_forward_hook(post)


def training_loss(built: Built, setup: TrainingSetup, ids: torch.Tensor,
          labels: torch.Tensor, extra: dict[str, Any] | None = None) -> torch.Tensor:
    model = built.model
    profile = profile_for(setup)
    if built.kind == "causal" and profile.fused_linear_loss:
        return fused_linear_loss(built.hf, ids, labels, cce=profile.fused_loss_is_cce,
                                 liger=liger_release(setup.liger_version),
                                 addmm_out_dtype=not torch_at_most(setup, (2, 7)))
    if built.kind == "causal" and resolve(setup).run.loss is Loss.CHUNKED:
        hidden = built.hf.base_model(input_ids=ids, use_cache=False).last_hidden_state
        head = built.hf.get_output_embeddings()
        total: torch.Tensor | None = None
        for h_chunk, l_chunk in zip(hidden.chunk(CHUNKS, dim=1), labels.chunk(CHUNKS, dim=1),
                                    strict=True):
            logits = head(h_chunk).float()
            part = nn.functional.cross_entropy(logits.flatten(0, 1), l_chunk.flatten(),
                                               reduction="sum")
            del logits
            total = part if total is None else total + part
        assert total is not None
        return total / labels.numel()
    out = model(input_ids=ids, labels=labels, **(extra or {}))
    loss: torch.Tensor = out.loss
    del out
    return loss


def run_steps(built: Built, setup: TrainingSetup, tracker: HostScalarTracker,
              optimizer: torch.optim.Optimizer | None) -> None:
    """Two steps (forward, loss, backward, optimizer step, zero_grad), recorded by `tracker`."""
    vocab = max(built.vocab, 2)
    with (tracker, cuda_attention(setup.attention.value), cuda_dropout(), cuda_autocast(),
          cuda_grouped_mm(),
          emulated_mixer_kernels(str(getattr(built.hf.config, "model_type", "")),
                                 profile_for(setup).mixer_kernels)):
        batch, seq = setup.micro_batch, setup.seq_len
        extra: dict[str, Any] = {}
        if built.inputs is not None:  # a VLM's micro-batch: ids with image tokens, pixels
            ids, extra = built.inputs()
        else:
            ids = torch.randint(0, vocab, (batch, seq))
        classes = built.kind == "classifier"
        labels = torch.randint(0, 2, (batch,)) if classes else ids.clone()
        tracker.recording = True
        for _ in range(2):
            tracker.set_phase(FORWARD, "embed")
            if built.autocast is not None:
                with torch.autocast("cpu", dtype=built.autocast):
                    loss = training_loss(built, setup, ids, labels, extra)
            else:
                loss = training_loss(built, setup, ids, labels, extra)
            tracker.set_phase(BACKWARD, "head")
            with tracker.watching_backward(loss):
                loss.backward()
            del loss
            optimizer_step(tracker, optimizer)
        tracker.recording = False


def optimizer_step(tracker: HostScalarTracker, optimizer: torch.optim.Optimizer | None) -> None:
    """The step and `zero_grad(set_to_none=True)`, recorded as the optimizer phase (the SFT and
    the RL trace end each step with it)."""
    tracker.set_phase(OPTIMIZER)
    tracker.in_optimizer = True
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    tracker.in_optimizer = False
    tracker.sample()


@contextlib.contextmanager
def swappable(mode: Any) -> Iterator[None]:
    """Let `module.to(...)` swap fake parameters (PEFT moves adapters with it).

    `nn.Module._apply` swaps FakeTensor parameters with `torch.utils.swap_tensors`, which
    refuses tensors that have weak references; the fake mode's converter memo holds one to
    every parameter initialised in place. The memo entry is dropped just before the swap.
    """
    original = torch.utils.swap_tensors
    memo = mode.fake_tensor_converter.meta_converter.tensor_memo

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        for key in [k for k, v in list(memo.items()) if v is t1 or v is t2]:
            del memo[key]
        original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def numel(p: torch.Tensor) -> int:
    """Parameters a tensor stands for (a packed 4-bit weight holds two per byte)."""
    if p.dtype == torch.uint8 and p.dim() == 2 and p.shape[1] == 1:
        return 2 * p.numel()
    return p.numel()


def wrap_in_backward(optimizers: list[torch.optim.Optimizer],
                      tracker: HostScalarTracker) -> None:
    for optim in optimizers:
        original = optim.step

        def step(*args: Any, _orig: Any = original, **kwargs: Any) -> Any:
            tracker.in_optimizer = True
            try:
                return _orig(*args, **kwargs)
            finally:
                tracker.in_optimizer = False

        optim.step = step  # type: ignore[method-assign]
