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
