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

from vram.result import BUCKET_ORDER, BucketName, Estimate, MomentBytes, MomentId


@dataclass(frozen=True)
class BucketThroughStep:
    name: BucketName
    at_peak_bytes: int
    most_bytes: int
    #: Why the two differ, in one sentence; empty when they do not.
    why: str
    #: The moment the bucket holds `most_bytes` ("the optimizer step"); empty when it is the
    #: peak's own moment or the bucket stays the same through the step.
    most_at: str = ""


#: A moment's label as the object of "at ...": "end of forward" reads "at the end of the
#: forward pass"; the others read as they are ("at the loss", "at the optimizer step").
_MOMENT_PHRASES: dict[MomentId, str] = {MomentId.FORWARD_END: "the end of the forward pass"}

#: What a moment is in the step, where its label does not say (the loss opens the backward).
_MOMENT_PHASES: dict[MomentId, str] = {MomentId.LOSS: "the backward pass"}


def moment_phrase(moment: MomentId) -> str:
    """A moment as a reader's phrase: "end of forward" -> "the end of the forward pass"."""
    return _MOMENT_PHRASES.get(moment, moment.value)


def peak_text(est: Estimate) -> str:
    """Where the peak is, in the words of the estimate's own note: "at the loss (the backward
    pass)", "at the optimizer step"; the phase alone when no moment was kept."""
    moment = peak_moment(est)
    if moment is None:
        return f"in the {est.phase.value.replace('_', ' ')}"
    label = moment.label
    where = _MOMENT_PHASES.get(label, "")
    return f"at {moment_phrase(label)}" + (f" ({where})" if where else "")


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
                       f"they are greatest at {_most_at(est, name)}.")
        rows.append(BucketThroughStep(name, at_peak, most, why,
                                      _most_at(est, name) if most > at_peak else ""))
    return rows


def _most_at(est: Estimate, name: BucketName) -> str:
    """The moment a changing bucket (gradients, activations) is at its most, as a phrase: the
    last such moment for gradients (all of them exist at the optimizer step), the first for
    activations."""
    if name is BucketName.GRADIENTS:
        most = max((m.gradient_bytes for m in est.moments), default=0)
        found = [m for m in est.moments if m.gradient_bytes == most][-1:]
    else:
        most = max((m.activation_bytes for m in est.moments), default=0)
        found = [m for m in est.moments if m.activation_bytes == most][:1]
    return moment_phrase(found[0].label) if found else ""
