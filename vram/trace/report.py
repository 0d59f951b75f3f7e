"""What a trace returns. Pure pydantic: importable without torch."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class TimelinePoint(BaseModel):
    """Live bytes right after one op of the traced step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: int
    live_bytes: int
    phase: str


class LiveTensor(BaseModel):
    """One of the largest storages alive at the peak of the deepest traced model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    what: str
    bytes: int
    bucket: str


class TraceResult(BaseModel):
    """The exact memory of one training step, from a real PyTorch step on fake tensors.

    `buckets` hold what is alive at the allocated peak (they sum to `allocated_peak_bytes`);
    `phase` is when that peak happens. Bytes are rounded per storage to the CUDA caching
    allocator's 512-byte blocks, as `torch.cuda.max_memory_allocated()` counts them.
    With `extrapolated`, the figures come from traces of `n_layers_traced` layers (two and
    three periods of the layer kinds; three and four under FSDP2), extended linearly to
    `n_layers`; the `timeline` and `top_tensors` are then those of the deeper trace
    (`timeline_n_layers`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    buckets: dict[str, int]
    allocated_peak_bytes: int
    #: The most each bucket holds at any moment of the step (gradients: all of them, at the
    #: optimizer step), from every segment's peak.
    bucket_max: dict[str, int] = {}
    #: Where the peak falls: the phase and, inside the repeated blocks, which block runs
    #: ("backward / model.layers / first": the first block's backward, or what follows it).
    peak_at: str = ""
    phase: str
    paged_bytes: int = 0
    timeline: list[TimelinePoint]
    timeline_n_layers: int
    n_layers: int
    n_layers_traced: tuple[int, ...]
    extrapolated: bool
    params_total: int
    params_trainable: int
    top_tensors: list[LiveTensor] = []
    notes: tuple[str, ...] = ()
    #: `torch.cuda.max_memory_reserved()` of the traced run: its allocations replayed through
    #: the caching allocator model (`vram.trace.allocator`); None when not replayed.
    reserved_peak_bytes: int | None = None
    #: The `PYTORCH_CUDA_ALLOC_CONF` settings of that replay ("" for PyTorch's defaults).
    alloc_conf: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the same keys as `python -m vram estimate --json` where shared."""
        return {
            "buckets": dict(self.buckets),
            "bucket_max": dict(self.bucket_max),
            "allocated_peak_bytes": self.allocated_peak_bytes,
            **({"reserved_peak_bytes": self.reserved_peak_bytes, "alloc_conf": self.alloc_conf}
               if self.reserved_peak_bytes is not None else {}),
            "phase": self.phase,
            "peak_at": self.peak_at,
            "paged_bytes": self.paged_bytes,
            "params": {"total": self.params_total, "trainable": self.params_trainable},
            "n_layers": self.n_layers,
            "n_layers_traced": list(self.n_layers_traced),
            "extrapolated": self.extrapolated,
            "timeline_n_layers": self.timeline_n_layers,
            "timeline": [[p.event, p.live_bytes, p.phase] for p in self.timeline],
            "top_tensors": [t.model_dump() for t in self.top_tensors],
            "notes": list(self.notes),
        }
