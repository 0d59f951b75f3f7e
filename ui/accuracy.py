"""'How right is it?': predicted against measured for the shared runs and the H200 runs, and
the exact trace's agreement; pure functions (no Streamlit), the page only draws them.

Sources: `../shared/validation/cases.csv` (published measured runs, estimated by
`vram.io.validate.run_cases`; absent in the Docker image, which the page says), the committed
H200 measurements `benchmarks/gpu_h200.csv`, and the trace grid `benchmarks/trace_grid.txt`.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from ui.charts import BUCKET_COLORS, FONT_FAMILY, SMALL_FONT_SIZE
from vram.io import validate
from vram.result import BucketName
from vram.units import GB, MIB

ROOT = Path(__file__).resolve().parents[1]
CASES_CSV = ROOT.parent / "shared" / "validation" / "cases.csv"
H200_CSV = ROOT / "benchmarks" / "gpu_h200.csv"
TRACE_GRID = ROOT / "benchmarks" / "trace_grid.txt"

METHOD_COLORS = {"full": BUCKET_COLORS[BucketName.WEIGHTS],
                 "lora": BUCKET_COLORS[BucketName.GRADIENTS],
                 "qlora": BUCKET_COLORS[BucketName.OPTIMIZER]}


@dataclass(frozen=True)
class Point:
    """One measured run against the estimate for it."""

    case_id: str
    source: str
    stack: str
    method: str
    metric: str
    measured_bytes: int
    predicted_bytes: int

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def shared_points(path: Path = CASES_CSV) -> tuple[list[Point], list[validate.CaseResult]]:
    """The shared case file's scored, estimated rows; ([], []) when the file is not there."""
    if not path.exists():
        return [], []
    with path.open(newline="", encoding="utf-8") as handle:
        stacks = {row["id"]: row.get("framework") or "hf-trainer" for row in csv.DictReader(handle)}
    results = validate.run_cases(path)
    points = [Point(r.case_id, PUBLISHED, stacks.get(r.case_id, "?"), r.method, r.metric,
                    r.measured_bytes, r.predicted_bytes)
              for r in results if r.scored and r.predicted_bytes is not None and r.measured_bytes]
    return points, results


_H200_METRICS = (("allocated", "measured_allocated_mib", "estimate_allocated_mib"),
                 ("reserved", "measured_reserved_mib", "estimate_reserved_mib"),
                 ("device", "measured_nvml_process_mib", "estimate_device_mib"))


def h200_points(path: Path = H200_CSV) -> list[Point]:
    """The committed H200 measurements: allocated, reserved and device figures per run."""
    if not path.exists():
        return []
    points = []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            for metric, measured, predicted in _H200_METRICS:
                if row.get(measured) and row.get(predicted):
                    points.append(Point(row["id"], OURS, row["framework"],
                                        row["method"], metric,
                                        round(float(row[measured]) * MIB),
                                        round(float(row[predicted]) * MIB)))
    return points


#: The two kinds of run, never mixed in one figure: runs others measured and published (what
#: the README's accuracy table and `vram validate` count: one figure each), and the project's
#: own GPU steps (each measured three ways: allocated, reserved, nvidia-smi).
PUBLISHED = "published runs"
OURS = "H200 runs (ours)"
SOURCES: tuple[str, ...] = (PUBLISHED, OURS)


def filter_points(points: Iterable[Point], *, stacks: Sequence[str] = (),
                  methods: Sequence[str] = (), metrics: Sequence[str] = (),
                  source: str | None = None) -> list[Point]:
    """Points of one source whose stack, method and metric are among those chosen (none
    chosen: all)."""
    return [p for p in points
            if (source is None or p.source == source)
            and (not stacks or p.stack in stacks) and (not methods or p.method in methods)
            and (not metrics or p.metric in metrics)]


def error_summary(points: Sequence[Point]) -> dict[str, float]:
    """Cases, median and largest absolute error (%), as `vram validate` reports them."""
    errors = sorted(abs(p.error_pct) for p in points)
    if not errors:
        return {"cases": 0, "median_abs_pct": 0.0, "max_abs_pct": 0.0}
    mid = len(errors) // 2
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    return {"cases": len(errors), "median_abs_pct": round(median, 1),
            "max_abs_pct": round(errors[-1], 1)}


