"""Several setups side by side (the Compare and Learn pages): one stacked bar each, the total
above it, capacities as lines with their labels in the right margin; pure functions.

The figure is the same on a phone and a projector (plotly does not reflow text), so it is laid
out for the narrowest screen, a 400 px phone (FIGURE_MIN_PX wide; in presentation mode, a
projector's), and keeps its height there:
the legend is the page's (`legend_markdown`), not plotly's, which wrapped into five rows and
squeezed the plot to about 70 px; names under the bars wrap to their bar's share of a phone, at
most TICK_LINES lines. A total is never crossed by a capacity line and never covers a
neighbour's: it moves up past the line, or above the neighbour it would meet on a phone. A
capacity label sits on its own line or gives way with its line (ui.breakdown_chart's rule).
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
    SMALL_FONT_SIZE,
    Unit,
    capacity_label_drop_order,
    capacity_lines,
    capacity_text,
    compact_gpu_name,
    figure,
    format_bytes,
    layout,
    to_unit,
    wrap_label,
)
from vram.result import BUCKET_ORDER, Estimate

_NUMBERED = re.compile(r"^(\d+)\. ")

#: The narrowest figure: a 400 px phone less the page's padding (measured: 364 px).
FIGURE_MIN_PX = 364
#: Lines a name under a bar may take.
TICK_LINES = 3
#: Characters a capacity label wraps to in the right margin.
CAPACITY_CHARS = 12
#: Characters an upright name under a bar wraps to (its lines stand side by side).
TICK_CHARS_UPRIGHT = 14
#: px between a total and the top of its bar, and between stacked totals or a line.
TOTAL_GAP_PX = 4.0


def legend_markdown() -> str:
    """The bucket colours as one line of HTML for the page (top of the stack first), which
    wraps with the page instead of taking the plot's room."""
    return " &nbsp; ".join(
        f"<span style='color:{BUCKET_COLORS[name]};font-size:1.2em'>■</span> "
        f"{BUCKET_LABELS[name]}" for name in reversed(BUCKET_ORDER))


def _left_margin(font_px: int) -> int:
    return max(92, round(5.75 * font_px))


def _distinct_words(rests: Sequence[str]) -> list[str]:
    """Each name without the parts and words all names share ("Llama 3.1 8B · full · b1×2k"
    beside "Llama 3.1 70B · QLoRA · b1×2k" -> "8B full", "70B QLoRA")."""
    parts = [rest.split(" · ") for rest in rests]
    common = set.intersection(*(set(p) for p in parts)) if len(parts) > 1 else set()
    words = [" ".join(p for p in pieces if p not in common).split() or rest.split()
             for pieces, rest in zip(parts, rests, strict=True)]
    shared = set.intersection(*(set(w) for w in words)) if len(words) > 1 else set()
    return [" ".join(w for w in ws if w not in shared) or " ".join(ws) for ws in words]


def tick_labels(labels: Sequence[str], font_px: int, plot_px: float = 0.0,
                min_figure_px: int = FIGURE_MIN_PX) -> tuple[list[str], bool]:
    """Short names under the bars, and whether they stand upright: the words that tell the
    setups apart, wrapped to the width one bar gets in the narrowest plot; where a word is
    wider than that they are turned upright (the figure is the same on a phone), at most
    TICK_LINES lines (the rest is in the hover and the table)."""
    numbered = [_NUMBERED.match(label) for label in labels]
    numbers = [m.group(1) + ". " if m else "" for m in numbered]
    rests = [label[m.end():] if m else label for label, m in zip(labels, numbered, strict=True)]
    plot_px = plot_px or min_figure_px - _left_margin(font_px)
    max_chars = int(plot_px / max(1, len(labels)) / (label_layout.CHAR_WIDTH_EM * font_px))
    names = [number + rest for number, rest in zip(numbers, _distinct_words(rests), strict=True)]
    # upright where a word takes more than 80 % of its bar's share: capitals ("QLoRA") are
    # wider than the 0.6 em an average character is counted at
    upright = any(len(word) > 0.8 * max_chars for name in names for word in name.split())
    width = TICK_CHARS_UPRIGHT if upright else max(4, max_chars)
    return ["<br>".join(wrap_label(name, width).split("<br>")[:TICK_LINES]) for name in names], \
        upright


def _bar_traces(labelled: Sequence[tuple[str, Estimate]], names: Sequence[str],
                unit: Unit) -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = []
    for bucket in BUCKET_ORDER:
        texts = [[format_bytes(est.bucket(bucket).bytes, unit), label]
                 for label, est in labelled]
        traces.append({
            "type": "bar", "x": list(names),
            "y": [to_unit(est.bucket(bucket).bytes, unit) for _, est in labelled],
            "name": BUCKET_LABELS[bucket],
            "marker": {"color": BUCKET_COLORS[bucket], "line": {"color": "white", "width": 1}},
            "customdata": texts,
            "hovertemplate": (f"{BUCKET_LABELS[bucket]}: %{{customdata[0]}}"
                              "<extra>%{customdata[1]}</extra>"),
        })
    return traces


