"""Showing results: metrics, charts, tables and the line-item math, in the chosen unit.

Everything here displays what `vram` computed; no memory arithmetic happens in this module.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from ui import charts, data
from ui.charts import Unit, format_bytes
from vram.gpus import FitOption, FitReport, Gpu
from vram.result import BUCKET_ORDER, Estimate, LineItem

#: Big numbers for the back of the room; charts set their own fonts (16 px and up).
_CSS = """
<style>
[data-testid="stMetricValue"] { font-size: 2.4rem; font-weight: 700; }
[data-testid="stMetricValue"] > div { white-space: normal; overflow-wrap: anywhere; }
[data-testid="stMetricLabel"] p { font-size: 1.1rem; }
[data-testid="stMetricDelta"] { font-size: 1.2rem; }
</style>
"""

PHASES = {"forward": "forward pass", "backward": "backward pass"}
_PLOTLY_CONFIG: dict[str, Any] = {"displayModeBar": False, "responsive": True}


def page_style() -> None:
    st.html(_CSS)


def plot(fig: Any, key: str) -> None:
    # theme=None keeps the figure's own fonts and the bucket colours.
    st.plotly_chart(fig, theme=None, config=_PLOTLY_CONFIG, key=key)


def gpu_price(usd_per_hour: float | None) -> str:
    return "price unknown" if usd_per_hour is None else f"${usd_per_hour:,.2f}/h"


def gpu_choice(option: FitOption) -> str:
    return f"{option.count}× {data.short_gpu_name(option.gpu.name)}"


def metrics(est: Estimate, report: FitReport, unit: Unit) -> None:
    """Peak per GPU, the cheapest GPUs that hold it, and the training ÷ inference multiple."""
    peak, cheapest, multiple = st.columns(3)
    peak.metric(
        "Peak memory per GPU",
        format_bytes(est.device_peak_bytes, unit),
        delta=f"during the {PHASES.get(est.phase.value, est.phase.value)}",
        delta_color="off",
        delta_arrow="off",
        help=(
            f"What nvidia-smi would show at the peak. PyTorch's max_memory_allocated would "
            f"report {format_bytes(est.allocated_peak_bytes, unit)}; max_memory_reserved "
            f"{format_bytes(est.reserved_peak_bytes, unit)}. The GPU fit uses the nvidia-smi "
            "figure."
        ),
    )
    if report.fits:
        # The cheapest priced option; a GPU without a price in the list cannot be "cheapest".
        priced = [o for o in report.fits if o.usd_per_hour is not None]
        best = (priced or list(report.fits))[0]
        cheapest.metric(
            "Cheapest GPUs that hold it",
            gpu_choice(best),
            delta=gpu_price(best.usd_per_hour),
            delta_color="off",
            delta_arrow="off",
            help="Cheapest by the total price per hour of the GPUs needed.",
        )
    else:
        cheapest.metric("Cheapest GPUs that hold it", "none in the list")
    multiple.metric(
        "Training ÷ inference",
        f"{est.training_to_inference:.1f}×",
        delta=f"inference: {format_bytes(est.inference.total_bytes, unit)}",
        delta_color="off",
        delta_arrow="off",
        help="Training memory against serving the same model with the same batch and length.",
    )


def notes(est: Estimate) -> None:
    if est.approximate:
        st.warning("The model's shape is approximate, so the figures are too.")
    if est.host_bytes:
        st.info(
            f"Host (CPU) memory needed for offloaded state: {format_bytes(est.host_bytes, 'GB')}."
        )
    for note in est.notes:
        st.caption(note)


def fit_frames(report: FitReport, unit: Unit) -> tuple[pd.DataFrame, pd.DataFrame]:
    """GPUs that hold the run (cheapest first) and those that do not, by how much."""
    fits = pd.DataFrame(
        [
            {
                "GPU": data.short_gpu_name(o.gpu.name),
                "count": o.count,
                "sharding": str(getattr(o.sharding, "value", o.sharding)),
                "$ per hour": o.usd_per_hour,
                "usable per GPU": format_bytes(o.usable_bytes, unit),
                "needs per GPU": format_bytes(o.device_peak_bytes, unit),
                "headroom": format_bytes(o.headroom_bytes, unit),
            }
            for o in report.fits
        ]
    )
    misses = pd.DataFrame(
        [
            {
                "GPU": data.short_gpu_name(o.gpu.name),
                "usable per GPU": format_bytes(o.usable_bytes, unit),
                "needs per GPU": format_bytes(o.device_peak_bytes, unit),
                "short by": format_bytes(-o.headroom_bytes, unit),
            }
            for o in report.misses
        ]
    )
    return fits, misses


def fit_tables(fits: Any, misses: Any) -> None:
    """The two tables of `fit_frames` (pandas or Arrow), side by side."""
    left, right = st.columns([3, 2])
    with left:
        st.subheader(f"GPUs that hold it ({len(fits)})")
        if len(fits) == 0:
            st.write("None: shrink a bucket (see the levers on the Learn page) or add GPUs.")
        else:
            st.dataframe(
                fits,
                hide_index=True,
                column_config={"$ per hour": st.column_config.NumberColumn(format="$%.2f")},
            )
    with right:
        st.subheader(f"Too small ({len(misses)})")
        if len(misses) == 0:
            st.write("Every GPU in the list holds it.")
        else:
            st.dataframe(misses, hide_index=True)


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


def bucket_table(labelled: Sequence[tuple[str, Estimate]], unit: Unit) -> pd.DataFrame:
    """One row per setup, one column per bucket, plus the peak and the inference figure."""
    rows: list[dict[str, Any]] = []
    for label, est in labelled:
        row: dict[str, Any] = {"setup": label}
        for name in BUCKET_ORDER:
            row[charts.BUCKET_LABELS[name]] = format_bytes(est.bucket(name).bytes, unit)
        row["peak per GPU"] = format_bytes(est.device_peak_bytes, unit)
        row["training ÷ inference"] = f"{est.training_to_inference:.1f}×"
        rows.append(row)
    return pd.DataFrame(rows)


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


def gpu_table(
    gpus: Sequence[Gpu], report: FitReport | None, unit: Unit, *, only_fits: bool
) -> pd.DataFrame:
    """The catalog with what the current run needs on each GPU (count, total price, headroom)."""
    options: dict[str, tuple[bool, FitOption | None]] = {}
    if report is not None:
        for option in report.misses:
            options.setdefault(option.gpu.id, (False, option))
        for option in report.fits:
            options[option.gpu.id] = (True, option)
    rows: list[dict[str, Any]] = []
    for gpu in gpus:
        fits, found = options.get(gpu.id, (False, None))
        if only_fits and not fits:
            continue
        rows.append(
            {
                "GPU": data.short_gpu_name(gpu.name),
                "segment": gpu.segment,
                f"memory ({unit})": round(charts.to_unit(gpu.memory_bytes, unit), 1),
                "bf16 TFLOPS": gpu.bf16_dense_tflops,
                "bandwidth (GB/s)": gpu.memory_bandwidth_gbps,
                "$ per GPU-hour": gpu.usd_per_hour,
                "holds it": "yes" if fits else ("no" if found is not None else "?"),
                "GPUs needed": found.count if fits and found else None,
                "$ per hour, all": found.usd_per_hour if fits and found else None,
                f"headroom ({unit})": (
                    round(charts.to_unit(found.headroom_bytes, unit), 1) if found else None
                ),
            }
        )
    return pd.DataFrame(rows)


def gpu_dataframe(table: pd.DataFrame, unit: Unit) -> None:
    money = st.column_config.NumberColumn(format="$%.2f")
    st.dataframe(
        table,
        hide_index=True,
        column_config={
            "GPU": st.column_config.TextColumn(width="medium", pinned=True),
            "$ per GPU-hour": money,
            "$ per hour, all": money,
        },
        height=min(800, 40 + 36 * max(1, len(table))),
        row_height=34,
    )