def source_note(source: str, points: Sequence[Point]) -> str:
    """What a source's figures are, with the whole source's summary (the README's, for the
    published runs)."""
    mine = [p for p in points if p.source == source]
    whole = error_summary(mine)
    if source == PUBLISHED:
        return (f"All {whole['cases']:,} scored published runs: median "
                f"{whole['median_abs_pct']:.1f} %, largest {whole['max_abs_pct']:.1f} %, as in "
                "the README's accuracy table (`python -m vram validate`). Our own H200 steps are "
                "counted apart (the other choice above).")
    runs = len({p.case_id for p in mine})
    return (f"{runs:,} steps the project ran on one H200, each measured three ways: "
            f"{whole['cases']:,} figures, median {whole['median_abs_pct']:.1f} %, largest "
            f"{whole['max_abs_pct']:.1f} % (benchmarks/gpu_h200.csv). Not in the README's "
            "table, which counts published runs only.")


@dataclass(frozen=True)
class TraceAgreement:
    rows: int
    agreeing: int
    max_abs_peak_pct: float


def trace_agreement(path: Path = TRACE_GRID) -> TraceAgreement | None:
    """The trace grid's rows (estimate against the exact fake-tensor trace): how many agree and
    the largest peak difference; None when the file is not there."""
    if not path.exists():
        return None
    rows = agreeing = 0
    worst = 0.0
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) < 14 or fields[-1] not in ("yes", "no"):
            continue
        peaks = [float(f.rstrip("%")) for f in fields if re.fullmatch(r"[+-]\d+\.\d%", f)]
        if not peaks:
            continue
        rows += 1
        agreeing += fields[-1] == "yes"
        worst = max(worst, abs(peaks[-1]))
    return TraceAgreement(rows, agreeing, worst)


def scatter_figure(points: Sequence[Point], *, height: int = 560) -> go.Figure:
    """Predicted against measured (GB), one colour per method, the y = x line of a perfect
    estimate; the hover names the run, its stack and its error."""
    traces: list[dict[str, Any]] = []
    top = max([max(p.measured_bytes, p.predicted_bytes) / GB for p in points] + [1.0]) * 1.05
    traces.append({"type": "scatter", "mode": "lines", "x": [0, top], "y": [0, top],
                   "name": "y = x (exact)", "line": {"color": "#333", "dash": "dash"},
                   "hoverinfo": "skip"})
    for method in sorted({p.method for p in points}):
        mine = [p for p in points if p.method == method]
        traces.append({
            "type": "scatter", "mode": "markers", "name": method,
            "x": [p.measured_bytes / GB for p in mine],
            "y": [p.predicted_bytes / GB for p in mine],
            "customdata": [[p.case_id, p.stack, p.metric, f"{p.error_pct:+.1f} %"] for p in mine],
            "hovertemplate": ("%{customdata[0]}<br>%{customdata[1]}, %{customdata[2]}<br>"
                              "measured %{x:.1f} GB, predicted %{y:.1f} GB "
                              "(%{customdata[3]})<extra></extra>"),
            "marker": {"size": 11, "color": METHOD_COLORS.get(method, "#999"),
                       "line": {"color": "white", "width": 1}},
        })
    return go.Figure({"data": traces, "layout": {
        "height": height, "font": {"size": SMALL_FONT_SIZE, "family": FONT_FAMILY},
        "plot_bgcolor": "white", "paper_bgcolor": "white",
        "margin": {"l": 92, "r": 16, "t": 64, "b": 64},
        "xaxis": {"title": {"text": "measured (GB)"}, "range": [0, top], "gridcolor": "#e5e5e5",
                  "automargin": True},
        "yaxis": {"title": {"text": "predicted (GB)"}, "range": [0, top],
                  "gridcolor": "#e5e5e5", "automargin": True},
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    }}, _validate=False)
