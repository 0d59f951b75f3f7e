"""Several setups side by side (the Compare and Learn pages): one stacked bar each, the total
above it, capacities as lines with their labels in the right margin; pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
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
from vram.result import BUCKET_ORDER, Estimate

_NUMBERED = re.compile(r"^(\d+)\. ")


def tick_labels(labels: Sequence[str], font_px: int) -> list[str]:
    """Short, wrapped names under the bars: the parts (`` · ``-separated) that tell the setups
    apart, each part's words wrapped to the width one bar gets in the narrowest plot."""
    numbered = [_NUMBERED.match(label) for label in labels]
    numbers = [m.group(1) + ". " if m else "" for m in numbered]
    rests = [label[m.end():] if m else label for label, m in zip(labels, numbered, strict=True)]
    parts = [rest.split(" · ") for rest in rests]
    common = set.intersection(*(set(p) for p in parts)) if len(parts) > 1 else set()
    max_chars = max(4, int(MIN_PLOT_PX / max(1, len(labels)) / (label_layout.CHAR_WIDTH_EM
                                                                 * font_px)))
    ticks = []
    for number, rest, pieces in zip(numbers, rests, parts, strict=True):
        distinct = [p for p in pieces if p not in common] or [rest]
        distinct[0] = number + distinct[0]
        ticks.append("<br>".join(wrap_label(p, max_chars) for p in distinct))
    return ticks


def compare_figure(
    labelled: Sequence[tuple[str, Estimate]],
    *,
    unit: Unit = "GB",
    capacities: Iterable[tuple[str, int]] = (),
    height: int = 560,
    font_px: int = SMALL_FONT_SIZE,
    keep_labelled: frozenset[int] = frozenset(),
) -> go.Figure:
    """Several setups side by side: one stacked bar each, the total written above it.

    Setup names are wrapped under their bars (never rotated into the legend), the legend sits
    above the plot, and the capacity labels sit in a right margin sized to their text, spread
    so that none overlaps another; the totals inside the plot cannot meet them.
    """
    names = tick_labels([label for label, _ in labelled], font_px)
    full_names = [label for label, _ in labelled]
    traces: list[dict[str, Any]] = []
    for bucket in BUCKET_ORDER:
        values = [to_unit(est.bucket(bucket).bytes, unit) for _, est in labelled]
        texts = [[format_bytes(est.bucket(bucket).bytes, unit), full]
                 for (_, est), full in zip(labelled, full_names, strict=True)]
        traces.append(
            dict(
                type="bar",
                x=names,
                y=values,
                name=BUCKET_LABELS[bucket],
                marker={"color": BUCKET_COLORS[bucket], "line": {"color": "white", "width": 1}},
                customdata=texts,
                hovertemplate=(f"{BUCKET_LABELS[bucket]}: %{{customdata[0]}}"
                               "<extra>%{customdata[1]}</extra>"),
            )
        )
    peaks = [est.device_peak_bytes for _, est in labelled]
    annotations: list[dict[str, Any]] = [
        {
            "x": name,
            "y": to_unit(peak, unit),
            "yshift": 4,
            "yanchor": "bottom",
            "showarrow": False,
            "text": f"<b>{format_bytes(peak, unit)}</b>",
            "font": {"size": font_px + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        }
        for name, peak in zip(names, peaks, strict=True)
    ]
    lines = capacity_lines(capacities, max(peaks, default=0))
    # Room above the tallest bar for its total (a line of text at this height).
    plot_guess_px = height - 200
    top = max([to_unit(p, unit) for p in peaks] + [to_unit(s, unit) for _, s in lines] + [0.0])
    top = top * (1 + 2 * label_layout.LINE_HEIGHT_EM * (font_px + 2) / plot_guess_px) or 1.0
    tick_lines = max((n.count("<br>") + 1 for n in names), default=1)
    margin = {"l": max(92, round(5.75 * font_px)), "r": 16, "t": 80,
              "b": int(tick_lines * font_px * 1.4) + 24}
    scale = px_scale(height, margin, top)
    # In the margin, long GPU names wrap onto a second line rather than squeeze the plot.
    cap_texts = [wrap_label(capacity_text(name, size, unit), 16) for name, size in lines]
    cap_values = [to_unit(size, unit) for _, size in lines]
    shapes: list[dict[str, Any]] = [
        {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": value,
         "y1": value, "line": {"color": "#333", "width": 2, "dash": "dash"}}
        for value in cap_values]
    shown = list(range(len(lines)))
    drops = iter(capacity_label_drop_order([s for _, s in lines], max(peaks, default=0),
                                           keep_labelled))

    def spread() -> list[float] | None:
        return label_layout.spread_in_column(
            [cap_values[i] * scale for i in shown],
            [label_layout.text_height_px(cap_texts[i], font_px) for i in shown],
            0.0, height - margin["t"] - margin["b"])

    placed = spread()
    while placed is None and shown:  # no room: the least telling label gives way, its line stays
        shown.remove(next(drops))
        placed = spread()
    cap_texts = [cap_texts[i] for i in shown]
    for text, label_px in zip(cap_texts, placed or [], strict=True):
        annotations.append({
            "xref": "paper", "x": 1.0, "yref": "y", "y": label_px / scale,
            "xanchor": "left", "xshift": 6, "showarrow": False, "text": text,
            "font": {"size": font_px, "color": "#333"},
        })
    if cap_texts:
        margin["r"] = int(max(label_layout.text_width_px(t, font_px) for t in cap_texts)) + 16
    return figure(
        traces,
        layout(
            barmode="stack",
            height=height,
            bargap=0.35,
            margin=margin,
            yaxis={
                "title": {"text": f"memory per GPU ({unit})", "font": {"size": font_px}},
                "tickfont": {"size": font_px},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
                "automargin": True,
            },
            xaxis={"fixedrange": True, "tickfont": {"size": font_px}, "tickangle": 0},
            legend={"font": {"size": font_px}, "orientation": "h", "x": 0, "xanchor": "left",
                    "y": 1.02, "yanchor": "bottom"},
            annotations=annotations,
            shapes=shapes,
        ),
    )
