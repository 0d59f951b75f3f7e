"""Run two training steps on fake tensors and account for every live byte.

One step, as the HF Trainer runs it: forward (under autocast for the mixed recipes), the loss
(HF's own: full logits upcast to fp32 for the cross-entropy; or a torchtune-style chunked
cross-entropy: 8 chunks, each projected by the LM head and upcast to fp32 on its own), backward,
`optimizer.step()`, `zero_grad(set_to_none=True)`. Two steps run, so optimizer state created
lazily in the first step is alive through the second.

Extrapolation: past the first, a model's blocks are identical (or repeat with a period p, as
Gemma 2's sliding/global pairs do), so for every labelled segment of the step (a phase, and
within it: before the blocks, inside the first block, inside the last block, the embedding's
backward, after them) the peak live bytes and each bucket are exactly linear in the depth.
`trace_step` traces models of 2p and 3p blocks and extends each segment linearly,
`v(L) = v(2p) + (L - 2p)(v(3p) - v(2p)) / p`; the peak is the largest extended segment. Starting
from two periods keeps the first block, which can differ (a LoRA model with a parallel residual
keeps nothing in its first MLP), out of the slope. Blocks between the first and the last cannot
hold a larger peak (live bytes inside block k are linear in k), so they need no segment of
their own. FSDP2 breaks that in backward (each block but the first has the next one down
all-gathered beside it): its traces start from 3p and 4p blocks, where the blocks between
are a segment ("mid") of both traces (`SHARDED_START_PERIODS`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from vram.setup import Offload, Optimizer, Sharding, TrainingSetup
from vram.stacks.profile import profile_for
from vram.stacks.resolve import resolve
from vram.trace.build import TraceUnsupported, build, depth, layer_period, with_depth
from vram.trace.engine import (
    HostScalarTracker,
    RawTrace,
    install_labels,
    numel,
    run_steps,
    swappable,
    wrap_in_backward,
)
from vram.trace.mixer_kernels import trace_note
from vram.trace.optim import TRACE_OPTIMIZERS, in_backward, make_optimizer, state_tensors
from vram.trace.report import LiveTensor, TimelinePoint, TraceResult
from vram.trace.tracker import SegmentPeak
from vram.trace.vision import fed_layers

MAX_POINTS = 2000


def trace_depth(config: dict[str, Any], setup: TrainingSetup, n_layers: int, *,
                tracker: HostScalarTracker | None = None,
                from_build: bool = False) -> RawTrace:
    """Trace two steps of the model with `n_layers` blocks. With `from_build`, `tracker`
    watches the model's build too (its allocation log starts at the first parameter:
    `vram.trace.allocator`); `tracker.steps_end` is where its log's steps end."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    cfg = with_depth(config, n_layers)
    tracker = tracker if tracker is not None else HostScalarTracker()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, swappable(mode):
        with tracker if from_build else contextlib.nullcontext():
            built = build(cfg, setup)
        model = built.model
        params = list(model.parameters())
        train = [p for p in params if p.requires_grad]
        if not train:
            raise TraceUnsupported("setup: nothing to train (no parameter requires a gradient)")
        optimizer = make_optimizer(setup, train, tracker.exclude)
        per_param = in_backward(train) if setup.optimizer is Optimizer.ADAMW_IN_BACKWARD else []
        wrap_in_backward(per_param, tracker)
        optimizers = [optimizer] if optimizer is not None else per_param

        weight_keys: dict[int, str] = {}
        for p in params:
            tracker.register(p, "param")
            weight_keys[tracker.storage_key(p)] = "weights"
        for b in model.buffers():
            tracker.register(b, "buffer")
            weight_keys[tracker.storage_key(b)] = "weights"

        def classify() -> dict[int, str]:
            classes = dict(weight_keys)
            for t in state_tensors(optimizers):
                classes[tracker.storage_key(t)] = "optimizer"
            for p in train:
                if p.grad is not None:
                    classes[tracker.storage_key(p.grad)] = "gradients"
            return classes

        tracker.classifier = classify
        install_labels(built, tracker)
        run_steps(built, setup, tracker, optimizer)
        tracker.steps_end = len(tracker.alloc_log)
        params_total = sum(numel(p) for p in params)
        params_trainable = sum(p.numel() for p in train)
    return RawTrace(
        n_layers=n_layers, peaks=dict(tracker.peaks), timeline=tracker.timeline,
        paged_bytes=tracker.excluded_bytes, params_total=params_total,
        params_trainable=params_trainable, seconds=time.perf_counter() - start,
    )


