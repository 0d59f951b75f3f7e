"""Activation offload as torchtune and TRL run it, on fake tensors.

`OffloadActivations` (torchtune/training/_activation_offloading.py@v0.6.1; TRL copies it,
trl/models/activation_offloading.py@v1.9.0) is a `saved_tensors_hooks` context around the
forward. What it keeps where, with its defaults (`use_pin_memory=True`, `use_streams=True`,
`max_fwd_stash_size=5`, `min_offload_size=1024` bytes):

* pack (forward): a saved tensor of at least 1,024 bytes that is not a parameter or buffer is
  copied into a new pinned host tensor of its size (`torch.empty_like(..., pin_memory=True,
  device="cpu")`); with streams the device tensor itself stays alive in `fwd_stash` until
  `max_fwd_stash_size` newer tensors have been packed (their copies are then known done), so
  the last five offloaded tensors are still on the device; smaller ones stay where they are;
* unpack (backward): the host copy comes back into a new device tensor
  (`.to("cuda", non_blocking=True)`), stashed in `bwd_tensor_stash`; when a node unpacks its
  first tensor, the previous node's are freed by a hook that runs after this node, so the
  tensors of two autograd nodes are on the device at once; what is still in `fwd_stash` is
  used in place (it never left), and the stash is emptied after the first such node runs;
* the output head's forward runs under `NoOpManager` (nothing of it is offloaded); torchtune
  wraps the model's forward only (`with self.activations_handling_ctx: logits =
  self._model(**batch)`, the loss after it), TRL wraps `model(**inputs)`, whose loss a
  Transformers model computes inside its forward: the loss's saved tensors (the fp32 logits'
  softmax) are offloaded under TRL, not under torchtune (`offload_loss`);
* torchtune requires activation checkpointing with it (recipes/full_finetune_distributed.py
  @v0.6.1 #L205-L213); TRL does not (trl/trainer/sft_trainer.py@v1.9.0 #L1352). Under
  non-reentrant checkpointing the only tensors the outer hooks see inside a block are the
  block's inputs, saved by checkpoint's `_NoopSaveInputs` (torch/utils/checkpoint.py@v2.13.0):
  one hidden state per layer goes to the host; the recomputed tensors are not offloaded.

The emulation runs the same hooks with the same rules. The host copies are not tensors here
(the trace has no host): their bytes are counted, and the peak of pinned host memory is
reported. Streams are not simulated: a copy is taken to finish when torchtune's
synchronisation says it has (the stash sizes above).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

#: trl/models/activation_offloading.py@v1.9.0 get_act_offloading_ctx_manager defaults.
MAX_FWD_STASH = 5
MIN_OFFLOAD_BYTES = 1024
SOURCE = "torchtune/training/_activation_offloading.py@v0.6.1"


@dataclass
class _Offloaded:
    """A tensor on the host: how to make it again on the device (a DTensor's local tensor
    goes to the host; it comes back wrapped in the same placements)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int
    spec: Any = None  # (mesh, placements, global shape, global stride) of a DTensor

    def make(self) -> torch.Tensor:
        local = torch.empty_strided(self.shape, self.stride, dtype=self.dtype)
        if self.spec is None:
            return local
        from torch.distributed.tensor import DTensor

        mesh, placements, shape, stride = self.spec
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape,
                                  stride=stride)


def _offloaded(tensor: torch.Tensor) -> _Offloaded:
    """What the host keeps of `tensor`: its local part (torchtune's `empty_like(activation,
    device="cpu")` of a DTensor is its local shard)."""
    from torch.distributed.tensor import DTensor

    spec = None
    local = tensor
    if isinstance(tensor, DTensor):
        spec = (tensor.device_mesh, tensor.placements, tensor.shape, tensor.stride())
        local = tensor.to_local()
    stride = local.stride() if local.is_contiguous() else _contiguous(local.shape)
    return _Offloaded(tuple(local.shape), tuple(stride), local.dtype,
                      local.numel() * local.element_size(), spec)


