"""Content and checks for the Learn page: the exercises and how an answer is graded.

The text is ours; every number shown next to it comes from `vram.estimate`.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ui import params
from ui.charts import BUCKET_LABELS, format_bytes
from vram.result import BucketName, Estimate
from vram.step.through_step import through_step
from vram.step.what_if import PRESETS, WhatIf, ratios_text, what_if
from vram.units import GB


@dataclass(frozen=True)
class Exercise:
    """A setup (overrides of the default state), a question, and which figure answers it."""

    key: str
    question: str
    state: dict[str, Any] = field(default_factory=dict)
    #: What the answer is: "peak" (device peak per GPU), a bucket name (at the peak),
    #: "most:<bucket>" (the most that bucket holds at any moment of the step), or
    #: "item:<line item key>" (one line item, e.g. the allocator's slack or the loss).
    target: str = "peak"
    hint: str = ""
    #: For "the price of a lever": the answer is target(state) - target(baseline state).
    baseline: dict[str, Any] | None = None
    #: Other readings of the question that are right too: (state overrides, what the figure
    #: then is, why it differs from this run's), e.g. the weights in bf16 beside the fp32
    #: master weights that bf16 mixed precision keeps.
    also: tuple[tuple[dict[str, Any], str, str], ...] = ()


EXERCISES: tuple[Exercise, ...] = (
    Exercise(
        key="ex1",
        question=(
            "Full fine-tuning of the 8B model with AdamW in bf16 mixed precision: how many GB "
            "does the **optimizer state** take?"
        ),
        state={"method": "full", "opt": "adamw", "prec": "bf16-mixed"},
        target=BucketName.OPTIMIZER.value,
        hint="AdamW keeps two fp32 numbers per trained parameter.",
    ),
    Exercise(
        key="ex2",
        question="Same run: how many GB do the **weights** take?",
        state={"method": "full", "opt": "adamw", "prec": "bf16-mixed"},
        target=BucketName.WEIGHTS.value,
        hint="Which copies of the weights does this precision recipe keep?",
        # The seed's "16-bit weights (2 B)" read for 8B: 16 GB. Right for the weights in
        # bf16; this run (PyTorch AMP, as the Hugging Face Trainer runs bf16 mixed) keeps
        # them in fp32 and casts each layer to bf16 as it runs.
        also=(({"prec": "bf16-true"}, "the weights in bf16 (2 bytes each)",
               "Under bf16 mixed precision, as PyTorch's autocast runs it (the Hugging Face "
               "Trainer's bf16=True), the weights you train stay in fp32 (4 bytes each): "
               "they are the master copy, and the bf16 copies are made one layer at a time "
               "as the layer runs, so they are not kept as weights. That is why this run "
               "holds {answer}; in pure bf16 (no fp32 master) it would be {also}."),),
    ),
    Exercise(
        key="ex3",
        question=(
            "QLoRA of the 8B model, batch 1, 2,048 tokens: what is the **peak per GPU** in GB? "
            "Does it fit a 24 GB card?"
        ),
        state={"method": "qlora", "batch": 1, "seq": 2048},
        target="peak",
        hint="4-bit base (0.5 B/param plus constants), small adapters, and the logits.",
    ),
    Exercise(
        key="ex4",
        question=(
            "QLoRA of the 8B model at 16,384 tokens without gradient checkpointing: how many GB "
            "of **activations**?"
        ),
        state={"method": "qlora", "seq": 16384, "ckpt": False},
        target=BucketName.ACTIVATIONS.value,
        hint="Activations grow with batch × sequence; the logits with batch × sequence × vocab.",
    ),
    Exercise(
        key="ex5",
        question=(
            "Full fine-tuning of the 8B model (AdamW, bf16 mixed): at the peak the page shows "
            "gradients of 0 GB. How many GB do the **gradients** take at the optimizer step, "
            "when all of them exist?"
        ),
        state={"method": "full", "opt": "adamw", "prec": "bf16-mixed"},
        target="most:gradients",
        hint="One gradient per trained parameter, in the parameter's own dtype (fp32 here).",
    ),
    Exercise(
        key="ex6",
        question=(
            "Full fine-tuning of the 8B model: what is the **overhead** in GB (the CUDA context "
            "plus the allocator's cache, which nvidia-smi counts and PyTorch does not)?"
        ),
        state={"method": "full"},
        target=BucketName.OVERHEAD.value,
        hint="About 1 GB of context, plus slack that grows with the largest blocks.",
    ),
    Exercise(
        key="ex7",
        question=(
            "QLoRA of the 8B model, batch 1, 2,048 tokens: how many GB does **fragmentation** "
            "(the caching allocator's reserved but unused slack) add?"
        ),
        state={"method": "qlora"},
        target="item:overhead.allocator",
        hint="PyTorch reserves whole segments; what it reserves but does not use is slack.",
    ),
    Exercise(
        key="ex8",
        question=(
            "QLoRA of the 8B model at 8,192 tokens: how many GB do the **logits, the loss and "
            "their gradients** take? (Vocabulary 128,256, upcast to fp32 for the loss.)"
        ),
        state={"method": "qlora", "seq": 8192},
        target="item:activations.loss",
        hint="batch × sequence × vocabulary numbers, several copies, some in fp32.",
    ),
    Exercise(
        key="ex9",
        question=(
            "**The price of a lever.** QLoRA of the 8B model at 8,192 tokens: how many GB of "
            "peak memory does turning **gradient checkpointing** on save?"
        ),
        state={"method": "qlora", "seq": 8192, "ckpt": False},
        baseline={"method": "qlora", "seq": 8192, "ckpt": True},
        target="peak",
        hint="Checkpointing keeps one input per layer and recomputes the rest (about 30 % "
             "more compute).",
    ),
    Exercise(
        key="ex10",
        question=(
            "**The price of a lever.** Full fine-tuning of the 8B model: how many GB of "
            "**optimizer state** does 8-bit AdamW save against AdamW?"
        ),
        state={"method": "full", "opt": "adamw"},
        baseline={"method": "full", "opt": "adamw-8bit"},
        target=BucketName.OPTIMIZER.value,
        hint="Two states per parameter: 4 bytes each against about 1 byte each.",
    ),
)


def target_bytes(est: Estimate, target: str) -> int:
    """The figure an exercise asks for, in bytes (see `Exercise.target`)."""
    if target == "peak":
        return est.device_peak_bytes
    if target.startswith("most:"):
        name = BucketName(target.removeprefix("most:"))
        return next(r.most_bytes for r in through_step(est) if r.name is name)
    if target.startswith("item:"):
        key = target.removeprefix("item:")
        return sum(i.bytes for b in est.buckets for i in b.items if i.key == key)
    return est.bucket(target).bytes


def answer_bytes(ex: Exercise, est: Estimate, baseline: Estimate | None) -> int:
    """The right answer: the target, or for a lever what it saves against the baseline."""
    value = target_bytes(est, ex.target)
    return value if baseline is None else value - target_bytes(baseline, ex.target)


def target_label(target: str) -> str:
    if target == "peak":
        return "peak per GPU"
    if ":" in target:
        return target.split(":", 1)[1]
    return BUCKET_LABELS[BucketName(target)].lower()


def explanation(est: Estimate, target: str) -> str:
    """Where the right answer comes from: the bucket's line items, or the buckets of the peak."""
    if target.startswith("most:"):
        row = next(r for r in through_step(est)
                   if r.name is BucketName(target.removeprefix("most:")))
        return (f"At the peak: {format_bytes(row.at_peak_bytes, 'GB')}; at most: "
                f"{format_bytes(row.most_bytes, 'GB')}. {row.why}")
    if target.startswith("item:"):
        key = target.removeprefix("item:")
        found = [i for b in est.buckets for i in b.items if i.key == key]
        return "Where it comes from: " + "; ".join(
            f"{i.label}: `{i.formula}` = {i.bytes:,} bytes" for i in found)
    if target == "peak":
        parts = [
            f"{BUCKET_LABELS[b.name].lower()} {format_bytes(b.bytes, 'GB')}" for b in est.buckets
        ]
        return f"Where it comes from: {' + '.join(parts)}."
    items = est.bucket(target).items
    parts = [f"{i.label}: `{i.formula}` = {i.bytes:,} bytes" for i in items]
    return "Where it comes from: " + "; ".join(parts) if parts else "This bucket is empty here."


