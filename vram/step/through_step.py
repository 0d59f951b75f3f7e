"""Each bucket at the peak moment against the most it holds at any moment of the step.

The buckets of an `Estimate` are what is alive at the peak. Gradients and activations change
through the step: gradients are made layer by layer in the backward pass and all exist only at
the optimizer step; activations are greatest at the end of the forward pass. A peak at the loss
(the start of the backward pass) therefore holds few or no gradients, which a reader sees as
"Gradients: 0 GB" and asks about. `Estimate.moments` holds every candidate moment, so the most
each bucket holds is known; weights, optimizer state and overhead stay through the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from vram.result import BUCKET_ORDER, BucketName, Estimate, MomentBytes


@dataclass(frozen=True)
class BucketThroughStep:
    name: BucketName
    at_peak_bytes: int
    most_bytes: int
    #: Why the two differ, in one sentence; empty when they do not.
    why: str


def peak_moment(est: Estimate) -> MomentBytes | None:
    """The candidate moment the peak is at (the one holding the most), if the estimate kept any."""
    return max(est.moments, key=lambda m: m.allocated_bytes, default=None)


def through_step(est: Estimate) -> list[BucketThroughStep]:
    """Every bucket in the chart's order: bytes at the peak, and the most at any moment."""
    moment = peak_moment(est)
    rows = []
    for name in BUCKET_ORDER:
        at_peak = est.bucket(name).bytes
        most, why = at_peak, ""
        if moment is not None and name is BucketName.GRADIENTS:
            most = max(at_peak, at_peak - moment.gradient_bytes + est.gradient_bytes_total)
            if most > at_peak:
                why = (f"The peak is at {moment.label}: gradients are made layer by layer in "
                       "the backward pass and all of them exist only at the optimizer step, so "
                       "this moment holds "
                       + ("none yet." if at_peak == 0 else "only part of them."))
        elif moment is not None and name is BucketName.ACTIVATIONS:
            most = max(at_peak, at_peak - moment.activation_bytes + est.activation_bytes_max)
            if most > at_peak:
                why = (f"At {moment.label} part of the saved activations are already freed; "
                       "they are greatest at the end of the forward pass.")
        rows.append(BucketThroughStep(name, at_peak, most, why))
    return rows
