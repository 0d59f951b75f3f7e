"""'Verify with an exact trace' in the calculator, and its timeline chart."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from ui import step_charts


def test_timeline_marks_the_peak_and_shades_phases() -> None:
    points = [(0, 10, "forward"), (1, 30, "forward"), (2, 50, "backward"), (3, 20, "backward"),
              (4, 40, "optimizer step")]
    fig = step_charts.timeline_figure(points, peak_bytes=50, peak_phase="backward", unit="GB")
    go.Figure(fig.to_dict())  # valid plotly
    line, peak = fig.data
    assert list(line.y) == [p[1] / 1e9 for p in points]
    assert list(peak.x) == [2]
    assert [s.fillcolor for s in fig.layout.shapes if s.type == "rect"] == [
        step_charts.PHASE_COLORS["forward"], step_charts.PHASE_COLORS["backward"],
        step_charts.PHASE_COLORS["optimizer step"]]
    assert "backward" in fig.layout.annotations[0].text


def test_the_timeline_axis_covers_the_full_models_peak() -> None:
    """The timeline is a few-layer trace; the peak is the whole model's (1,129 GB against
    80 GB): the axis must reach it, and a line marks it."""
    points = [(0, 10 * 10**9, "forward"), (1, 80 * 10**9, "backward")]
    fig = step_charts.timeline_figure(points, peak_bytes=1_129 * 10**9, peak_phase="backward")
    assert fig.layout.yaxis.range[1] >= 1_129
    assert any(s.type == "line" and s.y0 == 1_129 for s in fig.layout.shapes)
    assert "1,129 GB" in fig.layout.annotations[0].text


@pytest.mark.parametrize(("value", "text"), [(-0.04, "0.0 %"), (0.0, "0.0 %"), (1.26, "+1.3 %"),
                                             (-3.44, "-3.4 %")])
def test_differences_never_read_minus_zero(value: float, text: str) -> None:
    from ui.verify import signed_pct

    assert signed_pct(value) == text


def test_without_the_extra_the_panel_says_how_to_install(
    app: AppTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ui.verify

    monkeypatch.setattr(ui.verify, "trace_available", lambda: False)
    app.run()
    assert not app.exception
    assert any(".[trace]" in info.value for info in app.info)


@pytest.mark.trace
def test_running_the_trace_shows_both_sides(app: AppTest) -> None:
    pytest.importorskip("torch")
    app.query_params.update({"model": "llama-3.2-1b", "method": "full", "seq": "512",
                             "prec": "bf16-true"})
    app.run()
    app.button(key="trace").click().run(timeout=180)
    assert not app.exception, [e.value for e in app.exception]
    table = app.dataframe[-1].value
    assert list(table[""]) == ["weights", "gradients", "optimizer", "activations",
                               "allocated peak"]
    assert any(chart.proto.spec and "Exact trace" in chart.proto.spec
               for chart in app.get("plotly_chart"))
