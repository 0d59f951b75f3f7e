"""What if a bucket were stored smaller? The peak and the cheapest fit with the weights,
gradients, optimizer state or activations stored RATIO times smaller.

A what-if, not a method: it asks what a representation that stores a bucket in fewer bytes
(fewer bits per value, low-rank states, a learned pattern) would buy, before anyone builds it.
The arithmetic, at every candidate moment of the step (`Estimate.moments`):

    held'(m) = held(m) - W(1 - 1/r_w) - O(1 - 1/r_o) - g(m)(1 - 1/r_g) - a(m)(1 - 1/r_a)

W and O (weights, optimizer state) live through the step; g(m) and a(m) are the gradients and
activations that moment holds. Each compressed part is rounded up to whole bytes. The new peak
is the largest moment, so compressing the activations can move the peak to the optimizer step.
What a moment holds beyond the four (FSDP2's in-flight buffers) is kept as it is, and so is
the CUDA context; the caching allocator's slack (reserved but unused: `device - allocated -
context`) keeps its share of what the peak holds, since it comes from the same blocks, now
smaller (a 28 GB slack beside 167 GB held keeps that share of the smaller peak).

The presets name published methods with their source and the cost in quality their authors
report; a preset that stores a bucket in B bits is a ratio of the bits the run uses now to B.

    python -m vram estimate --model llama-3.1-8b --method full --compress optimizer=4 --json
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from pydantic import BaseModel, ConfigDict

from vram.errors import VramError
from vram.gpus import FitReport, Gpu, fit
from vram.memory.optimizer import optimizer_spec
from vram.model.architecture import ModelSpec
from vram.result import BucketName, Estimate
from vram.setup import TrainingSetup
from vram.sharding.shards import shards_of
from vram.step.estimate import estimate

#: The buckets a what-if can shrink (the overhead is the CUDA context and allocator slack).
COMPRESSIBLE: tuple[BucketName, ...] = (BucketName.WEIGHTS, BucketName.GRADIENTS,
                                        BucketName.OPTIMIZER, BucketName.ACTIVATIONS)
MAX_RATIO = 1024

Ratios = Mapping[BucketName, Fraction]


class CompressError(VramError):
    """A compression that cannot be used: names the bucket or the ratio."""


def parse_ratio(text: str) -> Fraction:
    """"4", "2.5", "8/3": a ratio from 1 to 1024 (1 keeps the bucket as it is)."""
    try:
        ratio = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise CompressError(f"{text[:40]!r} is not a number") from None
    if not 1 <= ratio <= MAX_RATIO:
        raise CompressError(f"{text[:40]!r} must be from 1 to {MAX_RATIO} (times smaller)")
    return ratio


def parse_compress(text: str) -> tuple[BucketName, Fraction]:
    """One BUCKET=RATIO ("optimizer=4": the optimizer state stored 4 times smaller)."""
    bucket, sep, ratio = text.partition("=")
    names = ", ".join(b.value for b in COMPRESSIBLE)
    if not sep:
        raise CompressError(f"{text[:40]!r} is not BUCKET=RATIO (buckets: {names})")
    try:
        name = BucketName(bucket.strip().lower())
    except ValueError:
        name = None
    if name not in COMPRESSIBLE:
        raise CompressError(f"{bucket[:40]!r} is not one of: {names}")
    assert name is not None
    return name, parse_ratio(ratio)


def parse_ratios(texts: Sequence[str]) -> dict[BucketName, Fraction]:
    """Several BUCKET=RATIO (a later one for the same bucket wins); ratio 1 is left out."""
    ratios = dict(parse_compress(text) for text in texts)
    return {name: ratio for name, ratio in ratios.items() if ratio != 1}


def ratios_text(ratios: Ratios) -> str:
    """The CLI's and the URL's form: "optimizer=4,activations=2", in bucket order."""
    return ",".join(f"{name.value}={_number(ratios[name])}" for name in COMPRESSIBLE
                    if name in ratios and ratios[name] != 1)


def _number(ratio: Fraction) -> str:
    return str(ratio.numerator) if ratio.denominator == 1 else f"{float(ratio):g}"


def compressed(n_bytes: int, ratio: Fraction) -> int:
    """`n_bytes` stored `ratio` times smaller, rounded up to a whole byte."""
    return math.ceil(n_bytes * ratio.denominator / ratio.numerator)


class WhatIf(BaseModel):
    """The step with some buckets stored smaller: the buckets at its new peak (summing to
    `device_peak_bytes`), the moment of that peak, and the step as it is, to compare."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ratios: dict[str, float]
    buckets: dict[str, int]
    allocated_peak_bytes: int
    device_peak_bytes: int
    moment: str
    before_device_peak_bytes: int

    @property
    def saved_bytes(self) -> int:
        return self.before_device_peak_bytes - self.device_peak_bytes


