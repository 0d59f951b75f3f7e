"""The calculator's headline: the peak and its moment, the cheapest GPUs that hold the run, and
the lesson's question, how many 80 GB GPUs: what sharding needs beside the capacity count,
with one line on why the two differ.

The counts come from `vram.gpus.class_fit`; this module only words them.
"""

from __future__ import annotations

import streamlit as st

from ui import breakdown_chart, charts, data, text
from ui.charts import Unit, format_bytes
from vram.gpus import ClassFit, FitReport
from vram.result import Estimate
from vram.step.through_step import peak_text


def gpu_price(usd_per_hour: float | None) -> str:
    return "price unknown" if usd_per_hour is None else f"${usd_per_hour:,.2f}/h"


def class_name(found: ClassFit) -> str:
    return f"{found.class_gib} GB"


def class_value(found: ClassFit) -> tuple[str, str]:
    """The class metric's value and the line under it: "1× 80 GB" / "fits one 80 GB GPU";
    "16× 80 GB" / "~14× 80 GB by capacity"; "none" where no count holds it."""
    size = class_name(found)
    by_capacity = f"~{found.capacity_count}× {size} by capacity"
    if found.needed is None:
        return "none", by_capacity
    if found.reason == "fits-one":
        if not found.needed.fits:
            return f"1× {size}", f"one {size} GPU: {found.needed.verdict_text}"
        return f"1× {size}", f"fits one {size} GPU"
    return f"{found.needed.count}× {size}", by_capacity


def why_line(found: ClassFit, unit: Unit) -> str:
    """One line on why sharding needs another count than capacity ("" when they agree)."""
    size = class_name(found)
    n = found.needed.count if found.needed else None
    capacity = (f"By capacity, {format_bytes(found.whole_run_bytes, unit)} ÷ "
                f"{format_bytes(found.class_memory_bytes, unit)} per {size} GPU ≈ "
                f"{found.capacity_ratio:.1f}, so ~{found.capacity_count}")
    below = found.below_count
    if found.reason in ("fits-one", "agree"):
        return ""
    if found.reason == "steps":
        tried = ", ".join(str(c) for c in found.counts_tried)
        return (f"{capacity}; sharded (ZeRO-3/FSDP) it takes {n}: the fit tries {tried} GPUs, "
                f"and {below} are fewer than {found.capacity_count}." if below else
                f"{capacity}; a run on several GPUs takes at least {n}.")
    assert found.below_peak_bytes is not None and found.below_unsplit_bytes is not None
    each = (f"on {below} each GPU would hold {format_bytes(found.below_peak_bytes, unit)}, "
            f"{format_bytes(found.below_unsplit_bytes, unit)} of it its own activations and "
            "overhead, which sharding does not split")
    if found.reason == "none":
        return f"{capacity}; but no count holds it: {each}."
    return f"{capacity}; sharded it takes {n}: {each}."


def metrics(est: Estimate, report: FitReport, found: ClassFit | None, unit: Unit) -> None:
    """The peak and its moment, the cheapest GPUs that hold it, the 80 GB count."""
    peak, cheapest, lesson = st.columns(3)
    peak.metric(
        "Peak memory per GPU",
        format_bytes(est.device_peak_bytes, unit),
        delta=peak_text(est),
        delta_color="off",
        delta_arrow="off",
        help=(
            f"What nvidia-smi would show at the peak. PyTorch's max_memory_allocated would "
            f"report {format_bytes(est.allocated_peak_bytes, unit)}; max_memory_reserved "
            f"{format_bytes(est.reserved_peak_bytes, unit)}. The GPU fit uses the nvidia-smi "
            f"figure; its {breakdown_chart.band_text(est, unit)} (the box on the bar) is "
            "where measured runs fall, and a GPU surely holds the run when the band's top "
            "is within its memory."
        ),
    )
    if report.fits:
        # The cheapest priced option; a GPU without a price in the list cannot be "cheapest".
        priced = [o for o in report.fits if o.usd_per_hour is not None]
        best = (priced or list(report.fits))[0]
        full, compact = data.short_gpu_name(best.gpu.name), charts.compact_gpu_name(best.gpu.name)
        cheapest.metric(  # a GPU's name may come from a team's list: text, never Markdown
            "Cheapest per hour",
            f"{best.count}× {text.plain(compact)}",
            # the full name below the big one when that is shortened
            delta=(f"{text.plain(full)} · " if compact != full else "")
            + gpu_price(best.usd_per_hour),
            delta_color="off",
            delta_arrow="off",
            help="Cheapest by the price per hour of all the GPUs needed that surely hold the "
                 "run (the band's top within their memory; Make it fit ranks by the price of "
                 "the whole run).",
        )
    else:
        cheapest.metric("Cheapest per hour", "none in the list")
    if found is None:
        lesson.metric("80 GB GPUs", "none in the list",
                      help="The lessons count in 80 GB GPUs; the GPU list has none.")
        return
    value, line = class_value(found)
    name = (f" ({text.plain(data.short_gpu_name(found.needed.gpu.name))}, "
            f"{gpu_price(found.needed.usd_per_hour)})" if found.needed else "")
    lesson.metric(
        f"{class_name(found)} GPUs (the lesson's)", value, delta=line, delta_color="off",
        delta_arrow="off",
        help=(f"The fewest {class_name(found)} GPUs that hold the run as the fit shards it"
              f"{name}, beside the whole run divided by one card's memory"
              + (f"; {found.needed.verdict_text} there (the estimate is within the memory, "
                 "the band's top is not)." if found.needed and not found.needed.fits
                 else ".")),
    )


def borderline_line(report: FitReport) -> str:
    """"Borderline: 1× RTX 4090, 72 % likely to fit ..." where a cheaper option than the
    cheapest sure fit may hold the run ("" otherwise)."""
    best = next((o for o in report.fits if o.usd_per_hour is not None), None)
    cheaper = [o for o in report.borderline if o.usd_per_hour is not None
               and (best is None or best.usd_per_hour is None
                    or o.usd_per_hour < best.usd_per_hour)]
    if not cheaper:
        return ""
    o = cheaper[0]
    name = text.plain(data.short_gpu_name(o.gpu.name))  # a team's list: text, never Markdown
    return (f"Borderline: {o.count}× {name} "
            f"({gpu_price(o.usd_per_hour)}), {o.fit_probability * 100:.0f} % likely to fit: the "
            "estimate is within its memory, the band's top is not.")


def why(found: ClassFit | None, unit: Unit, report: FitReport | None = None) -> None:
    """The capacity count against sharding's, in one line under the headline; and where a
    cheaper card than the cheapest sure fit may hold the run, that it is borderline."""
    for line in (why_line(found, unit) if found is not None else "",
                 borderline_line(report) if report is not None else ""):
        if line:
            st.caption(line)
