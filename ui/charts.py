"""Plotly figures built from estimates: pure functions of their inputs, no Streamlit.

The app displays them, the CLI can export them (``fig.write_html(...)``), and tests check the
data they carry. Colours come from the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal
Design"), which stays distinguishable for the common forms of colour blindness; each bucket keeps
its colour everywhere.

    >>> fig = breakdown_figure(estimate, unit="GB", capacities=[("RTX 4090", 24 * GIB)])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import plotly.graph_objects as go

from vram.result import BUCKET_ORDER, BucketName, Estimate
from vram.units import GB, GIB

Unit = Literal["GB", "GiB"]

#: Bytes per display unit. GB = 10^9 (what vendors print), GiB = 2^30 (what nvidia-smi shows).
UNIT_BYTES: dict[str, int] = {"GB": GB, "GiB": GIB}

#: Okabe-Ito colours, one per bucket; overhead is a neutral grey so the four buckets stand out.
BUCKET_COLORS: dict[BucketName, str] = {
    BucketName.WEIGHTS: "#0072B2",  # blue
    BucketName.GRADIENTS: "#E69F00",  # orange
    BucketName.OPTIMIZER: "#009E73",  # bluish green
    BucketName.ACTIVATIONS: "#CC79A7",  # reddish purple
    BucketName.OVERHEAD: "#999999",  # grey
}

BUCKET_LABELS: dict[BucketName, str] = {
    BucketName.WEIGHTS: "Weights",
    BucketName.GRADIENTS: "Gradients",
    BucketName.OPTIMIZER: "Optimizer state",
    BucketName.ACTIVATIONS: "Activations",
    BucketName.OVERHEAD: "Overhead",
}

#: Colours for the inference side that are not buckets (the KV cache, working memory).
KV_CACHE_COLOR = "#56B4E9"  # sky blue
WORKING_COLOR = "#D55E00"  # vermillion

#: Readable from the back of a classroom: no chart text under 16 px.
FONT_SIZE = 18
SMALL_FONT_SIZE = 16
FONT_FAMILY = "Source Sans Pro, Arial, sans-serif"
#: Right margin (px) for capacity labels placed beside the plot.
CAPACITY_MARGIN = 275


def to_unit(n_bytes: int, unit: Unit) -> float:
    """Bytes as a float in GB (10^9) or GiB (2^30)."""
    return n_bytes / UNIT_BYTES[unit]


def format_bytes(n_bytes: int, unit: Unit) -> str:
    """Three significant digits and the unit: ``12.3 GB``, ``0.52 GiB``, ``840 GB``."""
    value = to_unit(n_bytes, unit)
    if value == 0:
        return f"0 {unit}"
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    if abs(value) >= 10:
        return f"{value:.1f} {unit}"
    if abs(value) >= 0.01:
        return f"{value:.2f} {unit}"
    return f"{value:.4f} {unit}"


def _figure(traces: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A figure from plain dicts, without plotly's per-property validation.

    Validation costs about 25 ms a figure, too slow for a redraw on every slider move; the
    tests validate every figure instead (``go.Figure(fig.to_dict())``).
    """
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


def _layout(**extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "font": {"size": FONT_SIZE, "family": FONT_FAMILY},
        "margin": {"l": 80, "r": 20, "t": 60, "b": 50},
        "plot_bgcolor": "white",
        "paper_bgcolor": "white",
        "hoverlabel": {"font": {"size": SMALL_FONT_SIZE}},
    }
    layout.update(extra)
    return layout


def spread_labels(centres: Sequence[float], min_gap: float) -> list[float]:
    """Move label positions apart so that neighbours are at least `min_gap` apart.

    Keeps the order; pushes labels up from the lowest, then pulls the whole stack down again
    as far as the lowest label's own position allows, so it stays centred on what it names.
    """
    if not centres:
        return []
    order = sorted(range(len(centres)), key=lambda i: centres[i])
    placed: list[float] = []
    for i in order:
        want = centres[i]
        placed.append(want if not placed else max(want, placed[-1] + min_gap))
    wanted = [centres[i] for i in order]
    excess = sum(p - w for p, w in zip(placed, wanted, strict=True)) / len(placed)
    # Pull down by the mean displacement, but keep every label at or above zero.
    shift = max(0.0, min(excess, placed[0]))
    placed = [p - shift for p in placed]
    out = [0.0] * len(centres)
    for slot, i in enumerate(order):
        out[i] = placed[slot]
    return out