def what_if(est: Estimate, ratios: Ratios) -> WhatIf:
    """`est` with the buckets in `ratios` stored that many times smaller (see the module)."""
    w, o = est.bucket(BucketName.WEIGHTS).bytes, est.bucket(BucketName.OPTIMIZER).bytes
    one = Fraction(1)
    w2 = compressed(w, ratios.get(BucketName.WEIGHTS, one))
    o2 = compressed(o, ratios.get(BucketName.OPTIMIZER, one))
    r_g = ratios.get(BucketName.GRADIENTS, one)
    r_a = ratios.get(BucketName.ACTIVATIONS, one)
    context = sum(i.bytes for i in est.bucket(BucketName.OVERHEAD).items
                  if i.key == "overhead.context")
    slack = est.device_peak_bytes - est.allocated_peak_bytes - context
    # (held after, label, gradients after, activations after, what else the moment holds)
    rows = [(w2 + o2 + compressed(m.gradient_bytes, r_g) + compressed(m.activation_bytes, r_a)
             + (rest := m.allocated_bytes - w - o - m.gradient_bytes - m.activation_bytes),
             m.label.value, compressed(m.gradient_bytes, r_g),
             compressed(m.activation_bytes, r_a),
             rest) for m in est.moments]
    if not rows:  # an estimate without its moments: the peak's buckets
        g, a = est.bucket(BucketName.GRADIENTS).bytes, est.bucket(BucketName.ACTIVATIONS).bytes
        rest = est.allocated_peak_bytes - w - o - g - a
        rows = [(w2 + o2 + compressed(g, r_g) + compressed(a, r_a) + rest, est.phase.value,
                 compressed(g, r_g), compressed(a, r_a), rest)]
    held, label, g2, a2, rest = max(rows, key=lambda row: row[0])
    overhead = context + allocator_slack(slack, held, est.allocated_peak_bytes)
    buckets = {BucketName.WEIGHTS.value: w2 + rest, BucketName.GRADIENTS.value: g2,
               BucketName.OPTIMIZER.value: o2, BucketName.ACTIVATIONS.value: a2,
               BucketName.OVERHEAD.value: overhead}
    return WhatIf(ratios={name.value: float(ratios[name]) for name in COMPRESSIBLE
                          if name in ratios},
                  buckets=buckets, allocated_peak_bytes=held,
                  device_peak_bytes=held + overhead, moment=label,
                  before_device_peak_bytes=est.device_peak_bytes)


def allocator_slack(slack_bytes: int, held_bytes: int, before_bytes: int) -> int:
    """The allocator's slack beside `held_bytes`: the share it had of `before_bytes` (the
    slack is the unused part of the blocks the step cycles through, which shrink with them),
    rounded up; never more than it was."""
    if before_bytes <= 0 or held_bytes >= before_bytes:
        return slack_bytes
    return math.ceil(slack_bytes * held_bytes / before_bytes)


def peak_with(ratios: Ratios) -> Callable[[ModelSpec, TrainingSetup], int]:
    """The device peak of a (model, setup) with `ratios` applied: what `fit` compares."""
    def peak(model: ModelSpec, setup: TrainingSetup) -> int:
        return what_if(estimate(model, setup), ratios).device_peak_bytes

    return peak


def what_if_fit(model: ModelSpec, setup: TrainingSetup, ratios: Ratios,
                gpus: Sequence[Gpu] | None = None) -> FitReport:
    """`vram.fit` with the buckets compressed: for each GPU the fewest that hold the run."""
    return fit(model, setup, gpus, device_peak=peak_with(ratios))


# --------------------------------------------------------------------------------------------
# Bits: what a bucket stores per value now, and presets named after published methods
# --------------------------------------------------------------------------------------------


def element_bits(est: Estimate, bucket: BucketName) -> float | None:
    """The bits per value a bucket holds now, about, where its values can be counted: weights
    per parameter, gradients per trained parameter (all of them, at the optimizer step),
    optimizer state per state value, each over the GPUs it is sharded across; None for the
    activations (a mix of shapes and dtypes) and for a bucket empty on the GPU (offloaded)."""
    shards = shards_of(est.setup)
    trainable = est.params.trainable
    if bucket is BucketName.WEIGHTS:
        values, n_bytes = est.params.total / shards.weights, est.bucket(bucket).bytes
    elif bucket is BucketName.GRADIENTS:
        values, n_bytes = trainable / shards.gradients, est.gradient_bytes_total
    elif bucket is BucketName.OPTIMIZER:
        states = optimizer_spec(est.setup.optimizer).states
        values, n_bytes = trainable * states / shards.optimizer, est.bucket(bucket).bytes
    else:
        return None
    if values <= 0 or n_bytes <= 0:
        return None
    return 8 * n_bytes / values


