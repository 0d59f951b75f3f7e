"""The plan's path as a waterfall of memory per GPU, the card's capacity as a line (pure
plotly, no Streamlit; tested on its data).

    >>> fig = path_figure(plan, unit="GB")
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from ui.charts import FONT_FAMILY, FONT_SIZE, SMALL_FONT_SIZE, Unit, format_bytes, to_unit
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
    rows = path_rows(plan)
    final = rows[-1]["bytes"]
    fig = go.Figure(go.Waterfall(
        x=[row["label"] for row in rows],
        y=[to_unit(row["bytes"], unit) for row in rows],
        measure=[row["measure"] for row in rows],
        text=[format_bytes(abs(row["bytes"]), unit) for row in rows],
        textposition="outside",
        decreasing={"marker": {"color": SAVED_COLOR}},
        increasing={"marker": {"color": OVER_COLOR}},
        totals={"marker": {"color": PEAK_COLOR if final <= plan.usable_bytes else OVER_COLOR}},
        connector={"line": {"color": "#999999"}},
    ))
    fig.add_hline(y=to_unit(plan.usable_bytes, unit), line_dash="dash", line_color="#333333",
                  annotation_text=f"{plan.hardware.gpu}: {format_bytes(plan.usable_bytes, unit)}",
                  annotation_font_size=SMALL_FONT_SIZE)
    fig.update_layout(
        # Room for the axis labels inside the figure: with 10 px margins the tick labels and the
        # step names were drawn outside it and cut (the browser test measures every text).
        height=height, margin={"l": 92, "r": 16, "t": 40, "b": 40}, showlegend=False,
        font={"family": FONT_FAMILY, "size": FONT_SIZE},
        yaxis={"title": f"memory per GPU ({unit})", "rangemode": "tozero", "automargin": True},
        xaxis={"automargin": True},
        plot_bgcolor="white",
    )
    return fig
