"""The plotly figures: pure functions, checked on the data they carry."""

from __future__ import annotations

import itertools
import subprocess
import sys

import plotly.graph_objects as go
import pytest

import vram
from ui import charts, label_layout
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
    assert charts.format_bytes(est.device_peak_bytes, unit) in fig.layout.title.text


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
    assert f"{est.training_to_inference:.1f}×" in fig.layout.title.text
    inference = [b for b in _bars(fig) if b.x[0] == "Inference"]
    assert sum(b.y[0] for b in inference) == pytest.approx(est.inference.total_bytes / 1e9)


def test_column_labels_never_share_a_row() -> None:
    heights = [20.0, 20.0, 30.0, 20.0]
    out = label_layout.spread_in_column([0.0, 5.0, 6.0, 300.0], heights, 0.0, 310.0)
    assert out is not None
    boxes = sorted((c - h / 2, c + h / 2) for c, h in zip(out, heights, strict=True))
    assert boxes[0][0] >= 0.0 and boxes[-1][1] <= 310.0
    assert all(b[0] >= a[1] - 1e-9 for a, b in itertools.pairwise(boxes))
    assert out[3] == pytest.approx(300.0)  # a label with room stays on what it names
    assert label_layout.spread_in_column([0.0] * 4, heights, 0.0, 50.0) is None  # no room


def test_breakdown_labels_do_not_overlap_on_the_estimate(est: vram.Estimate) -> None:
    """The server-side estimate of every label box: none overlaps another (the browser test
    measures the real boxes)."""
    caps = [("T4", 15 * GIB), ("L4", 22 * GIB), ("A100", 40 * GIB), ("H100", 80 * GIB)]
    fig = charts.breakdown_figure(est, capacities=caps)
    scale = (fig.layout.height - fig.layout.margin.t - fig.layout.margin.b) / (
        fig.layout.yaxis.range[1])
    rows = []
    for a in fig.layout.annotations:
        centre = (a.ay if a.showarrow else a.y) * scale
        half = label_layout.text_height_px(a.text, a.font.size) / 2
        rows.append((centre - half, centre + half))
    rows.sort()
    assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(rows))


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


def test_capacity_labels_drop_to_the_hover_when_there_is_no_room(est: vram.Estimate) -> None:
    """Too short a chart for every label: the bucket labels stay, the capacity labels go from
    the smallest card up (their lines keep the hover) rather than overlap or fail."""
    caps = [("T4", 15 * GIB), ("L4", 22 * GIB), ("A100", 40 * GIB), ("H100", 80 * GIB)]
    fig = charts.breakdown_figure(est, capacities=caps, height=260, font_px=22)
    texts = [a.text for a in fig.layout.annotations]
    assert len(BUCKET_ORDER) <= len(texts) < len(BUCKET_ORDER) + len(caps)
    assert not any("T4" in t for t in texts)
    assert any(t.type == "scatter" and "capacity" in t.hovertemplate for t in fig.data)


def test_capacity_labels_give_way_least_telling_first() -> None:
    """Below the peak the smallest card goes first, the lesson's card (kept) last of those;
    the smallest card that holds the run keeps its label longest."""
    sizes = [16 * GIB, 24 * GIB, 80 * GIB, 141 * 10**9, 206 * 10**9]
    order = charts.capacity_label_drop_order(sizes, 196 * 10**9, keep=frozenset({80 * GIB}))
    assert order == [0, 1, 3, 2, 4]
    assert charts.capacity_label_drop_order(sizes, 196 * 10**9) == [0, 1, 2, 3, 4]


def test_presentation_chart_keeps_the_80gb_label_and_one_line_per_capacity() -> None:
    """70B QLoRA with checkpointing off (about 196 GB) on the presentation chart: the lines of
    80 GB, H200 and MI300X are labelled, MI300X's on one line (a projector is wide), and when
    the room runs out it is a smaller card's label that goes, not the lesson's 80 GB one."""
    est = vram.estimate(vram.load_model("llama-3.1-70b"), TrainingSetup(method="qlora"))
    assert est.device_peak_bytes > 150 * 10**9
    h100 = 80 * GIB
    caps = [("Tesla T4", 16 * GIB), ("RTX 4090", 24 * GIB), ("A100-SXM4-40GB", 40 * GIB),
            ("L40S", 48 * 10**9), ("H100 80GB HBM3 (SXM5)", h100), ("H200 (SXM)", 141 * 10**9),
            ("MI300X", 192 * GIB)]
    fig = charts.breakdown_figure(est, capacities=caps, height=385, font_px=22,
                                  min_plot_px=700, keep_labelled=frozenset({h100}))
    texts = [a.text.replace("\u00a0", " ") for a in fig.layout.annotations]
    assert texts[-4:] == ["L40S · 48.0 GB", "H100 80GB HBM3 (SXM5) · 85.9 GB",
                          "H200 (SXM) · 141 GB", "MI300X · 206 GB"]
    shorter = charts.breakdown_figure(est, capacities=caps, height=320, font_px=22,
                                      min_plot_px=700, keep_labelled=frozenset({h100}))
    texts = [a.text.replace("\u00a0", " ") for a in shorter.layout.annotations]
    assert any(t.startswith("H100") for t in texts) and "MI300X · 206 GB" in texts
    assert not any(t.startswith("L40S") for t in texts)  # the least telling label gave way
    # A phone-width chart still wraps the long names so they never reach back over the bar.
    phone = charts.breakdown_figure(est, capacities=caps)
    assert any("<br>" in a.text for a in phone.layout.annotations if "H100" in a.text)


def test_compare_chart_keeps_its_lines_when_labels_run_out_of_room() -> None:
    """A short chart with big type: every capacity line is still drawn; only labels give way,
    and the lesson's 80 GB label is the last below the tallest bar to go."""
    model = vram.load_model("llama-3.1-70b")
    labelled = [(m, vram.estimate(model, TrainingSetup(method=m, grad_ckpt=True)))
                for m in ("full", "lora", "qlora")]
    h100 = 80 * GIB
    caps = [("A", 40 * GIB), ("H100", h100), ("H200", 141 * 10**9), ("MI300X", 192 * GIB)]
    fig = charts.compare_figure(labelled, capacities=caps, height=300, font_px=40,
                                keep_labelled=frozenset({h100}))
    assert len(fig.layout.shapes) == 3  # the three largest below the tallest bar
    texts = [a.text for a in fig.layout.annotations if "·" in a.text]
    assert 0 < len(texts) < 3
    assert any(t.startswith("H100") for t in texts)


@pytest.mark.parametrize(
    ("name", "compact"),
    [
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000"),
        ("NVIDIA H100 80GB HBM3 (SXM5)", "H100 80GB"),
        ("AMD Instinct MI300X", "MI300X"),
        ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),  # one word is never cut
        ("NVIDIA A100 80GB PCIe", "A100 80GB"),
    ],
)
def test_compact_gpu_names_fit_a_big_metric(name: str, compact: str) -> None:
    assert charts.compact_gpu_name(name) == compact
