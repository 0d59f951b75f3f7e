"""Reverse solvers: the largest micro-batch, the longest sequence, the fewest GPUs that fit.

Each searches on the estimate itself (galloping, then bisection) and keeps the invariant
"`low` fits, `high` does not", so the answer is proved by two estimates whatever the shape of
the curve: the one at the answer fits and the one just past it does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from vram.plan.hardware import Estimator, setup_on
from vram.setup import MAX_MICRO_BATCH, MAX_SEQ_LEN, TrainingSetup

NonNegativeInt = Annotated[int, Field(ge=0)]


class Proof(BaseModel):
    """An answer and the two estimates that prove it.

    `value` fits (`value_peak_bytes` <= `usable_bytes`) and `past` does not. `value` is 0
    when even the smallest does not fit (then `past` is that smallest); `past` is None when
    the search limit itself fits.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: NonNegativeInt
    value_peak_bytes: NonNegativeInt | None
    past: int | None
    past_peak_bytes: NonNegativeInt | None
    usable_bytes: NonNegativeInt


def _narrow(peak_at: Callable[[int], int], usable: int, low: int, high: int
            ) -> tuple[int, int]:
    """Shrink a bracket (`low` fits, `high` does not) until its ends are neighbours.

    Probes cycle: interpolation on the peak (memory grows almost linearly in batch and
    sequence, so it lands near the answer), the neighbour of that probe, then a bisection,
    which bounds the search at three probes per halving."""
    def fits(value: int) -> bool:
        return peak_at(value) <= usable

    last: int | None = None
    last_fit = False
    turn = 0
    while high - low > 1:
        if turn == 0:
            p_low, p_high = peak_at(low), peak_at(high)
            span = p_high - p_low
            guess = low + (usable - p_low) * (high - low) // span if span else (low + high) // 2
        elif turn == 1 and last is not None:
            guess = last + 1 if last_fit else last - 1
        else:
            guess = (low + high) // 2
        turn = (turn + 1) % 3
        probe = max(low + 1, min(high - 1, guess))
        last, last_fit = probe, fits(probe)
        if last_fit:
            low = probe
        else:
            high = probe
    return low, high


def largest_fitting(peak_at: Callable[[int], int], usable: int, start: int, limit: int
                    ) -> Proof:
    """The largest v in [1, limit] with peak_at(v) <= usable, found from `start`."""
    def fits(value: int) -> bool:
        return peak_at(value) <= usable

    start = max(1, min(start, limit))
    if fits(start):
        low, high = start, None
        step = start
        while high is None:
            candidate = min(limit, low + step)
            if candidate == low:
                return Proof(value=low, value_peak_bytes=peak_at(low), past=None,
                             past_peak_bytes=None, usable_bytes=usable)
            if fits(candidate):
                low, step = candidate, step * 2
            else:
                high = candidate
    else:
        high, low = start, 0
        while high > 1:
            candidate = high // 2
            if fits(candidate):
                low = candidate
                break
            high = candidate
        if low == 0:
            return Proof(value=0, value_peak_bytes=None, past=1, past_peak_bytes=peak_at(1),
                         usable_bytes=usable)
    low, high = _narrow(peak_at, usable, low, high)
    return Proof(value=low, value_peak_bytes=peak_at(low), past=high,
                 past_peak_bytes=peak_at(high), usable_bytes=usable)


def smallest_fitting(peak_at: Callable[[int], int], usable: int, limit: int) -> Proof:
    """The smallest v in [1, limit] with peak_at(v) <= usable; `past` is v - 1 (or None at 1).
    value 0 means no v up to `limit` fits (`past` is then `limit`)."""
    def fits(value: int) -> bool:
        return peak_at(value) <= usable

    if fits(1):
        return Proof(value=1, value_peak_bytes=peak_at(1), past=None, past_peak_bytes=None,
                     usable_bytes=usable)
    low, high = 1, 2  # low does not fit
    while not fits(min(high, limit)):
        if high >= limit:
            return Proof(value=0, value_peak_bytes=None, past=limit,
                         past_peak_bytes=peak_at(limit), usable_bytes=usable)
        low, high = high, high * 2
    high = min(high, limit)
    while high - low > 1:  # counts are few: plain bisection (`low` misses, `high` fits)
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle
    return Proof(value=high, value_peak_bytes=peak_at(high), past=low,
                 past_peak_bytes=peak_at(low), usable_bytes=usable)


def max_micro_batch(est: Estimator, setup: TrainingSetup, usable: int) -> Proof:
    """The largest micro-batch per GPU whose step fits in `usable` bytes."""
    return largest_fitting(
        lambda b: est.peak(setup.model_copy(update={"micro_batch": b})), usable,
        setup.micro_batch, MAX_MICRO_BATCH)


def max_seq_len(est: Estimator, setup: TrainingSetup, usable: int) -> Proof:
    """The longest sequence (tokens) whose step fits in `usable` bytes."""
    return largest_fitting(
        lambda s: est.peak(setup.model_copy(update={"seq_len": s})), usable,
        setup.seq_len, MAX_SEQ_LEN)


def fewest_gpus(est: Estimator, setup: TrainingSetup, usable: int, limit: int) -> Proof:
    """The fewest GPUs of `usable` bytes each that hold the run (ZeRO-3 when sharding is
    needed, as fit() does); exact, not only powers of two."""
    return smallest_fitting(lambda n: est.peak(setup_on(setup, n)), usable, limit)
