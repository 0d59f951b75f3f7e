"""Showing results: metrics, charts, tables and the line-item math, in the chosen unit.

Everything here displays what `vram` computed; no memory arithmetic happens in this module.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import streamlit as st

from ui import charts, data, text
from ui.charts import Unit, format_bytes
from vram import gpus as gpus_module
from vram.gpus import FitOption, FitReport, Gpu
from vram.result import BUCKET_ORDER, BucketName, Estimate, LineItem
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

PHASES = {"forward": "forward pass", "backward": "backward pass"}
_PLOTLY_CONFIG: dict[str, Any] = {"displayModeBar": False, "responsive": True}


def page_style() -> None:
    st.html(_CSS)


def plot(fig: Any, key: str) -> None:
    # theme=None keeps the figure's own fonts and the bucket colours.
    st.plotly_chart(fig, theme=None, config=_PLOTLY_CONFIG, key=key)


def gpu_price(usd_per_hour: float | None) -> str:
    return "price unknown" if usd_per_hour is None else f"${usd_per_hour:,.2f}/h"


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
        full, compact = data.short_gpu_name(best.gpu.name), charts.compact_gpu_name(best.gpu.name)
        cheapest.metric(  # a GPU's name may come from a team's list: text, never Markdown
            "Cheapest GPUs that hold it",
            f"{best.count}× {text.plain(compact)}",
            # the full name below the big one when that is shortened
            delta=(f"{text.plain(full)} · " if compact != full else "")
            + gpu_price(best.usd_per_hour),
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


#: The through-step table's columns (sizes in the page's unit).
THROUGH_STEP_SCHEMA = pa.schema([("bucket", pa.string()), ("at the peak", pa.float64()),
                                 ("most at any moment", pa.float64())])


def through_step_data(est: Estimate, unit: Unit) -> tuple[pa.Table, tuple[str, ...]]:
    """Each bucket at the peak beside the most it holds at any moment, and why they differ:
    an Arrow table (sent as it is; a pandas frame is converted on every run) and captions."""
    rows = through_step(est)
    table = pa.Table.from_pylist([{
        "bucket": charts.BUCKET_LABELS[r.name],
        "at the peak": round(charts.to_unit(r.at_peak_bytes, unit), 2),
        "most at any moment": round(charts.to_unit(r.most_bytes, unit), 2),
    } for r in rows], schema=THROUGH_STEP_SCHEMA)
    captions = tuple(f"**{charts.BUCKET_LABELS[r.name]}**: {r.why}" for r in rows if r.why)
    return table, captions


def through_step_table(table: pa.Table, captions: Sequence[str], unit: Unit) -> None:
    """The table and captions of `through_step_data`."""
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        # Short headers sized to their text, so all three columns show in a third of a laptop
        # screen (the long one was cut to "most at any mom").
        column_config={
            "bucket": st.column_config.TextColumn(),
            "at the peak": st.column_config.NumberColumn(
                f"at the peak ({unit})", format="%.2f",
                help="What each bucket holds at the moment of the peak."),
            "most at any moment": st.column_config.NumberColumn(
                f"most in the step ({unit})", format="%.2f",
                help="The most each bucket holds at any moment of the step."),
        },
    )
    for caption in captions:
        st.caption(caption)


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


#: The columns of the two fit tables (sizes in the page's unit; an unknown price is null).
FITS_SCHEMA = pa.schema([
    ("GPU", pa.string()), ("count", pa.int64()), ("sharding", pa.string()),
    ("$ per hour", pa.float64()), ("needs per GPU", pa.float64()),
    ("usable per GPU", pa.float64()), ("headroom", pa.float64()),
])
MISSES_SCHEMA = pa.schema([
    ("GPU", pa.string()), ("needs per GPU", pa.float64()), ("usable per GPU", pa.float64()),
    ("short by", pa.float64()),
])


def fit_frames(report: FitReport, est: Estimate, too_small: Sequence[Gpu], unit: Unit,
               ) -> tuple[pa.Table, pa.Table]:
    """GPUs that hold the run (cheapest first, with how many), and those too small for it as
    set up (`vram.gpus.too_small`: the same cards whose lines sit below the chart's peak).

    Sizes are numbers in `unit` (one decimal), so the columns sort and format as numbers; an
    unknown price is left empty, never the text "None". Arrow tables, built from the rows
    directly: `st.dataframe` sends them as they are (a pandas frame costs ~3 ms to convert).
    """
    def size(n_bytes: int) -> float:
        return round(charts.to_unit(n_bytes, unit), 1)

    fits = pa.Table.from_pylist(
        [
            {
                "GPU": data.short_gpu_name(o.gpu.name),
                "count": o.count,
                "sharding": str(getattr(o.sharding, "value", o.sharding)),
                "$ per hour": o.usd_per_hour,
                "needs per GPU": size(o.device_peak_bytes),
                "usable per GPU": size(o.usable_bytes),
                "headroom": size(o.headroom_bytes),
            }
            for o in report.fits
        ],
        schema=FITS_SCHEMA,
    )
    setup = est.setup
    misses = pa.Table.from_pylist(
        [
            {
                "GPU": data.short_gpu_name(g.name),
                "needs per GPU": size(need := est.device_peak_bytes
                                      + gpus_module.context_difference(g, setup)),
                "usable per GPU": size(g.memory_bytes),
                "short by": size(need - g.memory_bytes),
            }
            for g in too_small
        ],
        schema=MISSES_SCHEMA,
    )
    return fits, misses


#: Short headers for the fit tables' size columns (the unit is added), with the long name as
#: the header's help: with "needs per GPU (GB)" the headers were cut at 1280 px.
_SIZE_HEADERS: dict[str, str] = {
    "needs per GPU": "needs", "usable per GPU": "usable", "headroom": "headroom",
    "short by": "short by",
}


def _size_columns(unit: Unit, *names: str) -> dict[str, Any]:
    return {name: st.column_config.NumberColumn(f"{_SIZE_HEADERS[name]} ({unit})",
                                                format="%.1f", help=f"{name} ({unit})")
            for name in names}


def fit_tables(fits: Any, misses: Any, unit: Unit = "GB", *, n_gpus: int = 1,
               unsupported: Sequence[Gpu] = (), bf16: bool = False) -> None:
    """The two tables of `fit_frames`, each the page's full width so that no
    column is cut (side by side, half of them scrolled out of sight on a laptop)."""
    st.subheader(f"GPUs that hold it ({len(fits)})")
    if len(fits) == 0:
        st.write("None: shrink a bucket (see the levers on the Learn page) or add GPUs.")
    else:
        st.dataframe(
            fits,
            hide_index=True,
            width="stretch",
            # Columns sized to their content (a "large" GPU column pushed the sizes out of
            # sight on a laptop); the GPU stays pinned when a phone scrolls sideways.
            column_config={
                "GPU": st.column_config.TextColumn(pinned=True),
                "count": st.column_config.NumberColumn("GPUs"),
                "sharding": st.column_config.TextColumn(),
                "$ per hour": st.column_config.NumberColumn("$/h", format="$%.2f",
                                                            help="$ per hour, all the GPUs"),
                **_size_columns(unit, "needs per GPU", "usable per GPU", "headroom"),
            },
        )
    each = "one GPU" if n_gpus == 1 else f"{n_gpus} GPUs, each"
    st.subheader(f"Too small on {each} ({len(misses)})")
    if unsupported:
        names = text.plain(", ".join(data.short_gpu_name(g.name) for g in unsupported))
        hint = (" Set Precision to fp16 mixed to run there (fp16 needs loss scaling; "
                "bf16 does not)." if bf16 else "")
        st.caption(f"Left out: {names}, which have no bf16 hardware.{hint}")
    if len(misses) == 0:
        st.write("Every GPU in the list holds it as set up.")
    else:
        st.dataframe(
            misses,
            hide_index=True,
            width="stretch",
            column_config={
                "GPU": st.column_config.TextColumn(pinned=True),
                **_size_columns(unit, "needs per GPU", "usable per GPU", "short by"),
            },
        )


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


def _number(value: float | None) -> float:
    return float("nan") if value is None else float(value)


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
                "bf16 TFLOPS": _number(gpu.bf16_dense_tflops),
                "bandwidth (GB/s)": _number(gpu.memory_bandwidth_gbps),
                "$ per GPU-hour": (gpu.usd_per_hour if gpu.usd_per_hour is not None
                                   else float("nan")),
                "holds it": "yes" if fits else ("no" if found is not None else "?"),
                # Empty cells (NaN), not the text "None", where a figure does not apply.
                "GPUs needed": found.count if fits and found else float("nan"),
                "$ per hour, all": (found.usd_per_hour if fits and found
                                    and found.usd_per_hour is not None else float("nan")),
                f"headroom ({unit})": (
                    round(charts.to_unit(found.headroom_bytes, unit), 1) if found
                    else float("nan")
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
            "GPUs needed": st.column_config.NumberColumn(format="%d"),
        },
        height=min(800, 40 + 36 * max(1, len(table))),
        row_height=34,
    )
