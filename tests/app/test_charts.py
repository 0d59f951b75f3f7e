"""The plotly figures: pure functions, checked on the data they carry."""

from __future__ import annotations

import itertools
import subprocess
import sys

import plotly.graph_objects as go
import pytest

import vram
from ui import breakdown_chart, charts, compare_chart, label_layout, step_charts
from vram.result import BUCKET_ORDER
from vram.setup import TrainingSetup
from vram.step.through_step import through_step

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
    """The peak's bar sums to the peak; the faded bar beside it (8B full: gradients 0 at the
    loss, 32.1 GB at the optimizer step) sums each bucket at its most."""
    fig = breakdown_chart.breakdown_figure(est, unit=unit, capacities=[("RTX 4090", 24 * GIB)])
    peak_bars = [b for b in _bars(fig) if b.x[0] == 0]
    step_bars = [b for b in _bars(fig) if b.x[0] == breakdown_chart.STEP_X]
    assert [b.name for b in peak_bars] == [charts.BUCKET_LABELS[n] for n in BUCKET_ORDER]
    total = sum(b.y[0] for b in peak_bars)
    assert total == pytest.approx(est.device_peak_bytes / charts.UNIT_BYTES[unit])
    most = sum(r.most_bytes for r in through_step(est)) / charts.UNIT_BYTES[unit]
    assert sum(b.y[0] for b in step_bars) == pytest.approx(most)
    assert all(b.opacity < 1 for b in step_bars)
    texts = " ".join(a.text for a in fig.layout.annotations).replace("\u00a0", " ")
    for name in BUCKET_ORDER:  # every segment carries its size
        assert charts.format_bytes(est.bucket(name).bytes, unit) in texts
    assert charts.format_bytes(est.device_peak_bytes, unit) in fig.layout.title.text
    assert list(fig.layout.xaxis.ticktext) == ["most", "peak"]


def test_a_zero_at_the_peak_never_stands_without_its_reason() -> None:
    """8B full: "Gradients: 0 GB" names the optimizer step, where all 32.1 GB exist; QLoRA's
    adapters' gradients (under 1 % of the peak) get no second bar, but their 0 says "none
    yet"."""
    full = vram.estimate(vram.load_model("llama-3.1-8b"), TrainingSetup(method="full"))
    texts = [a.text.replace("<br>", " ").replace("\u00a0", " ") for a in
             breakdown_chart.breakdown_figure(full, min_plot_px=700).layout.annotations]
    assert "Gradients: 0 GB (32.1 GB at the optimizer step)" in texts
    qlora = vram.estimate(vram.load_model("llama-3.1-8b"), TrainingSetup(method="qlora"))
    fig = breakdown_chart.breakdown_figure(qlora)
    texts = [a.text.replace("<br>", " ").replace("\u00a0", " ")
             for a in fig.layout.annotations]
    assert "Gradients: 0 GB (none yet)" in texts
    assert not [b for b in _bars(fig) if b.x[0] != 0]  # one bar: nothing material differs


def _label_boxes(fig: go.Figure) -> tuple[list[tuple[str, float, float, float]], list[float]]:
    """(text, centre, bottom, top) of every label in px, and every capacity line in px."""
    scale = (fig.layout.height - fig.layout.margin.t - fig.layout.margin.b) / (
        fig.layout.yaxis.range[1])
    lines = [t.y[0] * scale for t in fig.data if t.type == "scatter"]
    boxes = []
    for a in fig.layout.annotations:
        centre = (a.ay if a.showarrow else a.y) * scale
        half = label_layout.text_height_px(a.text, a.font.size) / 2
        boxes.append((a.text, centre, centre - half, centre + half))
    return boxes, lines


@pytest.mark.parametrize(("slug", "method", "ckpt"), [
    ("llama-3.1-8b", "full", False), ("llama-3.1-8b", "qlora", False),
    ("llama-3.1-70b", "full", False), ("llama-3.1-70b", "qlora", False),
    ("llama-3.1-70b", "qlora", True), ("llama-3.1-70b", "lora", True)])
@pytest.mark.parametrize(("height", "font_px", "min_plot_px"), [(560, 16, 260), (385, 22, 700)])
def test_capacity_labels_sit_on_their_own_line(slug: str, method: str, ckpt: bool, height: int,
                                               font_px: int, min_plot_px: int) -> None:
    """Each capacity label holds its own line inside its box and no other line; no bucket
    label has a line through it; no two labels overlap (server-side extents)."""
    est = vram.estimate(vram.load_model(slug), TrainingSetup(method=method, grad_ckpt=ckpt))
    caps = [("Tesla T4", 16 * GIB), ("RTX 4090", 24 * GIB), ("A100-SXM4-40GB", 40 * GIB),
            ("L40S", 45 * GIB), ("H100", 80 * GIB), ("H200", 141 * 10**9),
            ("MI300X", 192 * GIB)]
    fig = breakdown_chart.breakdown_figure(est, capacities=caps, height=height,
                                           font_px=font_px, min_plot_px=min_plot_px,
                                           keep_labelled=frozenset({80 * GIB}))
    boxes, lines = _label_boxes(fig)
    for text, _, bottom, top in boxes:
        inside = [line for line in lines if bottom - 1 <= line <= top + 1]
        if "·" in text:  # a capacity label: exactly its own line, well inside
            assert len(inside) == 1, text
            assert bottom + label_layout.LINE_MARGIN_PX - 0.01 <= inside[0], text
            assert inside[0] <= top - label_layout.LINE_MARGIN_PX + 0.01, text
        else:
            assert not inside, text
    rows = sorted((b, t) for _, _, b, t in boxes)
    assert all(b[0] >= a[1] - 1e-6 for a, b in itertools.pairwise(rows))
    named = [text for text, *_ in boxes if "·" in text]
    assert len(named) == len([t for t in fig.data if t.type == "scatter"])  # no unnamed line
    assert named  # at least the lesson's card or the one that holds the run


