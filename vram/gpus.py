"""The GPU catalog (`data/gpus.csv`, or a team's own list) and the cheapest setup that holds a run.

Memory is stored as the driver reports it (nvidia-smi's total, in bytes), because that is the
capacity an out-of-memory error is measured against. A team points the app and the CLI at its
own list and prices with the environment variable `VRAM_GPUS_CSV`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vram.errors import CatalogError, FileReadError
from vram.files import read_csv_rows
from vram.io.knobs import MAX_NUMBER_CHARS
from vram.memo import memoized
from vram.memory.overhead import cuda_context_bytes
from vram.model.architecture import ModelSpec
from vram.paths import data_dir
from vram.result import BucketName
from vram.setup import MAX_CONTEXT_MIB, Offload, Precision, Sharding, TrainingSetup
from vram.setup.layout import gpu_step
from vram.step.bounds import DeviceBand, Verdict
from vram.step.estimate import estimate, estimate_peaks
from vram.units import MIB, ceil_div

GPUS_ENV = "VRAM_GPUS_CSV"
MAX_GPU_ROWS = 10_000
#: More memory than any GPU will have (1 PiB): the bound of `memory_bytes`.
MAX_MEMORY_BYTES = 2**50
_REQUIRED_COLUMNS = ("id", "name", "segment", "memory_bytes")
#: Data-parallel sizes tried for multi-GPU setups, up to 8 nodes of `max_per_node`.
GPU_COUNTS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
MAX_NODES = 8


class Gpu(BaseModel):
    #: inf and nan are refused in every float field (a rate or price of `1e99999` is inf).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    id: Annotated[str, Field(min_length=1, max_length=64)]
    name: Annotated[str, Field(min_length=1, max_length=128)]
    vendor: str
    segment: Literal["consumer", "workstation", "datacenter"]
    memory_bytes: Annotated[int, Field(gt=0, lt=MAX_MEMORY_BYTES)]
    memory_source: str = ""
    bf16_dense_tflops: Annotated[float, Field(gt=0)] | None = None
    #: Whether the GPU computes in bf16: False where a list has the bf16 column and leaves it
    #: empty (data/gpus.csv: T4, V100); None where a team's list has no such column (unknown,
    #: taken as able).
    bf16: bool | None = None
    memory_bandwidth_gbps: Annotated[float, Field(gt=0)] | None = None
    usd_per_hour: Annotated[float, Field(gt=0, lt=10_000)] | None = None
    price_source: str = ""
    max_per_node: Annotated[int, Field(ge=1, le=64)] = 8
    #: The CUDA context as nvidia-smi counts it on this GPU, where measured (GPUS_SOURCES.md);
    #: None: unknown, the estimate's constant (1 GiB) is used.
    cuda_context_mib: Annotated[int, Field(ge=0, le=MAX_CONTEXT_MIB)] | None = None

    @property
    def cuda_context_bytes(self) -> int:
        """The context a run on this GPU holds beside its tensors (nvidia-smi)."""
        if self.cuda_context_mib is None:
            return cuda_context_bytes()
        return self.cuda_context_mib * MIB


def _number(row: dict[str, str], key: str) -> float | None:
    """A float column: empty is None; text that is not a finite number names the column."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
            value = float(text) if len(text) <= MAX_NUMBER_CHARS else None
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        raise ValueError(f"column {key}: {text[:40]!r} is not a finite number")
    return value


def _integer(row: dict[str, str], key: str, default: int | None = None) -> int | None:
    """An integer column (empty: `default`); anything else names the column."""
    text = (row.get(key) or "").strip()
    if not text:
        return default
    if len(text) > MAX_NUMBER_CHARS or not text.lstrip("+-").isdigit():
        raise ValueError(f"column {key}: {text[:40]!r} is not a whole number")
    return int(text)


def _row_to_gpu(row: dict[str, str]) -> Gpu:
    tflops = _number(row, "bf16_dense_tflops")
    return Gpu(
        id=row["id"].strip(), name=row["name"].strip(), vendor=(row.get("vendor") or "").strip(),
        segment=row["segment"].strip(),
        memory_bytes=_integer(row, "memory_bytes", 0),  # 0 is refused by the field's range
        memory_source=row.get("memory_source") or "",
        bf16_dense_tflops=tflops,
        bf16=(tflops is not None) if "bf16_dense_tflops" in row else None,
        memory_bandwidth_gbps=_number(row, "memory_bandwidth_gbps"),
        usd_per_hour=_number(row, "usd_per_hour"), price_source=row.get("price_source") or "",
        max_per_node=_integer(row, "max_per_node", 8),
        cuda_context_mib=_integer(row, "cuda_context_mib"),
    )