def capacity_lines(
    capacities: Iterable[tuple[str, int]], peak_bytes: int, *, max_below: int = 3
) -> list[tuple[str, int]]:
    """The capacities worth drawing: the largest few below the peak, and the first above it.

    Names sharing a size are joined ("L4 / A10"), so each line is drawn once.
    """
    by_size: dict[int, list[str]] = {}
    for name, size in capacities:
        names = by_size.setdefault(int(size), [])
        if name not in names:
            names.append(name)
    sizes = sorted(by_size)
    shown = [s for s in sizes if s < peak_bytes][-max_below:] if max_below else []
    above = [s for s in sizes if s >= peak_bytes]
    if above:
        shown.append(above[0])
    return [(" / ".join(by_size[s][:2]), s) for s in shown]


def capacity_marks(lines: Sequence[tuple[str, int]], unit: Unit, axis_top: float, *,
                   in_margin: bool = False,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Dashed lines at GPU capacities and their labels, kept about one text line apart.

    Labels sit at the plot's right edge on a white box (Compare), or in the right margin when
    the plot has its own labels there (the breakdown's segment labels), so neither hides the
    other; the figure then needs a right margin of CAPACITY_MARGIN.
    """
    label_ys = spread_labels([to_unit(size, unit) for _, size in lines], 0.06 * axis_top)
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for (name, size), label_y in zip(lines, label_ys, strict=True):
        y = to_unit(size, unit)
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                       "y0": y, "y1": y, "line": {"color": "#333", "width": 2, "dash": "dash"}})
        place = ({"xanchor": "left", "yanchor": "middle", "y": label_y} if in_margin else
                 {"xanchor": "right", "yanchor": "bottom", "y": label_y,
                  "bgcolor": "rgba(255,255,255,0.85)"})
        annotations.append({
            "xref": "paper", "x": 1.0, "yref": "y", "showarrow": False,
            "text": f"{name} · {format_bytes(size, unit)}",
            "font": {"size": SMALL_FONT_SIZE, "color": "#333"}, **place,
        })
    return shapes, annotations


def breakdown_figure(
    estimate: Estimate,
    *,
    unit: Unit = "GB",
    capacities: Iterable[tuple[str, int]] = (),
    height: int = 560,
) -> go.Figure:
    """One stacked bar of the buckets (per GPU), each labelled, with GPU capacities as lines.

    `capacities` are ``(name, memory_bytes)`` pairs; the lines below the peak and the first one
    above it are drawn, so the picture shows the smallest card that holds the run.
    """
    peak = estimate.device_peak_bytes
    traces: list[dict[str, Any]] = []
    bottom = 0.0
    centres: list[float] = []
    labels: list[str] = []
    colors: list[str] = []
    x_name = "Per GPU"
    for name in BUCKET_ORDER:
        n_bytes = estimate.bucket(name).bytes
        value = to_unit(n_bytes, unit)
        text = f"{BUCKET_LABELS[name]}: {format_bytes(n_bytes, unit)}"
        traces.append(
            dict(
                type="bar",
                x=[x_name],
                y=[value],
                name=BUCKET_LABELS[name],
                marker={"color": BUCKET_COLORS[name], "line": {"color": "white", "width": 1}},
                hovertemplate=f"{text}<extra></extra>",
                width=0.5,
            )
        )
        centres.append(bottom + value / 2)
        labels.append(text)
        colors.append(BUCKET_COLORS[name])
        bottom += value

    lines = capacity_lines(capacities, peak)
    top = max([to_unit(peak, unit)] + [to_unit(s, unit) for _, s in lines]) * 1.08 or 1.0
    min_gap = top * 0.075
    positions = spread_labels(centres, min_gap)
    annotations: list[dict[str, Any]] = []
    for text, y, label_y, color in zip(labels, centres, positions, colors, strict=True):
        annotations.append(
            {
                # The text sits at the arrow's tail (ax, ay); the head points at the segment.
                "x": 0.27,
                "y": y,
                "xref": "x",
                "yref": "y",
                "ax": 0.36,
                "ay": label_y,
                "axref": "x",
                "ayref": "y",
                "text": f"<span style='color:{color}'>■</span> {text}",
                "showarrow": True,
                "arrowhead": 0,
                "arrowwidth": 1,
                "arrowcolor": "#555",
                "xanchor": "left",
                "font": {"size": FONT_SIZE, "color": "#222"},
                # a capacity line crossing the label passes behind it, not through the text
                "bgcolor": "rgba(255,255,255,0.92)",
            }
        )
    annotations.append(
        {
            "x": x_name,
            "y": to_unit(peak, unit),
            "yshift": 14,
            "showarrow": False,
            "text": f"<b>{format_bytes(peak, unit)}</b>",
            "font": {"size": FONT_SIZE + 4, "color": "#222"},
            "bgcolor": "rgba(255,255,255,0.85)",
        }
    )
    shapes, marks = capacity_marks(lines, unit, top, in_margin=True)
    annotations.extend(marks)
    return _figure(
        traces,
        _layout(
            barmode="stack",
            height=height,
            showlegend=False,
            margin={"l": 80, "r": CAPACITY_MARGIN if lines else 20, "t": 60, "b": 50},
            xaxis={"range": [-0.35, 2.0], "showticklabels": False, "fixedrange": True},
            yaxis={
                "title": {"text": f"memory per GPU ({unit})"},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
            },
            annotations=annotations,
            shapes=shapes,
        ),
    )


def _inference_color(key: str) -> str:
    lowered = key.lower()
    if "weight" in lowered or "param" in lowered:
        return BUCKET_COLORS[BucketName.WEIGHTS]
    if "kv" in lowered or "cache" in lowered:
        return KV_CACHE_COLOR
    return WORKING_COLOR


def inference_figure(estimate: Estimate, *, unit: Unit = "GB", height: int = 460) -> go.Figure:
    """Training (stacked by bucket) next to inference (weights, KV cache, working memory)."""
    traces: list[dict[str, Any]] = []
    for name in BUCKET_ORDER:
        n_bytes = estimate.bucket(name).bytes
        text = f"{BUCKET_LABELS[name]}: {format_bytes(n_bytes, unit)}"
        traces.append(
            dict(
                type="bar",
                x=["Training"],
                y=[to_unit(n_bytes, unit)],
                name=BUCKET_LABELS[name],
                marker={"color": BUCKET_COLORS[name]},
                legendgroup="training",
                hovertemplate=f"{text}<extra></extra>",
            )
        )
    for item in estimate.inference.items:
        traces.append(
            dict(
                type="bar",
                x=["Inference"],
                y=[to_unit(item.bytes, unit)],
                name=item.label,
                marker={"color": _inference_color(item.key)},
                legendgroup="inference",
                hovertemplate=f"{item.label}: {format_bytes(item.bytes, unit)}<extra></extra>",
            )
        )
    train = estimate.device_peak_bytes
    infer = estimate.inference.total_bytes
    top = max(to_unit(train, unit), to_unit(infer, unit)) * 1.25 or 1.0
    annotations = [
        {
            "x": "Training",
            "y": to_unit(train, unit),
            "yshift": 16,
            "showarrow": False,
            "text": f"<b>{format_bytes(train, unit)}</b>",
            "font": {"size": FONT_SIZE + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        },
        {
            "x": "Inference",
            "y": to_unit(infer, unit),
            "yshift": 16,
            "showarrow": False,
            "text": f"<b>{format_bytes(infer, unit)}</b>",
            "font": {"size": FONT_SIZE + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        },
        {
            "xref": "paper",
            "x": 0.5,
            "yref": "paper",
            "y": 1.0,
            "yanchor": "bottom",
            "showarrow": False,
            "text": f"training = <b>{estimate.training_to_inference:.1f}×</b> inference",
            "font": {"size": FONT_SIZE + 2, "color": "#222"},
        },
    ]
    return _figure(
        traces,
        _layout(
            barmode="stack",
            height=height,
            bargap=0.45,
            yaxis={
                "title": {"text": f"memory per GPU ({unit})"},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
            },
            xaxis={"fixedrange": True, "tickfont": {"size": FONT_SIZE + 2}, "tickangle": 0},
            # Colours match the breakdown chart; hovering a segment names it.
            showlegend=False,
            annotations=annotations,
        ),
    )


def compare_figure(
    labelled: Sequence[tuple[str, Estimate]],
    *,
    unit: Unit = "GB",
    capacities: Iterable[tuple[str, int]] = (),
    height: int = 560,
) -> go.Figure:
    """Several setups side by side: one stacked bar each, the total written above it."""
    names = [label for label, _ in labelled]
    traces: list[dict[str, Any]] = []
    for bucket in BUCKET_ORDER:
        values = [to_unit(est.bucket(bucket).bytes, unit) for _, est in labelled]
        texts = [format_bytes(est.bucket(bucket).bytes, unit) for _, est in labelled]
        traces.append(
            dict(
                type="bar",
                x=names,
                y=values,
                name=BUCKET_LABELS[bucket],
                marker={"color": BUCKET_COLORS[bucket], "line": {"color": "white", "width": 1}},
                customdata=texts,
                hovertemplate=f"{BUCKET_LABELS[bucket]}: %{{customdata}}<extra>%{{x}}</extra>",
            )
        )
    peaks = [est.device_peak_bytes for _, est in labelled]
    annotations: list[dict[str, Any]] = [
        {
            "x": name,
            "y": to_unit(peak, unit),
            "yshift": 16,
            "showarrow": False,
            "text": f"<b>{format_bytes(peak, unit)}</b>",
            "font": {"size": FONT_SIZE + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        }
        for name, peak in zip(names, peaks, strict=True)
    ]
    lines = capacity_lines(capacities, max(peaks, default=0))
    top = max([to_unit(p, unit) for p in peaks] + [to_unit(s, unit) for _, s in lines] + [0.0])
    shapes, marks = capacity_marks(lines, unit, top * 1.15)
    annotations.extend(marks)
    return _figure(
        traces,
        _layout(
            barmode="stack",
            height=height,
            bargap=0.35,
            yaxis={
                "title": {"text": f"memory per GPU ({unit})"},
                "range": [0, top * 1.15 or 1.0],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
            },
            xaxis={"fixedrange": True, "tickfont": {"size": SMALL_FONT_SIZE}},
            legend={"font": {"size": SMALL_FONT_SIZE}, "orientation": "h", "y": -0.15},
            annotations=annotations,
            shapes=shapes,
        ),
    )


#: Background colours of the step's phases on the trace timeline (Okabe-Ito, light).
PHASE_COLORS: dict[str, str] = {
    "forward": "rgba(86,180,233,0.15)",
    "backward": "rgba(230,159,0,0.15)",
    "optimizer step": "rgba(0,158,115,0.15)",
}


def timeline_figure(
    points: Sequence[tuple[int, int, str]], *, peak_bytes: int, peak_phase: str,
    unit: Unit = "GB", height: int = 420,
) -> go.Figure:
    """Live bytes over a traced step, phases shaded, the peak marked.

    `points` are (event index, live bytes, phase) as the trace reports them.
    """
    xs = [p[0] for p in points]
    ys = [to_unit(p[1], unit) for p in points]
    shapes: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(points) + 1):
        if i == len(points) or points[i][2] != points[start][2]:
            shapes.append({
                "type": "rect", "xref": "x", "yref": "paper", "x0": points[start][0],
                "x1": points[i - 1][0], "y0": 0, "y1": 1, "line": {"width": 0},
                "fillcolor": PHASE_COLORS.get(points[start][2], "rgba(0,0,0,0.05)"),
                "layer": "below",
            })
            start = i
    peak_index = max(range(len(points)), key=lambda i: points[i][1]) if points else 0
    traces: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "name": "live bytes",
         "line": {"color": BUCKET_COLORS[BucketName.WEIGHTS], "width": 3},
         "hovertemplate": f"%{{y:.2f}} {unit}<extra></extra>"},
    ]
    annotations: list[dict[str, Any]] = []
    if points:
        traces.append({
            "type": "scatter", "mode": "markers", "x": [xs[peak_index]], "y": [ys[peak_index]],
            "name": "peak", "marker": {"size": 16, "color": "#D55E00", "symbol": "star"},
        })
        annotations.append({
            "x": xs[peak_index], "y": ys[peak_index], "xref": "x", "yref": "y", "yshift": 18,
            "showarrow": False, "font": {"size": SMALL_FONT_SIZE},
            "text": f"<b>peak {format_bytes(peak_bytes, unit)}</b> ({peak_phase})",
        })
    return _figure(traces, _layout(
        height=height, showlegend=False, shapes=shapes, annotations=annotations,
        xaxis={"title": {"text": "operation in the traced step"}, "showgrid": False},
        yaxis={"title": {"text": f"live memory ({unit})"}, "rangemode": "tozero",
               "gridcolor": "#eee"},
        title={"text": "Exact trace: live memory over one step (shaded: forward, backward, "
                       "optimizer)", "font": {"size": FONT_SIZE}},
    ))
