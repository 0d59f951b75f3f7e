"""How long can my context be? The longest sequence on these GPUs, with the levers that
lengthen it (issue 23): context parallel, tensor parallel, activation offload, float8.

Each lever is the run's setup changed and estimated again, the longest sequence searched on
the estimate (`vram.plan.solve.max_seq_len`: two estimates prove it). Each carries what it
costs per step: the bytes each GPU sends over its peer link (context and tensor parallel's
collectives), or over PCIe to the host (offload), and the time that takes at the link's
bandwidth (`data/interconnect.csv`; a GPU without a row talks over PCIe 4.0 x16), and the
stacks that run it (`data/stacks.toml`).

    >>> from vram import load_model, TrainingSetup
    >>> answer = max_context(load_model("llama-3.1-8b"), TrainingSetup(method="lora"),
    ...                      gpu="h100-sxm", count=8)
    >>> [(row.lever, row.max_seq_len) for row in answer.rows]
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from typing import Any

from vram.errors import VramError
from vram.gpus import load_gpus, setup_on
from vram.model.spec import ModelSpec
from vram.paths import data_dir
from vram.plan.hardware import Estimator, find_gpu
from vram.plan.levers import applied
from vram.plan.solve import Proof, max_seq_len
from vram.plan.throughput import HOST_LINK_BYTES_PER_S
from vram.setup import ContextParallel, Offload, TrainingSetup
from vram.stacks.resolve import resolve
from vram.stacks.table import stacks


@dataclass(frozen=True, slots=True)
class ContextRow:
    """One way to run: the longest sequence that fits, what it costs, who runs it."""

    lever: str
    setup: TrainingSetup | None  # None: the lever does not apply (see `why_not`)
    max_seq_len: int
    proof: Proof | None
    #: Bytes each GPU sends per optimizer step at that length: over its peer link (CP, TP)
    #: and to and from the host (offload).
    peer_bytes: int = 0
    host_bytes: int = 0
    seconds: float = 0.0  # those transfers at the links' bandwidth (not overlapped)
    stacks: tuple[str, ...] = ()
    why_not: str = ""


@dataclass(frozen=True, slots=True)
class ContextAnswer:
    gpu: str
    count: int
    usable_bytes: int
    rows: tuple[ContextRow, ...]

    @property
    def best(self) -> ContextRow:
        return max(self.rows, key=lambda r: r.max_seq_len)


@cache
def _peer_link() -> dict[str, tuple[float, str]]:
    with (data_dir() / "interconnect.csv").open(newline="", encoding="utf-8") as handle:
        return {row["gpu"]: (float(row["peer_gbps"]) * 1e9, row["link"])
                for row in csv.DictReader(handle)}


def peer_bytes_per_s(gpu: str) -> float:
    """Bytes per second one GPU sends to a peer (each way); PCIe 4.0 x16 without a row."""
    found = _peer_link().get(gpu)
    return found[0] if found else HOST_LINK_BYTES_PER_S


#: A lever that needs more GPUs than the run has: the change is this marker.
MORE_GPUS = {"_needs": "2 or more GPUs (one sequence split over them)"}


def _levers(setup: TrainingSetup, count: int) -> list[tuple[str, dict[str, Any]]]:
    """The changes to try: as set, each lever alone, and context parallel with the others."""
    group = count // (setup.tp * setup.pp)
    cp = {"cp": group, "sharding": "zero3"} if group > 1 and setup.cp == 1 else None
    offload = {"offload": Offload.ACTIVATIONS.value, "grad_ckpt": True}
    fp8 = {"fp8": _fp8_recipe(setup)} if _fp8_recipe(setup) else None
    tp = {"tp": min(8, count), "sharding": "none" if count <= 8 else "zero3"} \
        if count > 1 and setup.tp == 1 else None
    out: list[tuple[str, dict[str, Any]]] = [("as set", {})]
    if not setup.grad_ckpt:
        out.append(("checkpointing", {"grad_ckpt": True}))
    out += [("add CP", cp or MORE_GPUS), ("add TP", tp or MORE_GPUS),
            ("offload activations", offload)]
    if fp8:
        out.append(("FP8", fp8))
    if cp:
        out.append(("add CP + offload", {**cp, **offload}))
    return out


def _fp8_recipe(setup: TrainingSetup) -> str | None:
    recipes = stacks()[setup.framework].fp8_recipes
    return recipes[0].value if recipes else None


def _supporting(setup: TrainingSetup) -> tuple[str, ...]:
    """The stacks that run this setup's layout, offload and float8 (the same knobs)."""
    out = []
    for framework in stacks():
        trial = setup.model_copy(update={"framework": framework, "cp_kind": None,
                                         "sequence_parallel": None})
        if resolve(trial).unsupported is None:
            out.append(framework.value)
    return tuple(out)


