"""The plan's path as a waterfall of memory per GPU, the card's capacity as a line (pure
plotly, no Streamlit; tested on its data).

    >>> fig = path_figure(plan, unit="GB")
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from ui import label_layout
from ui.charts import (
    FONT_FAMILY,
    FONT_SIZE,
    MIN_PLOT_PX,
    SMALL_FONT_SIZE,
    Unit,
    format_bytes,
    to_unit,
    wrap_label,
)
from vram.plan.planner import Plan

SAVED_COLOR = "#009E73"  # Okabe-Ito bluish green: memory given back
PEAK_COLOR = "#0072B2"  # blue: a total
OVER_COLOR = "#D55E00"  # vermillion: a total over the capacity


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
    """The waterfall, laid out so no two texts meet at any width: step names wrapped to their
    bar's share of the narrowest plot (never rotated), each size inside its own bar (hidden,
    left to the hover, where it does not fit), and the capacity label in a right margin sized
    to it, where no bar's text can reach."""
    rows = path_rows(plan)
    final = rows[-1]["bytes"]
    font_px = SMALL_FONT_SIZE
    max_chars = max(6, int(MIN_PLOT_PX / max(1, len(rows))
                           / (label_layout.CHAR_WIDTH_EM * font_px)))
    labels = [wrap_label(row["label"], max_chars) for row in rows]
    tick_lines = max(label.count("<br>") + 1 for label in labels)
    sizes = [format_bytes(abs(row["bytes"]), unit) for row in rows]
    fig = go.Figure(go.Waterfall(
        x=labels,
        y=[to_unit(row["bytes"], unit) for row in rows],
        measure=[row["measure"] for row in rows],
        text=sizes,
        textposition="inside",
        textfont={"size": font_px},
        customdata=[[row["label"].replace("<br>", " "), size] for row, size in zip(
            rows, sizes, strict=True)],
        hovertemplate="%{customdata[0]}: %{customdata[1]}<extra></extra>",
        decreasing={"marker": {"color": SAVED_COLOR}},
        increasing={"marker": {"color": OVER_COLOR}},
        totals={"marker": {"color": PEAK_COLOR if final <= plan.usable_bytes else OVER_COLOR}},
        connector={"line": {"color": "#999999"}},
    ))
    capacity = to_unit(plan.usable_bytes, unit)
    cap_text = wrap_label(f"{plan.hardware.gpu}: {format_bytes(plan.usable_bytes, unit)}", 14)
    fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=capacity, y1=capacity,
                  line={"color": "#333333", "dash": "dash", "width": 2})
    fig.add_annotation(xref="paper", x=1.0, xanchor="left", xshift=6, yref="y", y=capacity,
                       showarrow=False, text=cap_text,
                       font={"size": font_px, "color": "#333333"})
    top = max(to_unit(plan.device_peak_bytes, unit), capacity) * 1.08 or 1.0
    fig.update_layout(
        # Room for the axis labels inside the figure: with 10 px margins the tick labels and the
        # step names were drawn outside it and cut (the browser test measures every text).
        height=height, showlegend=False,
        margin={"l": 92, "r": int(label_layout.text_width_px(cap_text, font_px)) + 16,
                "t": 30, "b": int(tick_lines * font_px * 1.4) + 24},
        font={"family": FONT_FAMILY, "size": FONT_SIZE},
        uniformtext={"minsize": font_px, "mode": "hide"},
        yaxis={"title": f"memory per GPU ({unit})", "range": [0, top], "automargin": True},
        xaxis={"tickangle": 0, "tickfont": {"size": font_px}},
        plot_bgcolor="white",
    )
    return fig