@dataclass(frozen=True)
class Grade:
    ok: bool
    message: str


def grade_also(answer_gb: float, actual_bytes: int, also_bytes: int, what: str, why: str,
               *, tolerance: float = 0.15) -> Grade | None:
    """A Grade when `answer_gb` is right for another reading of the question (`also_bytes`,
    `what`), with `why` this run's answer differs; None when it is not that either."""
    if also_bytes <= 0 or abs(answer_gb / (also_bytes / GB) - 1) > tolerance:
        return None
    return Grade(True, f"Right for {what}: {format_bytes(also_bytes, 'GB')}. "
                 + why.format(answer=format_bytes(actual_bytes, "GB"),
                              also=format_bytes(also_bytes, "GB")))


def check(ex: Exercise, answer_gb: float,
          run: Callable[[dict[str, Any]], Estimate | None]) -> tuple[Grade, Estimate] | None:
    """Grade an answer to `ex`: `run` estimates a state's overrides (None: cannot). Names the
    bucket a wrong peak's gap looks like, and accepts the exercise's other readings (`also`)
    with why this run's figure differs. None when the exercise's own run cannot be built."""
    est = run(ex.state)
    baseline = run(ex.baseline) if ex.baseline is not None else None
    if est is None or (ex.baseline is not None and baseline is None):
        return None
    actual = answer_bytes(ex, est, baseline)
    gap = gap_hint(answer_gb, est) if ex.target == "peak" and baseline is None else ""
    result = grade(answer_gb, actual, gap=gap)
    for state, what, why in ex.also if not result.ok else ():
        other = run({**ex.state, **state})
        if other is not None:
            result = grade_also(answer_gb, actual, target_bytes(other, ex.target), what,
                                why) or result
    return result, est