def shipped_gpus_path() -> Path:
    """The catalog that ships with vram (`data/gpus.csv`), whatever `VRAM_GPUS_CSV` says."""
    return data_dir() / "gpus.csv"


def default_gpus_path() -> Path:
    override = os.environ.get(GPUS_ENV)
    return Path(override) if override else shipped_gpus_path()


@lru_cache(maxsize=8)  # a few lists per process; each at most MAX_GPU_ROWS rows, 20 MB of text
def _load(path: str) -> tuple[Gpu, ...]:
    gpus: list[Gpu] = []
    seen: set[str] = set()
    try:  # a regular UTF-8 CSV of at most 20 MB with the needed columns (vram.files)
        rows = read_csv_rows(path, what="GPU list", required=_REQUIRED_COLUMNS)
    except FileReadError as exc:
        raise CatalogError(str(exc)) from None
    for line, row in rows:
        if len(gpus) >= MAX_GPU_ROWS:
            raise CatalogError(f"GPU list {path}: more than {MAX_GPU_ROWS} rows")
        try:
            gpu = _row_to_gpu(row)
        except (KeyError, ValueError, ValidationError, AttributeError, TypeError) as exc:
            first = str(exc).splitlines()
            detail = " ".join(first[:3])[:200]
            raise CatalogError(f"GPU list {Path(path).name} line {line}: {detail}") from None
        if gpu.id in seen:
            raise CatalogError(
                f"GPU list {Path(path).name} line {line}: duplicate id {gpu.id!r}")
        seen.add(gpu.id)
        gpus.append(gpu)
    if not gpus:
        raise CatalogError(f"GPU list {path}: no rows")
    return tuple(gpus)


def load_gpus(path: str | Path | None = None) -> tuple[Gpu, ...]:
    """The GPU catalog, validated row by row (an error names the row). Cached per path."""
    return _load(str(path if path is not None else default_gpus_path()))


