"""Presentation mode (`present=1` in the URL, a toggle): for a projector at the back of a room.

Large type, no sidebar and no page title, the peak and one big four-bucket chart above the
fold at 1280x720, and chart text at a bigger size. The state key is a view key
(ui.results.DISPLAY_KEYS): it changes how a page looks, never the estimate.
"""

from __future__ import annotations

import streamlit as st

#: Chart text in presentation mode (px): readable from about 10 m on a 1280x720 projector.
FONT_PX = 22
#: The big chart's height (px): with the metrics above it, it ends above a 720 px fold.
CHART_HEIGHT = 385
#: The narrowest plot the big chart gets in this mode (a 1024 px projector, less the axis and
#: the page's padding): capacity labels wrap to this, not to a phone's width.
MIN_PLOT_PX = 700
#: The narrowest a chart is drawn in this mode (CSS below): the projector's layout, scrolled
#: sideways on a screen narrower than that rather than cut.
MIN_FIGURE_PX = 840

_CSS = """
<style>
[data-testid="stSidebar"], [data-testid="stSidebarCollapsedControl"],
[data-testid="stToolbar"], h1 { display: none !important; }
[data-testid="stHeader"] { background: transparent; height: 0; pointer-events: none; }
.block-container, [data-testid="stMainBlockContainer"] {
  padding-top: 0.75rem !important; max-width: 100%% !important;
}
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li {
  font-size: 1.25rem; color: #000;
}
[data-testid="stMetricValue"], [data-testid="stMetricValue"] * {
  font-size: 3.2rem !important; color: #000; line-height: 1.15;
}
[data-testid="stMetricLabel"] p { font-size: 1.35rem !important; color: #000; }
/* Tables in the mode's font (they are HTML here: ui.tables.show), the bar's controls too. */
[data-testid="stTable"] th, [data-testid="stTable"] td {
  font-size: 1.2rem !important; color: #000; line-height: 1.35;
}
[data-testid="stButtonGroup"] button p, [data-testid="stMainBlockContainer"] label p {
  font-size: 1.25rem !important;
}
/* Charts keep the projector's layout on a narrow screen: scrolled, never cut. */
[data-testid="stFullScreenFrame"]:has([data-testid="stPlotlyChart"]),
[data-testid="stPlotlyChart"] { min-width: %(min_figure_px)spx; }
[data-testid="stElementContainer"]:has([data-testid="stPlotlyChart"]) { overflow-x: auto; }
</style>
"""


def is_on() -> bool:
    return bool(st.session_state.get("present"))


def toggle() -> None:
    st.toggle("Presentation", key="present",
              help="Large type, no sidebar, the peak and the chart above the fold; "
                   "also in the link (present=1).")


def style() -> None:
    if is_on():
        st.html(_CSS % {"min_figure_px": MIN_FIGURE_PX})
