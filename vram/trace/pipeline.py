"""Trace one pipeline stage with its schedule's micro-batches in flight (issue 23).

The stage runs PyTorch's own pipelining (torch/distributed/pipelining@v2.13.0: a
`PipelineStage` per model chunk and the schedule: `ScheduleGPipe`, `Schedule1F1B`,
`ScheduleInterleaved1F1B`, as torchtitan builds them: torchtitan/distributed/
pipeline_parallel.py@v0.2.2) on the fake process group, as the rank that holds it: the
sends and receives allocate what they allocate and carry nothing. What the schedule keeps is
then exact for that rank:

* GPipe: every micro-batch's forward before any backward (all `m` in flight);
* 1F1B: `pp - rank` forwards before the first backward (`min(pp - rank, m)` in flight);
* interleaved 1F1B with `v` chunks per rank: the warm-up of `(pp - rank - 1) * 2 + (v - 1) *
  pp` chunk-forwards (torch's `_get_1f1b_rank_ops` warmup), each a chunk of `L / (pp v)`
  blocks;
* PyTorch's stages preallocate one receive buffer per micro-batch (activations on every
  stage but the first, gradients on every stage but the last: `stage.py` `_create_act_recv_info`,
  `_create_grad_recv_info`), alive for the step.

The stage's model is a Transformers decoder cut to the stage's blocks: the first stage has the
embedding, the last the final norm, the head and the loss (`cross_entropy` on
`logits.float()`), the others neither (their modules replaced by `nn.Identity`, so no
parameter of another stage is counted). Blocks are called as the model calls them, with the
rotary embeddings computed on each stage (Transformers computes them once in the model's
forward; a stage has to make its own, as torchtitan's stages do from `freqs_cis`).

P2P warm-up is skipped: it votes with `.item()` on a received tensor, which fake tensors
cannot answer; the stages are given their input and output shapes (static inference mode).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vram.setup import TrainingSetup
from vram.trace.build import Built, TraceUnsupported, build, with_depth
from vram.trace.engine import (
    BACKWARD,
    FORWARD,
    RawTrace,
    install_labels,
    optimizer_step,
    swappable,
)
from vram.trace.optim import make_optimizer
from vram.trace.parallel import (
    ParallelRaw,
    ParallelSpec,
    register_weights,
    runs_fsdp,
)
from vram.trace.sharded import (
    ShardedTracker,
    classifier,
    fsdp_params_of,
    fsdp_regions,
    muting_propagation,
    tracking_resizes,
)

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """The pipeline: degree, schedule, chunks per rank, micro-batches, and the rank traced."""

    pp: int
    schedule: str = "1f1b"  # torchtitan's default `pipeline_parallel_schedule`
    virtual: int = 1
    microbatches: int = 1
    rank: int = 0

    def check(self) -> None:
        if self.schedule not in SCHEDULES:
            raise TraceUnsupported(f"pp_schedule: one of {', '.join(SCHEDULES)}")
        if self.pp < 2 or not 0 <= self.rank < self.pp:
            raise TraceUnsupported("pp: at least 2, and the traced rank below it")
        if (self.virtual > 1) != (self.schedule == "interleaved"):
            raise TraceUnsupported("pp_virtual: above 1 exactly for the interleaved schedule")

    @property
    def stages(self) -> list[int]:
        """The stage indices this rank holds (looped: rank, rank + pp, ...)."""
        return [self.rank + j * self.pp for j in range(self.virtual)]


class StageModule(nn.Module):
    """One model chunk: some consecutive blocks, with the embedding if it is the first stage
    and the final norm and head if it is the last."""

    def __init__(self, hf: Any, blocks: list[nn.Module], *, first: bool, last: bool,
                 seq_tp: Any = None) -> None:
        super().__init__()
        self.hf_ref = [hf]  # not a submodule: its parameters are the blocks' and stage's own
        self.blocks = nn.ModuleList(blocks)
        self.first, self.last = first, last
        self.embed = hf.model.embed_tokens if first else None
        self.norm = hf.model.norm if last else None
        self.head = hf.lm_head if last else None
        self.seq_tp = seq_tp  # the TP mesh when the stream is split on the sequence (SP)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hf = self.hf_ref[0]
        h = self.embed(x) if self.embed is not None else self._from_local(x)
        seq = h.shape[1]
        positions = torch.arange(seq).unsqueeze(0)
        embeddings = hf.model.rotary_emb(h, positions)
        for block in self.blocks:
            h = block(h, attention_mask=None, position_ids=positions,
                      position_embeddings=embeddings)
        if self.head is not None and self.norm is not None:
            return self.head(self.norm(h))  # split logits stay a DTensor (loss parallel)
        return _to_local(h)

    def _from_local(self, x: torch.Tensor) -> torch.Tensor:
        if self.seq_tp is None:
            return x
        from torch.distributed.tensor import DTensor, Shard

        return DTensor.from_local(x, self.seq_tp, [Shard(1)], run_check=False)


def _to_local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The last stage's loss: cross-entropy on fp32 logits, as Transformers' causal LM loss."""
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten())


