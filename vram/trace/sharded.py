"""Trace rank 0 of an FSDP2 (`fully_shard`) run on fake tensors, with a fake process group.

The recipe: `fully_shard` on every repeated block, then on the root module (embedding, final
norm and head: the root's unit, as Accelerate's FSDP2 wraps), over a 1-D mesh of `n_gpus`
ranks; with `fsdp_embedding_units` the embedding and an untied head are units of their own
(torchtune's `custom_sharded_layers`, torchtitan's `apply_fsdp`) and the root keeps the norm.
One process plays rank 0 of N: PyTorch's fake process group answers every
collective without sending anything (torch/testing/_internal/distributed/fake_pg.py), so
all-gathers and reduce-scatters allocate their real output buffers and nothing else. This is
how PyTorch's own `torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker` runs.

* `bf16-mixed`: `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` over fp32 sharded
  parameters (no autocast: the all-gathered parameters are bf16 already);
  `bf16-true` and `fp32`: no policy (parameters, all-gathers and reductions in their dtype).
* `fsdp_reshard_after_forward`: frees each block's all-gathered parameters after its forward
  (all-gathered again in backward), or keeps them to the backward.

What FSDP2 frees it frees by `untyped_storage().resize_(0)` (`_fsdp_param.py` free_storage),
which a dispatch mode does not see: the tracker patches `UntypedStorage.resize_` as
FSDPMemTracker does. DTensor ops are left to DTensor (their local ops are counted), and ops
that DTensor's sharding propagation runs under its own fake mode are not counted.

Buckets (rank 0): `weights` the sharded parameters (padded to a multiple of N along dim 0),
`gradients` the sharded gradients, `optimizer` the sharded state, `gathered` the
all-gathered (unsharded) parameters and all-gather buffers, `reducing` unsharded gradients
and reduce-scatter buffers, `activations` the rest.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from vram.setup import Precision, TrainingSetup
from vram.trace.build import Built, TraceUnsupported, build, with_depth
from vram.trace.engine import (
    HostScalarTracker,
    RawTrace,
    install_labels,
    numel,
    run_steps,
    swappable,
)
from vram.trace.optim import make_optimizer, state_tensors

GATHERED, REDUCING = "gathered", "reducing"


def fsdp2_reshards_after_forward(setup: TrainingSetup) -> bool:
    """`fully_shard(reshard_after_forward=...)` of the blocks: the setup's, else FSDP2's
    default True (torch/distributed/fsdp/_fully_shard/_fully_shard.py@v2.13.0 #L246-L260)."""
    value = setup.fsdp_reshard_after_forward
    return True if value is None else value


@contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A fake process group of `world_size` ranks, this process rank 0; yields a 1-D CPU mesh.
    The mesh is made before any fake mode (DeviceMesh reads its rank list as real values)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def mixed_precision_policy(setup: TrainingSetup) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if setup.precision is Precision.BF16_MIXED:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if setup.precision is Precision.FP16_MIXED:
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def separate_units(built: Built) -> tuple[Any, Any] | None:
    """The embedding and the output head to shard as units of their own (torchtune's
    `custom_sharded_layers`, torchtitan's `apply_fsdp`), or None when the head shares the
    embedding's matrix (a tied head stays with the embedding in the root unit: torchtune's
    tied models do not list them) or either is missing."""
    embedding = built.hf.get_input_embeddings()
    head = built.hf.get_output_embeddings()
    if embedding is None or head is None or head.weight is embedding.weight:
        return None
    return embedding, head


def shard(built: Built, setup: TrainingSetup, mesh: Any) -> list[Any]:
    """`fully_shard` every repeated block, then the root; returns the FSDP states. With
    `fsdp_embedding_units` (`vram.stacks.resolve`) the embedding before the blocks
    and the output head after them are units of their own, each with the blocks'
    `reshard_after_forward` (torchtune's `shard_model` with `custom_sharded_layers`,
    torchtune/training/_distributed.py@v0.3.0; the order of the calls does not change what
    runs: the root's lazy init orders the units by module); the root keeps the final norm."""
    from torch.distributed.fsdp import fully_shard

    from vram.stacks.resolve import resolve

    policy = mixed_precision_policy(setup)
    reshard = fsdp2_reshards_after_forward(setup)
    own = separate_units(built) if resolve(setup).run.fsdp_embedding_units else None
    modules = [block for _, blocks in built.layer_lists for block in blocks]
    if own is not None:
        modules = [own[0], *modules, own[1]]
    states = [fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
              for module in modules]
    states.append(fully_shard(built.model, mesh=mesh, mp_policy=policy))
    return states


def fsdp_params_of(states: list[Any]) -> Iterator[Any]:
    for state in states:
        group = state._get_fsdp_state()._fsdp_param_group
        if group is not None:
            yield from group.fsdp_params


class ShardedTracker(HostScalarTracker):
    """`StorageTracker` for FSDP2: storage resizes, DTensor and nested fake modes."""

    def __init__(self) -> None:
        super().__init__()
        self.outer_mode: Any = None
        self.region = ""  # "gathered" or "reducing" while FSDP2 collects or reduces
        self.region_keys: dict[int, str] = {}
        #: Inside DTensor's sharding propagation: it runs the op on global-shape fake
        #: tensors to learn the output's metadata; nothing of it exists on a GPU.
        self.muted = False

    def register(self, tensor: torch.Tensor, origin: str = "") -> None:
        key = self.storage_key(tensor)
        new = key not in self.live and key not in self.excluded
        super().register(tensor, origin)
        if new and self.region and key in self.live:
            self.region_keys[key] = self.region

    def _forget(self, key: int) -> None:
        """A storage's region label dies with it: the next storage at the same address (the
        key is `id()`) is labelled by where it is made, not by what lived there before."""
        super()._forget(key)
        self.region_keys.pop(key, None)

    def resized(self, storage: torch.UntypedStorage) -> None:
        """FSDP2 allocates and frees unsharded parameters by resizing their storage."""
        from vram.model.params import allocated_bytes

        key = self.key(storage)
        info = self.live.get(key)
        if info is None:
            return
        nbytes = allocated_bytes(storage.nbytes())
        self.live_bytes += nbytes - info.nbytes
        info.nbytes = nbytes
        self.sample()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        from torch._guards import active_fake_mode
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented
        if func is torch.ops._c10d_functional.wait_tensor.default:
            return args[0]  # in eager, waiting returns the tensor itself
        if self.muted or active_fake_mode() is not self.outer_mode:
            return func(*args, **(kwargs or {}))  # DTensor's sharding propagation
        return super().__torch_dispatch__(func, types, args, kwargs)


@contextmanager
def tracking_resizes(tracker: ShardedTracker) -> Iterator[None]:
    """`UntypedStorage.resize_` is not an aten op a dispatch mode sees (FSDPMemTracker patches
    it the same way: torch/distributed/_tools/mem_tracker.py@v2.13.0 _track_resize)."""
    original = torch.UntypedStorage.resize_

    @functools.wraps(original)
    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        out = original(storage, size)
        tracker.resized(storage)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


@contextmanager
def muting_propagation(tracker: ShardedTracker) -> Iterator[None]:
    """DTensor's sharding propagation makes global-shape fake tensors under the fake mode
    already active (torch/distributed/tensor/_sharding_prop.py@v2.13.0
    _propagate_tensor_meta_non_cached: `detect_fake_mode() or FakeTensorMode()`), so the mode
    cannot tell them apart: they are not counted while it runs."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = ShardingPropagator._propagate_tensor_meta_non_cached

    @functools.wraps(original)
    def propagate(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer, tracker.muted = tracker.muted, True
        try:
            return original(self, *args, **kwargs)
        finally:
            tracker.muted = outer

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]


@contextmanager
def fsdp_regions(tracker: ShardedTracker) -> Iterator[None]:
    """Label what FSDP2's unshard (all-gather and copy-out) and its gradient reduction
    allocate (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@v2.13.0 unshard,
    wait_for_unshard, post_backward)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    names = {"unshard": GATHERED, "wait_for_unshard": GATHERED, "post_backward": REDUCING}
    originals = {name: getattr(FSDPParamGroup, name) for name in names}

    def labelled(name: str, region: str) -> Callable[..., Any]:
        original = originals[name]

        @functools.wraps(original)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            outer, tracker.region = tracker.region, region
            try:
                return original(self, *args, **kwargs)
            finally:
                tracker.region = outer

        return run

    for name, region in names.items():
        setattr(FSDPParamGroup, name, labelled(name, region))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(FSDPParamGroup, name, original)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def storages(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s memory: a DTensor's local tensor, and the inner tensors
    of a wrapper subclass (torchao's `WeightWithDynamicFloat8CastTensor` keeps the weight in
    `_tensor`; the wrapper's own storage holds nothing)."""
    t = _local(t)
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None or type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter):
        return [t]
    names, _ = flatten()
    return [inner for name in names for inner in storages(getattr(t, name))]


def classifier(tracker: ShardedTracker, weight_keys: dict[int, str], fsdp_params: list[Any],
               train: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer,
               ) -> Callable[[], dict[int, str]]:
    """The buckets of the storages that are not activations: the weights (`weight_keys`),
    FSDP2's gathered parameters and unsharded gradients, the optimizer's state, and the
    gradients (the sharded ones under FSDP2, else those of `train`)."""
    def classify() -> dict[int, str]:
        classes = dict(tracker.region_keys)
        classes.update(weight_keys)
        for fp in fsdp_params:
            unsharded = getattr(fp, "_unsharded_param", None)
            if unsharded is not None:
                classes[tracker.storage_key(_local(unsharded))] = GATHERED
                if unsharded.grad is not None:
                    classes[tracker.storage_key(_local(unsharded.grad))] = REDUCING
        for t in state_tensors([optimizer]):
            for inner in storages(t):
                classes[tracker.storage_key(inner)] = "optimizer"
        grads = [fp.sharded_param.grad for fp in fsdp_params] or [p.grad for p in train]
        for grad in grads:
            if grad is not None:
                for inner in storages(grad):
                    classes[tracker.storage_key(inner)] = "gradients"
        return classes

    return classify


def trace_sharded_depth(config: dict[str, Any], setup: TrainingSetup,
                        n_layers: int) -> RawTrace:
    """Trace two FSDP2 steps of rank 0 of `setup.n_gpus`, the model with `n_layers` blocks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if setup.n_gpus < 2:
        raise TraceUnsupported("gpus: a sharded trace needs 2 or more")
    start = time.perf_counter()
    cfg = with_depth(config, n_layers)
    tracker = ShardedTracker()
    with fake_process_group(setup.n_gpus) as mesh:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        tracker.outer_mode = mode
        with mode, swappable(mode):
            built = build(cfg, setup)
            built.autocast = None  # the policy all-gathers 16-bit parameters: no autocast
            params_total = sum(numel(p) for p in built.model.parameters())
            params_trainable = sum(p.numel() for p in built.model.parameters()
                                   if p.requires_grad)
            states = shard(built, setup, mesh)
            fsdp_params = list(fsdp_params_of(states))
            train = [p for p in built.model.parameters() if p.requires_grad]
            optimizer = make_optimizer(setup, train, tracker.exclude)
            if optimizer is None:
                raise TraceUnsupported("optimizer: the sharded trace steps after backward")
            weight_keys: dict[int, str] = {}
            for fp in fsdp_params:
                tracker.register(fp._sharded_param_data, "param")
                weight_keys[tracker.storage_key(fp._sharded_param_data)] = "weights"
            for b in built.model.buffers():
                tracker.register(b, "buffer")
                weight_keys[tracker.storage_key(b)] = "weights"

            tracker.classifier = classifier(tracker, weight_keys, fsdp_params, [], optimizer)
            install_labels(built, tracker, label_before_hooks=True)
            with tracking_resizes(tracker), fsdp_regions(tracker), muting_propagation(tracker):
                run_steps(built, setup, tracker, optimizer)
    return RawTrace(
        n_layers=n_layers, peaks=dict(tracker.peaks), timeline=tracker.timeline,
        paged_bytes=tracker.excluded_bytes, params_total=params_total,
        params_trainable=params_trainable, seconds=time.perf_counter() - start,
    )

