"""The inference comparison and the exact trace's timeline: pure figure functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from ui.charts import (
    BUCKET_COLORS,
    BUCKET_LABELS,
    FONT_SIZE,
    KV_CACHE_COLOR,
    SMALL_FONT_SIZE,
    WORKING_COLOR,
    Unit,
    figure,
    format_bytes,
    layout,
    to_unit,
)
from vram.result import BUCKET_ORDER, BucketName, Estimate


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
            "yshift": 4,
            "yanchor": "bottom",
            "showarrow": False,
            "text": f"<b>{format_bytes(train, unit)}</b>",
            "font": {"size": FONT_SIZE + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        },
        {
            "x": "Inference",
            "y": to_unit(infer, unit),
            "yshift": 4,
            "yanchor": "bottom",
            "showarrow": False,
            "text": f"<b>{format_bytes(infer, unit)}</b>",
            "font": {"size": FONT_SIZE + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        },
    ]
    return figure(
        traces,
        layout(
            barmode="stack",
            height=height,
            bargap=0.45,
            yaxis={
                "title": {"text": f"memory per GPU ({unit})"},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
                "automargin": True,
            },
            xaxis={"fixedrange": True, "tickfont": {"size": FONT_SIZE + 2}, "tickangle": 0},
            # Colours match the breakdown chart; hovering a segment names it.
            showlegend=False,
            title={"text": f"training = <b>{estimate.training_to_inference:.1f}×</b> inference",
                   "font": {"size": FONT_SIZE + 2, "color": "#222"},
                   "x": 0.01, "xref": "container", "xanchor": "left"},
            margin={"l": 92, "r": 16, "t": 64, "b": 50},
            annotations=annotations,
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
    # The timeline is the short (few-layer) trace; the peak is the full model's, extended from
    # it. The axis covers both, and the full peak is its own line, so neither is off the chart.
    full_peak = to_unit(peak_bytes, unit)
    top = max([*ys, full_peak, 0.0]) * 1.12 or 1.0
    if points:
        traces.append({
            "type": "scatter", "mode": "markers", "x": [xs[peak_index]], "y": [ys[peak_index]],
            "name": "peak", "marker": {"size": 16, "color": "#D55E00", "symbol": "star"},
            "hovertemplate": f"peak of the traced layers: %{{y:.2f}} {unit}<extra></extra>",
        })
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                       "y0": full_peak, "y1": full_peak,
                       "line": {"color": "#D55E00", "width": 2, "dash": "dash"}})
        annotations.append({
            "xref": "paper", "x": 0.0, "xanchor": "left", "y": full_peak, "yref": "y",
            "yanchor": "bottom", "showarrow": False, "font": {"size": SMALL_FONT_SIZE},
            "text": f"<b>peak {format_bytes(peak_bytes, unit)}</b> ({peak_phase}), all layers",
        })
    return figure(traces, layout(
        height=height, showlegend=False, shapes=shapes, annotations=annotations,
        xaxis={"title": {"text": "operation in the traced step"}, "showgrid": False},
        yaxis={"title": {"text": f"live memory ({unit})"}, "range": [0, top],
               "gridcolor": "#eee", "automargin": True},
        title={"text": "Exact trace: live memory over one step (shaded: forward, backward, "
                       "optimizer)", "font": {"size": FONT_SIZE}},
    ))
