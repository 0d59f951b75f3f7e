"""Reverse solvers: the largest micro-batch, the longest sequence, the fewest GPUs that fit.

Each searches on the estimate itself (galloping, then bisection) and keeps the invariant
"`low` fits, `high` does not", so the answer is proved by two estimates whatever the shape of
the curve: the one at the answer fits and the one just past it does not. A fit is a sure
one: the band's high bound (`vram.step.bounds`) is within the memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from vram.gpus import setup_on
from vram.plan.hardware import Estimator
from vram.setup import MAX_MICRO_BATCH, MAX_SEQ_LEN, TrainingSetup
from vram.setup.layout import gpu_step, seq_step

NonNegativeInt = Annotated[int, Field(ge=0)]


class Proof(BaseModel):
    """An answer and the two estimates that prove it.

    `value` fits (`value_high_bytes`, the compared figure, <= `usable_bytes`) and `past` does
    not. `value` is 0 when even the smallest does not fit (then `past` is that smallest);
    `past` is None when the search limit itself fits. `*_peak_bytes` are the estimates
    themselves, `*_high_bytes` their bands' high bounds (the same where no band is given).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: NonNegativeInt
    value_peak_bytes: NonNegativeInt | None
    past: int | None
    past_peak_bytes: NonNegativeInt | None
    usable_bytes: NonNegativeInt
    value_high_bytes: NonNegativeInt | None = None
    past_high_bytes: NonNegativeInt | None = None


def _proof(value: int, past: int | None, usable: int, peak_at: Callable[[int], int],
           point_at: Callable[[int], int]) -> Proof:
    """The proof of `value` (0: none) against `past` (None: none)."""
    return Proof(value=value, value_peak_bytes=point_at(value) if value else None,
                 value_high_bytes=peak_at(value) if value else None, past=past,
                 past_peak_bytes=point_at(past) if past is not None else None,
                 past_high_bytes=peak_at(past) if past is not None else None,
                 usable_bytes=usable)


def _narrow(peak_at: Callable[[int], int], usable: int, fit: int, miss: int,
            axis: Callable[[int], float]) -> tuple[int, int]:
    """Shrink a bracket (`fit` fits, `miss` does not; either order) to neighbours.

    Probes cycle: a secant through the two latest probes along `axis` (memory is close to
    linear in batch and sequence, and in 1/GPUs under sharding, so it lands near the answer),
    the neighbour of that probe, then a bisection, which bounds the search at three probes
    per halving."""
    step = 1 if miss > fit else -1
    # the two most recent points with their peaks: a secant through them
    recent = [(fit, peak_at(fit)), (miss, peak_at(miss))]
    last_fit = False
    turn = 0
    while abs(miss - fit) > 1:
        (x0, p0), (x1, p1) = recent[-2], recent[-1]
        if turn == 0 and p0 != p1 and axis(x0) != axis(x1):
            x = axis(x1) + (usable - p1) * (axis(x1) - axis(x0)) / (p1 - p0)
            guess = _nearest_value(x, fit, miss, axis)
        elif turn == 1:
            guess = x1 + step if last_fit else x1 - step
        else:
            guess = (fit + miss) // 2
        turn = (turn + 1) % 3
        lo, hi = min(fit, miss), max(fit, miss)
        probe = max(lo + 1, min(hi - 1, guess))
        peak = peak_at(probe)
        recent.append((probe, peak))
        last_fit = peak <= usable
        if last_fit:
            fit = probe
        else:
            miss = probe
    return fit, miss


def _nearest_value(x: float, fit: int, miss: int, axis: Callable[[int], float]) -> int:
    """The integer between the bracket's ends whose `axis` value is nearest x, on the
    fitting side (axis is monotone)."""
    lo, hi = min(fit, miss), max(fit, miss)
    while hi - lo > 1:  # bisection on the axis: no estimate, just arithmetic
        middle = (lo + hi) // 2
        if (axis(middle) - x) * (axis(hi) - axis(lo)) <= 0:
            lo = middle
        else:
            hi = middle
    return lo if miss > fit else hi


