"""`plan()`: does the run fit my hardware, what is the most it can take, what to change so it
fits (and what each change costs), and what the whole run costs on every catalog option.

    >>> import vram
    >>> model = vram.load_model("llama-3.1-8b")
    >>> setup = vram.TrainingSetup(method="qlora", seq_len=4096, micro_batch=4)
    >>> p = vram.plan(model, setup, hardware=vram.Hardware(gpu="rtx-4090"), tokens=1e9)
    >>> p.fits, p.path_summary, p.options[0].usd_per_run
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from vram.errors import InputError
from vram.gpus import Gpu, largest_count, load_gpus, setup_on
from vram.model.architecture import ModelSpec
from vram.plan.calibration import MfuTable, default_mfu_table
from vram.plan.hardware import Estimator, Hardware, find_gpu
from vram.plan.levers import (
    LEVERS,
    MORE_GPUS,
    TIER_PENALTY,
    LeverSpec,
    applied,
    costs_memory,
    describe_change,
)
from vram.plan.solve import Proof, fewest_gpus, max_micro_batch, max_seq_len
from vram.plan.throughput import Workload, gpu_class, offloaded_activations, seconds_per_token
from vram.setup import Method, TrainingSetup
from vram.setup.layout import gpu_step
from vram.step.bounds import FitVerdict, Verdict

#: Used for time ratios only, on a GPU whose catalog row has no FLOP/s figure.
NOMINAL_TFLOPS = 100.0
GB = 1e9

NonNegativeInt = Annotated[int, Field(ge=0)]


class Lever(BaseModel):
    """One lever applied to the setup on the target hardware."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    setup_change: str
    saved_bytes: int
    device_peak_bytes: NonNegativeInt
    #: The band's high bound after the lever; `fits` when it is within the memory.
    device_high_bytes: NonNegativeInt
    fits: bool
    time_factor: float
    cost_factor: float
    quality_tier: int
    quality_note: str


class PathStep(BaseModel):
    """One step of the path: the lever added to the steps before it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    setup_change: str
    saved_bytes: int
    time_factor: float
    device_peak_bytes: NonNegativeInt
    device_high_bytes: NonNegativeInt
    headroom_bytes: int
    quality_note: str


class RunOption(BaseModel):
    """The fewest GPUs of one type that hold the run, and what the run costs on them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    name: str
    count: NonNegativeInt
    fits: bool
    device_peak_bytes: NonNegativeInt | None
    usable_bytes: NonNegativeInt
    proof: Proof
    tokens_per_second: float | None
    hours: float | None
    usd_per_hour: float | None
    usd_per_run: float | None
    usd_per_million_tokens: float | None


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str
    setup: TrainingSetup
    hardware: Hardware
    hardware_given: bool
    run_setup: TrainingSetup
    #: A sure fit: the band's high bound is within the memory (`verdict` says more).
    fits: bool
    verdict: Verdict
    #: The chance the run fits as set up, read from the band.
    fit_probability: float
    device_peak_bytes: NonNegativeInt
    device_low_bytes: NonNegativeInt
    device_high_bytes: NonNegativeInt
    #: The share of runs the band is calibrated to cover.
    bounds_rate: float
    usable_bytes: NonNegativeInt
    headroom_bytes: int
    max_micro_batch: Proof
    max_seq_len: Proof
    #: The levers that save memory on this run, most saved first.
    levers: tuple[Lever, ...]
    #: Levers that hold as much memory or more here (their `saved_bytes` <= 0): what they
    #: would cost, never listed as savings (vram.plan.levers.costs_memory).
    costly_levers: tuple[Lever, ...]
    path: tuple[PathStep, ...]
    path_fits: bool
    path_setup: TrainingSetup
    path_summary: str
    #: How the time was had: the GPU's kind and figures, and the MFU's source (`MfuTable`).
    speed_basis: str
    tokens: float | None
    tokens_per_second: float | None
    hours: float | None
    usd_per_run: float | None
    usd_per_million_tokens: float | None
    options: tuple[RunOption, ...]
    estimates: NonNegativeInt

    @property
    def shortfall_bytes(self) -> int:
        return max(0, -self.headroom_bytes)

    @property
    def verdict_text(self) -> str:
        """'fits', 'borderline, 72 % likely to fit' or 'does not fit'."""
        return FitVerdict(self.verdict, self.fit_probability).text()

    @property
    def cheapest_run(self) -> RunOption | None:
        """The option whose whole run (`tokens`) costs least: the plan's ranking, by the
        run's price; `vram.fit` ranks by the price per hour (`FitReport.cheapest_per_hour`)."""
        return next((o for o in self.options if o.fits), None)


