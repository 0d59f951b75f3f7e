"""The allocator slack of 7B/8B full fine-tunes: the replay beside the closed form (issue 21).

    PYTHONPATH=. nice -n 10 python benchmarks/reserved_full_replay.py \
        > benchmarks/reserved_full_replay.txt

Published single-GPU full fine-tunes of 7B-class models measure a reserved figure 6-17 % above
the closed form's (allocated + `overhead.allocator_slack_bytes`: 3 % of the allocated peak + 20 %
of the activations). This traces each setup of a grid (Llama-2-7B and Llama-3.1-8B at full
depth; bf16-true and bf16-mixed; fused and foreach AdamW and 8-bit AdamW; checkpointing on and
off; batch 1-4, 512-4096 tokens) on fake tensors from the model's build on
(`vram.trace.allocator.trace_allocations`), replays build, reset of the peaks and three steps
through the caching allocator model (`vram.memory.allocator`), and sets the replay's allocated
and reserved peaks beside the estimate's. Columns (MiB):

    alloc_r / res_r / slack_r   the replay's allocated and reserved peaks, reserved - allocated
    alloc_e                     the estimate's allocated peak
    res_fit / slack_f           its reserved peak with the fitted slack alone (before the idle
                                loss blocks), and that slack
    fit_r                       the fitted slack applied to the replay's allocated peak
                                (3 % of alloc_r + 20 % of the estimate's activations)
    err_fit                     res_fit against res_r, %
    res_e / err_e               the estimate's reserved peak with the idle loss blocks
                                (`overhead.idle_loss_bytes`) and its error against res_r, %
    state / emb / logits        quantities the estimate has: the optimizer bucket, the largest
                                parameter block (V x h in the parameters' dtype), the fp32
                                logits block (b x s x V x 4)
    free                        the three largest free blocks of the large pool at the last
                                allocated peak (what the slack is made of)

After the rows: the reserved error against the replay by group, with the fitted slack alone and
with the idle loss blocks, the replayed over the fitted slack, and the rows the term moved.

`--only SUBSTRING` limits the rows. The replay of each row is cached in /tmp/vram_full_replay
(`--cache DIR`): a second run only estimates. Not a test: the evidence for ACCURACY.md's
"Issue 21, item 6: the slack of 7B/8B full fine-tunes, replayed". About 20 s a row on a 2-core
machine (96 rows at full depth: the replay is not linear in the depth, so none is cut).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from vram import TrainingSetup, estimate
from vram.memory.allocator import ALLOC, FREE, Event, replay
from vram.memory.allocator.caching import CachingAllocator
from vram.memory.allocator.conf import AllocConf
from vram.memory.allocator.replay import RESET_PEAKS
from vram.memory.overhead import allocator_slack_bytes
from vram.model.architecture import model_from_config
from vram.model.catalog import load_config
from vram.trace.allocator import run_conf, trace_allocations

MIB = 2**20
MODELS = ("llama-2-7b", "llama-3.1-8b")
PRECISIONS = ("bf16-true", "bf16-mixed")
#: (optimizer, framework): hf-trainer steps fused AdamW, peft-accelerate foreach (as measured
#: on the H200, `benchmarks/gpu_compare.py`).
OPTIMIZERS = (("adamw", "hf-trainer"), ("adamw", "peft-accelerate"),
              ("adamw-8bit", "hf-trainer"))
SHAPES = ((1, 512), (1, 4096), (4, 1024), (4, 4096))
OPT_NAMES = {("adamw", "hf-trainer"): "fused", ("adamw", "peft-accelerate"): "foreach",
             ("adamw-8bit", "hf-trainer"): "8bit"}


def grid() -> list[tuple[str, TrainingSetup]]:
    """The grid's rows, as (id, setup) pairs, one model at a time."""
    rows = []
    for model, precision, (optimizer, framework), ckpt, (batch, seq) in itertools.product(
            MODELS, PRECISIONS, OPTIMIZERS, (True, False), SHAPES):
        setup = TrainingSetup(method="full", precision=precision, optimizer=optimizer,
                              framework=framework, micro_batch=batch, seq_len=seq,
                              grad_ckpt=ckpt, attention="sdpa")
        name = (f"{model} {precision} {OPT_NAMES[(optimizer, framework)]} "
                f"{'ckpt' if ckpt else 'nockpt'} b{batch} s{seq}")
        rows.append((name, setup))
    return rows


def free_at_peak(events: list[Event], conf: AllocConf, peak_bytes: int) -> list[int]:
    """The large pool's free block sizes (largest first) at the last event after the reset
    where the allocated figure equals `peak_bytes`."""
    last, reset = -1, False
    alloc, live = CachingAllocator(conf), {}
    for index, (kind, key, size, stream) in enumerate(events):
        if kind == ALLOC:
            live[key] = alloc.malloc(size, stream)
        elif kind == FREE:
            alloc.free(live.pop(key))
        elif kind == RESET_PEAKS:
            reset = True
        if reset and alloc.stats.allocated_bytes == peak_bytes:
            last = index
    alloc, live = CachingAllocator(conf), {}
    for kind, key, size, stream in events[:last + 1]:
        if kind == ALLOC:
            live[key] = alloc.malloc(size, stream)
        elif kind == FREE:
            alloc.free(live.pop(key))
    return sorted((block.size for block in alloc.large._blocks.values()), reverse=True)


