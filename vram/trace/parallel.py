"""Trace rank 0 of a tensor-, context- and data-parallel run on fake tensors (issue 23).

One process plays rank 0 of `dp x cp x tp` ranks of PyTorch's fake process group (as
`vram.trace.sharded` does for FSDP2), on a device mesh named ("dp", "cp", "tp"):

* `tp`: DTensor tensor parallel, with or without sequence parallel (`tensor_parallel`);
* `cp`: context parallel, ring (PyTorch's `context_parallel`) or Ulysses all-to-all
  (`context_parallel`);
* FSDP2 over the `dp x cp` ranks (torchtitan's "fsdp" mesh flattens dp_shard and cp:
  torchtitan/distributed/parallel_dims.py@v0.2.2; Accelerate's `dp_shard_cp` likewise) when
  the setup shards with FSDP2 and `dp x cp > 1`;
* activation offload (`offload`) and torchao float8 (`fp8`) on any of them.

Pipeline parallel is traced one stage at a time (`vram.trace.pipeline`).

The step is the SFT step of `vram.trace.step` (two steps, the optimizer's state alive in the
second), with the contexts each mechanism needs around the forward and the backward:
`context_parallel` (ring) or the Ulysses exchange, `loss_parallel` (TP with the logits left
split by vocabulary), and the offload hooks around the forward and the loss (TRL wraps
`model(**inputs)`, whose loss is computed inside the forward).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vram.setup import TrainingSetup
from vram.trace.build import Built, TraceUnsupported, build, depth, layer_period, with_depth
from vram.trace.engine import (
    BACKWARD,
    FORWARD,
    RawTrace,
    install_labels,
    numel,
    optimizer_step,
    swappable,
    training_loss,
)
from vram.trace.optim import make_optimizer
from vram.trace.report import TraceResult
from vram.trace.sharded import (
    ShardedTracker,
    classifier,
    fake_process_group,
    fsdp_params_of,
    fsdp_regions,
    muting_propagation,
    shard,
    storages,
    tracking_resizes,
)

RING, ULYSSES = "ring", "ulysses"


@dataclass(frozen=True, slots=True)
class ParallelSpec:
    """How the ranks are laid out (the fields issue 23 adds to `TrainingSetup`)."""

    tp: int = 1
    sequence_parallel: bool = True  # torchtitan always; Megatron's `--sequence-parallel`
    loss_parallel: bool = True  # torchtitan's default (`disable_loss_parallel` False)
    cp: int = 1
    cp_kind: str = RING
    dp: int = 1  # data-parallel ranks besides cp (FSDP2 shards over dp x cp)
    offload_activations: bool = False
    #: whose offload: "torchtune" (the model's forward only) or "trl" (`model(**inputs)`,
    #: the loss computed inside it included; storages deduplicated while stashed)
    offload_style: str = "torchtune"

    @property
    def offload_loss(self) -> bool:
        return self.offload_style == "trl"
    fp8: str | None = None  # torchao recipe: tensorwise, rowwise
    fp8_all_gather: bool = False  # FSDP2 all-gathers float8 weights (tensorwise)

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp

    def check(self) -> None:
        for name in ("tp", "cp", "dp"):
            if getattr(self, name) < 1:
                raise TraceUnsupported(f"{name}: at least 1")
        if self.cp_kind not in (RING, ULYSSES):
            raise TraceUnsupported(f"cp_kind: one of {RING}, {ULYSSES}")
        if self.offload_style not in ("torchtune", "trl"):
            raise TraceUnsupported("offload_style: torchtune or trl")


@dataclass
class ParallelRaw:
    """A traced depth and what the trace saw outside the device."""

    raw: RawTrace
    host_peak_bytes: int = 0
    offloaded_bytes: int = 0
    notes: list[str] = field(default_factory=list)


def _meshes(spec: ParallelSpec) -> dict[str, Any]:
    """The ("dp", "cp", "tp") mesh's sub-meshes: "tp", "cp", and "fsdp" (dp x cp flattened).
    Made before any fake mode: a mesh reads its rank list as real values."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (spec.dp, spec.cp, spec.tp),
                            mesh_dim_names=("dp", "cp", "tp"))
    if spec.dp > 1 and spec.cp > 1:
        fsdp = mesh["dp", "cp"]._flatten("dp_cp")
    else:
        fsdp = mesh["cp"] if spec.cp > 1 else mesh["dp"]
    return {"tp": mesh["tp"], "cp": mesh["cp"], "fsdp": fsdp}