def gap_hint(answer_gb: float, est: Estimate, *, tolerance: float = 0.15) -> str:
    """For a wrong peak: the bucket the gap looks like ("" when none). Too low by about a
    bucket's size: that bucket was left out; too high by about what a bucket holds at another
    moment than the peak: it was counted at its most (gradients at the optimizer step,
    activations at the end of the forward pass), but the peak's moment holds less of it."""
    gap = est.device_peak_bytes - round(answer_gb * GB)
    if gap == 0:
        return ""
    candidates: list[tuple[int, str]] = []
    if gap > 0:
        candidates = [(b.bytes, f"the {BUCKET_LABELS[b.name].lower()} "
                                f"({format_bytes(b.bytes, 'GB')}): did you leave them out?")
                      for b in est.buckets if b.bytes > 0]
    else:
        candidates = [(r.most_bytes - r.at_peak_bytes,
                       f"what the {BUCKET_LABELS[r.name].lower()} add after the peak's moment "
                       f"({format_bytes(r.most_bytes - r.at_peak_bytes, 'GB')}): at the peak "
                       f"they hold {format_bytes(r.at_peak_bytes, 'GB')}, "
                       f"{format_bytes(r.most_bytes, 'GB')} only at {r.most_at}")
                      for r in through_step(est) if r.most_bytes > r.at_peak_bytes]
    near = [(abs(size - abs(gap)), text) for size, text in candidates
            if abs(size - abs(gap)) <= tolerance * abs(gap)]
    return f" The gap, {format_bytes(abs(gap), 'GB')}, is about {min(near)[1]}" if near else ""