def _transfers(model: ModelSpec, setup: TrainingSetup, est: Estimator) -> tuple[int, int]:
    """Per GPU and optimizer step: bytes over the peer link and to and from the host."""
    b, s = setup.micro_batch, setup.seq_len // setup.cp
    layers, h = model.n_layers, model.hidden_size
    stack = model.decoder
    e = 2  # 16-bit activations
    peer = 0
    if setup.cp > 1:
        kv = 2 * b * setup.seq_len * stack.n_kv_heads * stack.head_dim
        share = (setup.cp - 1) / setup.cp
        if resolve(setup).run.cp_kind is ContextParallel.ULYSSES:
            # q, k, v and the output, there and back in the backward
            widths = 2 * stack.n_heads * stack.head_dim + 2 * stack.n_kv_heads * stack.head_dim
            peer += int(layers * 2 * share * b * s * widths * e)
        else:
            # k and v all-gathered in forward and again in backward; dk, dv (fp32) round the
            # ring in backward (`_templated_ring_attention(_backward)`)
            peer += int(layers * share * (2 * kv * e + kv * 4))
    if setup.tp > 1:
        # four hidden-wide collectives per layer in forward and four in backward
        peer += int(layers * 8 * (setup.tp - 1) / setup.tp * b * s * h * e)
    host = 2 * est(setup).host_bytes if setup.offload is Offload.ACTIVATIONS else 0
    return peer * setup.grad_accum, host * setup.grad_accum


def _row(model: ModelSpec, est: Estimator, lever: str, change: dict[str, Any],
         base: TrainingSetup, count: int, usable: int, gpu: str) -> ContextRow:
    if change is MORE_GPUS:
        return ContextRow(lever, None, 0, None, why_not=f"needs {MORE_GPUS['_needs']}")
    trial = applied(base, change) if change else base
    if trial is None:
        return ContextRow(lever, None, 0, None, why_not="the knobs do not combine "
                          "(see `python -m vram estimate` with them)")
    problem = resolve(trial).unsupported
    if problem is not None:
        return ContextRow(lever, None, 0, None, why_not=problem)
    try:
        proof = max_seq_len(est, trial, usable)
    except VramError as exc:
        return ContextRow(lever, None, 0, None, why_not=str(exc))
    at = trial.model_copy(update={"seq_len": max(proof.value, 1)})
    peer, host = _transfers(model, at, est) if proof.value else (0, 0)
    seconds = peer / peer_bytes_per_s(gpu) + host / HOST_LINK_BYTES_PER_S
    return ContextRow(lever, trial, proof.value, proof, peer, host, seconds,
                      _supporting(trial))


def max_context(model: ModelSpec, setup: TrainingSetup, *, gpu: str, count: int,
                est: Estimator | None = None) -> ContextAnswer:
    """The longest sequence on `count` GPUs of type `gpu`, as set and with each lever."""
    card = find_gpu(gpu, load_gpus())
    est = est or Estimator(model)
    base = setup_on(setup, count)
    if setup.tp * setup.pp > 1 or setup.cp > 1:
        base = applied(setup, {"n_gpus": count}) or base
    rows = tuple(_row(model, est, lever, change, base, count, card.memory_bytes, card.id)
                 for lever, change in _levers(base, count))
    return ContextAnswer(card.id, count, card.memory_bytes, rows)


def context_text(answer: ContextAnswer) -> str:
    lines = [f"Longest context on {answer.count} x {answer.gpu} "
             f"({answer.usable_bytes / 2**30:.1f} GiB each):",
             f"{'lever':<22} {'tokens':>10} {'peer GB/step':>13} {'host GB/step':>13} "
             f"{'comm s/step':>11}  stacks"]
    for row in answer.rows:
        if row.setup is None:
            lines.append(f"{row.lever:<22} {'-':>10}  {row.why_not}")
            continue
        lines.append(f"{row.lever:<22} {row.max_seq_len:>10,} {row.peer_bytes / 1e9:>13.1f} "
                     f"{row.host_bytes / 1e9:>13.1f} {row.seconds:>11.2f}  "
                     + ", ".join(row.stacks))
    best = answer.best
    lines.append(f"longest: {best.max_seq_len:,} tokens ({best.lever})")
    return "\n".join(lines)


def context_json(answer: ContextAnswer) -> dict[str, Any]:
    return {
        "gpu": answer.gpu, "count": answer.count, "usable_bytes": answer.usable_bytes,
        "best": {"lever": answer.best.lever, "max_seq_len": answer.best.max_seq_len},
        "rows": [{"lever": r.lever, "max_seq_len": r.max_seq_len,
                  "peer_bytes_per_step": r.peer_bytes, "host_bytes_per_step": r.host_bytes,
                  "comm_seconds_per_step": round(r.seconds, 3), "stacks": list(r.stacks),
                  "why_not": r.why_not or None,
                  "setup": None if r.setup is None else {
                      k: v for k, v in r.setup.model_dump(mode="json").items()
                      if k in ("tp", "pp", "cp", "cp_kind", "offload", "fp8", "grad_ckpt",
                               "sharding", "n_gpus")}}
                 for r in answer.rows],
    }
