"""The calculator's chart: the buckets of one GPU at the moment of the peak, as one stacked bar
with each bucket labelled, beside a faded bar of what each bucket holds at its most through the
step, and GPU capacities as dashed lines; a pure function of the estimate (no Streamlit).

Why two bars: a peak at the loss holds no gradients yet (they are made in the backward pass),
so the peak's bar alone shows "Gradients: 0 GB", the first thing a class asks about. The faded
bar shows the state that lives through the step (every gradient by the optimizer step, the
activations at their largest); it is never all present at once, so it is no peak. Each label
that differs names where its bucket is at its most ("Gradients: 0 GB (32.1 GB at the
optimizer step)").

Labels: a capacity label sits on its own line (moved at most a few pixels, never where another
line runs through it), or the capacity gives way, least telling first, line and label
together, so no line is left unnamed and no label can be read as another line's; bucket
labels are spread in the room left between capacity labels and lines, and point at their
segment with a leader line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from ui import label_layout
from ui.charts import (
    BUCKET_COLORS,
    BUCKET_LABELS,
    MIN_PLOT_PX,
    SMALL_FONT_SIZE,
    Unit,
    capacity_label_drop_order,
    capacity_lines,
    capacity_text,
    figure,
    format_bytes,
    layout,
    px_scale,
    to_unit,
    wrap_label,
)
from vram.result import Estimate
from vram.step.through_step import BucketThroughStep, through_step

#: Bar geometry in x-axis units: the peak's bar spans [-BAR_HALF, BAR_HALF], the faded bar of
#: the step [STEP_X - BAR_HALF, STEP_X + BAR_HALF]; bucket labels start at LABEL_X, the axis
#: ends at X_MAX (the capacity labels' right edge). With both bars each is 41 px wide on a
#: 400 px phone, 54 px with one.
BAR_HALF = 0.3
STEP_X = -0.66
LABEL_X = 0.42
X_MIN = -0.35
X_MIN_WITH_STEP = STEP_X - BAR_HALF - 0.05
X_MAX = 2.65
#: Capacity lines stop this far (x units, about 3 px on a phone) inside X_MAX, under their
#: label's right edge: drawn to X_MAX, a dash showed past the text.
LINE_INSET = 0.03
BREAKDOWN_MARGIN: dict[str, int] = {"l": 92, "r": 12, "t": 64, "b": 16}
#: Room under the axis for the bars' names ("most", "peak") when both are drawn.
TICK_MARGIN = 30
#: A bucket label keeps this far (px) from any capacity line, so it never reads as the line's.
LINE_CLEAR_PX = 3.0
#: The faded bar's opacity.
STEP_OPACITY = 0.4
#: A bucket's most against its figure at the peak is worth a second bar and a figure in the
#: label when it differs by at least this share of the peak (LoRA's adapters' gradients, under
#: a GB beside a 196 GB peak, are not).
MATERIAL = 0.01


def material(row: BucketThroughStep, peak_bytes: int) -> bool:
    return row.most_bytes - row.at_peak_bytes >= MATERIAL * peak_bytes


def bucket_label(row: BucketThroughStep, unit: Unit, peak_bytes: int) -> str:
    """"Gradients: 0 GB (32.1 GB at the optimizer step)": the peak's figure, and where the
    bucket is at its most when that is materially more; "(none yet)" beside a 0 that becomes
    more later, so a zero never stands without its reason."""
    text = f"{BUCKET_LABELS[row.name]}: {_size(row.at_peak_bytes, unit)}"
    if row.most_at and material(row, peak_bytes):
        text += f" ({_size(row.most_bytes, unit)} at {row.most_at})"
    elif row.at_peak_bytes == 0 < row.most_bytes:
        text += " (none yet)"
    return text


def _size(n_bytes: int, unit: Unit) -> str:
    """A size that a wrapped label never breaks between number and unit."""
    return format_bytes(n_bytes, unit).replace(" ", "\u00a0")


def _bars(rows: Sequence[BucketThroughStep], unit: Unit, step: bool,
          ) -> tuple[list[dict[str, Any]], list[float]]:
    """The bar traces (the faded step's first, when drawn) and each peak segment's centre."""
    traces: list[dict[str, Any]] = []
    if step:
        for row in rows:
            text = f"{BUCKET_LABELS[row.name]}: {format_bytes(row.most_bytes, unit)}"
            traces.append({
                "type": "bar", "x": [STEP_X], "y": [to_unit(row.most_bytes, unit)],
                "name": f"{BUCKET_LABELS[row.name]} (most)", "opacity": STEP_OPACITY,
                "marker": {"color": BUCKET_COLORS[row.name],
                           "line": {"color": "white", "width": 1}},
                "hovertemplate": f"{text} at its most in the step<br>(never all at once)"
                                 "<extra></extra>", "width": 2 * BAR_HALF,
            })
    centres: list[float] = []
    bottom = 0.0
    for row in rows:
        value = to_unit(row.at_peak_bytes, unit)
        hover = f"{BUCKET_LABELS[row.name]}: {format_bytes(row.at_peak_bytes, unit)} at the peak"
        if row.why:
            hover += (f"<br>up to {format_bytes(row.most_bytes, unit)} at another moment"
                      f"<br>{wrap_label(row.why, 60)}")
        traces.append({
            "type": "bar", "x": [0], "y": [value], "name": BUCKET_LABELS[row.name],
            "marker": {"color": BUCKET_COLORS[row.name], "line": {"color": "white", "width": 1}},
            "hovertemplate": f"{hover}<extra></extra>", "width": 2 * BAR_HALF,
        })
        centres.append(bottom + value / 2)
        bottom += value
    return traces, centres


@dataclass(frozen=True)
class _Column:
    """The label column's geometry: pixels per axis unit and the plot's height in px."""

    scale: float
    plot_px: float
    font_px: int


def _place(col: _Column, bucket_px: Sequence[float], bucket_h: Sequence[float],
           cap_px: Sequence[float], cap_h: Sequence[float], drop_order: Sequence[int],
           ) -> tuple[list[int], list[float], list[float] | None]:
    """Which capacities keep their line and label, where the labels go (on their lines), and
    where the bucket labels go around them. A capacity gives way, least telling first, until
    every label fits; its line goes with its label, so no line is left that nothing names."""
    # Bucket labels off every line if there is room for that, else they may cross one
    # (behind their white box); capacity labels stay on their own lines either way.
    for avoid_lines in (True, False):
        shown = list(range(len(cap_px)))
        drops = iter(drop_order)
        while True:
            lines = [cap_px[i] for i in shown]
            caps = label_layout.on_lines(lines, [cap_h[i] for i in shown], lines, 0.0,
                                         col.plot_px)
            if caps is not None:
                boxes = [(c - cap_h[i] / 2, c + cap_h[i] / 2)
                         for c, i in zip(caps, shown, strict=True)]
                if avoid_lines:
                    boxes += [(p - LINE_CLEAR_PX, p + LINE_CLEAR_PX) for p in lines]
                buckets = label_layout.spread_avoiding(bucket_px, bucket_h, boxes, 0.0,
                                                       col.plot_px)
                if buckets is not None:
                    return shown, caps, buckets
            if not shown:
                break
            shown.remove(next(drops))
    # no room even for the bucket labels alone: where they are (a chart far too short)
    return [], [], label_layout.spread_in_column(bucket_px, bucket_h, 0.0, col.plot_px)


def _annotations(labels: Sequence[str], centres: Sequence[float], placed: Sequence[float],
                 cap_texts: Sequence[str], cap_placed: Sequence[float], col: _Column,
                 ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for text, centre, label_px in zip(labels, centres, placed, strict=True):
        out.append({
            # The text sits at the arrow's tail (ax, ay); the head points at the segment.
            "x": BAR_HALF, "y": centre, "xref": "x", "yref": "y",
            "ax": LABEL_X, "ay": label_px / col.scale, "axref": "x", "ayref": "y",
            "text": text, "showarrow": True, "arrowhead": 0, "arrowwidth": 1,
            "arrowcolor": "#555", "xanchor": "left", "align": "left",
            "font": {"size": col.font_px, "color": "#222"},
            "bgcolor": "rgba(255,255,255,0.92)",
        })
    for text, label_px in zip(cap_texts, cap_placed, strict=True):
        out.append({  # on its line (at most a few px off): no leader needed
            "x": X_MAX, "y": label_px / col.scale, "xref": "x", "yref": "y",
            "showarrow": False, "text": text, "xanchor": "right", "yanchor": "middle",
            "align": "right",
            "font": {"size": col.font_px, "color": "#333"},
            "bgcolor": "rgba(255,255,255,0.92)",
        })
    return out


def breakdown_figure(
    estimate: Estimate,
    *,
    unit: Unit = "GB",
    capacities: Iterable[tuple[str, int]] = (),
    height: int = 560,
    font_px: int = SMALL_FONT_SIZE,
    too_small: frozenset[str] | None = None,
    min_plot_px: int = MIN_PLOT_PX,
    keep_labelled: frozenset[int] = frozenset(),
) -> go.Figure:
    """The peak's stacked bar (per GPU), each bucket labelled, beside the faded bar of the
    step (drawn when a bucket holds more at another moment), with GPU capacities as lines.

    `capacities` are ``(name, memory_bytes)`` pairs; the lines below the peak and the first one
    above it are drawn, so the picture shows the smallest card that holds the run. The peak is
    the title, where no label can cover it. `min_plot_px` is the narrowest plot the figure
    will be shown in (a phone by default; a projector in presentation mode), to which long
    labels are wrapped. `keep_labelled` holds capacities (bytes) whose labels are the last
    below the peak to drop when there is no room (capacity_label_drop_order).
    """
    peak = estimate.device_peak_bytes
    rows = through_step(estimate)
    step = any(material(r, peak) for r in rows)
    traces, centres = _bars(rows, unit, step)
    x_min = X_MIN_WITH_STEP if step else X_MIN
    lines = capacity_lines(capacities, peak, too_small=too_small)
    tallest = max([to_unit(peak, unit)] + [to_unit(s, unit) for _, s in lines])
    if step:
        tallest = max(tallest, sum(to_unit(r.most_bytes, unit) for r in rows))
    top = tallest * 1.06 or 1.0
    # Room for the tick labels and the axis title, which grow with the type.
    margin = {**BREAKDOWN_MARGIN, "l": max(BREAKDOWN_MARGIN["l"], round(5.75 * font_px)),
              "b": BREAKDOWN_MARGIN["b"] + (TICK_MARGIN if step else 0)}
    col = _Column(px_scale(height, margin, top), height - margin["t"] - margin["b"], font_px)
    # Wrapped to the room right of the bar on the narrowest plot, so a long label never
    # reaches back over the bar on a phone.
    room_chars = int((X_MAX - LABEL_X) / (X_MAX - x_min) * min_plot_px
                     / (label_layout.CHAR_WIDTH_EM * font_px))
    labels = [wrap_label(bucket_label(r, unit, peak), room_chars) for r in rows]
    cap_texts = [wrap_label(capacity_text(name, size, unit), room_chars) for name, size in lines]
    cap_values = [to_unit(size, unit) for _, size in lines]
    shown, cap_placed, placed = _place(
        col, [c * col.scale for c in centres],
        [label_layout.text_height_px(t, font_px) for t in labels],
        [v * col.scale for v in cap_values],
        [label_layout.text_height_px(t, font_px) for t in cap_texts],
        capacity_label_drop_order([s for _, s in lines], peak, keep_labelled))
    for i in shown:
        traces.append({
            # ends just inside the label's right edge, so no dash shows past the text
            "type": "scatter", "mode": "lines", "x": [x_min, X_MAX - LINE_INSET],
            "y": [cap_values[i], cap_values[i]],
            "line": {"color": "#333", "width": 2, "dash": "dash"}, "showlegend": False,
            "hovertemplate": f"{cap_texts[i].replace('<br>', ' ')}<extra>capacity</extra>",
        })
    annotations = _annotations(
        labels, centres, placed or [c * col.scale for c in centres],
        [cap_texts[i] for i in shown], cap_placed, col)
    xaxis: dict[str, Any] = {"range": [x_min, X_MAX], "showticklabels": False,
                             "fixedrange": True, "showgrid": False, "zeroline": False}
    if step:  # the two bars' names under them
        xaxis.update(showticklabels=True, tickvals=[STEP_X, 0], ticktext=["most", "peak"],
                     tickfont={"size": font_px, "color": "#444"}, ticks="")
    return figure(traces, layout(
        barmode="stack", height=height, showlegend=False, margin=margin,
        title={"text": f"Peak <b>{format_bytes(peak, unit)}</b> per GPU",
               "font": {"size": font_px + 6, "color": "#222"},
               "x": 0.01, "xref": "container", "xanchor": "left",
               "y": 1 - 12 / height, "yref": "container", "yanchor": "top"},
        xaxis=xaxis,
        yaxis={"title": {"text": f"memory per GPU ({unit})", "font": {"size": font_px}},
               "tickfont": {"size": font_px}, "range": [0, top], "gridcolor": "#e5e5e5",
               "fixedrange": True, "automargin": True},
        annotations=annotations,
    ))
