"""Plotly figures built from estimates: pure functions of their inputs, no Streamlit.

The shared pieces of every chart: units, the bucket colours and labels, fonts, and the
capacity lines; the figures themselves are in ui.breakdown_chart (the calculator's),
ui.compare_chart (Compare, Learn) and ui.step_charts (inference, the trace's timeline). The app
displays them, the CLI can export them (``fig.write_html(...)``), and tests check the data they
carry. Colours come from the Okabe-Ito palette (Okabe & Ito 2008, "Color Universal
Design"), which stays distinguishable for the common forms of colour blindness; each bucket keeps
its colour everywhere.

    >>> fig = breakdown_chart.breakdown_figure(est, capacities=[("RTX 4090", 24 * GIB)])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import plotly.graph_objects as go

from vram.result import BucketName
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


def figure(traces: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A figure from plain dicts, without plotly's per-property validation.

    Validation costs about 25 ms a figure, too slow for a redraw on every slider move; the
    tests validate every figure instead (``go.Figure(fig.to_dict())``).
    """
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


def layout(**extra: Any) -> dict[str, Any]:
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


def px_scale(height: int, margin: dict[str, int], top: float) -> float:
    """Pixels per y-axis unit: the height is fixed, so this is exact."""
    return (height - margin["t"] - margin["b"]) / top


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
