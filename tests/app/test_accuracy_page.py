"""The 'How right is it?' computations (ui.accuracy) agree with `vram validate`."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import pytest

from ui import accuracy
from vram.io import validate


def test_shared_points_summarise_as_validate_does(cases_csv: Path) -> None:
    points, results = accuracy.shared_points(cases_csv)
    summary = validate.summarize(results)
    mine = accuracy.error_summary(points)
    assert mine["cases"] == summary.cases
    assert mine["median_abs_pct"] == pytest.approx(summary.median_abs_pct, abs=0.05)
    assert mine["max_abs_pct"] == pytest.approx(summary.max_abs_pct, abs=0.05)


def test_a_missing_case_file_gives_nothing_not_an_error(tmp_path: Path) -> None:
    assert accuracy.shared_points(tmp_path / "absent.csv") == ([], [])
    assert accuracy.trace_agreement(tmp_path / "absent.txt") is None


def test_h200_points_filters_and_the_scatter() -> None:
    points = accuracy.h200_points()
    assert points and {p.metric for p in points} == {"allocated", "reserved", "device"}
    qlora = accuracy.filter_points(points, methods=["qlora"], metrics=["allocated"])
    assert qlora and all(p.method == "qlora" and p.metric == "allocated" for p in qlora)
    fig = accuracy.scatter_figure(qlora)
    go.Figure(fig.to_dict())
    line = fig.data[0]
    assert list(line.x) == list(line.y)  # the y = x line
    assert sum(len(t.x) for t in fig.data[1:]) == len(qlora)


def test_trace_grid_agreement_is_read() -> None:
    grid = accuracy.trace_agreement()
    assert grid is not None and grid.rows >= 100 and grid.agreeing <= grid.rows


def test_the_page_keeps_published_runs_and_our_steps_apart() -> None:
    """It opens on the published runs with the README's figures (73 runs, 20.4 % in
    benchmarks/validation.txt's last line), and shows our H200 steps only when chosen: the
    two are never one number (they once read "256 runs, largest error 86.5 %")."""
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import ROOT

    last = (ROOT / "benchmarks" / "validation.txt").read_text().strip().splitlines()[-1]
    fields = dict(part.split("=") for part in last.split())
    app = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    app.run()
    app.switch_page("pages/5_How_right_is_it.py").run()
    assert not app.exception
    values = [m.value for m in app.metric]
    assert values[0] == fields["cases"]
    assert values[2] == f"{float(fields['max_abs_pct']):.1f} %"
    app.segmented_control(key="acc_source").set_value(accuracy.OURS).run()
    assert not app.exception
    ours = accuracy.h200_points()
    assert app.metric[0].value == f"{len(ours):,}"
    assert "Not in the README's table" in " ".join(c.value for c in app.caption)