def grade(answer_gb: float, actual_bytes: int, *, tolerance: float = 0.15,
          gap: str = "") -> Grade:
    """Within `tolerance` (relative) counts as right; otherwise say how far off and which way,
    and where the gap is (`gap`, from `gap_hint`), else a factor of 2 or 4 that suggests a
    data type."""
    actual_gb = actual_bytes / GB
    if actual_gb == 0:
        ok = abs(answer_gb) < 0.05
        return Grade(ok, "Right: nothing at all." if ok else "It is zero here.")
    ratio = answer_gb / actual_gb
    off = abs(ratio - 1)
    if off <= tolerance:
        return Grade(True, f"Right: the calculator says {actual_gb:.2f} GB ({off:.0%} off).")
    direction = "too high" if ratio > 1 else "too low"
    hint = gap  # a bucket the gap looks like says more than a factor would
    factors = [] if gap else [
        (2.0, "a factor of 2: 16-bit vs 32-bit, or one state vs two?"),
        (4.0, "a factor of 4: 4-bit vs 16-bit, or fp32 vs 8-bit?"),
    ]
    for factor, why in factors:
        for candidate in (factor, 1 / factor):
            if abs(ratio / candidate - 1) <= tolerance:
                hint = f" You are off by {why}"
    return Grade(
        False,
        f"Not quite: {answer_gb:.2f} GB is {direction}; the calculator says "
        f"{actual_gb:.2f} GB ({ratio:.2f}× the right answer).{hint}",
    )


LEVERS_MARKDOWN = """
| lever | shrinks | costs |
|---|---|---|
| LoRA (train small adapters) | gradients, optimizer state | a little quality on some tasks |
| QLoRA (4-bit frozen base) | weights, gradients, optimizer state | slower steps, a little quality |
| 8-bit or paged optimizer | optimizer state | tiny quality risk; paging can stall |
| SGD / Lion / Adafactor | optimizer state | tuning; convergence differs |
| pure bf16 (no fp32 master) | weights, optimizer state | precision of small updates |
| gradient checkpointing | activations | ~30% more compute (one extra forward) |
| smaller micro-batch + gradient accumulation | activations | more, smaller steps (slower) |
| shorter sequences / packing | activations | context the model sees |
| FlashAttention / SDPA | activations (no s×s scores) | nothing on supported GPUs |
| chunked / fused loss | activations (the logits) | nothing; needs stack support |
| ZeRO-1 / 2 / 3 (FSDP) | optimizer, + gradients, + weights per GPU | more GPUs, communication |
| CPU offload | optimizer (and weights) on the GPU | host RAM, slower steps (PCIe) |
"""

BELIEFS_MARKDOWN = """
- **"A 7B model needs 14 GB, so a 16 GB card can train it."** 14 GB is the bf16 weights alone.
  Full fine-tuning with AdamW adds gradients and two optimizer states per parameter: around
  four times that before a single activation.
- **"Memory is all about parameters."** At long sequences the activations, and the logits of a
  large vocabulary upcast to fp32 for the loss, can be bigger than the whole model.
- **"QLoRA makes everything 4× smaller."** Only the frozen linear weights are 4-bit. The
  embeddings, the head and the activations keep their size.
- **"Eight GPUs give eight times the memory."** Plain data parallelism (DDP) copies everything to
  every GPU; only ZeRO/FSDP sharding splits the model state, and never the activations.
- **"nvidia-smi and PyTorch should agree."** PyTorch counts live tensors; nvidia-smi adds the
  allocator's cache and the CUDA context, often one to several GB more.
"""


@dataclass(frozen=True)
class Seed:
    """A back-of-the-envelope figure a class starts from: parameters × bytes per parameter,
    with the recipe that gives that many bytes, and the calculator's run to compare with."""

    key: str
    title: str
    params_billions: float
    bytes_per_param: float
    recipe: str
    why: str
    #: The calculator's state for the same run (a link and the live comparison).
    state: dict[str, Any] = field(default_factory=dict)
    #: The seed's upper figure, where it is a range (QLoRA's constants).
    upper_bytes_per_param: float | None = None
    #: Where the calculator's run counts other bytes per parameter than the seed, why.
    calculator_note: str = ""