class _Clock:
    """Wall time of runs on one GPU type: hours for `tokens`, from the throughput model."""

    def __init__(self, model: ModelSpec, est: Estimator, gpu: Gpu, table: MfuTable) -> None:
        self.model, self.est, self.gpu, self.table = model, est, gpu, table
        self.timed = gpu if gpu.bf16_dense_tflops else gpu.model_copy(
            update={"bf16_dense_tflops": NOMINAL_TFLOPS})

    def seconds_per_token(self, setup: TrainingSetup) -> float:
        """Wall seconds per token of the whole run (all GPUs together)."""
        result = self.est(setup)
        work = Workload(model=self.model, setup=setup, gpu=self.timed,
                        trainable_params=result.params.trainable,
                        offloaded_activation_bytes=offloaded_activations(setup, result))
        per_gpu = seconds_per_token(work, self.table.mfu(setup.method, gpu_class(self.gpu)))
        assert per_gpu is not None
        return per_gpu / setup.n_gpus

    def ratio(self, after: TrainingSetup, before: TrainingSetup) -> float:
        return self.seconds_per_token(after) / self.seconds_per_token(before)


def _gb(n_bytes: int) -> str:
    return f"{n_bytes / GB:.1f} GB"


def _pct(factor: float) -> str:
    return f"{(factor - 1) * 100:+.0f} % time"


def _levers(est: Estimator, clock: _Clock, setup: TrainingSetup, usable: int) -> list[Lever]:
    """Every applicable lever on `setup`, by memory saved (largest first)."""
    base = est.peak(setup)
    found: list[Lever] = []
    candidates: list[tuple[LeverSpec, TrainingSetup]] = []
    for spec in LEVERS:
        change = spec.change(setup)
        changed = applied(setup, change) if change is not None else None
        if changed is not None and changed != setup:
            candidates.append((spec, changed))
    if setup.n_gpus * 2 <= largest_count(clock.gpu):
        candidates.append((MORE_GPUS, setup_on(setup, setup.n_gpus * 2)))
    for spec, changed in candidates:
        peak, high = est.peak(changed), est.high(changed)
        time = clock.ratio(changed, setup)
        cost = time * changed.n_gpus / setup.n_gpus  # GPU-hours scale with the count
        found.append(Lever(
            name=spec.name, setup_change=describe_change(setup, changed),
            saved_bytes=base - peak, device_peak_bytes=peak, device_high_bytes=high,
            fits=high <= usable,
            time_factor=round(time, 4), cost_factor=round(cost, 4),
            quality_tier=spec.quality_tier, quality_note=spec.quality_note))
    found.sort(key=lambda lever: -lever.saved_bytes)
    return found


def _score(lever: Lever) -> float:
    """Memory saved per unit of cost (time, plus a penalty for the quality tier)."""
    cost = max(lever.time_factor - 1.0, 0.0) + TIER_PENALTY[lever.quality_tier]
    return lever.saved_bytes / max(cost, 0.005)


def _path(est: Estimator, clock: _Clock, setup: TrainingSetup, usable: int,
          levers: Sequence[Lever]) -> tuple[list[PathStep], TrainingSetup]:
    """Greedy by memory saved per cost, each step verified on the combined setup, until the
    band's high bound fits; then every step the fitting path can do without is dropped (each
    removal verified too)."""
    if est.high(setup) <= usable:
        return [], setup
    by_name = {spec.name: spec for spec in LEVERS}
    order = [by_name[lever.name] for lever in sorted(levers, key=_score, reverse=True)
             if lever.saved_bytes > 0 and lever.name in by_name and lever.quality_tier < 3]
    chosen: list[LeverSpec] = []
    current = setup
    for spec in order:
        if any(c.knob == spec.knob for c in chosen):
            continue
        change = spec.change(current)
        changed = applied(current, change) if change is not None else None
        if changed is None or est.peak(changed) >= est.peak(current):
            continue
        chosen.append(spec)
        current = changed
        if est.high(current) <= usable:
            break
    if est.high(current) <= usable:
        for spec in list(reversed(chosen[:-1])):
            rest = [c for c in chosen if c is not spec]
            trial = _apply_all(setup, rest)
            if trial is not None and est.high(trial) <= usable:
                chosen = rest
        current = _apply_all(setup, chosen) or current
    steps: list[PathStep] = []
    before = setup
    for spec in chosen:
        change = spec.change(before)
        after = applied(before, change) if change is not None else None
        if after is None:
            break
        peak = est.peak(after)
        steps.append(PathStep(
            name=spec.name, setup_change=describe_change(before, after),
            saved_bytes=est.peak(before) - peak, time_factor=round(clock.ratio(after, before), 4),
            device_peak_bytes=peak, device_high_bytes=est.high(after),
            headroom_bytes=usable - peak, quality_note=spec.quality_note))
        before = after
    return steps, before


