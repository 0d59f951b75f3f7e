"""The calculator's chart: one stacked bar of the buckets per GPU, each labelled, with GPU
capacities as dashed lines; a pure function of the estimate (no Streamlit).
"""

from __future__ import annotations

from collections.abc import Iterable
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
from vram.through_step import through_step

#: Bar geometry of the breakdown chart, in x-axis units: the bar spans [-BAR_HALF, BAR_HALF],
#: bucket labels start at LABEL_X, the axis ends at X_MAX (the capacity labels' right edge).
#: The bar takes a fifth of the plot's width, 56 px on a 400 px phone.
BAR_HALF = 0.3
LABEL_X = 0.42
X_MIN = -0.35
X_MAX = 2.65
#: Capacity lines stop this far (x units, about 3 px on a phone) inside X_MAX, under their
#: label's right edge: drawn to X_MAX, a dash showed past the text.
LINE_INSET = 0.03
BREAKDOWN_MARGIN: dict[str, int] = {"l": 92, "r": 12, "t": 64, "b": 16}


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
    """One stacked bar of the buckets (per GPU), each labelled, with GPU capacities as lines.

    `capacities` are ``(name, memory_bytes)`` pairs; the lines below the peak and the first one
    above it are drawn, so the picture shows the smallest card that holds the run. Bucket and
    capacity labels share one column beside the bar and are spread so that none overlaps
    another (ui.label_layout); a label moved off what it names gets a leader line. The peak is
    the title, where no label can cover it.

    `min_plot_px` is the narrowest plot the figure will be shown in (a phone by default; a
    projector in presentation mode), to which long capacity labels are wrapped.
    `keep_labelled` holds capacities (bytes) whose labels are the last below the peak to drop
    when there is no room (capacity_label_drop_order).
    """
    peak = estimate.device_peak_bytes
    traces: list[dict[str, Any]] = []
    bottom = 0.0
    centres: list[float] = []
    labels: list[str] = []
    for row in through_step(estimate):
        name, n_bytes = row.name, row.at_peak_bytes
        value = to_unit(n_bytes, unit)
        text = f"{BUCKET_LABELS[name]}: {format_bytes(n_bytes, unit)}"
        hover = f"{text} at the peak"
        if row.why:  # gradients or activations that the peak moment holds only part of
            hover += (f"<br>up to {format_bytes(row.most_bytes, unit)} at another moment"
                      f"<br>{wrap_label(row.why, 60)}")
        traces.append({
            "type": "bar", "x": [0], "y": [value], "name": BUCKET_LABELS[name],
            "marker": {"color": BUCKET_COLORS[name], "line": {"color": "white", "width": 1}},
            "hovertemplate": f"{hover}<extra></extra>", "width": 2 * BAR_HALF,
        })
        centres.append(bottom + value / 2)
        labels.append(text)
        bottom += value

    lines = capacity_lines(capacities, peak, too_small=too_small)
    top = max([to_unit(peak, unit)] + [to_unit(s, unit) for _, s in lines]) * 1.06 or 1.0
    # Room for the tick labels and the axis title, which grow with the type.
    margin = {**BREAKDOWN_MARGIN, "l": max(BREAKDOWN_MARGIN["l"], round(5.75 * font_px))}
    scale = px_scale(height, margin, top)
    # Wrapped to the room right of the bar on the narrowest plot, so a long GPU name never
    # reaches back over the bar on a phone.
    room_chars = int((X_MAX - LABEL_X) / (X_MAX - X_MIN) * min_plot_px
                     / (label_layout.CHAR_WIDTH_EM * font_px))
    cap_texts = [wrap_label(capacity_text(name, size, unit), room_chars) for name, size in lines]
    cap_values = [to_unit(size, unit) for _, size in lines]
    for name_text, value in zip(cap_texts, cap_values, strict=True):
        traces.append({
            # ends just inside the label's right edge, so no dash shows past the text
            "type": "scatter", "mode": "lines", "x": [X_MIN, X_MAX - LINE_INSET],
            "y": [value, value],
            "line": {"color": "#333", "width": 2, "dash": "dash"}, "showlegend": False,
            "hovertemplate": f"{name_text.replace('<br>', ' ')}<extra>capacity</extra>",
        })
    plot_px = height - margin["t"] - margin["b"]
    bucket_heights = [label_layout.text_height_px(t, font_px) for t in labels]
    shown = list(range(len(lines)))
    drops = iter(capacity_label_drop_order([s for _, s in lines], peak, keep_labelled))

    def spread() -> list[float] | None:
        return label_layout.spread_in_column(
            [c * scale for c in centres] + [cap_values[i] * scale for i in shown],
            bucket_heights + [label_layout.text_height_px(cap_texts[i], font_px)
                              for i in shown],
            0.0, plot_px)

    placed = spread()
    while placed is None and shown:
        # No room: the least telling capacity label gives way (its line keeps its hover).
        shown.remove(next(drops))
        placed = spread()
    if placed is None:
        placed = [c * scale for c in centres]
    cap_texts = [cap_texts[i] for i in shown]
    cap_values = [cap_values[i] for i in shown]
    annotations: list[dict[str, Any]] = []
    for text, centre, label_px in zip(labels, centres, placed, strict=False):
        annotations.append({
            # The text sits at the arrow's tail (ax, ay); the head points at the segment.
            "x": BAR_HALF, "y": centre, "xref": "x", "yref": "y",
            "ax": LABEL_X, "ay": label_px / scale, "axref": "x", "ayref": "y",
            "text": text, "showarrow": True, "arrowhead": 0, "arrowwidth": 1,
            "arrowcolor": "#555", "xanchor": "left",
            "font": {"size": font_px, "color": "#222"},
            # a capacity line crossing the label passes behind it, not through the text
            "bgcolor": "rgba(255,255,255,0.92)",
        })
    for text, value, label_px in zip(cap_texts, cap_values, placed[len(labels):], strict=True):
        moved = abs(label_px - value * scale) > 2
        annotations.append({
            "x": X_MAX, "y": value, "xref": "x", "yref": "y",
            "ax": X_MAX, "ay": label_px / scale, "axref": "x", "ayref": "y",
            "showarrow": moved, "arrowhead": 0, "arrowwidth": 1, "arrowcolor": "#333",
            "text": text, "xanchor": "right",
            "font": {"size": font_px, "color": "#333"},
            "bgcolor": "rgba(255,255,255,0.92)",
        })
    return figure(
        traces,
        layout(
            barmode="stack",
            height=height,
            showlegend=False,
            margin=margin,
            title={"text": f"Peak <b>{format_bytes(peak, unit)}</b> per GPU",
                   "font": {"size": font_px + 6, "color": "#222"},
                   "x": 0.01, "xref": "container", "xanchor": "left",
                   "y": 1 - 12 / height, "yref": "container", "yanchor": "top"},
            xaxis={"range": [X_MIN, X_MAX], "showticklabels": False, "fixedrange": True,
                   "showgrid": False, "zeroline": False},
            yaxis={
                "title": {"text": f"memory per GPU ({unit})", "font": {"size": font_px}},
                "tickfont": {"size": font_px},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
                "automargin": True,
            },
            annotations=annotations,
        ),
    )