def test_bucket_colours_are_fixed_and_distinct(est: vram.Estimate) -> None:
    assert len(set(charts.BUCKET_COLORS.values())) == len(BUCKET_ORDER)
    for fig in (
        breakdown_chart.breakdown_figure(est),
        step_charts.inference_figure(est),
        compare_chart.compare_figure([("a", est), ("b", est)]),
    ):
        for bar in _bars(fig)[: len(BUCKET_ORDER)]:
            label = bar.name.removesuffix(" (most)")
            name = next(n for n in BUCKET_ORDER if charts.BUCKET_LABELS[n] == label)
            assert bar.marker.color == charts.BUCKET_COLORS[name]


def test_figures_are_valid_plotly_with_big_text(est: vram.Estimate) -> None:
    figs = [
        breakdown_chart.breakdown_figure(est, capacities=[("H100", 80 * GIB), ("T4", 15 * GIB)]),
        step_charts.inference_figure(est, unit="GiB"),
        compare_chart.compare_figure([("full", est), ("again", est)],
                                     capacities=[("A100", 80 * GIB)]),
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
    fig = step_charts.inference_figure(est)
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
    fig = breakdown_chart.breakdown_figure(est, capacities=caps)
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


def test_capacities_give_way_when_there_is_no_room(est: vram.Estimate) -> None:
    """Too short a chart for every label: the bucket labels stay; the capacities go from the
    smallest card up, each line with its label, so no dashed line is left unnamed."""
    caps = [("T4", 15 * GIB), ("L4", 22 * GIB), ("A100", 40 * GIB), ("H100", 80 * GIB)]
    tall = breakdown_chart.breakdown_figure(est, capacities=caps)
    short = breakdown_chart.breakdown_figure(est, capacities=caps, height=300, font_px=22)
    for fig in (tall, short):
        named = [a.text for a in fig.layout.annotations if "·" in a.text]
        lines = [t for t in fig.data if t.type == "scatter"]
        assert len(named) == len(lines)
        assert len([a for a in fig.layout.annotations if "·" not in a.text]) == len(BUCKET_ORDER)
    assert [t for t in tall.data if t.type == "scatter"]
    assert not [t for t in short.data if t.type == "scatter"]


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
    fig = breakdown_chart.breakdown_figure(est, capacities=caps, height=385, font_px=22,
                                  min_plot_px=700, keep_labelled=frozenset({h100}))
    texts = [a.text.replace("\u00a0", " ") for a in fig.layout.annotations]
    # No bucket label may sit on a line, so L40S's label, the least telling, gives way.
    assert texts[-3:] == ["H100 80GB HBM3 (SXM5) · 85.9 GB", "H200 (SXM) · 141 GB",
                          "MI300X · 206 GB"]
    shorter = breakdown_chart.breakdown_figure(est, capacities=caps, height=320, font_px=22,
                                               min_plot_px=700, keep_labelled=frozenset({h100}))
    texts = [a.text.replace("\u00a0", " ") for a in shorter.layout.annotations]
    assert any(t.startswith("H100") for t in texts) and "MI300X · 206 GB" in texts
    assert not any(t.startswith(("L40S", "H200")) for t in texts)  # the less telling gave way
    # A phone-width chart still wraps the long names so they never reach back over the bar.
    phone = breakdown_chart.breakdown_figure(est, capacities=caps)
    assert any("<br>" in a.text for a in phone.layout.annotations if "H100" in a.text)


def test_compare_chart_gives_way_line_and_label_together() -> None:
    """A short chart with big type: capacities give way, each line with its label (no line is
    left unnamed), and the lesson's 80 GB is the last below the tallest bar to go."""
    model = vram.load_model("llama-3.1-70b")
    labelled = [(m, vram.estimate(model, TrainingSetup(method=m, grad_ckpt=True)))
                for m in ("full", "lora", "qlora")]
    h100 = 80 * GIB
    caps = [("A", 40 * GIB), ("H100", h100), ("H200", 141 * 10**9), ("MI300X", 192 * GIB)]
    fig = compare_chart.compare_figure(labelled, capacities=caps, height=720, font_px=40,
                                       keep_labelled=frozenset({h100}))
    texts = [a.text for a in fig.layout.annotations if "·" in a.text]
    assert 0 < len(texts) == len(fig.layout.shapes) < 3
    assert any(t.startswith("H100") for t in texts)


def _total_boxes(fig: go.Figure) -> tuple[list[tuple[float, float]], list[float], float]:
    m = fig.layout.margin
    scale = (fig.layout.height - m.t - m.b) / fig.layout.yaxis.range[1]
    totals = [(a.y * scale, a.y * scale + label_layout.text_height_px(a.text, a.font.size))
              for a in fig.layout.annotations if a.xref != "paper"]
    lines = [s.y0 * scale for s in fig.layout.shapes]
    return totals, lines, scale


def test_no_line_crosses_a_total_and_totals_clear_their_neighbours() -> None:
    """70B QLoRA (65.1 GB) under the 80 GB line and 8B QLoRA near the 48 GB lines: each total
    moves above the line it would cross; on a phone neighbouring totals would touch, so the
    later one moves above the earlier; the legend is the page's, so the plot keeps its
    height."""
    pins = [("llama-3.1-8b", "full"), ("llama-3.1-8b", "qlora"), ("llama-3.1-70b", "qlora"),
            ("llama-3.1-70b", "lora")]
    labelled = [(f"{n + 1}. {slug} · {m}", vram.estimate(vram.load_model(slug),
                                                        TrainingSetup(method=m, grad_ckpt=True)))
                for n, (slug, m) in enumerate(pins)]
    caps = [("RTX 4090", 24 * GIB), ("A100-SXM4-40GB", 40 * GIB), ("L40S", 45 * GIB),
            ("H100 80GB HBM3 (SXM5)", 80 * GIB), ("H200 (SXM)", 141 * 10**9),
            ("MI300X", 192 * GIB)]
    fig = compare_chart.compare_figure(labelled, capacities=caps)
    totals, lines, _ = _total_boxes(fig)
    assert len(totals) == 4
    for bottom, top in totals:
        assert not [line for line in lines if bottom - 1 < line < top + 1]
    for (b1, t1), (b2, t2) in itertools.pairwise(totals):  # neighbours on a phone
        assert t1 <= b2 + 1e-6 or t2 <= b1 + 1e-6
    assert not fig.layout.showlegend
    assert fig.layout.margin.t + fig.layout.margin.b < fig.layout.height / 3
    ticks = list(fig.data[0].x)
    assert all(t.count("<br>") < compare_chart.TICK_LINES for t in ticks)
    # the words that tell them apart, upright: four bars on a phone are too narrow for them
    assert [t.replace("<br>", " ") for t in ticks] == [
        "1. llama-3.1-8b full", "2. llama-3.1-8b qlora", "3. llama-3.1-70b qlora",
        "4. llama-3.1-70b lora"]
    assert fig.layout.xaxis.tickangle == -90


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


@pytest.mark.parametrize("unit", ["GB", "GiB"])
def test_the_band_is_a_box_on_the_peaks_bar(est: vram.Estimate, unit: charts.Unit) -> None:
    """The device figure's band (Estimate.bounds) as a shape on the peak's bar, from its low
    to its high bound, in the chart's unit; no line is added (capacity lines are scatters)."""
    fig = breakdown_chart.breakdown_figure(est, unit=unit, capacities=[("RTX 4090", 24 * GIB)])
    (box,) = fig.layout.shapes
    low, high = est.bounds.device
    assert box.type == "rect" and box.x0 < 0 < box.x1 < breakdown_chart.BAR_HALF
    assert (box.y0, box.y1) == pytest.approx((charts.to_unit(low, unit),
                                              charts.to_unit(high, unit)))
    assert box.y0 <= est.device_peak_bytes / charts.UNIT_BYTES[unit] <= box.y1
    peak_bars = [b for b in _bars(fig) if b.x[0] == 0]
    band = breakdown_chart.band_text(est, unit)
    assert band.startswith("90 % band") and all(band in b.hovertemplate for b in peak_bars)
    assert len([t for t in fig.data if t.type == "scatter"]) == 1  # the RTX 4090's line alone


def test_a_gpu_name_in_a_chart_label_is_text() -> None:
    """A team list's GPU name in a capacity line's label or the plan chart's: plotly renders
    <a href>, <b> and entities in labels, so the tags arrive as characters (issue 25)."""
    name = 'Lab <a href="https://evil.example/x">GPU</a> <b>x</b> AT&T'
    label = charts.capacity_text(name, 80 * 10**9, "GB")
    assert "<a" not in label and "<b>" not in label
    assert label.startswith('Lab &lt;a href="https://evil.example/x"&gt;GPU&lt;/a&gt; '
                            "&lt;b&gt;x&lt;/b&gt; AT&amp;T")
    assert charts.capacity_text("H200 (SXM)", 151 * 10**9, "GB") == "H200 (SXM)\u00a0· 151\u00a0GB"