def ratio_for_bits(est: Estimate, bucket: BucketName, bits: float) -> Fraction:
    """The ratio that stores `bucket` in `bits` per value (1 when it holds no more now)."""
    now = element_bits(est, bucket)
    if now is None or now <= bits:
        return Fraction(1)
    return (Fraction(now).limit_denominator(10_000) / Fraction(str(bits))).limit_denominator(
        10_000)


@dataclass(frozen=True)
class Preset:
    """A published way to store a bucket smaller: bits per value (or a ratio), its paper and
    the cost in quality its authors report."""

    key: str
    name: str
    bucket: BucketName
    source: str
    quality: str
    bits: float | None = None
    ratio: Fraction | None = None

    def ratio_for(self, est: Estimate) -> Fraction:
        if self.bits is not None:
            return ratio_for_bits(est, self.bucket, self.bits)
        assert self.ratio is not None
        return self.ratio


PRESETS: tuple[Preset, ...] = (
    Preset("optimizer-8bit", "8-bit optimizer states", BucketName.OPTIMIZER,
           "Dettmers et al. 2022, 8-bit Optimizers via Block-wise Quantization, ICLR 2022, "
           "arXiv:2110.02861 (bitsandbytes)",
           "matched 32-bit Adam on 1.5B-parameter language modelling, GLUE fine-tuning, "
           "ImageNet, WMT'14 and RoBERTa pretraining, with the same hyperparameters "
           "(abstract)", bits=8.125),  # one fp32 absmax per 256 values: 8 + 32/256
    Preset("optimizer-4bit", "4-bit optimizer states", BucketName.OPTIMIZER,
           "Li, Chen and Zhu 2023, Memory Efficient Optimizers with 4-bit States, NeurIPS "
           "2023, arXiv:2309.01507",
           "accuracy comparable to full-precision AdamW on NLU, translation, image "
           "classification and instruction tuning (abstract)",
           bits=4.25),  # one fp32 scale per 128 values: 4 + 32/128
    Preset("optimizer-lowrank", "Low-rank optimizer states (GaLore)", BucketName.OPTIMIZER,
           "Zhao et al. 2024, GaLore: Memory-Efficient LLM Training by Gradient Low-Rank "
           "Projection, ICML 2024, arXiv:2403.03507; APOLLO (Zhu et al. 2025, MLSys, "
           "arXiv:2412.05270) goes further, to SGD-like memory",
           "up to 65.5 % less optimizer-state memory while keeping pretraining quality for "
           "LLaMA 1B and 7B on C4 and RoBERTa fine-tuning on GLUE (abstract)",
           ratio=Fraction(1000, 345)),  # 65.5 % less: stored at 34.5 %
    Preset("optimizer-adam-mini", "Adam-mini (one second moment per block)",
           BucketName.OPTIMIZER,
           "Zhang et al. 2024, Adam-mini: Use Fewer Learning Rates To Gain More, ICLR 2025, "
           "arXiv:2406.16793",
           "on par with or better than AdamW on pretraining and fine-tuning up to 8B, with "
           "about half of AdamW's optimizer memory (abstract)", ratio=Fraction(2)),
    Preset("activations-fp8", "FP8 activations", BucketName.ACTIVATIONS,
           "Xi et al. 2024, COAT: Compressing Optimizer States and Activation for "
           "Memory-Efficient FP8 Training, ICLR 2025, arXiv:2410.19313",
           "nearly lossless against BF16 training in their LLM pretraining and fine-tuning "
           "runs (abstract); 16-bit activations stored in 8 bits", ratio=Fraction(2)),
    Preset("weights-4bit", "4-bit weights (NF4)", BucketName.WEIGHTS,
           "Dettmers et al. 2023, QLoRA: Efficient Finetuning of Quantized LLMs, NeurIPS "
           "2023, arXiv:2305.14314",
           "a frozen NF4 base with LoRA matched 16-bit full and LoRA fine-tuning on their "
           "benchmarks (abstract); weights that are trained are another matter",
           bits=4.127),  # NF4 with double quantization: 4 + 0.127 bits per parameter
)
