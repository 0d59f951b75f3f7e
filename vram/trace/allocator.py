"""The reserved figure of a traced step: its allocations replayed through the caching allocator.

`vram.trace.step` counts live bytes, which is `torch.cuda.max_memory_allocated()`. What the GPU
holds is `max_memory_reserved()`: the segments the caching allocator asked the driver for, more
than what is live by what its caching and rounding cost. This module runs the same step with the
tracker on from the moment the model is built (the build's allocations and frees shape the cache
the step starts from: a tied head's weight allocated and dropped, an upcast's old copy freed),
takes the tracker's allocation log (`StorageTracker.alloc_log`) and replays it through
`vram.memory.allocator`:

    build, reset_peak_memory_stats(), step 1, step 2, step 3

which is how `benchmarks/gpu_measure.py` measured 61 real steps on an H200. The trace runs two
steps; the third repeats the second's events (steady state: step 2 allocates nothing that
outlives it). The model is traced at its full depth (no extrapolation): the replay's figure is
not linear in the depth.

    >>> from vram.trace.allocator import trace_reserved
    >>> r = trace_reserved(config, setup)
    >>> r.reserved_peak_bytes, r.allocated_peak_bytes
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from vram.memory.allocator import (
    ALLOC,
    FREE,
    MARK,
    RESET_PEAKS,
    AllocConf,
    Event,
    ReplayResult,
    parse_alloc_conf,
    replay,
)
from vram.memory.allocator.libraries import CUBLAS_WORKSPACE_SM90_BYTES
from vram.setup import TrainingSetup
from vram.stacks.resolve import resolve
from vram.trace.build import TraceUnsupported, depth
from vram.trace.engine import BACKWARD, FORWARD, HostScalarTracker
from vram.trace.report import TraceResult
from vram.trace.step import trace_depth, traces_fsdp2

#: How many steps `benchmarks/gpu_measure.py` ran after the build (the trace runs two).
MEASURED_STEPS = 3
#: Allocation ids of the cuBLAS workspaces (counting down; the traced storages count up).
WORKSPACE_ID = -(1 << 20)
#: The thread each traced phase runs on: autograd's device thread runs the backward pass.
PHASE_THREADS = {BACKWARD: "autograd"}


@dataclass(frozen=True)
class AllocationLog:
    """A traced run's allocator events: the build, then one list per traced step."""

    build: list[Event]
    steps: list[list[Event]]
    n_layers: int
    seconds: float
    #: `MARK k` events in the steps: phase `phases[k]` begins.
    phases: tuple[str, ...] = ()
    #: (part, index, thread): where each thread ran its first cuBLAS matmul; part 0 is the
    #: build, part k step k (a GPU allocates that thread's cuBLAS workspace there).
    first_matmuls: tuple[tuple[int, int, str], ...] = ()

    def parts(self, workspace_bytes: int) -> list[list[Event]]:
        """The build and the steps, with each thread's cuBLAS workspace allocated at its first
        matmul (`vram.memory.allocator.libraries`; 0: none)."""
        parts = [list(self.build), *(list(step) for step in self.steps)]
        if workspace_bytes:
            for n, (part, index, _) in enumerate(sorted(self.first_matmuls, reverse=True)):
                parts[part].insert(index, (ALLOC, WORKSPACE_ID - n, workspace_bytes, 0))
        return parts

    def program(self, steps: int = MEASURED_STEPS, *,
                workspace_bytes: int = CUBLAS_WORKSPACE_SM90_BYTES) -> list[Event]:
        """Build, reset of the peaks, then `steps` steps (past the traced ones, the last traced
        step repeats with fresh allocation ids)."""
        build, *traced = self.parts(workspace_bytes)
        events = [*build, (RESET_PEAKS, 0, 0, 0)]
        for index in range(steps):
            if index < len(traced):
                events.extend(traced[index])
            else:
                events.extend(repeat_step(traced[-1], offset=(index + 1) << 40))
        return events


def repeat_step(step: list[Event], *, offset: int) -> list[Event]:
    """The same step again: ids allocated in it get fresh ids (`offset` + id); frees of what
    an earlier step allocated are kept out (they happen once). Raises if the step leaves an
    allocation alive (it would pile up, which a steady step does not)."""
    born = {key for kind, key, _, _ in step if kind == ALLOC}
    dead = {key for kind, key, _, _ in step if kind == FREE}
    if born - dead:
        raise TraceUnsupported(f"steps: {len(born - dead)} allocations outlive the traced step; "
                               "it cannot be repeated")
    out: list[Event] = []
    for kind, key, size, stream in step:
        if kind in (ALLOC, FREE) and key in born:
            out.append((kind, key + offset, size, stream))
        elif kind not in (ALLOC, FREE):
            out.append((kind, key, size, stream))
    return out


