"""The app's tables: the buckets through the step, the GPUs that hold a run (and those too
small), the GPU catalog with what the run needs on each, and setups side by side.

Every value here is computed by `vram`; this module only formats it.

Two rules from reading the tables on a laptop and a projector:

- **No grey "None".** Streamlit's grid draws a missing number as a grey "None". A column
  with gaps (a price the list does not give, a GPU count where the GPU does not hold the
  run) is therefore text: its numbers right-aligned and padded with spaces to one width, so
  that a click on the header still sorts them in order (the grid compares text with
  `localeCompare`, where a space comes before every digit), and a gap is a word or empty.
- **The mode's font.** In presentation mode a table is HTML (`st.table`), which the mode's
  CSS sets in large type and which wraps instead of scrolling; the grid draws on a canvas in
  its own small font.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import streamlit as st

from ui import charts, data
from ui.charts import Unit
from vram import gpus as gpus_module
from vram.gpus import FitOption, FitReport, Gpu
from vram.result import BUCKET_ORDER, Estimate
from vram.step.through_step import through_step


def padded(values: Sequence[float | None], fmt: str, missing: str = "") -> list[str]:
    """Numbers as text of one width (leading spaces), so text order is number order; a None
    becomes `missing` (a word sorts after every number, an empty cell before)."""
    texts = [None if v is None else format(v, fmt) for v in values]
    width = max((len(t) for t in texts if t is not None), default=0)
    return [missing if t is None else t.rjust(width) for t in texts]


def show(table: pa.Table, *, present: bool, column_config: dict[str, Any] | None = None,
         pinned: str | None = None) -> None:
    """`table` as the sortable grid, or in presentation mode as an HTML table in large type
    (its headers are the grid's labels)."""
    config = column_config or {}
    if present:
        st.table([{(_label(config.get(k)) or k): _cell(v, config.get(k)) for k, v in row.items()}
                  for row in table.to_pylist()], hide_index=True)
        return
    if pinned is not None:
        config = {**config, pinned: st.column_config.TextColumn(pinned=True)}
    st.dataframe(table, hide_index=True, width="stretch", column_config=config)


def _cell(value: Any, config: Any) -> str:
    """A cell as the grid would show it: numbers in the column's printf format."""
    fmt = config.get("type_config", {}).get("format") if isinstance(config, dict) else None
    if isinstance(value, float):
        return fmt % value if isinstance(fmt, str) and fmt.startswith("%") else f"{value:,.1f}"
    return "" if value is None else str(value)


def _label(config: Any) -> str | None:
    if isinstance(config, dict):
        label = config.get("label")
        return str(label) if label else None
    return None


# --------------------------------------------------------------------------------------------
# The buckets at the peak and through the step (the calculator)
# --------------------------------------------------------------------------------------------

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


def through_step_table(table: pa.Table, captions: Sequence[str], unit: Unit, *,
                       present: bool = False) -> None:
    """The table and captions of `through_step_data`."""
    show(table, present=present, column_config={
        # Short headers, so all three columns show in a third of a laptop screen (the long
        # one was cut to "most at any mom").
        "bucket": st.column_config.TextColumn(),
        "at the peak": st.column_config.NumberColumn(
            f"at the peak ({unit})", format="%.2f",
            help="What each bucket holds at the moment of the peak."),
        "most at any moment": st.column_config.NumberColumn(
            f"most in the step ({unit})", format="%.2f",
            help="The most each bucket holds at any moment of the step."),
    })
    for caption in captions:
        st.caption(caption)


# --------------------------------------------------------------------------------------------
# The GPUs that hold the run, and those too small (the calculator)
# --------------------------------------------------------------------------------------------

#: The columns of the two fit tables (sizes in the page's unit; the price is text: see above).
FITS_SCHEMA = pa.schema([
    ("GPU", pa.string()), ("count", pa.int64()), ("sharding", pa.string()),
    ("$ per hour", pa.string()), ("needs per GPU", pa.float64()),
    ("usable per GPU", pa.float64()), ("headroom", pa.float64()),
])
MISSES_SCHEMA = pa.schema([
    ("GPU", pa.string()), ("needs per GPU", pa.float64()), ("usable per GPU", pa.float64()),
    ("short by", pa.float64()),
])
#: A price the GPU list does not give.
NO_PRICE = "unknown"


def fit_frames(report: FitReport, est: Estimate, too_small: Sequence[Gpu], unit: Unit,
               ) -> tuple[pa.Table, pa.Table]:
    """GPUs that hold the run (cheapest first, with how many), and those too small for it as
    set up (`vram.gpus.too_small`: the same cards whose lines sit below the chart's peak).

    Sizes are numbers in `unit` (one decimal), so the columns sort and format as numbers; the
    price is text ("unknown" where the list has none, never "None"). Arrow tables, built from
    the rows directly: `st.dataframe` sends them as they are (a pandas frame costs ~3 ms)."""
    def size(n_bytes: int) -> float:
        return round(charts.to_unit(n_bytes, unit), 1)

    prices = padded([o.usd_per_hour for o in report.fits], ".2f", NO_PRICE)
    fits = pa.Table.from_pylist(
        [
            {
                "GPU": data.short_gpu_name(o.gpu.name),
                "count": o.count,
                "sharding": str(getattr(o.sharding, "value", o.sharding)),
                "$ per hour": price,
                "needs per GPU": size(o.device_peak_bytes),
                "usable per GPU": size(o.usable_bytes),
                "headroom": size(o.headroom_bytes),
            }
            for o, price in zip(report.fits, prices, strict=True)
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


def fit_tables(fits: pa.Table, misses: pa.Table, unit: Unit = "GB", *, n_gpus: int = 1,
               unsupported: Sequence[Gpu] = (), bf16: bool = False,
               present: bool = False) -> None:
    """The two tables of `fit_frames`, each the page's full width so that no
    column is cut (side by side, half of them scrolled out of sight on a laptop)."""
    st.subheader(f"GPUs that hold it ({len(fits)})")
    if len(fits) == 0:
        st.write("None: shrink a bucket (see the levers on the Learn page) or add GPUs.")
    else:
        # Columns sized to their content (a "large" GPU column pushed the sizes out of sight
        # on a laptop); the GPU stays pinned when a phone scrolls sideways.
        show(fits, present=present, pinned="GPU", column_config={
            "count": st.column_config.NumberColumn("GPUs"),
            "sharding": st.column_config.TextColumn(),
            "$ per hour": st.column_config.TextColumn("$/h", alignment="right",
                                                      help="$ per hour, all the GPUs"),
            **_size_columns(unit, "needs per GPU", "usable per GPU", "headroom"),
        })
    each = "one GPU" if n_gpus == 1 else f"{n_gpus} GPUs, each"
    st.subheader(f"Too small on {each} ({len(misses)})")
    if unsupported:
        names = ", ".join(data.short_gpu_name(g.name) for g in unsupported)
        hint = (" Set Precision to fp16 mixed to run there (fp16 needs loss scaling; "
                "bf16 does not)." if bf16 else "")
        st.caption(f"Left out: {names}, which have no bf16 hardware.{hint}")
    if len(misses) == 0:
        st.write("Every GPU in the list holds it as set up.")
    else:
        show(misses, present=present, pinned="GPU", column_config=_size_columns(
            unit, "needs per GPU", "usable per GPU", "short by"))


# --------------------------------------------------------------------------------------------
# Setups side by side (Compare, Learn)
# --------------------------------------------------------------------------------------------


def bucket_table(labelled: Sequence[tuple[str, Estimate]], unit: Unit) -> pa.Table:
    """One row per setup, one column per bucket, plus the peak and the inference multiple;
    shown with `st.table`, which wraps to the page's width (the grid cut the last columns
    off at 1280 px)."""
    rows: list[dict[str, Any]] = []
    for label, est in labelled:
        row: dict[str, Any] = {"setup": label}
        for name in BUCKET_ORDER:
            row[charts.BUCKET_LABELS[name]] = charts.format_bytes(est.bucket(name).bytes, unit)
        row["peak per GPU"] = charts.format_bytes(est.device_peak_bytes, unit)
        row["training ÷ inference"] = f"{est.training_to_inference:.1f}×"
        rows.append(row)
    return pa.Table.from_pylist(rows)


# --------------------------------------------------------------------------------------------
# The GPU catalog with what the run needs on each (the GPUs page)
# --------------------------------------------------------------------------------------------


def gpu_table(gpus: Sequence[Gpu], report: FitReport | None, unit: Unit, *,
              only_fits: bool) -> pa.Table:
    """The catalog, the answer first: whether each GPU holds the run, how many, their price
    and the headroom; then the GPU's own memory, price, speed and bandwidth (the segment is
    the page's filter), so that every column shows at 1280 px. A figure that does not apply
    is an empty cell, a price or bf16 speed the list lacks a word."""
    options: dict[str, tuple[bool, FitOption | None]] = {}
    if report is not None:
        for option in report.misses:
            options.setdefault(option.gpu.id, (False, option))
        for option in report.fits:
            options[option.gpu.id] = (True, option)
    shown = [(gpu, *options.get(gpu.id, (False, None))) for gpu in gpus]
    shown = [row for row in shown if row[1] or not only_fits]

    def fitting(value: Any, fits: bool) -> float | None:
        return float(value) if fits and value is not None else None

    counts = padded([fitting(f.count, ok) if f else None for _, ok, f in shown], ".0f")
    totals = padded([fitting(f.usd_per_hour, ok) if f else None for _, ok, f in shown], ".2f")
    headroom = padded([round(charts.to_unit(f.headroom_bytes, unit), 1) if f else None
                       for _, _, f in shown], ".1f")
    prices = padded([g.usd_per_hour for g, _, _ in shown], ".2f", "unknown")
    tflops = padded([g.bf16_dense_tflops for g, _, _ in shown], ",.0f", "no bf16")
    bandwidth = padded([g.memory_bandwidth_gbps for g, _, _ in shown], ",.0f", "unknown")
    rows = [
        {
            "GPU": data.short_gpu_name(gpu.name),
            "holds it": "yes" if fits else ("no" if found is not None else "?"),
            "GPUs needed": counts[n],
            "$/h, all": totals[n],
            f"headroom ({unit})": headroom[n],
            f"memory ({unit})": round(charts.to_unit(gpu.memory_bytes, unit), 1),
            "$/GPU-hour": prices[n],
            "bf16 TFLOPS": tflops[n],
            "GB/s": bandwidth[n],
        }
        for n, (gpu, fits, found) in enumerate(shown)
    ]
    return pa.Table.from_pylist(rows) if rows else pa.table({"GPU": pa.array([], pa.string())})


#: The GPU table's column widths (px): together they fit the 760 px a 1280 px screen gives
#: the page beside the sidebar, so no column hides behind a sideways scroll.
GPU_WIDTHS: dict[str, int] = {"GPU": 154, "holds it": 62, "GPUs needed": 52, "$/h, all": 64,
                              "headroom": 110, "memory": 96, "$/GPU-hour": 76,
                              "bf16 TFLOPS": 92, "GB/s": 56}


def gpu_dataframe(table: pa.Table, unit: Unit, *, present: bool = False) -> None:
    if present:
        show(table, present=True)
        return

    def text(name: str, label: str | None = None, help: str | None = None) -> Any:
        return st.column_config.TextColumn(label, width=GPU_WIDTHS[name], help=help,
                                           alignment="right")

    st.dataframe(
        table, hide_index=True, width="stretch",
        column_config={
            "GPU": st.column_config.TextColumn(width=GPU_WIDTHS["GPU"], pinned=True),
            "holds it": st.column_config.TextColumn(width=GPU_WIDTHS["holds it"]),
            "GPUs needed": text("GPUs needed", "GPUs", "GPUs needed to hold the run"),
            "$/h, all": text("$/h, all", help="$ per hour for all the GPUs needed"),
            f"headroom ({unit})": text("headroom", f"headroom ({unit})",
                                       "memory left per GPU; negative: short by"),
            f"memory ({unit})": st.column_config.NumberColumn(
                f"memory ({unit})", width=GPU_WIDTHS["memory"], format="%.1f",
                help="as the driver reports it"),
            "$/GPU-hour": text("$/GPU-hour", "$/GPU-h", "typical on-demand $ per GPU-hour"),
            "bf16 TFLOPS": text("bf16 TFLOPS", help="dense bf16 TFLOPS"),
            "GB/s": text("GB/s", help="memory bandwidth (GB/s)"),
        },
        height=min(800, 40 + 36 * max(1, len(table))),
        row_height=34,
    )
