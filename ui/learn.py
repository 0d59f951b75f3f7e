"""Content and checks for the Learn page: the exercises and how an answer is graded.

The text is ours; every number shown next to it comes from `vram.estimate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ui.charts import BUCKET_LABELS, format_bytes
from vram.result import BucketName, Estimate
from vram.units import GB


@dataclass(frozen=True)
class Exercise:
    """A setup (overrides of the default state), a question, and which figure answers it."""

    key: str
    question: str
    state: dict[str, Any] = field(default_factory=dict)
    #: A bucket name, or "peak" for the device peak per GPU.
    target: str = "peak"
    hint: str = ""


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
)


def target_bytes(est: Estimate, target: str) -> int:
    return est.device_peak_bytes if target == "peak" else est.bucket(target).bytes


def target_label(target: str) -> str:
    return "peak per GPU" if target == "peak" else BUCKET_LABELS[BucketName(target)].lower()


def explanation(est: Estimate, target: str) -> str:
    """Where the right answer comes from: the bucket's line items, or the buckets of the peak."""
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


def grade(answer_gb: float, actual_bytes: int, *, tolerance: float = 0.15) -> Grade:
    """Within `tolerance` (relative) counts as right; otherwise say how far off and which way."""
    actual_gb = actual_bytes / GB
    if actual_gb == 0:
        ok = abs(answer_gb) < 0.05
        return Grade(ok, "Right: nothing at all." if ok else "It is zero here.")
    ratio = answer_gb / actual_gb
    off = abs(ratio - 1)
    if off <= tolerance:
        return Grade(True, f"Right: the calculator says {actual_gb:.2f} GB ({off:.0%} off).")
    direction = "too high" if ratio > 1 else "too low"
    hint = ""
    for factor, why in (
        (2.0, "a factor of 2: 16-bit vs 32-bit, or one state vs two?"),
        (4.0, "a factor of 4: 4-bit vs 16-bit, or fp32 vs 8-bit?"),
    ):
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
