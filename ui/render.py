"""Showing results: metrics, charts, tables and the line-item math, in the chosen unit.

Everything here displays what `vram` computed; no memory arithmetic happens in this module.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import streamlit as st

from ui import charts
from ui.charts import Unit, format_bytes
from vram.result import BucketName, Estimate, LineItem
from vram.step.through_step import through_step

#: Big numbers for the back of the room; charts set their own fonts (16 px and up).
_CSS = """
<style>
[data-testid="stMetricValue"] { font-size: 2.4rem; font-weight: 700; }
/* A long value ("1× RTX 6000 Ada Generation") wraps between words rather than end in "…" */
[data-testid="stMetricValue"] * {
  white-space: normal !important; overflow: visible !important; text-overflow: clip !important;
  overflow-wrap: break-word; line-height: 1.15;
}
[data-testid="stMetricLabel"] p { font-size: 1.1rem; }
/* Labels and deltas wrap rather than end in "…" on a laptop or a projector. */
[data-testid="stMetricLabel"] *, [data-testid="stMetricDelta"] * {
  white-space: normal !important; overflow: visible !important; text-overflow: clip !important;
}
[data-testid="stMetricDelta"] { font-size: 1.2rem; }
</style>
"""

_PLOTLY_CONFIG: dict[str, Any] = {"displayModeBar": False, "responsive": True}


def page_style() -> None:
    st.html(_CSS)


def plot(fig: Any, key: str) -> None:
    # theme=None keeps the figure's own fonts and the bucket colours.
    st.plotly_chart(fig, theme=None, config=_PLOTLY_CONFIG, key=key)


def notes(est: Estimate) -> None:
    if est.approximate:
        st.warning("The model's shape is approximate, so the figures are too.")
    if est.host_bytes:
        st.info(
            f"Host (CPU) memory needed for offloaded state: {format_bytes(est.host_bytes, 'GB')}."
        )
    # The through-step table's caption already says why the peak holds only part of the
    # gradients, at more length; the estimate's short note would say it a second time.
    explained = any(r.why for r in through_step(est) if r.name is BucketName.GRADIENTS)
    for note in est.notes:
        if explained and note.startswith("The peak is at ") and "gradients" in note:
            continue
        st.caption(note)


def _inputs_text(inputs: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k}={v}"
        for k, v in inputs.items()
    )


def _cell(text: str) -> str:
    return html.escape(text).replace("|", "\\|").replace("\n", " ")


def _formula(text: str) -> str:
    # Inside a code span Markdown escapes HTML itself; only backticks and pipes would break it.
    return text.replace("`", "'").replace("|", "/")


def _items_markdown(items: Sequence[LineItem]) -> str:
    """Line items as a Markdown table (cheaper to send than a dataframe, and it wraps)."""
    lines = ["| item | formula | inputs | bytes |", "|---|---|---|---:|"]
    for item in items:
        label = _cell(item.label) + (
            f" <br><small>{_cell(item.source)}</small>" if item.source else ""
        )
        lines.append(
            f"| {label} | `{_formula(item.formula)}` | {_cell(_inputs_text(item.inputs))} "
            f"| {item.bytes:,} |"
        )
    return "\n".join(lines)


def show_math(est: Estimate, unit: Unit) -> None:
    """Every line item of every bucket, so a student can redo the arithmetic by hand."""
    if not st.toggle("Show the math: every line item, its formula and inputs", key="math"):
        return
    st.markdown(
        "Each bucket is the sum of its line items; the buckets sum to the peak per GPU. "
        "Bytes are exact integers; 1 GB = 10⁹ bytes, 1 GiB = 2³⁰ bytes."
    )
    for bucket in est.buckets:
        name = charts.BUCKET_LABELS[bucket.name]
        color = charts.BUCKET_COLORS[bucket.name]
        st.markdown(
            f"#### <span style='color:{color}'>■</span> {name}: "
            f"{format_bytes(bucket.bytes, unit)} ({bucket.bytes:,} bytes)",
            unsafe_allow_html=True,
        )
        if bucket.items:
            st.markdown(_items_markdown(bucket.items), unsafe_allow_html=True)
    st.markdown(
        f"#### Total at the peak ({est.phase.value}): {format_bytes(est.device_peak_bytes, unit)}"
        f"\n\n{est.device_peak_bytes:,} = " + " + ".join(f"{b.bytes:,}" for b in est.buckets)
    )
    if est.inference.items:
        st.markdown(f"#### Inference: {format_bytes(est.inference.total_bytes, unit)}")
        st.markdown(_items_markdown(est.inference.items), unsafe_allow_html=True)


def download(payload_json: Callable[[], str]) -> None:
    """The button offering the estimate as JSON, made only when someone clicks it (a deferred
    download: the page does not build and store a file nobody asked for on every rerun)."""
    st.download_button(
        "Download the estimate (JSON)",
        payload_json,
        file_name="vram-estimate.json",
        mime="application/json",
        on_click="ignore",
        key="download",
    )