#: What every teaching preset (the seeds, Learn's three-way example) sets on top of the app's
#: defaults: gradient checkpointing on, as the recipes the seeds come from train (the QLoRA
#: reference script, artidoro/qlora qlora.py@00e5ad2: `gradient_checkpointing ... default=True`,
#: "You want to use this."). The calculator's own default stays off (vram.TrainingSetup); without
#: it 70B QLoRA at 2,048 tokens peaks near 200 GB of activations and no longer fits one 80 GB GPU.
TEACHING_STATE: dict[str, Any] = {"ckpt": True}

TEACHING_NOTE = ("Teaching presets turn **gradient checkpointing on**, as the QLoRA and LoRA "
                 "recipes do; the calculator starts with it off, so a plain link shows more "
                 "activations.")


SEEDS: tuple[Seed, ...] = (
    Seed("7b-full", "7B, full fine-tuning", 7, 16,
         "16 bytes per parameter: 16-bit weights (2) + 16-bit gradients (2) + an fp32 master "
         "copy of the weights (4) + AdamW's two fp32 moments (4 + 4).",
         "Mixed-precision AdamW before any activation: the rule of thumb behind '7B needs "
         "more than an 80 GB card to fully fine-tune'.",
         {"model": "llama-2-7b", "method": "full", "opt": "adamw", "prec": "bf16-mixed",
          **TEACHING_STATE},
         calculator_note=(
             "The calculator's bf16 mixed is PyTorch's autocast (the Hugging Face Trainer's "
             "bf16=True): the weights stay in fp32, the master copy itself (4 B), and each "
             "layer is cast to bf16 as it runs, so no 16-bit copy is kept; the gradients "
             "take the weights' fp32 (4 B). 4 + 4 + 8 for AdamW: the same 16 B per "
             "parameter, split as the run holds it. Its weights bucket is the fp32 copy: "
             "for 8B, 32 GB, not the 16 GB of the weights in bf16.")),
    Seed("70b-full-16", "70B, full, 16 B/param", 70, 16,
         "The same 16 bytes per parameter: 16-bit weights and gradients, an fp32 master copy, "
         "fp32 Adam moments.",
         "1,120 GB of model state alone: fourteen 80 GB GPUs before activations, so it is "
         "sharded (ZeRO-3/FSDP) across nodes.",
         {"model": "llama-3.1-70b", "method": "full", "opt": "adamw", "prec": "bf16-mixed",
          **TEACHING_STATE}),
    Seed("70b-full-12", "70B, full, 12 B/param", 70, 12,
         "12 bytes per parameter: 16-bit weights (2) and gradients (2) plus AdamW's two fp32 "
         "moments (8), with no fp32 master copy (bf16 weights, an optimizer with fp32 state).",
         "840 GB against 1,120 GB: the 280 GB between them is the fp32 master copy (4 bytes per "
         "parameter) that mixed precision keeps so small updates are not rounded away.",
         {"model": "llama-3.1-70b", "method": "full", "opt": "adamw", "prec": "bf16-true",
          **TEACHING_STATE},
         calculator_note=(
             "The calculator's pure bf16 keeps AdamW's two moments in bf16 too (PyTorch's "
             "AdamW makes each with `torch.zeros_like(param)`), so it counts 8 B per parameter, "
             "not 12: the 12 B recipe needs an optimizer that keeps fp32 moments beside bf16 "
             "weights.")),
    Seed("70b-lora", "70B, LoRA on a 16-bit base", 70, 2,
         "2 bytes per parameter: the frozen base in bf16; the adapters (well under 1 % of the "
         "parameters) carry the only gradients and optimizer state.",
         "About 140 GB of weights: two 80 GB GPUs, or one 141 GB H200, before activations.",
         {"model": "llama-3.1-70b", "method": "lora", "prec": "bf16-true", **TEACHING_STATE}),
    Seed("70b-qlora", "70B, QLoRA (4-bit base)", 70, 0.5,
         "0.5 bytes per parameter for the 4-bit (NF4) base, plus its quantization constants "
         "(one absmax per 64 weights: up to about 0.06 bytes per parameter): 35-40 GB.",
         "What real stacks add on top: the embeddings and the LM head stay unquantized in "
         "16 bits (about 4 GB for Llama 3.1 70B's 128k vocabulary), the activations and the "
         "logits, and with non-reentrant checkpointing bitsandbytes keeps each layer's input.",
         {"model": "llama-3.1-70b", "method": "qlora", **TEACHING_STATE},
         upper_bytes_per_param=0.5625),
)