def place_totals(peaks_px: Sequence[float], height_px: float, width_px: float,
                 slot_px: float, lines_px: Sequence[float]) -> list[float]:
    """The bottom (px) of each bar's total: just above its bar, moved up past any capacity
    line it would cross and above any earlier total it would meet on the narrowest screen
    (bars `slot_px` apart there, totals `width_px` wide)."""
    placed: list[float] = []
    for i, peak in enumerate(peaks_px):
        reach = [j for j in range(i) if (i - j) * slot_px < width_px]
        bottom = peak + TOTAL_GAP_PX
        moved = True
        while moved:  # each move is upwards, to one of finitely many places: it ends
            moved = False
            ups = [line + TOTAL_GAP_PX for line in lines_px
                   if bottom - TOTAL_GAP_PX < line < bottom + height_px + TOTAL_GAP_PX]
            ups += [placed[j] + height_px + TOTAL_GAP_PX for j in reach
                    if bottom < placed[j] + height_px and placed[j] < bottom + height_px]
            if ups and max(ups) > bottom:
                bottom, moved = max(ups), True
        placed.append(bottom)
    return placed


def compare_figure(
    labelled: Sequence[tuple[str, Estimate]],
    *,
    unit: Unit = "GB",
    capacities: Iterable[tuple[str, int]] = (),
    height: int = 560,
    font_px: int = SMALL_FONT_SIZE,
    keep_labelled: frozenset[int] = frozenset(),
    min_figure_px: int = FIGURE_MIN_PX,
) -> go.Figure:
    """Several setups side by side: one stacked bar each, the total written above it, setup
    names wrapped under their bars, capacity lines named in the right margin; laid out for a
    figure `min_figure_px` wide (a phone; a projector in presentation mode)."""
    peaks = [est.device_peak_bytes for _, est in labelled]
    lines = capacity_lines(capacities, max(peaks, default=0))
    cap_texts = [wrap_label(capacity_text(compact_gpu_name(name), size, unit), CAPACITY_CHARS)
                 for name, size in lines]
    cap_width = max((label_layout.text_width_px(t, font_px) for t in cap_texts), default=0.0)
    margin = {"l": _left_margin(font_px), "r": int(cap_width) + 16 if lines else 16, "t": 24}
    plot_min = min_figure_px - margin["l"] - margin["r"]
    names, upright = tick_labels([label for label, _ in labelled], font_px, plot_min)
    margin["b"] = (int(label_layout.CHAR_WIDTH_EM * font_px * TICK_CHARS_UPRIGHT) if upright
                   else int(TICK_LINES * font_px * 1.4)) + 12
    plot_px = height - margin["t"] - margin["b"]
    total_texts = [f"<b>{format_bytes(peak, unit)}</b>" for peak in peaks]
    total_h = label_layout.text_height_px("x", font_px + 2)
    total_w = max((label_layout.text_width_px(t, font_px + 2) for t in total_texts),
                  default=0.0)
    cap_values = [to_unit(size, unit) for _, size in lines]
    tallest = max([to_unit(p, unit) for p in peaks] + cap_values + [0.0]) or 1.0
    top = tallest
    for _ in range(4):  # room above the highest total (scale and totals depend on each other)
        scale = plot_px / top
        bottoms = place_totals([to_unit(p, unit) * scale for p in peaks], total_h, total_w,
                               plot_min / max(1, len(peaks)), [v * scale for v in cap_values])
        highest = max([b + total_h for b in bottoms] + [0.0])
        if highest <= plot_px:
            break
        top = min(top * highest / plot_px * 1.02, 3 * tallest)  # a chart far too short
    shown, cap_placed = _capacity_labels(cap_values, cap_texts, lines, peaks, scale, plot_px,
                                         font_px, keep_labelled)
    annotations = [
        {"x": name, "y": bottom / scale, "yanchor": "bottom", "showarrow": False,
         "text": text, "font": {"size": font_px + 2}, "bgcolor": "rgba(255,255,255,0.85)"}
        for name, bottom, text in zip(names, bottoms, total_texts, strict=True)]
    annotations += [
        {"xref": "paper", "x": 1.0, "yref": "y", "y": centre / scale, "yanchor": "middle",
         "xanchor": "left", "xshift": 6, "showarrow": False, "text": cap_texts[i],
         "align": "left", "font": {"size": font_px, "color": "#333"}}
        for i, centre in zip(shown, cap_placed, strict=True)]
    shapes = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
               "y0": cap_values[i], "y1": cap_values[i],
               "line": {"color": "#333", "width": 2, "dash": "dash"}} for i in shown]
    return figure(_bar_traces(labelled, names, unit), layout(
        barmode="stack", height=height, bargap=0.35, margin=margin, showlegend=False,
        yaxis={"title": {"text": f"memory per GPU ({unit})", "font": {"size": font_px}},
               "tickfont": {"size": font_px}, "range": [0, top], "gridcolor": "#e5e5e5",
               "fixedrange": True, "automargin": False},
        xaxis={"fixedrange": True, "tickfont": {"size": font_px},
               "tickangle": -90 if upright else 0, "automargin": False},
        annotations=annotations, shapes=shapes,
    ))


def _capacity_labels(values: Sequence[float], texts: Sequence[str],
                     lines: Sequence[tuple[str, int]], peaks: Sequence[int], scale: float,
                     plot_px: float, font_px: int, keep: frozenset[int],
                     ) -> tuple[list[int], list[float]]:
    """The capacities that keep line and label (each label on its own line), least telling
    giving way first."""
    shown = list(range(len(values)))
    drops = iter(capacity_label_drop_order([s for _, s in lines], max(peaks, default=0), keep))
    while shown:
        px = [values[i] * scale for i in shown]
        placed = label_layout.on_lines(
            px, [label_layout.text_height_px(texts[i], font_px) for i in shown], px, 0.0,
            plot_px)
        if placed is not None:
            return shown, placed
        shown.remove(next(drops))
    return [], []
