"""The plotly figures: pure functions, checked on the data they carry."""

from __future__ import annotations

import itertools
import subprocess
import sys

import plotly.graph_objects as go
import pytest

import vram
from ui import charts
from vram.result import BUCKET_ORDER
from vram.setup import TrainingSetup

GIB = 2**30


@pytest.fixture(scope="module")
def est() -> vram.Estimate:
    return vram.estimate(vram.load_model("llama-3.1-8b"), TrainingSetup(method="full"))


def _bars(fig: go.Figure) -> list[go.Bar]:
    return [t for t in fig.data if t.type == "bar"]


def test_charts_do_not_import_streamlit() -> None:
    code = "import sys, ui.charts; sys.exit('streamlit' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("unit", ["GB", "GiB"])
def test_breakdown_segments_sum_to_the_peak(est: vram.Estimate, unit: charts.Unit) -> None:
    fig = charts.breakdown_figure(est, unit=unit, capacities=[("RTX 4090", 24 * GIB)])
    bars = _bars(fig)
    assert [b.name for b in bars] == [charts.BUCKET_LABELS[n] for n in BUCKET_ORDER]
    total = sum(b.y[0] for b in bars)
    assert total == pytest.approx(est.device_peak_bytes / charts.UNIT_BYTES[unit])
    texts = " ".join(a.text for a in fig.layout.annotations)
    for name in BUCKET_ORDER:  # every segment carries its size
        assert charts.format_bytes(est.bucket(name).bytes, unit) in texts
    assert charts.format_bytes(est.device_peak_bytes, unit) in texts


def test_bucket_colours_are_fixed_and_distinct(est: vram.Estimate) -> None:
    assert len(set(charts.BUCKET_COLORS.values())) == len(BUCKET_ORDER)
    for fig in (
        charts.breakdown_figure(est),
        charts.inference_figure(est),
        charts.compare_figure([("a", est), ("b", est)]),
    ):
        for bar in _bars(fig)[: len(BUCKET_ORDER)]:
            name = next(n for n in BUCKET_ORDER if charts.BUCKET_LABELS[n] == bar.name)
            assert bar.marker.color == charts.BUCKET_COLORS[name]


def test_figures_are_valid_plotly_with_big_text(est: vram.Estimate) -> None:
    figs = [
        charts.breakdown_figure(est, capacities=[("H100", 80 * GIB), ("T4", 15 * GIB)]),
        charts.inference_figure(est, unit="GiB"),
        charts.compare_figure([("full", est), ("again", est)], capacities=[("A100", 80 * GIB)]),
    ]
    for fig in figs:
        go.Figure(fig.to_dict())  # the app skips validation for speed; this is where it happens
        assert fig.layout.font.size >= 16
        for annotation in fig.layout.annotations:
            assert annotation.font.size is None or annotation.font.size >= 16


def test_capacity_lines_show_the_first_card_that_holds_it() -> None:
    caps = [
        ("T4", 15 * GIB),
        ("L4", 22 * GIB),
        ("A10", 22 * GIB),
        ("A100", 80 * GIB),
        ("H200", 141 * GIB),
    ]
    lines = charts.capacity_lines(caps, peak_bytes=30 * GIB)
    assert [size for _, size in lines] == [15 * GIB, 22 * GIB, 80 * GIB]
    assert lines[1][0] == "L4 / A10"


def test_inference_figure_writes_the_multiple(est: vram.Estimate) -> None:
    fig = charts.inference_figure(est)
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert f"{est.training_to_inference:.1f}×" in texts
    inference = [b for b in _bars(fig) if b.x[0] == "Inference"]
    assert sum(b.y[0] for b in inference) == pytest.approx(est.inference.total_bytes / 1e9)


def test_spread_labels_keeps_order_and_gap() -> None:
    out = charts.spread_labels([0.0, 0.1, 0.2, 10.0], min_gap=1.0)
    assert out == sorted(out)
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(out))


@pytest.mark.parametrize(
    ("n_bytes", "unit", "text"),
    [
        (0, "GB", "0 GB"),
        (16 * 10**9, "GB", "16.0 GB"),
        (80 * GIB, "GiB", "80.0 GiB"),
        (840 * 10**9, "GB", "840 GB"),
        (5 * 10**8, "GB", "0.50 GB"),
    ],
)
def test_format_bytes(n_bytes: int, unit: charts.Unit, text: str) -> None:
    assert charts.format_bytes(n_bytes, unit) == text