def _apply_all(setup: TrainingSetup, specs: Sequence[LeverSpec]) -> TrainingSetup | None:
    current: TrainingSetup | None = setup
    for spec in specs:
        if current is None:
            return None
        change = spec.change(current)
        current = applied(current, change) if change is not None else None
    return current


def _short(verdict: FitVerdict, headroom: int) -> str:
    """Why a setup is not a sure fit: borderline with its chance, or how far short."""
    if verdict.verdict is Verdict.BORDERLINE:
        return verdict.text()
    return f"short by {_gb(-headroom)}"


def path_summary(steps: Sequence[PathStep], verdict: FitVerdict, usable: int, peak: int,
                 last: FitVerdict | None = None) -> str:
    """'+activation checkpointing (-41.0 GB, +30 % time), then 8-bit AdamW (...): fits, ...'
    `verdict` is the setup's as it is, `last` the path's end's."""
    if verdict.fits:
        return f"fits as it is: {_gb(usable - peak)} headroom"
    if not steps:
        return f"no lever makes it surely fit: {_short(verdict, usable - peak)}"
    parts = [f"{'+' if i == 0 else 'then '}{s.name} (-{_gb(s.saved_bytes)}, "
             f"{_pct(s.time_factor)})" for i, s in enumerate(steps)]
    end = steps[-1]
    if end.device_high_bytes <= usable:
        ending = f"fits, {_gb(end.headroom_bytes)} headroom"
    else:
        ending = "still " + _short(last or verdict, end.headroom_bytes)
    return ", ".join(parts) + f": {ending}"


def _options(model: ModelSpec, est: Estimator, setup: TrainingSetup, gpus: Sequence[Gpu],
             table: MfuTable, tokens: float | None) -> list[RunOption]:
    """Each GPU type at its fewest count that holds the run, cheapest whole run first."""
    options: list[RunOption] = []
    for gpu in gpus:
        limit = largest_count(gpu)
        proof = fewest_gpus(est, setup, gpu.memory_bytes, limit)
        count = proof.value
        fits = count > 0
        run = setup_on(setup, count if fits else limit)
        rate: float | None = None
        if fits and gpu.bf16_dense_tflops:
            rate = 1.0 / _Clock(model, est, gpu, table).seconds_per_token(run)
        hours = tokens / rate / 3600 if rate and tokens else None
        price = gpu.usd_per_hour * count if gpu.usd_per_hour and fits else None
        per_million = price / 3600 / rate * 1e6 if price and rate else None
        options.append(RunOption(
            gpu=gpu.id, name=gpu.name, count=count, fits=fits,
            device_peak_bytes=proof.value_peak_bytes if fits else proof.past_peak_bytes,
            usable_bytes=gpu.memory_bytes, proof=proof, tokens_per_second=rate, hours=hours,
            usd_per_hour=price, usd_per_run=price * hours if price and hours else None,
            usd_per_million_tokens=per_million))
    options.sort(key=lambda o: (not o.fits, o.usd_per_million_tokens is None,
                                o.usd_per_million_tokens or 0.0, o.hours or 0.0, o.count))
    return options


#: The most tokens a plan prices (the CLI's --tokens bound): 10 quadrillion.
MAX_TOKENS = 1e16


def checked_tokens(tokens: float | None) -> float | None:
    """`tokens` as a float, or InputError naming it: a finite number above 0, at most 1e16."""
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, numbers.Real):
        raise InputError("tokens", f"a number of tokens to train, not {type(tokens).__name__}")
    value = float(tokens)
    if not (math.isfinite(value) and 0 < value <= MAX_TOKENS):
        raise InputError("tokens", f"{tokens!r}: a finite number above 0 and at most "
                         f"{MAX_TOKENS:.0e} (or None: no time and cost)")
    return value