def trace_allocations(config: dict[str, Any], setup: TrainingSetup,
                      n_layers: int | None = None) -> AllocationLog:
    """Build and run two steps of `config` under `setup` on fake tensors, logging every
    allocation from the first parameter on (`n_layers`: that many blocks; default all)."""
    if traces_fsdp2(setup):
        raise TraceUnsupported("reserved: the allocator replay of FSDP2 ranks is not traced yet")
    start = time.perf_counter()
    target = depth(config) if n_layers is None else n_layers
    tracker = HostScalarTracker()
    trace_depth(config, setup, target, tracker=tracker, from_build=True)
    log, dropped, end = tracker.alloc_log, tracker.dropped_events, tracker.steps_end
    cut = [i for i, e in enumerate(log[:end]) if e[0] == MARK and
           tracker.marks[e[1]] == FORWARD]
    spans = list(itertools.pairwise([0, *cut, end]))  # the build, then each step
    parts = [[e for i, e in enumerate(log[a:b], start=a) if i not in dropped] for a, b in spans]
    return AllocationLog(build=parts[0], steps=parts[1:], n_layers=target,
                         seconds=time.perf_counter() - start, phases=tuple(tracker.marks),
                         first_matmuls=_first_matmuls(tracker.first_matmuls, spans, dropped))


def _first_matmuls(found: list[tuple[int, str]], spans: list[tuple[int, int]],
                   dropped: frozenset[int]) -> tuple[tuple[int, int, str], ...]:
    """Each thread's first matmul as (part, index in the part's kept events, thread)."""
    first: dict[str, int] = {}
    for position, phase in found:
        thread = PHASE_THREADS.get(phase, "main")
        first[thread] = min(position, first.get(thread, position))
    out = []
    for thread, position in first.items():
        for part, (a, b) in enumerate(spans):
            if a <= position < b:
                index = sum(1 for i in range(a, position) if i not in dropped)
                out.append((part, index, thread))
    return tuple(out)


@dataclass(frozen=True)
class ReservedTrace:
    """The replay of a traced run: peaks over the steps (after the build), as measured."""

    reserved_peak_bytes: int
    allocated_peak_bytes: int
    replay: ReplayResult
    n_layers: int
    seconds: float


def trace_reserved(config: dict[str, Any], setup: TrainingSetup, *,
                   conf: AllocConf | None = None, n_layers: int | None = None,
                   steps: int = MEASURED_STEPS) -> ReservedTrace:
    """`max_memory_reserved()` and `max_memory_allocated()` of `steps` training steps after
    the model is built, from the traced allocations replayed through the allocator model."""
    log = trace_allocations(config, setup, n_layers)
    start = time.perf_counter()
    result = replay(log.program(steps), conf if conf is not None else run_conf(setup))
    return ReservedTrace(reserved_peak_bytes=result.reserved_peak_bytes,
                         allocated_peak_bytes=result.allocated_peak_bytes, replay=result,
                         n_layers=log.n_layers,
                         seconds=log.seconds + time.perf_counter() - start)


def run_conf(setup: TrainingSetup) -> AllocConf:
    """The allocator settings the run has: the `alloc_conf` knob, else the stack's."""
    return parse_alloc_conf(resolve(setup).run.alloc_conf)


def with_reserved(result: TraceResult, config: dict[str, Any], setup: TrainingSetup, *,
                  conf: AllocConf | None = None) -> TraceResult:
    """`result` (a `trace_step` result) with its reserved peak: the model traced again at full
    depth from its build, three steps replayed through the allocator model under `conf`
    (default: the run's, `run_conf`)."""
    conf = conf if conf is not None else run_conf(setup)
    reserved = trace_reserved(config, setup, conf=conf, n_layers=result.n_layers)
    note = (f"reserved: {reserved.n_layers} blocks traced from the build and replayed through "
            f"the caching allocator model in {reserved.seconds:.1f} s")
    return result.model_copy(update={
        "reserved_peak_bytes": reserved.reserved_peak_bytes,
        "alloc_conf": conf.text(), "notes": (*result.notes, note)})