class FitOption(BaseModel):
    """One way to run the setup: `count` GPUs of one kind, and the verdict of its band
    (`vram.step.bounds.judge`): it fits when the band's high bound is within the memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: Gpu
    count: int
    sharding: Sharding
    device_peak_bytes: int
    usable_bytes: int
    usd_per_hour: float | None
    #: The band of the device figure on this GPU (its own CUDA context applied).
    device_low_bytes: int
    device_high_bytes: int
    verdict: Verdict
    #: The chance the run fits, read from the band.
    fit_probability: float

    @property
    def headroom_bytes(self) -> int:
        """Memory left beside the estimate itself (the band's middle)."""
        return self.usable_bytes - self.device_peak_bytes

    @property
    def fits(self) -> bool:
        """A sure fit: the band's high bound is within the memory."""
        return self.verdict is Verdict.FITS

    @property
    def likely(self) -> bool:
        """At least even odds: the estimate itself is within the memory (a sure fit, or a
        borderline one at 50 % or more)."""
        return self.verdict is not Verdict.DOES_NOT_FIT and self.headroom_bytes >= 0

    @property
    def verdict_text(self) -> str:
        """'fits', 'borderline, 72 % likely to fit' or 'does not fit'."""
        if self.verdict is Verdict.BORDERLINE:
            return f"borderline, {self.fit_probability * 100:.0f} % likely to fit"
        return self.verdict.value


class FitReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: For each GPU the fewest that surely hold the run (the band's high bound fits),
    #: cheapest per hour first.
    fits: tuple[FitOption, ...]
    #: GPUs none of whose counts surely holds the run: their fewest, by shortfall.
    misses: tuple[FitOption, ...]
    #: GPUs that cannot run the setup's number format at all (bf16 on a T4 or V100), by size.
    unsupported: tuple[Gpu, ...] = ()
    #: For each GPU the fewest where the band straddles its memory and the estimate itself
    #: fits (50 % likely or more), when that is fewer than its sure fit (or it has none): may
    #: fit, with the chance; cheapest per hour first.
    borderline: tuple[FitOption, ...] = ()

    @property
    def cheapest_per_hour(self) -> FitOption | None:
        """The option with the lowest price per hour for all its GPUs: fit's ranking. The
        planner ranks by the price of the whole run (`Plan.cheapest_run`)."""
        return self.fits[0] if self.fits else None

    @property
    def cheapest(self) -> FitOption | None:
        """`cheapest_per_hour` (the name the README's examples use)."""
        return self.cheapest_per_hour


def largest_count(gpu: Gpu) -> int:
    """The most GPUs of this type the catalog search considers: a node, or 8 nodes of a
    datacenter GPU."""
    return gpu.max_per_node * (MAX_NODES if gpu.segment == "datacenter" else 1)


def setup_on(setup: TrainingSetup, count: int) -> TrainingSetup:
    """The same run on `count` GPUs: keep the user's sharding, or shard fully (ZeRO-3/FSDP)."""
    if count == setup.n_gpus:
        return setup
    if count // (setup.tp * setup.pp) == 1:  # one shard group: nothing to replicate or shard
        sharding = Sharding.NONE if setup.sharding is not Sharding.ZERO3 else Sharding.ZERO3
    else:
        sharding = setup.sharding if setup.sharding is not Sharding.NONE else Sharding.ZERO3
    # the setup's own rule (`TrainingSetup`): an offload the new sharding cannot run is dropped
    offload = setup.offload if setup.offload.runs_with(sharding) else Offload.NONE
    return setup.model_copy(update={"n_gpus": count, "sharding": sharding, "offload": offload})


def _counts(gpu: Gpu, setup: TrainingSetup) -> list[int]:
    """The GPU counts tried, fewest first: those the setup's parallel layout runs on (a
    multiple of `gpu_step`: tp=4 is not run on 2 GPUs), at least 2 for a multi-GPU setup."""
    largest = largest_count(gpu)
    step = gpu_step(setup)
    counts = [c for c in GPU_COUNTS if c <= largest and c % step == 0]
    if setup.n_gpus > 1:
        counts = [c for c in counts if c >= 2] or [max(2, step)]
    return counts


def context_difference(gpu: Gpu, setup: TrainingSetup) -> int:
    """The GPU's own CUDA context instead of the estimate's constant, unless the setup gives
    the context it measured (`context_mib`)."""
    if setup.context_mib is not None:
        return 0
    return gpu.cuda_context_bytes - cuda_context_bytes()


BF16_PRECISIONS = frozenset({Precision.BF16_MIXED, Precision.BF16_TRUE})


def runs_precision(gpu: Gpu, precision: Precision) -> bool:
    """Whether `gpu` computes in `precision`: bf16 needs bf16 hardware (NVIDIA Ampere and later;
    CUDA's bf16 kernels refuse Turing and Volta), which the catalog marks with a bf16 TFLOPS
    figure; data/gpus.csv leaves it empty for the T4 and V100. fp16 and fp32 run everywhere."""
    return precision not in BF16_PRECISIONS or gpu.bf16 is not False


def too_small(setup: TrainingSetup, device_peak_bytes: int, gpus: Sequence[Gpu]) -> tuple[Gpu, ...]:
    """GPUs that cannot hold this run as set up (its own GPU count), smallest first: the same
    comparison as the fit (the GPU's own CUDA context), so the chart's capacity lines and the
    'too small' list name the same cards."""
    return tuple(sorted(
        (g for g in gpus
         if device_peak_bytes + context_difference(g, setup) > g.memory_bytes),
        key=lambda g: g.memory_bytes,
    ))


def _device_band(model: ModelSpec, setup: TrainingSetup) -> DeviceBand:
    """The estimate's device peak and its band, remembered per model: fit() asks for the same
    few setups (one per GPU count) for every GPU of the catalog, and again on every call."""
    def band() -> DeviceBand:
        peaks = estimate_peaks(model, setup)
        return DeviceBand.of(peaks.device_peak_bytes, peaks.bounds)

    return memoized(model, ("device_band", setup), band)


def _device_peak(model: ModelSpec, setup: TrainingSetup) -> int:
    return _device_band(model, setup).point


def fit_option(gpu: Gpu, count: int, run: TrainingSetup, band: DeviceBand) -> FitOption:
    """`count` GPUs of `gpu` running `run`, whose band on that GPU is `band`."""
    judged = band.judged(gpu.memory_bytes)
    return FitOption(
        gpu=gpu, count=count, sharding=run.sharding, device_peak_bytes=band.point,
        usable_bytes=gpu.memory_bytes,
        usd_per_hour=gpu.usd_per_hour * count if gpu.usd_per_hour else None,
        device_low_bytes=band.low, device_high_bytes=band.high, verdict=judged.verdict,
        fit_probability=judged.probability)


def _by_price(option: FitOption) -> tuple[bool, float, int]:
    """Cheapest per hour first; an unpriced GPU last."""
    return option.usd_per_hour is None, option.usd_per_hour or 0.0, option.count


def fit(model: ModelSpec, setup: TrainingSetup, gpus: Sequence[Gpu] | None = None, *,
        device_peak: Callable[[ModelSpec, TrainingSetup], DeviceBand] | None = None,
        ) -> FitReport:
    """For each GPU, the fewest that surely hold the run (the band's high bound fits); fits
    cheapest per hour first (the price of all the GPUs an hour; the planner ranks by the
    whole run's price), misses by shortfall, and where fewer GPUs likely hold it (the band
    straddles their memory, the estimate within it), that count as borderline, with its
    chance.

    A GPU that cannot compute in the setup's precision (bf16 on a T4) is neither a fit nor a
    miss: it is listed in `unsupported`, where fp16 would run. `device_peak` replaces the
    estimate's device band of a (model, setup) (a what-if: vram.step.what_if).
    """
    band_of = device_peak or _device_band
    catalog = tuple(gpus) if gpus is not None else load_gpus()
    unsupported = tuple(sorted((g for g in catalog if not runs_precision(g, setup.precision)),
                               key=lambda g: g.memory_bytes))
    catalog = tuple(g for g in catalog if runs_precision(g, setup.precision))
    runs: dict[int, tuple[TrainingSetup, DeviceBand]] = {}
    fits: list[FitOption] = []
    misses: list[FitOption] = []
    borderline: list[FitOption] = []
    for gpu in catalog:
        best = first = straddles = None
        context = context_difference(gpu, setup)
        known = setup.context_mib is None and gpu.cuda_context_mib is not None
        for count in _counts(gpu, setup):
            if count not in runs:
                run = setup_on(setup, count)
                runs[count] = (run, band_of(model, run))
            run, band = runs[count]
            if first is not None and band.point + context > gpu.memory_bytes:
                continue  # neither the first option nor a likely fit: no need to build it
            option = fit_option(gpu, count, run, band.with_context(context, known))
            first = first or option
            if option.fits:
                best = option
                break
            if straddles is None and option.likely:
                straddles = option
        if best is not None:
            fits.append(best)
        elif first is not None:
            misses.append(first)
        if straddles is not None:
            borderline.append(straddles)
    fits.sort(key=_by_price)
    borderline.sort(key=_by_price)
    misses.sort(key=lambda o: o.headroom_bytes, reverse=True)
    return FitReport(fits=tuple(fits), misses=tuple(misses), unsupported=unsupported,
                     borderline=tuple(borderline))


# --------------------------------------------------------------------------------------------
# The lesson's question: how many GPUs of one class (80 GB), by capacity and by sharding
# --------------------------------------------------------------------------------------------

#: The class of GPU the lessons count in ("fits one 80 GB GPU"): nominal GiB. A GPU is of the
#: class when the memory its driver reports is within CLASS_TOLERANCE of it (A100 80GB reports
#: 81,920 MiB, H100 81,559 MiB: data/gpus.csv).
LESSON_CLASS_GIB = 80
CLASS_TOLERANCE = 0.03


def in_class(gpu: Gpu, class_gib: int = LESSON_CLASS_GIB) -> bool:
    """Whether `gpu` is one of the `class_gib` GB cards (80 GB: A100 80GB, H100 SXM/PCIe)."""
    nominal = class_gib * 2**30
    return abs(gpu.memory_bytes - nominal) <= CLASS_TOLERANCE * nominal


Reason = Literal["fits-one", "agree", "steps", "unsplit", "none"]


class ClassFit(BaseModel):
    """How many GPUs of one class a run needs, by capacity and as the fit shards it.

    Capacity divides the whole run (its peak on one GPU, nothing sharded) by one card's
    memory, as a lesson does ("840 GB / 80 GB: ~11 GPUs"). Sharding (ZeRO-3/FSDP) needs more:
    it splits the weights, gradients and optimizer state, but every GPU keeps its own
    activations and overhead, and the fit tries 1, 2, 4, 8, ... GPUs (`GPU_COUNTS`).
    `reason` says which of these makes the two counts differ:

    - ``fits-one``: one GPU of the class holds the run;
    - ``agree``: capacity and sharding give the same count;
    - ``steps``: the count tried before `needed` (`below_count`) is under the capacity count;
    - ``unsplit``: `below_count` GPUs were enough by capacity but each also holds what
      sharding does not split (`below_unsplit_bytes`), so the next count was needed;
    - ``none``: no count in the list holds it (`below_*`: the largest count tried).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    class_gib: int
    #: The fewest GPUs of the class that likely hold the run (the cheapest of those; its
    #: verdict says whether surely or borderline), or None.
    needed: FitOption | None
    whole_run_bytes: int
    class_memory_bytes: int
    capacity_count: int
    reason: Reason
    below_count: int | None = None
    #: Per GPU at `below_count`: the device peak, and what sharding does not split of it
    #: (activations and overhead).
    below_peak_bytes: int | None = None
    below_unsplit_bytes: int | None = None
    #: The GPU counts the fit tried, up to `needed` (all of them where none holds the run).
    counts_tried: tuple[int, ...] = ()

    @property
    def capacity_ratio(self) -> float:
        """The whole run over one card's memory (13.6 for 70B full on an 85.9 GB A100)."""
        return self.whole_run_bytes / self.class_memory_bytes


def fewest_in_class(report: FitReport, class_gib: int = LESSON_CLASS_GIB) -> FitOption | None:
    """The fewest GPUs of the class that likely hold the run in `report` (the estimate within
    their memory: a sure fit or a borderline one; the option says which), the cheapest of
    those."""
    fits = [o for o in (*report.fits, *report.borderline) if in_class(o.gpu, class_gib)]
    return min(fits, key=lambda o: o.count) if fits else None  # fits are cheapest first


def _whole_run(setup: TrainingSetup) -> TrainingSetup:
    """The run on one GPU with nothing sharded or offloaded: all of its memory in one place."""
    return setup.model_copy(update={"n_gpus": 1, "sharding": Sharding.NONE,
                                    "offload": Offload.NONE})


def class_fit(model: ModelSpec, setup: TrainingSetup, report: FitReport,
              gpus: Sequence[Gpu] | None = None, class_gib: int = LESSON_CLASS_GIB,
              ) -> ClassFit | None:
    """The lesson's count for `report` (from `fit`): fewest GPUs of the class beside the
    capacity count; None when the list has no GPU of the class that runs the precision."""
    catalog = tuple(gpus) if gpus is not None else load_gpus()
    members = [g for g in catalog if in_class(g, class_gib) and g not in report.unsupported]
    if not members:
        return None
    needed = fewest_in_class(report, class_gib)
    card = needed.gpu if needed else max(members, key=lambda g: g.memory_bytes)
    whole = _device_peak(model, _whole_run(setup)) + context_difference(card, setup)
    capacity = max(1, ceil_div(whole, card.memory_bytes))
    counts = _counts(card, setup)
    base = {"class_gib": class_gib, "needed": needed, "whole_run_bytes": whole,
            "class_memory_bytes": card.memory_bytes, "capacity_count": capacity,
            "counts_tried": tuple(c for c in counts if needed is None or c <= needed.count)}
    if needed is not None and needed.count == 1:
        return ClassFit(**base, reason="fits-one")
    if needed is not None and needed.count <= capacity:
        return ClassFit(**base, reason="agree")
    if needed is None:
        below: int | None = counts[-1]
    else:
        below = max((c for c in counts if c < needed.count), default=None)
        if below is None or below < capacity:
            return ClassFit(**base, reason="steps", below_count=below)
    assert below is not None
    run = estimate(model, setup_on(setup, below))
    context = context_difference(card, setup)
    unsplit = (run.bucket(BucketName.ACTIVATIONS).bytes + run.bucket(BucketName.OVERHEAD).bytes
               + context)
    return ClassFit(**base, reason="unsplit" if needed else "none", below_count=below,
                    below_peak_bytes=run.device_peak_bytes + context,
                    below_unsplit_bytes=unsplit)
