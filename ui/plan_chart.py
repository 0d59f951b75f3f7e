"""The plan's path as a waterfall of memory per GPU, the card's capacity as a line (pure
plotly, no Streamlit; tested on its data).

    >>> fig = path_figure(plan, unit="GB")
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from ui.charts import (
    FONT_FAMILY,
    FONT_SIZE,
    SMALL_FONT_SIZE,
    Unit,
    chart_text,
    format_bytes,
    short_gpu_name,
    to_unit,
    wrap_label,
)
from vram.plan.planner import Plan

SAVED_COLOR = "#009E73"  # Okabe-Ito bluish green: memory given back
PEAK_COLOR = "#0072B2"  # blue: a total
OVER_COLOR = "#D55E00"  # vermillion: a total over the capacity


def gpu_name(plan: Plan) -> str:
    """The planned GPU's short name (its catalog id when no option names it), to read."""
    return short_gpu_name(next((o.name for o in plan.options if o.gpu == plan.hardware.gpu),
                               plan.hardware.gpu))


def path_rows(plan: Plan) -> list[dict[str, Any]]:
    """The bars: the setup's peak, each step's saving (negative), the final peak."""
    rows: list[dict[str, Any]] = [{"label": "your setup", "measure": "absolute",
                                   "bytes": plan.device_peak_bytes}]
    for step in plan.path:
        rows.append({"label": step.name, "measure": "relative", "bytes": -step.saved_bytes})
    if plan.path:
        rows.append({"label": "after the path", "measure": "total",
                     "bytes": plan.path[-1].device_peak_bytes})
    return rows


def path_figure(plan: Plan, *, unit: Unit = "GB", height: int = 420) -> go.Figure:
    """The waterfall on its side, laid out so no two texts meet at any width: each step's name
    on its own row of the y axis (wrapped, never rotated), each size inside its own bar
    (hidden, left to the hover, where it does not fit), and the capacity label above the plot
    at its line, where no bar's text can reach."""
    rows = path_rows(plan)
    final = rows[-1]["bytes"]
    font_px = SMALL_FONT_SIZE
    labels = [wrap_label(row["label"], 18) for row in rows]
    sizes = [format_bytes(abs(row["bytes"]), unit) for row in rows]
    fig = go.Figure(go.Waterfall(
        orientation="h",
        y=labels,
        x=[to_unit(row["bytes"], unit) for row in rows],
        measure=[row["measure"] for row in rows],
        text=sizes,
        textposition="inside",
        textfont={"size": font_px},
        customdata=[[row["label"], size] for row, size in zip(rows, sizes, strict=True)],
        hovertemplate="%{customdata[0]}: %{customdata[1]}<extra></extra>",
        decreasing={"marker": {"color": SAVED_COLOR}},
        increasing={"marker": {"color": OVER_COLOR}},
        totals={"marker": {"color": PEAK_COLOR if final <= plan.usable_bytes else OVER_COLOR}},
        connector={"line": {"color": "#999999"}},
    ))
    capacity = to_unit(plan.usable_bytes, unit)
    top = max(to_unit(plan.device_peak_bytes, unit), capacity) * 1.05 or 1.0
    fig.add_shape(type="line", yref="paper", y0=0, y1=1, xref="x", x0=capacity, x1=capacity,
                  line={"color": "#333333", "dash": "dash", "width": 2})
    fig.add_annotation(yref="paper", y=1.0, yanchor="bottom", xref="x", x=capacity,
                       xanchor="right" if capacity > top / 2 else "left", showarrow=False,
                       text=f"{chart_text(gpu_name(plan))}: "
                            f"{format_bytes(plan.usable_bytes, unit)}",
                       font={"size": font_px, "color": "#333333"})
    fig.update_layout(
        height=max(height, 70 * len(rows) + 80), showlegend=False,
        margin={"l": 16, "r": 16, "t": 40, "b": 56},
        font={"family": FONT_FAMILY, "size": FONT_SIZE},
        uniformtext={"minsize": font_px, "mode": "hide"},
        xaxis={"title": f"memory per GPU ({unit})", "range": [0, top], "automargin": True},
        yaxis={"autorange": "reversed", "tickfont": {"size": font_px}, "automargin": True},
        plot_bgcolor="white",
    )
    return fig