@contextlib.contextmanager
def fake_process_group_at(rank: int, world_size: int) -> Iterator[None]:
    """A fake process group of `world_size` ranks, this process rank `rank`."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _meshes(pipe: PipelineSpec, spec: ParallelSpec) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (pipe.pp, spec.dp, spec.tp),
                            mesh_dim_names=("pp", "dp", "tp"))
    return {"pp": mesh["pp"], "dp": mesh["dp"], "tp": mesh["tp"]}


def _strip(hf: Any, first: bool, last: bool) -> None:
    """Remove the embedding and the head from a stage that does not hold them."""
    if not first:
        hf.model.embed_tokens = nn.Identity()
    if not last:
        hf.lm_head = nn.Identity()
        hf.model.norm = nn.Identity()


def _stage_modules(built: Built, pipe: PipelineSpec, per_chunk: int,
                   seq_tp: Any) -> list[StageModule]:
    blocks = list(built.layer_lists[0][1])
    n_stages = pipe.pp * pipe.virtual
    return [StageModule(built.hf, blocks[j * per_chunk:(j + 1) * per_chunk],
                        first=index == 0, last=index == n_stages - 1, seq_tp=seq_tp)
            for j, index in enumerate(pipe.stages)]


def _schedule(pipe: PipelineSpec, stages: list[Any]) -> Any:
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )
    from torch.distributed.pipelining._utils import InferenceMode

    loss = _loss  # every rank passes it: a schedule without one runs no backward
    if pipe.schedule == "interleaved":
        schedule: Any = ScheduleInterleaved1F1B(stages, n_microbatches=pipe.microbatches,
                                                loss_fn=loss)
    else:
        cls = ScheduleGPipe if pipe.schedule == "gpipe" else Schedule1F1B
        schedule = cls(stages[0], n_microbatches=pipe.microbatches, loss_fn=loss)

    def static_warmup(stages: list[Any], *_args: Any) -> None:
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedule._warmup_p2p = static_warmup
    return schedule


def _io(module: StageModule, setup: TrainingSetup, built: Built, spec: ParallelSpec,
        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's stage input and output (shapes for static inference)."""
    b, s = setup.micro_batch, setup.seq_len
    hidden = int(built.hf.config.hidden_size)
    local = s // spec.tp if spec.tp > 1 and spec.sequence_parallel else s
    x = (torch.randint(0, max(built.vocab, 2), (b, s)) if module.first
         else torch.empty(b, local, hidden, dtype=dtype))
    vocab = max(built.vocab, 2)
    out = (torch.empty(b, s, vocab, dtype=dtype) if module.last
           else torch.empty(b, local, hidden, dtype=dtype))
    # static inference reads requires_grad: a gradient is received for the output and sent
    # back for a hidden-state input
    if x.is_floating_point():
        x.requires_grad_(True)
    return x, out.requires_grad_(True)


def _follow_phases(stages: list[Any], tracker: ShardedTracker) -> None:
    """The tracker's phase follows the schedule: forward and backward alternate under 1F1B."""
    for stage in stages:
        forward, backward = stage.forward_one_chunk, stage.backward_one_chunk

        def fwd(*a: Any, _f: Any = forward, **k: Any) -> Any:
            tracker.set_phase(FORWARD, "embed")
            return _f(*a, **k)

        def bwd(*a: Any, _f: Any = backward, **k: Any) -> Any:
            tracker.set_phase(BACKWARD, "head")
            return _f(*a, **k)

        stage.forward_one_chunk, stage.backward_one_chunk = fwd, bwd