def speed_basis(gpu: Gpu, method: Method, table: MfuTable) -> str:
    """What the plan's time rests on: the GPU's own rate and kind from its list, and where its
    kind's MFU comes from; a GPU no measured run used says so (a team's own ids)."""
    if not gpu.bf16_dense_tflops:
        return f"{gpu.id}: no bf16_dense_tflops in the GPU list, so no time or cost"
    cls = gpu_class(gpu)
    measured = ("a measured GPU" if gpu.id in table.measured_gpus
                else "not among the measured GPUs: timed by its kind")
    return (f"{gpu.id}: {gpu.bf16_dense_tflops:g} TFLOP/s dense bf16 from the GPU list, "
            f"{cls.value} class, {measured}; {table.basis(method, cls)}")


def plan(model: ModelSpec, setup: TrainingSetup, *, hardware: Hardware | None = None,
         tokens: float | None = None, gpus: Sequence[Gpu] | None = None,
         mfu: MfuTable | None = None) -> Plan:
    """Plan `setup` on `hardware` (default: the cheapest catalog option that holds it, else
    the GPU with the most memory): verdict, largest batch and sequence, levers, the path
    that fits, and time and cost for `tokens` on every catalog option."""
    tokens = checked_tokens(tokens)
    catalog = tuple(gpus) if gpus is not None else load_gpus()
    table = mfu if mfu is not None else default_mfu_table()
    est = Estimator(model)
    options = _options(model, est, setup, catalog, table, tokens)
    step = gpu_step(setup)
    if hardware is None:
        best = next((o for o in options if o.fits), None)
        if best is not None:
            hardware = Hardware(gpu=best.gpu, count=best.count)
        else:
            largest = max(catalog, key=lambda g: g.memory_bytes)
            if step > 64:
                raise InputError("setup", f"a layout over {step} GPUs (tp × pp × lcm(cp, ep)); "
                                 "a plan's hardware is at most 64 per node")
            hardware = Hardware(gpu=largest.id, count=min(setup.n_gpus, 64 // step * step))
        given = False
    else:
        given = True
        if hardware.total % step:
            raise InputError("hardware", f"{hardware.total} GPUs: the parallel layout runs on "
                             f"multiples of {step} (tp × pp × lcm(cp, ep))")
    gpu = find_gpu(hardware.gpu, catalog)
    run_setup = setup_on(setup, hardware.total)
    usable = gpu.memory_bytes
    band = est.band(run_setup)
    peak = band.point
    judged = band.judged(usable)
    clock = _Clock(model, est, gpu, table)
    every = _levers(est, clock, run_setup, usable)
    levers = [lever for lever in every if not costs_memory(lever.saved_bytes)]
    steps, path_setup = _path(est, clock, run_setup, usable, levers)
    fits = judged.fits
    final = path_setup if (fits or steps) else run_setup
    rate: float | None = None
    if gpu.bf16_dense_tflops and est.high(final) <= usable:
        rate = 1.0 / clock.seconds_per_token(final)
    price = gpu.usd_per_hour * hardware.total if gpu.usd_per_hour else None
    hours = tokens / rate / 3600 if rate and tokens else None
    return Plan(
        speed_basis=speed_basis(gpu, final.method, table),
        model_name=model.name, setup=setup, hardware=hardware, hardware_given=given,
        run_setup=run_setup, fits=fits, verdict=judged.verdict,
        fit_probability=judged.probability, device_peak_bytes=peak, device_low_bytes=band.low,
        device_high_bytes=band.high, bounds_rate=band.rate, usable_bytes=usable,
        headroom_bytes=usable - peak,
        max_micro_batch=max_micro_batch(est, run_setup, usable),
        max_seq_len=max_seq_len(est, run_setup, usable),
        levers=tuple(levers),
        costly_levers=tuple(lever for lever in every if costs_memory(lever.saved_bytes)),
        path=tuple(steps),
        path_fits=est.high(path_setup) <= usable, path_setup=path_setup,
        path_summary=path_summary(steps, judged, usable, peak,
                                  est.band(path_setup).judged(usable)),
        tokens=tokens, tokens_per_second=rate, hours=hours,
        usd_per_run=price * hours if price and hours else None,
        usd_per_million_tokens=price / 3600 / rate * 1e6 if price and rate else None,
        options=tuple(options), estimates=est.calls,
    )
