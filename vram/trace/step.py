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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vram.setup import Loss, Optimizer, TrainingSetup
from vram.stacks.resolve import resolve
from vram.trace.attention import cuda_attention
from vram.trace.build import Built, TraceUnsupported, build, depth, layer_period, with_depth
from vram.trace.cuda_autocast import cuda_autocast
from vram.trace.dropout import cuda_dropout
from vram.trace.optim import in_backward, make_optimizer, state_tensors
from vram.trace.report import LiveTensor, TimelinePoint, TraceResult
from vram.trace.tracker import SegmentPeak, StorageTracker

CHUNKS = 8
MAX_POINTS = 2000
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


class _HostScalarTracker(StorageTracker):
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


def _install_labels(built: Built, tracker: StorageTracker, *,
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


def _loss(built: Built, setup: TrainingSetup, ids: torch.Tensor,
          labels: torch.Tensor) -> torch.Tensor:
    model = built.model
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
    out = model(input_ids=ids, labels=labels)
    loss: torch.Tensor = out.loss
    del out
    return loss


def trace_depth(config: dict[str, Any], setup: TrainingSetup, n_layers: int) -> RawTrace:
    """Trace two steps of the model with `n_layers` blocks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    cfg = with_depth(config, n_layers)
    tracker = _HostScalarTracker()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, _swappable(mode):
        built = build(cfg, setup)
        model = built.model
        params = list(model.parameters())
        train = [p for p in params if p.requires_grad]
        if not train:
            raise TraceUnsupported("setup: nothing to train (no parameter requires a gradient)")
        optimizer = make_optimizer(setup, train, tracker.exclude)
        per_param = in_backward(train) if setup.optimizer is Optimizer.ADAMW_IN_BACKWARD else []
        _wrap_in_backward(per_param, tracker)
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
        _install_labels(built, tracker)
        run_steps(built, setup, tracker, optimizer)
        params_total = sum(_numel(p) for p in params)
        params_trainable = sum(p.numel() for p in train)
    return RawTrace(
        n_layers=n_layers, peaks=dict(tracker.peaks), timeline=tracker.timeline,
        paged_bytes=tracker.excluded_bytes, params_total=params_total,
        params_trainable=params_trainable, seconds=time.perf_counter() - start,
    )


def run_steps(built: Built, setup: TrainingSetup, tracker: _HostScalarTracker,
              optimizer: torch.optim.Optimizer | None) -> None:
    """Two steps (forward, loss, backward, optimizer step, zero_grad), recorded by `tracker`."""
    vocab = max(built.vocab, 2)
    with tracker, cuda_attention(setup.attention.value), cuda_dropout(), cuda_autocast():
        batch, seq = setup.micro_batch, setup.seq_len
        ids = torch.randint(0, vocab, (batch, seq))
        classes = built.kind == "classifier"
        labels = torch.randint(0, 2, (batch,)) if classes else ids.clone()
        tracker.recording = True
        for _ in range(2):
            tracker.set_phase(FORWARD, "embed")
            if built.autocast is not None:
                with torch.autocast("cpu", dtype=built.autocast):
                    loss = _loss(built, setup, ids, labels)
            else:
                loss = _loss(built, setup, ids, labels)
            tracker.set_phase(BACKWARD, "head")
            with tracker.watching_backward(loss):
                loss.backward()
            del loss
            optimizer_step(tracker, optimizer)
        tracker.recording = False


def optimizer_step(tracker: _HostScalarTracker, optimizer: torch.optim.Optimizer | None) -> None:
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
def _swappable(mode: Any) -> Iterator[None]:
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


def _numel(p: torch.Tensor) -> int:
    """Parameters a tensor stands for (a packed 4-bit weight holds two per byte)."""
    if p.dtype == torch.uint8 and p.dim() == 2 and p.shape[1] == 1:
        return 2 * p.numel()
    return p.numel()


def _wrap_in_backward(optimizers: list[torch.optim.Optimizer],
                      tracker: _HostScalarTracker) -> None:
    for optim in optimizers:
        original = optim.step

        def step(*args: Any, _orig: Any = original, **kwargs: Any) -> Any:
            tracker.in_optimizer = True
            try:
                return _orig(*args, **kwargs)
            finally:
                tracker.in_optimizer = False

        optim.step = step  # type: ignore[method-assign]


def _depth_tracer(setup: TrainingSetup) -> Callable[[dict[str, Any], TrainingSetup, int],
                                                    RawTrace]:
    if traces_fsdp2(setup):
        from vram.trace.sharded import trace_sharded_depth

        return trace_sharded_depth
    return trace_depth


def _downsample(timeline: list[tuple[int, int, str]]) -> list[TimelinePoint]:
    """At most MAX_POINTS points; each kept point is the highest of its window (peak kept)."""
    if len(timeline) <= MAX_POINTS:
        chosen = timeline
    else:
        window = -(-len(timeline) // MAX_POINTS)
        chosen = [max(timeline[i:i + window], key=lambda p: p[1])
                  for i in range(0, len(timeline), window)]
    return [TimelinePoint(event=e, live_bytes=b, phase=ph) for e, b, ph in chosen]


def _top(peak: SegmentPeak) -> list[LiveTensor]:
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
    elif setup.sharding.value != "none" or setup.n_gpus > 1:
        notes.append(f"sharding {setup.sharding.value} over {setup.n_gpus} GPUs is not traced: "
                     "figures are for one unsharded GPU")
    if setup.offload.value != "none":
        notes.append(f"offload {setup.offload.value} is not traced")
    return tuple(notes)


#: FSDP2 traces start from three blocks: in backward each block but the first has the next
#: one all-gathered beside it (the first has none to prefetch), so the second block's backward
#: can hold more than the first's. From three blocks on, the blocks between the first and the
#: last ("mid", a segment of their own) are linear in their index and the extension keeps
#: them; at two blocks the second is the last, and its prefetch of the first block differs.
SHARDED_START_PERIODS = 3


def _bucket_max(snapshots: list[dict[str, int]]) -> dict[str, int]:
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
    full = depth(config)
    notes = _setup_notes(setup)
    tracer = _depth_tracer(setup)
    period = layer_period(config)
    periods = SHARDED_START_PERIODS if traces_fsdp2(setup) else 2
    lo, hi = periods * period, (periods + 1) * period
    if n_layers is not None or full <= hi:
        target = n_layers if n_layers is not None else full
        raw = tracer(config, setup, target)
        peak_key = max(raw.peaks, key=lambda k: raw.peaks[k].live)
        peak = raw.peaks[peak_key]
        return TraceResult(
            peak_at=" / ".join(peak_key),
            buckets=dict(peak.buckets), allocated_peak_bytes=peak.live, phase=peak.phase,
            bucket_max=_bucket_max([dict(p.buckets) for p in raw.peaks.values()]),
            paged_bytes=raw.paged_bytes, timeline=_downsample(raw.timeline),
            timeline_n_layers=target, n_layers=target, n_layers_traced=(target,),
            extrapolated=False, params_total=raw.params_total,
            params_trainable=raw.params_trainable, top_tensors=_top(peak), notes=notes,
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
        bucket_max=_bucket_max(extended),
        paged_bytes=line(one.paged_bytes, two.paged_bytes),
        timeline=_downsample(two.timeline), timeline_n_layers=hi, n_layers=full,
        n_layers_traced=(lo, hi), extrapolated=True,
        params_total=line(one.params_total, two.params_total),
        params_trainable=line(one.params_trainable, two.params_trainable),
        top_tensors=_top(b),
        notes=(f"traced {lo} and {hi} blocks in {one.seconds + two.seconds:.1f} s; "
               f"extended linearly to {full}", *notes),
    )