def trace_stage_depth(config: dict[str, Any], setup: TrainingSetup, spec: ParallelSpec,
                      pipe: PipelineSpec, per_chunk: int) -> ParallelRaw:
    """Two steps of `pipe.rank`'s stages, each chunk `per_chunk` blocks deep."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.pipelining import PipelineStage

    from vram.trace.attention import cuda_attention
    from vram.trace.parallel import real_mesh_concatenation

    pipe.check()
    if spec.cp > 1:
        raise TraceUnsupported("cp: the pipeline trace runs tp and dp, not cp")
    start = time.perf_counter()
    cfg = with_depth(config, per_chunk * pipe.pp * pipe.virtual)
    tracker = ShardedTracker()
    group_size = spec.dp * spec.tp
    with fake_process_group_at(pipe.rank * group_size, pipe.pp * group_size):
        mesh = _meshes(pipe, spec)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        tracker.outer_mode = mode
        with mode, swappable(mode):
            built = build(cfg, setup)
            n_stages = pipe.pp * pipe.virtual
            _strip(built.hf, pipe.stages[0] == 0, pipe.stages[-1] == n_stages - 1)
            seq_tp = mesh["tp"] if spec.tp > 1 and spec.sequence_parallel else None
            if spec.tp > 1:
                from vram.trace.tensor_parallel import apply_tp

                apply_tp(built, mesh["tp"], sequence_parallel=spec.sequence_parallel,
                         loss_parallel=spec.loss_parallel)
            modules = _stage_modules(built, pipe, per_chunk, seq_tp)
            owned = nn.ModuleList(modules)
            built.model = owned  # the optimizer and the counts see this rank's stages only
            states: list[Any] = []
            if runs_fsdp(setup, spec):
                built.autocast = None
                with real_mesh_concatenation():
                    states = _shard_stages(modules, setup, mesh["dp"])
            dtype = built.autocast or next(owned.parameters()).dtype
            stages = [PipelineStage(m, stage_index=i, num_stages=n_stages,
                                    device=torch.device("cpu"), group=mesh["pp"].get_group(),
                                    input_args=(_io(m, setup, built, spec, dtype)[0],),
                                    output_args=(_io(m, setup, built, spec, dtype)[1],))
                      for m, i in zip(modules, pipe.stages, strict=True)]
            schedule = _schedule(pipe, stages)
            fsdp_params = list(fsdp_params_of(states))
            train = [p for p in owned.parameters() if p.requires_grad]
            optimizer = make_optimizer(setup, train, tracker.exclude)
            if optimizer is None:
                raise TraceUnsupported("optimizer: the pipeline trace steps after backward")
            weight_keys = register_weights(built, tracker, fsdp_params)
            tracker.classifier = classifier(tracker, weight_keys, fsdp_params, train,
                                             optimizer)
            install_labels(built, tracker, label_before_hooks=True)
            _follow_phases(stages, tracker)
            batch = setup.micro_batch * pipe.microbatches
            with (tracking_resizes(tracker), fsdp_regions(tracker), muting_propagation(tracker),
                  tracker, cuda_attention(setup.attention.value)):
                ids = torch.randint(0, max(built.vocab, 2), (batch, setup.seq_len))
                tracker.recording = True
                for _ in range(2):
                    _step(schedule, stages, built, ids, spec)
                    optimizer_step(tracker, optimizer)
                tracker.recording = False
            params = sum(p.numel() for p in owned.parameters())
    raw = RawTrace(n_layers=per_chunk, peaks=dict(tracker.peaks), timeline=tracker.timeline,
                   paged_bytes=tracker.excluded_bytes, params_total=params,
                   params_trainable=len(train) and sum(p.numel() for p in train),
                   seconds=time.perf_counter() - start)
    return ParallelRaw(raw)


def _step(schedule: Any, stages: list[Any], built: Built, ids: torch.Tensor,
          spec: ParallelSpec) -> None:
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    kwargs: dict[str, Any] = {}
    if last:
        kwargs["target"] = ids.clone()
        kwargs["losses"] = []
    with contextlib.ExitStack() as stack:
        if built.autocast is not None:
            stack.enter_context(torch.autocast("cpu", dtype=built.autocast))
        if last and spec.tp > 1 and spec.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            stack.enter_context(loss_parallel())
        # torchtitan asks for no outputs (torchtitan/train.py@v0.2.2 #L502-L515
        # `return_outputs=False`): the last stage then keeps no micro-batch's logits
        schedule.step(ids if first else None, return_outputs=False, **kwargs)


def _shard_stages(modules: list[StageModule], setup: TrainingSetup, mesh: Any) -> list[Any]:
    """FSDP2 under PP as torchtitan applies it: each block a unit, then each stage module,
    with `reshard_after_forward=False` by default (`fsdp_reshard_after_forward="default"`:
    not resharded under PP, to avoid an all-gather per micro-batch;
    torchtitan/models/llama3/infra/parallelize.py@v0.2.2 apply_fsdp)."""
    from torch.distributed.fsdp import fully_shard

    from vram.trace.sharded import mixed_precision_policy

    policy = mixed_precision_policy(setup)
    reshard = bool(setup.fsdp_reshard_after_forward)
    states = [fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
              for module in modules for block in module.blocks]
    states += [fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
               for module in modules]
    return states


def trace_stage(config: dict[str, Any], setup: TrainingSetup, spec: ParallelSpec,
                pipe: PipelineSpec) -> tuple[Any, ParallelRaw]:
    """`pipe.rank`'s stages traced with chunks of two depths and extended to the config's
    `L / (pp v)` blocks per chunk (as `vram.trace.parallel.trace_parallel` extends)."""
    from vram.trace.build import depth
    from vram.trace.parallel import extend_parallel, start_periods

    chunks = pipe.pp * pipe.virtual
    full = depth(config) // chunks
    if full * chunks != depth(config):
        raise TraceUnsupported(f"pp: {chunks} chunks must divide the {depth(config)} blocks")
    lo = start_periods(setup, spec)
    if full <= lo + 1:
        one = trace_stage_depth(config, setup, spec, pipe, full)
        two = trace_stage_depth(config, setup, spec, pipe, full)
        return extend_parallel(one, two, full, full, 1, spec), two
    one = trace_stage_depth(config, setup, spec, pipe, lo)
    two = trace_stage_depth(config, setup, spec, pipe, lo + 1)
    return extend_parallel(one, two, lo, full, 1, spec), two
