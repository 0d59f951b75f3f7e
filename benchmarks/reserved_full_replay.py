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
    alloc_e / res_e / slack_e   the estimate's (closed form)
    fit_r                       the closed form's slack applied to the replay's allocated peak
                                (3 % of alloc_r + 20 % of the estimate's activations)
    res_err                     res_e against res_r, %
    state / emb / logits        quantities the estimate has: the optimizer state, the largest
                                parameter block (V x h in the parameters' dtype), the fp32
                                logits block (b x s x V x 4)
    free                        the three largest free blocks of the large pool at the last
                                allocated peak (what the slack is made of)

After the rows: the closed form's reserved error against the replay by group, then the same
with a candidate term, the loss's idle blocks (`idle_loss_candidate`: two fp32 logits blocks,
2 x b x s x V x 4, where the state is at least that large and a logits block is larger than
any parameter-shaped block; checkpointed steps, unfused loss). `--candidate-checks` instead
runs the candidate, patched into the estimate, over the 61 H200 steps
(`reserved_closed_form.py --rows`) and prints the shared case file's validation with it, to
diff against `validation.txt`.

`--only SUBSTRING` limits the rows. Rows are cached in /tmp/vram_full_replay (`--cache DIR`):
a second run only prints. The script is not a test: it is the evidence for ACCURACY.md's
"Issue 21, item 6: the slack of 7B/8B full fine-tunes, replayed". About 20 s a row on a
2-core machine (96 rows, full depth: the replay is not linear in the depth, so none is cut).
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


def measure(name: str, setup: TrainingSetup) -> dict[str, Any]:
    model_name = name.split()[0]
    config = load_config(model_name)
    log = trace_allocations(config, setup)
    conf = run_conf(setup)
    events = log.program()
    result = replay(events, conf)
    free = free_at_peak(events, conf, result.allocated_peak_bytes)
    est = estimate(model_from_config(config, model_name), setup)
    acts, state = est.bucket("activations").bytes, est.bucket("optimizer").bytes
    param_bytes = 2 if setup.precision.value == "bf16-true" else 4
    vocab, hidden = int(config["vocab_size"]), int(config["hidden_size"])
    return {
        "id": name, "layers": log.n_layers, "vocab": vocab, "hidden": hidden,
        "alloc_r": result.allocated_peak_bytes, "res_r": result.reserved_peak_bytes,
        "alloc_e": est.allocated_peak_bytes, "res_e": est.reserved_peak_bytes,
        "fit_r": allocator_slack_bytes(result.allocated_peak_bytes, acts),
        "acts_e": acts, "state": state, "emb": vocab * hidden * param_bytes,
        "logits": setup.micro_batch * setup.seq_len * vocab * 4, "free": free[:3],
        "trace_s": round(log.seconds, 1),
    }


def line(row: dict[str, Any]) -> str:
    def m(key: str) -> str:
        return f"{row[key] / MIB:8.0f}"
    slack_r = (row["res_r"] - row["alloc_r"]) / MIB
    slack_e = (row["res_e"] - row["alloc_e"]) / MIB
    err = 100 * (row["res_e"] / row["res_r"] - 1)
    free = ",".join(f"{b / MIB:.0f}" for b in row["free"])
    return (f"{m('alloc_r')} {m('res_r')} {slack_r:7.0f} {m('alloc_e')} {m('res_e')} "
            f"{slack_e:7.0f} {row['fit_r'] / MIB:7.0f} {err:+7.1f}% {m('state')} {m('emb')} "
            f"{m('logits')}  {free:<17} {row['id']}")


HEADER = (f"{'alloc_r':>8} {'res_r':>8} {'slack_r':>7} {'alloc_e':>8} {'res_e':>8} "
          f"{'slack_e':>7} {'fit_r':>7} {'res_err':>8} {'state':>8} {'emb':>8} {'logits':>8}  "
          f"{'free (MiB)':<17} setup")


def error_pct(estimated: int, replayed: int) -> float:
    return 100 * (estimated / replayed - 1)


def idle_loss_candidate(row: dict[str, Any]) -> int:
    """The candidate's reserved: at least allocated + two fp32 logits blocks where it fires."""
    words = row["id"].split()
    batch, seq = int(words[4][1:]), int(words[5][1:])
    block = batch * seq * row["vocab"] * 4
    param_bytes = 4 if words[1] == "bf16-mixed" else 2
    fires = (words[3] == "ckpt" and row["state"] >= 2 * block
             and block > row["vocab"] * row["hidden"] * param_bytes)
    return max(row["res_e"], row["alloc_e"] + 2 * block) if fires else int(row["res_e"])


def spread(values: list[float]) -> str:
    absolute = sorted(abs(v) for v in values)
    return (f"n={len(values):3} |error| median {statistics.median(absolute):5.2f} p90 "
            f"{absolute[int(0.9 * len(absolute))]:5.2f} max {absolute[-1]:5.2f}; signed median "
            f"{statistics.median(values):+6.2f} min {min(values):+6.2f} max {max(values):+6.2f}")


def summarize(rows: list[dict[str, Any]]) -> None:
    """The closed form's reserved error against the replay, by group, then with the
    candidate term; and the replayed slack over the closed form's, by group."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        words = row["id"].split()
        for key in ("all", *words[:4]):
            groups.setdefault(key, []).append(row)
    print("\nreserved: closed form against the replay, %")
    for key, members in groups.items():
        ratios = sorted((r["res_r"] - r["alloc_r"]) / max(1, r["res_e"] - r["alloc_e"])
                        for r in members)
        print(f"  {key:<13} {spread([error_pct(r['res_e'], r['res_r']) for r in members])}"
              f"  slack_r/slack_e median {statistics.median(ratios):.2f}")
    print("\nwith the candidate (idle loss blocks), %")
    print(f"  {'all':<13} "
          f"{spread([error_pct(idle_loss_candidate(r), r['res_r']) for r in rows])}")
    for row in rows:
        moved = idle_loss_candidate(row)
        if moved != row["res_e"]:
            print(f"  moved {error_pct(row['res_e'], row['res_r']):+6.1f} -> "
                  f"{error_pct(moved, row['res_r']):+6.1f}  {row['id']}")


def candidate_checks() -> None:
    """The candidate patched into the estimate: the H200 table, then the shared validation."""
    import dataclasses

    import vram.step.estimate as step_estimate
    from benchmarks import reserved_closed_form
    from vram.cli import main as cli_main
    from vram.setup import Method

    original = step_estimate._rank_peak

    def patched(model: Any, setup: TrainingSetup, figures: Any, stage: Any) -> Any:
        step = original(model, setup, figures, stage)
        block = setup.micro_batch * setup.seq_len * model.vocab_size * 4
        policy = step.part.profile.precision
        largest = model.vocab_size * model.hidden_size * max(policy.weights, policy.gradients,
                                                             policy.states)
        state = step.part.optimizer_bucket.bytes - step.part.optimizer.paged_bytes
        if (setup.method is Method.FULL and setup.grad_ckpt
                and not step.part.profile.fused_linear_loss
                and state >= 2 * block and block > largest):
            return dataclasses.replace(step, reserved=max(step.reserved,
                                                          step.allocated + 2 * block))
        return step

    step_estimate._rank_peak = patched
    reserved_closed_form.main(["--rows"])
    cli_main(["validate", str(reserved_closed_form.CASES)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/vram_full_replay"))
    ap.add_argument("--only", default="")
    ap.add_argument("--candidate-checks", action="store_true")
    args = ap.parse_args()
    if args.candidate_checks:
        candidate_checks()
        return
    args.cache.mkdir(parents=True, exist_ok=True)
    print(HEADER)
    rows = []
    for name, setup in grid():
        if args.only not in name:
            continue
        path = args.cache / (name.replace(" ", "_") + f"_d{'full'}.json")
        if path.exists():
            row = json.loads(path.read_text())
            if "vocab" not in row:  # rows cached before the column
                config = load_config(name.split()[0])
                row.update(vocab=int(config["vocab_size"]), hidden=int(config["hidden_size"]))
                path.write_text(json.dumps(row))
        else:
            row = measure(name, setup)
            path.write_text(json.dumps(row))
        rows.append(row)
        print(line(row), flush=True)
    summarize(rows)


if __name__ == "__main__":
    main()