def _depth_tracer(setup: TrainingSetup) -> Callable[[dict[str, Any], TrainingSetup, int],
                                                    RawTrace]:
    if traces_fsdp2(setup):
        from vram.trace.sharded import trace_sharded_depth

        return trace_sharded_depth
    return trace_depth


def downsample_timeline(timeline: list[tuple[int, int, str]]) -> list[TimelinePoint]:
    """At most MAX_POINTS points; each kept point is the highest of its window (peak kept)."""
    if len(timeline) <= MAX_POINTS:
        chosen = timeline
    else:
        window = -(-len(timeline) // MAX_POINTS)
        chosen = [max(timeline[i:i + window], key=lambda p: p[1])
                  for i in range(0, len(timeline), window)]
    return [TimelinePoint(event=e, live_bytes=b, phase=ph) for e, b, ph in chosen]


def live_tensors(peak: SegmentPeak) -> list[LiveTensor]:
    return [LiveTensor(what=w, bytes=b, bucket=k) for w, b, k in peak.top]


def traces_fsdp2(setup: TrainingSetup) -> bool:
    """Whether the trace runs the setup sharded: FSDP2 (`fully_shard`) over 2+ ranks, rank 0
    of a fake process group (see `vram.trace.sharded`)."""
    return resolve(setup).fsdp2


def _setup_notes(setup: TrainingSetup) -> tuple[str, ...]:
    """What of the setup the trace does not model (one micro-batch on one GPU, or rank 0 of an
    FSDP2 run)."""
    notes = []
    if traces_fsdp2(setup):
        notes.append(f"rank 0 of FSDP2 over {setup.n_gpus} GPUs (a fake process group)")
    elif setup.sharding is not Sharding.NONE or setup.n_gpus > 1:
        notes.append(f"sharding {setup.sharding.value} over {setup.n_gpus} GPUs is not traced: "
                     "figures are for one unsharded GPU")
    if setup.offload is not Offload.NONE:
        notes.append(f"offload {setup.offload.value} is not traced")
    if setup.grad_ckpt and resolve(setup).run.ckpt_reentrant:
        notes.append("checkpointing is traced non-reentrant (use_reentrant=False); this setup's "
                     "is reentrant, which keeps no autograd Function's ctx attributes "
                     "(bitsandbytes' 4-bit inputs) in the checkpointed forward")
    return tuple(notes)

#: FSDP2 traces start from three blocks: in backward each block but the first has the next
#: one all-gathered beside it (the first has none to prefetch), so the second block's backward
#: can hold more than the first's. From three blocks on, the blocks between the first and the
#: last ("mid", a segment of their own) are linear in their index and the extension keeps
#: them; at two blocks the second is the last, and its prefetch of the first block differs.
SHARDED_START_PERIODS = 3


def bucket_maxima(snapshots: list[dict[str, int]]) -> dict[str, int]:
    """The most each bucket held at any segment's peak (all gradients exist at the step)."""
    names = {name for snap in snapshots for name in snap}
    return {name: max(snap.get(name, 0) for snap in snapshots) for name in sorted(names)}


def trace_step(config: dict[str, Any], setup: TrainingSetup, *,
               n_layers: int | None = None) -> TraceResult:
    """The exact allocated memory of one training step of `config` under `setup`.

    With `n_layers=None`, models of two and three periods of blocks (2 and 3 blocks for most
    models; three and four for FSDP2) are traced and every segment's peak and
    buckets are extended linearly to the config's depth (exact for identical blocks, and fast:
    a 70B model in seconds). With `n_layers=k`, a model of exactly `k` blocks is traced and
    nothing is extrapolated (`k` = the config's depth gives the full trace).
    """
    if setup.optimizer not in TRACE_OPTIMIZERS:
        traced = ", ".join(o.value for o in TRACE_OPTIMIZERS)
        raise TraceUnsupported(
            f"optimizer: {setup.optimizer.value} is not traced (the trace runs {traced}); "
            "the estimate models it: python -m vram estimate")
    full = depth(config)
    if n_layers is not None and not 1 <= n_layers <= full:
        raise TraceUnsupported(f"n_layers (--layers): {n_layers}; the config has {full} "
                               f"layers: 1 to {full}")
    notes = _setup_notes(setup)
    mixer_note = trace_note(str(config.get("model_type", "")), profile_for(setup).mixer_kernels)
    notes = (*notes, mixer_note) if mixer_note else notes
    tracer = _depth_tracer(setup)
    period = layer_period(config)
    periods = SHARDED_START_PERIODS if traces_fsdp2(setup) else 2
    # every layer the tower feeds is in both traced models (Qwen3-VL's deepstack)
    periods = max(periods, -(-fed_layers(config) // period))
    lo, hi = periods * period, (periods + 1) * period
    if n_layers is not None or full <= hi:
        target = n_layers if n_layers is not None else full
        raw = tracer(config, setup, target)
        peak_key = max(raw.peaks, key=lambda k: raw.peaks[k].live)
        peak = raw.peaks[peak_key]
        return TraceResult(
            peak_at=" / ".join(peak_key),
            buckets=dict(peak.buckets), allocated_peak_bytes=peak.live, phase=peak.phase,
            bucket_max=bucket_maxima([dict(p.buckets) for p in raw.peaks.values()]),
            paged_bytes=raw.paged_bytes, timeline=downsample_timeline(raw.timeline),
            timeline_n_layers=target, n_layers=target, n_layers_traced=(target,),
            extrapolated=False, params_total=raw.params_total,
            params_trainable=raw.params_trainable, top_tensors=live_tensors(peak), notes=notes,
        )
    # Blocks of alternating kinds (Gemma 2: sliding, then global attention) repeat with a
    # period; the trace extends whole periods, not single blocks. It starts from two periods:
    # the first block can differ from the rest (with frozen embeddings and a parallel
    # residual, a LoRA model's first MLP sees no tensor that needs a gradient and keeps
    # nothing), and a one-block model puts its only block's backward in a segment it shares
    # with the "first" role.
    one = tracer(config, setup, lo)
    two = tracer(config, setup, hi)
    p1, p2 = one.peaks, two.peaks  # at 2+ blocks, first and last are distinct segments

    def line(v1: int, v2: int) -> int:
        return v1 + (full - lo) * (v2 - v1) // period

    best_key: tuple[str, ...] | None = None
    best_live = -1
    for key in p1.keys() & p2.keys():
        live = line(p1[key].live, p2[key].live)
        if live > best_live:
            best_key, best_live = key, live
    assert best_key is not None
    a, b = p1[best_key], p2[best_key]
    # A bucket can be empty at one depth and not the other (FSDP2's "reducing" buffer at the
    # same instant of a 2- and a 3-block run): an absent bucket held 0 bytes.
    def extend(x: dict[str, int], y: dict[str, int]) -> dict[str, int]:
        return {k: line(x.get(k, 0), y.get(k, 0)) for k in sorted(x.keys() | y.keys())}

    buckets = extend(a.buckets, b.buckets)
    extended = [extend(p1[key].buckets, p2[key].buckets) for key in p1.keys() & p2.keys()]
    return TraceResult(
        peak_at=" / ".join(best_key),
        buckets=buckets, allocated_peak_bytes=best_live, phase=b.phase,
        bucket_max=bucket_maxima(extended),
        paged_bytes=line(one.paged_bytes, two.paged_bytes),
        timeline=downsample_timeline(two.timeline), timeline_n_layers=hi, n_layers=full,
        n_layers_traced=(lo, hi), extrapolated=True,
        params_total=line(one.params_total, two.params_total),
        params_trainable=line(one.params_trainable, two.params_trainable),
        top_tensors=live_tensors(b),
        notes=(f"traced {lo} and {hi} blocks in {one.seconds + two.seconds:.1f} s; "
               f"extended linearly to {full}", *notes),
    )
