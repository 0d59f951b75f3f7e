"""Plotly figures built from estimates: pure functions of their inputs, no Streamlit.

The app displays them, the CLI can export them (``fig.write_html(...)``), and tests check the
data they carry. Colours come from the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal
Design"), which stays distinguishable for the common forms of colour blindness; each bucket keeps
its colour everywhere.

    >>> fig = breakdown_figure(estimate, unit="GB", capacities=[("RTX 4090", 24 * GIB)])
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import plotly.graph_objects as go

from ui import label_layout
from vram.result import BUCKET_ORDER, BucketName, Estimate
from vram.step.through_step import through_step
from vram.units import GB, GIB

Unit = Literal["GB", "GiB"]

#: Bytes per display unit. GB = 10^9 (what vendors print), GiB = 2^30 (what nvidia-smi shows).
UNIT_BYTES: dict[str, int] = {"GB": GB, "GiB": GIB}

#: Okabe-Ito colours, one per bucket; overhead is a neutral grey so the four buckets stand out.
BUCKET_COLORS: dict[BucketName, str] = {
    BucketName.WEIGHTS: "#0072B2",  # blue
    BucketName.GRADIENTS: "#E69F00",  # orange
    BucketName.OPTIMIZER: "#009E73",  # bluish green
    BucketName.ACTIVATIONS: "#CC79A7",  # reddish purple
    BucketName.OVERHEAD: "#999999",  # grey
}

BUCKET_LABELS: dict[BucketName, str] = {
    BucketName.WEIGHTS: "Weights",
    BucketName.GRADIENTS: "Gradients",
    BucketName.OPTIMIZER: "Optimizer state",
    BucketName.ACTIVATIONS: "Activations",
    BucketName.OVERHEAD: "Overhead",
}

#: Colours for the inference side that are not buckets (the KV cache, working memory).
KV_CACHE_COLOR = "#56B4E9"  # sky blue
WORKING_COLOR = "#D55E00"  # vermillion

#: Readable from the back of a classroom: no chart text under 16 px.
FONT_SIZE = 18
SMALL_FONT_SIZE = 16
FONT_FAMILY = "Source Sans Pro, Arial, sans-serif"


def short_gpu_name(name: str) -> str:
    """A GPU's name without its vendor prefix: "NVIDIA GeForce RTX 4090" -> "RTX 4090"."""
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "AMD Instinct ", "AMD "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


#: Characters of a GPU name that a big metric value holds on one line, with its count, in a
#: third of a 1280 px projector (52 px type): "1× RTX 6000 Ada Generation" took three lines
#: and pushed the chart off screen, "1× RTX 6000 Ada" still two.
COMPACT_GPU_CHARS = 9


def compact_gpu_name(name: str) -> str:
    """A GPU's name short enough for a big metric: its leading words up to COMPACT_GPU_CHARS
    (at least one), "Tesla" dropped: "RTX 6000 Ada Generation" -> "RTX 6000"."""
    words = short_gpu_name(name).removeprefix("Tesla ").split(" ")
    kept = [words[0]]
    for word in words[1:]:
        if len(" ".join([*kept, word])) > COMPACT_GPU_CHARS:
            break
        kept.append(word)
    return " ".join(kept)


def to_unit(n_bytes: int, unit: Unit) -> float:
    """Bytes as a float in GB (10^9) or GiB (2^30)."""
    return n_bytes / UNIT_BYTES[unit]


def format_bytes(n_bytes: int, unit: Unit) -> str:
    """Three significant digits and the unit: ``12.3 GB``, ``0.52 GiB``, ``840 GB``."""
    value = to_unit(n_bytes, unit)
    if value == 0:
        return f"0 {unit}"
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    if abs(value) >= 10:
        return f"{value:.1f} {unit}"
    if abs(value) >= 0.01:
        return f"{value:.2f} {unit}"
    return f"{value:.4f} {unit}"