@dataclass
class OffloadState:
    """What the emulated `OffloadActivations` holds, and the host memory it used."""

    max_fwd_stash: int = MAX_FWD_STASH
    min_bytes: int = MIN_OFFLOAD_BYTES
    host: dict[int, _Offloaded | torch.Tensor] = field(default_factory=dict)
    fwd_stash: dict[int, torch.Tensor] = field(default_factory=dict)
    bwd_stash: dict[int, torch.Tensor] = field(default_factory=dict)
    next_id: int = 0
    host_bytes: int = 0
    host_peak_bytes: int = 0
    offloaded_bytes: int = 0  # bytes sent to the host over a step (each way)
    node: Any = None
    muted: int = 0  # inside the output head (NoOpManager)
    params: set[int] = field(default_factory=set)
    #: TRL's deduplication (trl/models/activation_offloading.py@v1.9.0 #L53-L80, #L222-L231,
    #: #L345-L351): a storage packed again while its first copy is still in the forward stash
    #: is not offloaded again: that reference keeps the tensor on the device.
    dedup: bool = False
    seen: dict[tuple[int, int, torch.dtype], int] = field(default_factory=dict)

    def pack(self, tensor: torch.Tensor) -> int:
        self.next_id += 1
        tid = self.next_id
        nbytes = tensor.numel() * tensor.element_size()
        if (self.muted or nbytes < self.min_bytes or isinstance(tensor, nn.Parameter)
                or _storage_id(tensor) in self.params):
            self.host[tid] = tensor
            return tid
        for old in [k for k in self.fwd_stash if k <= tid - self.max_fwd_stash]:
            del self.fwd_stash[old]
            self.seen = {key: t for key, t in self.seen.items() if t != old}
        key = _storage_key(tensor)
        if self.dedup and key in self.seen:
            self.host[tid] = tensor  # kept on the device
            return tid
        if self.dedup:
            self.seen[key] = tid
        host = _offloaded(tensor)
        self.host[tid] = host
        self.fwd_stash[tid] = tensor
        self.host_bytes += host.nbytes
        self.offloaded_bytes += host.nbytes
        self.host_peak_bytes = max(self.host_peak_bytes, self.host_bytes)
        return tid

    def unpack(self, tid: int) -> torch.Tensor:
        item = self.host.pop(tid)
        if isinstance(item, torch.Tensor):
            return item
        self.host_bytes -= item.nbytes
        node = torch._C._current_autograd_node()
        previous: list[int] = []
        if node is not self.node:  # a new node: the last node's tensors go after this one
            self.node = node
            previous = list(self.bwd_stash)
        if tid in self.fwd_stash:  # never left the device
            back = self.fwd_stash[tid]
        else:
            back = item.make()
            self.bwd_stash[tid] = back

        def after_node(outputs: Any, _inputs: Any) -> Any:
            self.fwd_stash.clear()  # "still things in the fwd_stash ... we're in bwd now"
            for old in previous:
                self.bwd_stash.pop(old, None)
            return outputs

        if node is not None:
            node.register_hook(after_node)
        return back

    def end_backward(self) -> None:
        """torchtune's end-of-backward callback drops what is still stashed."""
        self.fwd_stash.clear()
        self.bwd_stash.clear()
        self.seen.clear()
        self.node = None


def _contiguous(shape: torch.Size) -> tuple[int, ...]:
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def _storage_key(tensor: torch.Tensor) -> tuple[int, int, torch.dtype]:
    """TRL's `_get_unique_tensor_key`: the (local) storage, the offset in it, the dtype."""
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return _storage_id(local), int(local.storage_offset()), local.dtype


def _storage_id(tensor: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local()
    try:
        return id(tensor.untyped_storage())
    except (RuntimeError, NotImplementedError):
        return -1


@contextlib.contextmanager
def offloading(state: OffloadState, head: nn.Module | None) -> Iterator[None]:
    """The forward's `saved_tensors_hooks`, with the head's forward left out (NoOpManager)."""
    handles = []
    if head is not None:

        def enter(*_args: Any) -> None:
            state.muted += 1

        def leave(*_args: Any) -> None:
            state.muted -= 1

        handles = [head.register_forward_pre_hook(enter),
                   head.register_forward_hook(leave, always_call=True)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(state.pack, state.unpack):
            yield
    finally:
        for handle in handles:
            handle.remove()


def parameter_storages(model: nn.Module) -> set[int]:
    """Storages of the parameters (TRL's `update_model_params` skips them; so does
    torchtune's isinstance check for the parameters themselves)."""
    return {_storage_id(p) for p in model.parameters()}