def _identity(value: int) -> float:
    return float(value)


def _inverse(value: int) -> float:
    return 1.0 / value


def largest_fitting(peak_at: Callable[[int], int], usable: int, start: int, limit: int,
                    point_at: Callable[[int], int] | None = None) -> Proof:
    """The largest v in [1, limit] with peak_at(v) <= usable, searched from `start`;
    `point_at` gives the estimate the proof shows beside it (default: `peak_at`)."""
    point = point_at or peak_at

    def fits(value: int) -> bool:
        return peak_at(value) <= usable

    start = max(1, min(start, limit))
    if fits(start):
        low, high = start, 0
        step = start
        while not high:
            candidate = min(limit, low + step)
            if candidate == low:
                return _proof(low, None, usable, peak_at, point)
            if fits(candidate):
                low, step = candidate, step * 2
            else:
                high = candidate
    else:
        if start == 1 or not fits(1):
            return _proof(0, 1, usable, peak_at, point)
        low, high = 1, start
    low, high = _narrow(peak_at, usable, low, high, _identity)
    return _proof(low, high, usable, peak_at, point)


def smallest_fitting(peak_at: Callable[[int], int], usable: int, limit: int,
                     point_at: Callable[[int], int] | None = None) -> Proof:
    """The smallest v in [1, limit] with peak_at(v) <= usable; `past` is v - 1 (or None at 1).
    value 0 means no v up to `limit` fits (`past` is then `limit`)."""
    point = point_at or peak_at
    if peak_at(1) <= usable:
        return _proof(1, None, usable, peak_at, point)
    if limit == 1 or peak_at(limit) > usable:
        return _proof(0, limit, usable, peak_at, point)
    high, low = _narrow(peak_at, usable, limit, 1, _inverse)
    return _proof(high, low, usable, peak_at, point)


def max_micro_batch(est: Estimator, setup: TrainingSetup, usable: int) -> Proof:
    """The largest micro-batch per GPU whose step surely fits in `usable` bytes."""
    def at(b: int) -> TrainingSetup:
        return setup.model_copy(update={"micro_batch": b})

    return largest_fitting(lambda b: est.high(at(b)), usable, setup.micro_batch,
                           MAX_MICRO_BATCH, lambda b: est.peak(at(b)))


def max_seq_len(est: Estimator, setup: TrainingSetup, usable: int) -> Proof:
    """The longest sequence (tokens) whose step surely fits in `usable` bytes; under context
    parallel only lengths cp splits evenly (`seq_step`, as `check_layout` requires), so the
    answer and the length past it are both runnable."""
    step = seq_step(setup)

    def at(k: int) -> TrainingSetup:
        return setup.model_copy(update={"seq_len": k * step})

    found = largest_fitting(lambda k: est.high(at(k)), usable, setup.seq_len // step,
                            MAX_SEQ_LEN // step, lambda k: est.peak(at(k)))
    return found.model_copy(update={"value": found.value * step,
                                    "past": found.past * step if found.past else found.past})


def fewest_gpus(est: Estimator, setup: TrainingSetup, usable: int, limit: int) -> Proof:
    """The fewest GPUs of `usable` bytes each that surely hold the run (ZeRO-3 when sharding
    is needed, as fit() does); exact, not only powers of two: every count the setup's parallel
    layout runs on (multiples of `gpu_step`; tp=4 is never priced on 2 GPUs)."""
    step = gpu_step(setup)
    found = smallest_fitting(lambda k: est.high(setup_on(setup, k * step)), usable,
                             max(1, limit // step), lambda k: est.peak(setup_on(setup, k * step)))
    return found.model_copy(update={"value": found.value * step,
                                    "past": found.past * step if found.past else found.past})