@contextlib.contextmanager
def real_mesh_concatenation() -> Iterator[None]:
    """FSDP2 over tensor-parallel parameters concatenates the dp and tp meshes
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py@v2.13.0 `_init_sharding_spec_tp`); the
    new mesh builds its rank tensor and finds this rank in it with `nonzero`, which the fake
    mode cannot run. The concatenation (metadata only) runs outside the fake mode here."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh._concatenate

    def real(meshes: list[Any]) -> Any:
        with unset_fake_temporarily():
            return original(meshes)

    DeviceMesh._concatenate = staticmethod(real)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        DeviceMesh._concatenate = staticmethod(original)  # type: ignore[method-assign,assignment]


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def runs_fsdp(setup: TrainingSetup, spec: ParallelSpec) -> bool:
    """FSDP2 shards the model over the dp x cp ranks."""
    from vram.stacks.resolve import resolve

    return spec.dp * spec.cp > 1 and resolve(replace_gpus(setup, spec.dp * spec.cp)).fsdp2


def replace_gpus(setup: TrainingSetup, n: int) -> TrainingSetup:
    return setup.model_copy(update={"n_gpus": max(n, 1)})


def _inputs(built: Built, setup: TrainingSetup) -> tuple[torch.Tensor, ...]:
    vocab = max(built.vocab, 2)
    batch, seq = setup.micro_batch, setup.seq_len
    ids = torch.randint(0, vocab, (batch, seq))
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq).contiguous()
    return ids, ids.clone(), positions


@contextlib.contextmanager
def _step_context(spec: ParallelSpec, mesh: Any) -> Iterator[None]:
    """`loss_parallel` (TP with split logits) and the Ulysses exchange around the step."""
    with contextlib.ExitStack() as stack:
        if spec.tp > 1 and spec.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            stack.enter_context(loss_parallel())
        if spec.cp > 1 and spec.cp_kind == ULYSSES:
            from vram.trace.context_parallel import ulysses

            stack.enter_context(ulysses(mesh["cp"].get_group()))
        yield


def _forward_loss(built: Built, setup: TrainingSetup, ids: torch.Tensor,
                  labels: torch.Tensor, positions: torch.Tensor,
                  forward: Any = contextlib.nullcontext) -> torch.Tensor:
    """HF's loss (`vram.trace.step._loss`) with explicit positions (a CP rank's tokens are not
    at positions 0..s-1; under TP with SP the embedding's output is split on the sequence).
    `forward()` is entered around the model's forward only, the loss after it (torchtune's
    offload scope); to cover the loss too, enter it around this call."""
    from vram.setup import Loss
    from vram.stacks.resolve import resolve

    if resolve(setup).run.loss is Loss.CHUNKED or built.kind != "causal":
        with forward():
            return training_loss(built, setup, ids, labels)
    with forward():
        out = built.model(input_ids=ids, position_ids=positions)
    logits = out.logits
    del out
    loss: torch.Tensor = built.hf.loss_function(logits=logits, labels=labels,
                                                vocab_size=built.hf.config.vocab_size)
    return loss


def _run(built: Built, setup: TrainingSetup, spec: ParallelSpec, mesh: Any,
         tracker: ShardedTracker, optimizer: torch.optim.Optimizer | None,
         offload: Any) -> None:
    """Two steps (forward and loss, backward, optimizer step), recorded by `tracker`."""
    from vram.trace.attention import cuda_attention
    from vram.trace.cuda_autocast import cuda_autocast
    from vram.trace.dropout import cuda_dropout

    with tracker, cuda_attention(setup.attention.value), cuda_dropout(), cuda_autocast():
        ids, labels, positions = _inputs(built, setup)
        if spec.cp > 1 and spec.cp_kind == ULYSSES:
            from vram.trace.context_parallel import shard_contiguous

            ids, labels, positions = shard_contiguous([ids, labels, positions], spec.cp)
        tracker.recording = True
        for _ in range(2):
            with contextlib.ExitStack() as stack:
                if spec.cp > 1 and spec.cp_kind == RING:
                    from vram.trace.context_parallel import ring

                    batch = [t.clone() for t in (ids, labels, positions)]
                    stack.enter_context(ring(mesh["cp"], batch))
                    ids_r, labels_r, pos_r = batch
                else:
                    ids_r, labels_r, pos_r = ids, labels, positions
                stack.enter_context(_step_context(spec, mesh))
                tracker.set_phase(FORWARD, "embed")
                with _forward_context(built, offload if spec.offload_loss else None):
                    loss = _forward_loss(
                        built, setup, ids_r, labels_r, pos_r,
                        forward=lambda: _offload_context(built, None if spec.offload_loss
                                                         else offload))
                tracker.set_phase(BACKWARD, "head")
                with tracker.watching_backward(loss):
                    loss.backward()
                del loss
                if offload is not None:
                    offload.end_backward()
            optimizer_step(tracker, optimizer)
        tracker.recording = False


@contextlib.contextmanager
def _forward_context(built: Built, offload: Any) -> Iterator[None]:
    """Autocast (the mixed recipes) and, when `offload` is given, the offload hooks."""
    with contextlib.ExitStack() as stack:
        if built.autocast is not None:
            stack.enter_context(torch.autocast("cpu", dtype=built.autocast))
        stack.enter_context(_offload_context(built, offload))
        yield


@contextlib.contextmanager
def _offload_context(built: Built, offload: Any) -> Iterator[None]:
    if offload is None:
        yield
        return
    from vram.trace.offload import offloading

    with offloading(offload, built.hf.get_output_embeddings()):
        yield


def _prepare(built: Built, setup: TrainingSetup, spec: ParallelSpec, mesh: Any) -> list[Any]:
    """float8, then TP, then FSDP2 (torchtitan's order: converters, `apply_tp`, AC, FSDP)."""
    if spec.fp8 is not None:
        from vram.trace.fp8 import convert

        convert(built, spec.fp8, fsdp_all_gather=spec.fp8_all_gather)
    if spec.tp > 1:
        from vram.trace.tensor_parallel import apply_tp

        apply_tp(built, mesh["tp"], sequence_parallel=spec.sequence_parallel,
                 loss_parallel=spec.loss_parallel)
    if runs_fsdp(setup, spec):
        built.autocast = None  # the policy all-gathers 16-bit parameters
        with real_mesh_concatenation():
            return shard(built, setup, mesh["fsdp"])
    return []


def trace_parallel_depth(config: dict[str, Any], setup: TrainingSetup, spec: ParallelSpec,
                         n_layers: int) -> ParallelRaw:
    """Trace two steps of rank 0, the model with `n_layers` blocks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec.check()
    start = time.perf_counter()
    cfg = with_depth(config, n_layers)
    tracker = ShardedTracker()
    offload = None
    with fake_process_group(spec.world):
        mesh = _meshes(spec)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        tracker.outer_mode = mode
        with mode, swappable(mode):
            built = build(cfg, setup)
            params = list(built.model.parameters())
            params_total = sum(numel(p) for p in params)
            params_trainable = sum(p.numel() for p in params if p.requires_grad)
            states = _prepare(built, setup, spec, mesh)
            fsdp_params = list(fsdp_params_of(states))
            train = [p for p in built.model.parameters() if p.requires_grad]
            optimizer = make_optimizer(setup, train, tracker.exclude)
            if optimizer is None:
                raise TraceUnsupported("optimizer: the parallel trace steps after backward")
            weight_keys = register_weights(built, tracker, fsdp_params)
            tracker.classifier = classifier(tracker, weight_keys, fsdp_params, train, optimizer)
            install_labels(built, tracker, label_before_hooks=True)
            if spec.offload_activations:
                from vram.trace.offload import OffloadState, parameter_storages

                offload = OffloadState(params=parameter_storages(built.model),
                                       dedup=spec.offload_style == "trl")
            with tracking_resizes(tracker), fsdp_regions(tracker), muting_propagation(tracker):
                _run(built, setup, spec, mesh, tracker, optimizer, offload)
    raw = RawTrace(
        n_layers=n_layers, peaks=dict(tracker.peaks), timeline=tracker.timeline,
        paged_bytes=tracker.excluded_bytes, params_total=params_total,
        params_trainable=params_trainable, seconds=time.perf_counter() - start)
    if offload is None:
        return ParallelRaw(raw)
    return ParallelRaw(raw, offload.host_peak_bytes, offload.offloaded_bytes // 2)


def register_weights(built: Built, tracker: ShardedTracker,
                      fsdp_params: list[Any]) -> dict[int, str]:
    keys: dict[int, str] = {}
    if fsdp_params:
        tensors = [fp._sharded_param_data for fp in fsdp_params]
    else:
        tensors = [_local(p) for p in built.model.parameters()]
    for t in [*tensors, *built.model.buffers()]:
        for inner in storages(t):
            tracker.register(inner, "param")
            keys[tracker.storage_key(inner)] = "weights"
    return keys


# -- depth extension --------------------------------------------------------------------------

#: Offload keeps the last `max_fwd_stash_size` (5) offloaded tensors on the device; with
#: checkpointing that is one per block, so the blocks are alike only past the fifth: the
#: traces start there.
OFFLOAD_START_BLOCKS = 7


def start_periods(setup: TrainingSetup, spec: ParallelSpec) -> int:
    """From how many periods of blocks every segment is linear in the depth."""
    from vram.trace.step import SHARDED_START_PERIODS

    if spec.offload_activations and setup.grad_ckpt:
        return OFFLOAD_START_BLOCKS
    return SHARDED_START_PERIODS if runs_fsdp(setup, spec) else 2


def trace_parallel(config: dict[str, Any], setup: TrainingSetup, spec: ParallelSpec, *,
                   n_layers: int | None = None) -> tuple[TraceResult, ParallelRaw]:
    """Rank 0's exact allocated memory, traced at two depths and extended to the config's
    (as `vram.trace.step.trace_step` extends), or at `n_layers` exactly."""
    from vram.trace.step import bucket_maxima, downsample_timeline, live_tensors

    full = depth(config)
    period = layer_period(config)
    lo = start_periods(setup, spec) * period
    hi = lo + period
    if n_layers is not None or full <= hi:
        target = n_layers if n_layers is not None else full
        one = trace_parallel_depth(config, setup, spec, target)
        key = max(one.raw.peaks, key=lambda k: one.raw.peaks[k].live)
        peak = one.raw.peaks[key]
        result = TraceResult(
            peak_at=" / ".join(key), buckets=dict(peak.buckets),
            allocated_peak_bytes=peak.live, phase=peak.phase,
            bucket_max=bucket_maxima([dict(p.buckets) for p in one.raw.peaks.values()]),
            paged_bytes=one.raw.paged_bytes, timeline=downsample_timeline(one.raw.timeline),
            timeline_n_layers=target, n_layers=target, n_layers_traced=(target,),
            extrapolated=False, params_total=one.raw.params_total,
            params_trainable=one.raw.params_trainable, top_tensors=live_tensors(peak),
            notes=(_note(spec),))
        return result, one
    a, b = (trace_parallel_depth(config, setup, spec, n) for n in (lo, hi))
    return extend_parallel(a, b, lo, full, period, spec), b


def _note(spec: ParallelSpec) -> str:
    return (f"rank 0 of dp {spec.dp} x cp {spec.cp} ({spec.cp_kind}) x tp {spec.tp}"
            f"{' +SP' if spec.sequence_parallel and spec.tp > 1 else ''}"
            f"{', activation offload' if spec.offload_activations else ''}"
            f"{', fp8 ' + spec.fp8 if spec.fp8 else ''} (a fake process group)")


def extend_parallel(one: ParallelRaw, two: ParallelRaw, lo: int, full: int, period: int,
            spec: ParallelSpec) -> TraceResult:
    """Each segment's peak and buckets extended linearly from `lo` and `lo + period` blocks."""
    from vram.trace.step import bucket_maxima, downsample_timeline, live_tensors

    p1, p2 = one.raw.peaks, two.raw.peaks

    def line(v1: int, v2: int) -> int:
        return v1 + (full - lo) * (v2 - v1) // period

    def extend(x: dict[str, int], y: dict[str, int]) -> dict[str, int]:
        return {k: line(x.get(k, 0), y.get(k, 0)) for k in sorted(x.keys() | y.keys())}

    keys = p1.keys() & p2.keys()
    best = max(keys, key=lambda k: line(p1[k].live, p2[k].live))
    host = line(one.host_peak_bytes, two.host_peak_bytes)
    return TraceResult(
        peak_at=" / ".join(best), buckets=extend(p1[best].buckets, p2[best].buckets),
        allocated_peak_bytes=line(p1[best].live, p2[best].live), phase=p2[best].phase,
        bucket_max=bucket_maxima([extend(p1[k].buckets, p2[k].buckets) for k in keys]),
        paged_bytes=line(one.raw.paged_bytes, two.raw.paged_bytes),
        timeline=downsample_timeline(two.raw.timeline), timeline_n_layers=lo + period,
        n_layers=full, n_layers_traced=(lo, lo + period), extrapolated=True,
        params_total=line(one.raw.params_total, two.raw.params_total),
        params_trainable=line(one.raw.params_trainable, two.raw.params_trainable),
        top_tensors=live_tensors(p2[best]),
        notes=(f"traced {lo} and {lo + period} blocks in "
               f"{one.raw.seconds + two.raw.seconds:.1f} s; extended linearly to {full}",
               _note(spec), f"host (pinned) peak {host} bytes"))