def _figure(traces: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A figure from plain dicts, without plotly's per-property validation.

    Validation costs about 25 ms a figure, too slow for a redraw on every slider move; the
    tests validate every figure instead (``go.Figure(fig.to_dict())``).
    """
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


def _layout(**extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "font": {"size": FONT_SIZE, "family": FONT_FAMILY},
        "margin": {"l": 80, "r": 20, "t": 60, "b": 50},
        "plot_bgcolor": "white",
        "paper_bgcolor": "white",
        "hoverlabel": {"font": {"size": SMALL_FONT_SIZE}},
    }
    layout.update(extra)
    return layout


def capacity_text(name: str, n_bytes: int, unit: Unit) -> str:
    """A capacity line's label, "H200 (SXM) · 151 GB", with no-break spaces where a wrapped
    label must not break: never before the dot, never between a number and its unit."""
    size = format_bytes(n_bytes, unit).replace(" ", "\u00a0")
    return f"{name}\u00a0· {size}"


def capacity_lines(
    capacities: Iterable[tuple[str, int]], peak_bytes: int, *, max_below: int = 3,
    too_small: frozenset[str] | None = None,
) -> list[tuple[str, int]]:
    """The capacities worth drawing: the largest few below the peak, and the first above it.

    Names sharing a size are joined ("L4 / A10"), so each line is drawn once. `too_small`, when
    given, names the GPUs the fit found too small (vram.gpus.too_small, which counts each GPU's
    own CUDA context): a line is drawn below the peak exactly when its GPU is in that list.
    """
    by_size: dict[int, list[str]] = {}
    for name, size in capacities:
        names = by_size.setdefault(int(size), [])
        if name not in names:
            names.append(name)
    sizes = sorted(by_size)

    def below(size: int) -> bool:
        if too_small is None:
            return size < peak_bytes
        return any(name in too_small for name in by_size[size])

    shown = [s for s in sizes if below(s)][-max_below:] if max_below else []
    above = [s for s in sizes if not below(s)]
    if above:
        shown.append(above[0])
    return [(" / ".join(by_size[s][:2]), s) for s in shown]


#: The narrowest plot a chart is drawn in (a 400 px phone, less the page's padding and the
#: axis): labels are wrapped to fit their share of it.
MIN_PLOT_PX = 260

#: Bar geometry of the breakdown chart, in x-axis units: the bar spans [-BAR_HALF, BAR_HALF],
#: bucket labels start at LABEL_X, the axis ends at X_MAX (the capacity labels' right edge).
#: The bar takes a fifth of the plot's width, 56 px on a 400 px phone.
BAR_HALF = 0.3
LABEL_X = 0.42
X_MIN = -0.35
X_MAX = 2.65
#: Capacity lines stop this far (x units, about 3 px on a phone) inside X_MAX, under their
#: label's right edge: drawn to X_MAX, a dash showed past the text.
LINE_INSET = 0.03
BREAKDOWN_MARGIN: dict[str, int] = {"l": 92, "r": 12, "t": 64, "b": 16}


def capacity_label_drop_order(sizes: Sequence[int], peak_bytes: int,
                              keep: frozenset[int] = frozenset()) -> list[int]:
    """Indices of capacity labels in the order they give up their room when labels collide.

    First the cards below the peak, smallest first (the least telling); then those whose size
    is in `keep` (the card a lesson is about, e.g. the 80 GB one); the smallest card that holds
    the run last, since it answers the question the chart asks. A dropped label's line stays.
    """
    def rank(i: int) -> tuple[int, int]:
        size = sizes[i]
        if size >= peak_bytes:
            return (2, -size)
        return (1 if size in keep else 0, size)

    return sorted(range(len(sizes)), key=rank)


def _px_scale(height: int, margin: dict[str, int], top: float) -> float:
    """Pixels per y-axis unit: the height is fixed, so this is exact."""
    return (height - margin["t"] - margin["b"]) / top


def breakdown_figure(
    estimate: Estimate,
    *,
    unit: Unit = "GB",
    capacities: Iterable[tuple[str, int]] = (),
    height: int = 560,
    font_px: int = SMALL_FONT_SIZE,
    too_small: frozenset[str] | None = None,
    min_plot_px: int = MIN_PLOT_PX,
    keep_labelled: frozenset[int] = frozenset(),
) -> go.Figure:
    """One stacked bar of the buckets (per GPU), each labelled, with GPU capacities as lines.

    `capacities` are ``(name, memory_bytes)`` pairs; the lines below the peak and the first one
    above it are drawn, so the picture shows the smallest card that holds the run. Bucket and
    capacity labels share one column beside the bar and are spread so that none overlaps
    another (ui.label_layout); a label moved off what it names gets a leader line. The peak is
    the title, where no label can cover it.

    `min_plot_px` is the narrowest plot the figure will be shown in (a phone by default; a
    projector in presentation mode), to which long capacity labels are wrapped.
    `keep_labelled` holds capacities (bytes) whose labels are the last below the peak to drop
    when there is no room (capacity_label_drop_order).
    """
    peak = estimate.device_peak_bytes
    traces: list[dict[str, Any]] = []
    bottom = 0.0
    centres: list[float] = []
    labels: list[str] = []
    for row in through_step(estimate):
        name, n_bytes = row.name, row.at_peak_bytes
        value = to_unit(n_bytes, unit)
        text = f"{BUCKET_LABELS[name]}: {format_bytes(n_bytes, unit)}"
        hover = f"{text} at the peak"
        if row.why:  # gradients or activations that the peak moment holds only part of
            hover += (f"<br>up to {format_bytes(row.most_bytes, unit)} at another moment"
                      f"<br>{wrap_label(row.why, 60)}")
        traces.append({
            "type": "bar", "x": [0], "y": [value], "name": BUCKET_LABELS[name],
            "marker": {"color": BUCKET_COLORS[name], "line": {"color": "white", "width": 1}},
            "hovertemplate": f"{hover}<extra></extra>", "width": 2 * BAR_HALF,
        })
        centres.append(bottom + value / 2)
        labels.append(text)
        bottom += value

    lines = capacity_lines(capacities, peak, too_small=too_small)
    top = max([to_unit(peak, unit)] + [to_unit(s, unit) for _, s in lines]) * 1.06 or 1.0
    # Room for the tick labels and the axis title, which grow with the type.
    margin = {**BREAKDOWN_MARGIN, "l": max(BREAKDOWN_MARGIN["l"], round(5.75 * font_px))}
    scale = _px_scale(height, margin, top)
    # Wrapped to the room right of the bar on the narrowest plot, so a long GPU name never
    # reaches back over the bar on a phone.
    room_chars = int((X_MAX - LABEL_X) / (X_MAX - X_MIN) * min_plot_px
                     / (label_layout.CHAR_WIDTH_EM * font_px))
    cap_texts = [wrap_label(capacity_text(name, size, unit), room_chars) for name, size in lines]
    cap_values = [to_unit(size, unit) for _, size in lines]
    for name_text, value in zip(cap_texts, cap_values, strict=True):
        traces.append({
            # ends just inside the label's right edge, so no dash shows past the text
            "type": "scatter", "mode": "lines", "x": [X_MIN, X_MAX - LINE_INSET],
            "y": [value, value],
            "line": {"color": "#333", "width": 2, "dash": "dash"}, "showlegend": False,
            "hovertemplate": f"{name_text.replace('<br>', ' ')}<extra>capacity</extra>",
        })
    plot_px = height - margin["t"] - margin["b"]
    bucket_heights = [label_layout.text_height_px(t, font_px) for t in labels]
    shown = list(range(len(lines)))
    drops = iter(capacity_label_drop_order([s for _, s in lines], peak, keep_labelled))

    def spread() -> list[float] | None:
        return label_layout.spread_in_column(
            [c * scale for c in centres] + [cap_values[i] * scale for i in shown],
            bucket_heights + [label_layout.text_height_px(cap_texts[i], font_px)
                              for i in shown],
            0.0, plot_px)

    placed = spread()
    while placed is None and shown:
        # No room: the least telling capacity label gives way (its line keeps its hover).
        shown.remove(next(drops))
        placed = spread()
    if placed is None:
        placed = [c * scale for c in centres]
    cap_texts = [cap_texts[i] for i in shown]
    cap_values = [cap_values[i] for i in shown]
    annotations: list[dict[str, Any]] = []
    for text, centre, label_px in zip(labels, centres, placed, strict=False):
        annotations.append({
            # The text sits at the arrow's tail (ax, ay); the head points at the segment.
            "x": BAR_HALF, "y": centre, "xref": "x", "yref": "y",
            "ax": LABEL_X, "ay": label_px / scale, "axref": "x", "ayref": "y",
            "text": text, "showarrow": True, "arrowhead": 0, "arrowwidth": 1,
            "arrowcolor": "#555", "xanchor": "left",
            "font": {"size": font_px, "color": "#222"},
            # a capacity line crossing the label passes behind it, not through the text
            "bgcolor": "rgba(255,255,255,0.92)",
        })
    for text, value, label_px in zip(cap_texts, cap_values, placed[len(labels):], strict=True):
        moved = abs(label_px - value * scale) > 2
        annotations.append({
            "x": X_MAX, "y": value, "xref": "x", "yref": "y",
            "ax": X_MAX, "ay": label_px / scale, "axref": "x", "ayref": "y",
            "showarrow": moved, "arrowhead": 0, "arrowwidth": 1, "arrowcolor": "#333",
            "text": text, "xanchor": "right",
            "font": {"size": font_px, "color": "#333"},
            "bgcolor": "rgba(255,255,255,0.92)",
        })
    return _figure(
        traces,
        _layout(
            barmode="stack",
            height=height,
            showlegend=False,
            margin=margin,
            title={"text": f"Peak <b>{format_bytes(peak, unit)}</b> per GPU",
                   "font": {"size": font_px + 6, "color": "#222"},
                   "x": 0.01, "xref": "container", "xanchor": "left",
                   "y": 1 - 12 / height, "yref": "container", "yanchor": "top"},
            xaxis={"range": [X_MIN, X_MAX], "showticklabels": False, "fixedrange": True,
                   "showgrid": False, "zeroline": False},
            yaxis={
                "title": {"text": f"memory per GPU ({unit})", "font": {"size": font_px}},
                "tickfont": {"size": font_px},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
                "automargin": True,
            },
            annotations=annotations,
        ),
    )


def _inference_color(key: str) -> str:
    lowered = key.lower()
    if "weight" in lowered or "param" in lowered:
        return BUCKET_COLORS[BucketName.WEIGHTS]
    if "kv" in lowered or "cache" in lowered:
        return KV_CACHE_COLOR
    return WORKING_COLOR


def inference_figure(estimate: Estimate, *, unit: Unit = "GB", height: int = 460) -> go.Figure:
    """Training (stacked by bucket) next to inference (weights, KV cache, working memory)."""
    traces: list[dict[str, Any]] = []
    for name in BUCKET_ORDER:
        n_bytes = estimate.bucket(name).bytes
        text = f"{BUCKET_LABELS[name]}: {format_bytes(n_bytes, unit)}"
        traces.append(
            dict(
                type="bar",
                x=["Training"],
                y=[to_unit(n_bytes, unit)],
                name=BUCKET_LABELS[name],
                marker={"color": BUCKET_COLORS[name]},
                legendgroup="training",
                hovertemplate=f"{text}<extra></extra>",
            )
        )
    for item in estimate.inference.items:
        traces.append(
            dict(
                type="bar",
                x=["Inference"],
                y=[to_unit(item.bytes, unit)],
                name=item.label,
                marker={"color": _inference_color(item.key)},
                legendgroup="inference",
                hovertemplate=f"{item.label}: {format_bytes(item.bytes, unit)}<extra></extra>",
            )
        )
    train = estimate.device_peak_bytes
    infer = estimate.inference.total_bytes
    top = max(to_unit(train, unit), to_unit(infer, unit)) * 1.25 or 1.0
    annotations = [
        {
            "x": "Training",
            "y": to_unit(train, unit),
            "yshift": 4,
            "yanchor": "bottom",
            "showarrow": False,
            "text": f"<b>{format_bytes(train, unit)}</b>",
            "font": {"size": FONT_SIZE + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        },
        {
            "x": "Inference",
            "y": to_unit(infer, unit),
            "yshift": 4,
            "yanchor": "bottom",
            "showarrow": False,
            "text": f"<b>{format_bytes(infer, unit)}</b>",
            "font": {"size": FONT_SIZE + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        },
    ]
    return _figure(
        traces,
        _layout(
            barmode="stack",
            height=height,
            bargap=0.45,
            yaxis={
                "title": {"text": f"memory per GPU ({unit})"},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
                "automargin": True,
            },
            xaxis={"fixedrange": True, "tickfont": {"size": FONT_SIZE + 2}, "tickangle": 0},
            # Colours match the breakdown chart; hovering a segment names it.
            showlegend=False,
            title={"text": f"training = <b>{estimate.training_to_inference:.1f}×</b> inference",
                   "font": {"size": FONT_SIZE + 2, "color": "#222"},
                   "x": 0.01, "xref": "container", "xanchor": "left"},
            margin={"l": 92, "r": 16, "t": 64, "b": 50},
            annotations=annotations,
        ),
    )


def wrap_label(text: str, max_chars: int = 18) -> str:
    """`text` broken at spaces into lines of at most `max_chars` (a word never cut), ``<br>``.

    A no-break space (U+00A0) holds its neighbours together ("H200\u00a0· 141 GB" never
    starts a line with the dot)."""
    lines: list[str] = []
    for word in (w for w in text.split(" ") if w):
        if lines and len(lines[-1]) + 1 + len(word) <= max_chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)




_NUMBERED = re.compile(r"^(\d+)\. ")


def tick_labels(labels: Sequence[str], font_px: int) -> list[str]:
    """Short, wrapped names under the bars: the parts (`` · ``-separated) that tell the setups
    apart, each part's words wrapped to the width one bar gets in the narrowest plot."""
    numbered = [_NUMBERED.match(label) for label in labels]
    numbers = [m.group(1) + ". " if m else "" for m in numbered]
    rests = [label[m.end():] if m else label for label, m in zip(labels, numbered, strict=True)]
    parts = [rest.split(" · ") for rest in rests]
    common = set.intersection(*(set(p) for p in parts)) if len(parts) > 1 else set()
    max_chars = max(4, int(MIN_PLOT_PX / max(1, len(labels)) / (label_layout.CHAR_WIDTH_EM
                                                                 * font_px)))
    ticks = []
    for number, rest, pieces in zip(numbers, rests, parts, strict=True):
        distinct = [p for p in pieces if p not in common] or [rest]
        distinct[0] = number + distinct[0]
        ticks.append("<br>".join(wrap_label(p, max_chars) for p in distinct))
    return ticks


def compare_figure(
    labelled: Sequence[tuple[str, Estimate]],
    *,
    unit: Unit = "GB",
    capacities: Iterable[tuple[str, int]] = (),
    height: int = 560,
    font_px: int = SMALL_FONT_SIZE,
    keep_labelled: frozenset[int] = frozenset(),
) -> go.Figure:
    """Several setups side by side: one stacked bar each, the total written above it.

    Setup names are wrapped under their bars (never rotated into the legend), the legend sits
    above the plot, and the capacity labels sit in a right margin sized to their text, spread
    so that none overlaps another; the totals inside the plot cannot meet them.
    """
    names = tick_labels([label for label, _ in labelled], font_px)
    full_names = [label for label, _ in labelled]
    traces: list[dict[str, Any]] = []
    for bucket in BUCKET_ORDER:
        values = [to_unit(est.bucket(bucket).bytes, unit) for _, est in labelled]
        texts = [[format_bytes(est.bucket(bucket).bytes, unit), full]
                 for (_, est), full in zip(labelled, full_names, strict=True)]
        traces.append(
            dict(
                type="bar",
                x=names,
                y=values,
                name=BUCKET_LABELS[bucket],
                marker={"color": BUCKET_COLORS[bucket], "line": {"color": "white", "width": 1}},
                customdata=texts,
                hovertemplate=(f"{BUCKET_LABELS[bucket]}: %{{customdata[0]}}"
                               "<extra>%{customdata[1]}</extra>"),
            )
        )
    peaks = [est.device_peak_bytes for _, est in labelled]
    annotations: list[dict[str, Any]] = [
        {
            "x": name,
            "y": to_unit(peak, unit),
            "yshift": 4,
            "yanchor": "bottom",
            "showarrow": False,
            "text": f"<b>{format_bytes(peak, unit)}</b>",
            "font": {"size": font_px + 2},
            "bgcolor": "rgba(255,255,255,0.85)",
        }
        for name, peak in zip(names, peaks, strict=True)
    ]
    lines = capacity_lines(capacities, max(peaks, default=0))
    # Room above the tallest bar for its total (a line of text at this height).
    plot_guess_px = height - 200
    top = max([to_unit(p, unit) for p in peaks] + [to_unit(s, unit) for _, s in lines] + [0.0])
    top = top * (1 + 2 * label_layout.LINE_HEIGHT_EM * (font_px + 2) / plot_guess_px) or 1.0
    tick_lines = max((n.count("<br>") + 1 for n in names), default=1)
    margin = {"l": max(92, round(5.75 * font_px)), "r": 16, "t": 80,
              "b": int(tick_lines * font_px * 1.4) + 24}
    scale = _px_scale(height, margin, top)
    # In the margin, long GPU names wrap onto a second line rather than squeeze the plot.
    cap_texts = [wrap_label(capacity_text(name, size, unit), 16) for name, size in lines]
    cap_values = [to_unit(size, unit) for _, size in lines]
    shapes: list[dict[str, Any]] = [
        {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": value,
         "y1": value, "line": {"color": "#333", "width": 2, "dash": "dash"}}
        for value in cap_values]
    shown = list(range(len(lines)))
    drops = iter(capacity_label_drop_order([s for _, s in lines], max(peaks, default=0),
                                           keep_labelled))

    def spread() -> list[float] | None:
        return label_layout.spread_in_column(
            [cap_values[i] * scale for i in shown],
            [label_layout.text_height_px(cap_texts[i], font_px) for i in shown],
            0.0, height - margin["t"] - margin["b"])

    placed = spread()
    while placed is None and shown:  # no room: the least telling label gives way, its line stays
        shown.remove(next(drops))
        placed = spread()
    cap_texts = [cap_texts[i] for i in shown]
    for text, label_px in zip(cap_texts, placed or [], strict=True):
        annotations.append({
            "xref": "paper", "x": 1.0, "yref": "y", "y": label_px / scale,
            "xanchor": "left", "xshift": 6, "showarrow": False, "text": text,
            "font": {"size": font_px, "color": "#333"},
        })
    if cap_texts:
        margin["r"] = int(max(label_layout.text_width_px(t, font_px) for t in cap_texts)) + 16
    return _figure(
        traces,
        _layout(
            barmode="stack",
            height=height,
            bargap=0.35,
            margin=margin,
            yaxis={
                "title": {"text": f"memory per GPU ({unit})", "font": {"size": font_px}},
                "tickfont": {"size": font_px},
                "range": [0, top],
                "gridcolor": "#e5e5e5",
                "fixedrange": True,
                "automargin": True,
            },
            xaxis={"fixedrange": True, "tickfont": {"size": font_px}, "tickangle": 0},
            legend={"font": {"size": font_px}, "orientation": "h", "x": 0, "xanchor": "left",
                    "y": 1.02, "yanchor": "bottom"},
            annotations=annotations,
            shapes=shapes,
        ),
    )


#: Background colours of the step's phases on the trace timeline (Okabe-Ito, light).
PHASE_COLORS: dict[str, str] = {
    "forward": "rgba(86,180,233,0.15)",
    "backward": "rgba(230,159,0,0.15)",
    "optimizer step": "rgba(0,158,115,0.15)",
}


def timeline_figure(
    points: Sequence[tuple[int, int, str]], *, peak_bytes: int, peak_phase: str,
    unit: Unit = "GB", height: int = 420,
) -> go.Figure:
    """Live bytes over a traced step, phases shaded, the peak marked.

    `points` are (event index, live bytes, phase) as the trace reports them.
    """
    xs = [p[0] for p in points]
    ys = [to_unit(p[1], unit) for p in points]
    shapes: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(points) + 1):
        if i == len(points) or points[i][2] != points[start][2]:
            shapes.append({
                "type": "rect", "xref": "x", "yref": "paper", "x0": points[start][0],
                "x1": points[i - 1][0], "y0": 0, "y1": 1, "line": {"width": 0},
                "fillcolor": PHASE_COLORS.get(points[start][2], "rgba(0,0,0,0.05)"),
                "layer": "below",
            })
            start = i
    peak_index = max(range(len(points)), key=lambda i: points[i][1]) if points else 0
    traces: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "x": xs, "y": ys, "name": "live bytes",
         "line": {"color": BUCKET_COLORS[BucketName.WEIGHTS], "width": 3},
         "hovertemplate": f"%{{y:.2f}} {unit}<extra></extra>"},
    ]
    annotations: list[dict[str, Any]] = []
    # The timeline is the short (few-layer) trace; the peak is the full model's, extended from
    # it. The axis covers both, and the full peak is its own line, so neither is off the chart.
    full_peak = to_unit(peak_bytes, unit)
    top = max([*ys, full_peak, 0.0]) * 1.12 or 1.0
    if points:
        traces.append({
            "type": "scatter", "mode": "markers", "x": [xs[peak_index]], "y": [ys[peak_index]],
            "name": "peak", "marker": {"size": 16, "color": "#D55E00", "symbol": "star"},
            "hovertemplate": f"peak of the traced layers: %{{y:.2f}} {unit}<extra></extra>",
        })
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                       "y0": full_peak, "y1": full_peak,
                       "line": {"color": "#D55E00", "width": 2, "dash": "dash"}})
        annotations.append({
            "xref": "paper", "x": 0.0, "xanchor": "left", "y": full_peak, "yref": "y",
            "yanchor": "bottom", "showarrow": False, "font": {"size": SMALL_FONT_SIZE},
            "text": f"<b>peak {format_bytes(peak_bytes, unit)}</b> ({peak_phase}), all layers",
        })
    return _figure(traces, _layout(
        height=height, showlegend=False, shapes=shapes, annotations=annotations,
        xaxis={"title": {"text": "operation in the traced step"}, "showgrid": False},
        yaxis={"title": {"text": f"live memory ({unit})"}, "range": [0, top],
               "gridcolor": "#eee", "automargin": True},
        title={"text": "Exact trace: live memory over one step (shaded: forward, backward, "
                       "optimizer)", "font": {"size": FONT_SIZE}},
    ))