def replayed(name: str, setup: TrainingSetup) -> dict[str, Any]:
    """The replay's figures of one row (cached: they do not depend on the estimate)."""
    config = load_config(name.split()[0])
    log = trace_allocations(config, setup)
    conf = run_conf(setup)
    events = log.program()
    result = replay(events, conf)
    free = free_at_peak(events, conf, result.allocated_peak_bytes)
    return {"id": name, "layers": log.n_layers, "alloc_r": result.allocated_peak_bytes,
            "res_r": result.reserved_peak_bytes, "free": free[:3],
            "trace_s": round(log.seconds, 1)}


def with_estimate(row: dict[str, Any], setup: TrainingSetup) -> dict[str, Any]:
    """The row with the estimate's columns: `res_e` with the idle loss blocks, `res_fit` with
    the fitted slack alone (`res_e` less the `overhead.idle_loss` item)."""
    model_name = row["id"].split()[0]
    config = load_config(model_name)
    est = estimate(model_from_config(config, model_name), setup)
    idle = sum(i.bytes for i in est.bucket("overhead").items if i.key == "overhead.idle_loss")
    acts = est.bucket("activations").bytes
    param_bytes = 2 if setup.precision.value == "bf16-true" else 4
    vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
    return dict(
        row, alloc_e=est.allocated_peak_bytes, res_e=est.reserved_peak_bytes,
        res_fit=est.reserved_peak_bytes - idle,
        fit_r=allocator_slack_bytes(row["alloc_r"], acts), state=est.bucket("optimizer").bytes,
        emb=vocab * hidden * param_bytes, logits=setup.micro_batch * setup.seq_len * vocab * 4)


def line(row: dict[str, Any]) -> str:
    def m(key: str) -> str:
        return f"{row[key] / MIB:8.0f}"
    slack_r = (row["res_r"] - row["alloc_r"]) / MIB
    slack_fit = (row["res_fit"] - row["alloc_e"]) / MIB
    free = ",".join(f"{b / MIB:.0f}" for b in row["free"])
    return (f"{m('alloc_r')} {m('res_r')} {slack_r:7.0f} {m('alloc_e')} {m('res_fit')} "
            f"{slack_fit:7.0f} {row['fit_r'] / MIB:7.0f} "
            f"{error_pct(row['res_fit'], row['res_r']):+7.1f}% {m('res_e')} "
            f"{error_pct(row['res_e'], row['res_r']):+7.1f}% {m('state')} {m('emb')} "
            f"{m('logits')}  {free:<17} {row['id']}")


HEADER = (f"{'alloc_r':>8} {'res_r':>8} {'slack_r':>7} {'alloc_e':>8} {'res_fit':>8} "
          f"{'slack_f':>7} {'fit_r':>7} {'err_fit':>8} {'res_e':>8} {'err_e':>8} {'state':>8} "
          f"{'emb':>8} {'logits':>8}  {'free (MiB)':<17} setup")


def error_pct(estimated: int, replayed: int) -> float:
    return 100 * (estimated / replayed - 1)


def spread(values: list[float]) -> str:
    absolute = sorted(abs(v) for v in values)
    return (f"n={len(values):3} |error| median {statistics.median(absolute):5.2f} p90 "
            f"{absolute[int(0.9 * len(absolute))]:5.2f} max {absolute[-1]:5.2f}; signed median "
            f"{statistics.median(values):+6.2f} min {min(values):+6.2f} max {max(values):+6.2f}")


def summarize(rows: list[dict[str, Any]]) -> None:
    """The reserved error against the replay by group: fitted slack alone, then with the idle
    loss blocks; and the replayed slack over the fitted one."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        for key in ("all", *row["id"].split()[:4]):
            groups.setdefault(key, []).append(row)
    for title, column in (("fitted slack alone", "res_fit"), ("with the idle loss blocks",
                                                               "res_e")):
        print(f"\nreserved against the replay, {title}, %")
        for key, members in groups.items():
            print(f"  {key:<13} {spread([error_pct(r[column], r['res_r']) for r in members])}")
    print("\nreplayed slack / fitted slack, median by group")
    for key, members in groups.items():
        ratios = [(r["res_r"] - r["alloc_r"]) / max(1, r["res_fit"] - r["alloc_e"])
                  for r in members]
        print(f"  {key:<13} {statistics.median(ratios):.2f}")
    print("\nrows the idle loss blocks moved (error against the replay, %)")
    for row in rows:
        if row["res_e"] != row["res_fit"]:
            print(f"  {error_pct(row['res_fit'], row['res_r']):+6.1f} -> "
                  f"{error_pct(row['res_e'], row['res_r']):+6.1f}  {row['id']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/vram_full_replay"))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    print(HEADER)
    rows = []
    for name, setup in grid():
        if args.only not in name:
            continue
        path = args.cache / (name.replace(" ", "_") + "_dfull.json")
        if path.exists():
            row = json.loads(path.read_text())
        else:
            row = replayed(name, setup)
            path.write_text(json.dumps(row))
        rows.append(with_estimate(row, setup))
        print(line(rows[-1]), flush=True)
    summarize(rows)


if __name__ == "__main__":
    main()