def seed_link(reg: params.Registry, seed: Seed, *, present: bool = False) -> str:
    """The calculator's link for a seed's run: every setting of the seed spelled out in the
    app's own URL form (checkpointing on, even where a default agrees), and presentation mode
    kept when it is on.

    Relative to the Learn page (``./?...``), so it keeps the path the app is served under:
    from ``/vram/Learn`` it opens ``/vram/?...`` (an absolute ``/?...`` opened the proxy's
    root, "Not Found", under ``--server.baseUrlPath=/vram``, docs/app.md)."""
    by_key = {param.key: param for param in reg.params}
    query = {key: by_key[key].dump(value) for key, value in seed.state.items()}
    if present:
        query["present"] = "1"
    return "./?" + urllib.parse.urlencode(query)


def seed_range_bytes(seed: Seed) -> tuple[int, int]:
    """The seed's figure (low, high) in bytes: billions × 10^9 × bytes per parameter."""
    low = round(seed.params_billions * 1e9 * seed.bytes_per_param)
    upper = seed.upper_bytes_per_param or seed.bytes_per_param
    return low, round(seed.params_billions * 1e9 * upper)


def model_state_bytes(est: Estimate) -> int:
    """Weights + every gradient + optimizer state: what the seeds' bytes per parameter count
    (the most each holds through the step, so gradients are all there)."""
    wanted = {BucketName.WEIGHTS, BucketName.GRADIENTS, BucketName.OPTIMIZER}
    return sum(r.most_bytes for r in through_step(est) if r.name in wanted)


WHAT_IF_MARKDOWN = """
Every bucket above is bytes per value times values. The levers shrink the values (LoRA trains
fewer, sharding spreads them) or the bytes (8-bit states, 4-bit weights). A representation
that finds the pattern in the training state and stores the pattern instead, a low-rank
optimizer state, fewer bits per activation, stores the same values in fewer bytes, and the
same GPU holds a bigger run. The calculator's **What if a bucket were compressed?** asks what
that buys before anyone builds it: pick a bucket and how many times smaller it is stored (or a
published method), and it shows the new peak (it can move to another moment of the step), the
cheapest GPUs, and the largest batch, sequence and model that then fit one GPU.
"""

#: The Learn page's what-if example: 8B full with checkpointing, 8-bit optimizer states and
#: FP8 activations (two of the presets).
WHAT_IF_STATE: dict[str, Any] = {"method": "full", "opt": "adamw", "prec": "bf16-mixed",
                                 **TEACHING_STATE}
WHAT_IF_PRESETS = ("optimizer-8bit", "activations-fp8")


def what_if_example(est: Estimate) -> tuple[str, WhatIf]:
    """The example's `compress` text and what it gives (vram.step.what_if)."""
    chosen = {p.bucket: p.ratio_for(est) for p in PRESETS if p.key in WHAT_IF_PRESETS}
    return ratios_text(chosen), what_if(est, chosen)


def what_if_link(reg: params.Registry, compress: str) -> str:
    """The calculator with the example and its panel open (relative, like `seed_link`)."""
    by_key = {param.key: param for param in reg.params}
    query = {key: by_key[key].dump(value) for key, value in WHAT_IF_STATE.items()}
    return "./?" + urllib.parse.urlencode({**query, "whatif": "1", "compress": compress})
