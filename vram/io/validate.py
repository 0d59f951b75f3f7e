"""Compare estimates with measured training runs from a case file.

The case-file schema is `validation/README.md`'s: one measured run per row, the model as a
config.json path relative to the CSV. Each row is estimated with the same `estimate` the app
uses and compared with the figure of the same kind (`metric`: allocated, active, reserved or
device). Rows of confidence high or medium whose notes do not start with "UPPER BOUND" are
scored. Each row carries the figure's band (`vram.step.bounds`), and the report says how
many measured figures it covers, per metric.

Rows are read through their columns only, never the notes: each column is the case-file name
of a `TrainingSetup` knob (`vram.io.knobs`), so every adjustment made here is one a person can make
through the same input. A `device` figure (nvidia-smi / NVML "used") includes the CUDA context;
a row that measured it on its machine says so in `context_mib`, which sets the setup's knob.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from vram.errors import CatalogError, FileReadError, VramError
from vram.files import read_csv_rows
from vram.io.knobs import SetupKnob, setup_from_texts
from vram.model.architecture import model_from_config_file
from vram.setup import CASE_FILE_DEEPSPEED_NAMES, TrainingSetup
from vram.step.bounds import bounds_table
from vram.step.estimate import estimate

SCORED_CONFIDENCE = frozenset({"high", "medium"})


@dataclass(frozen=True, slots=True)
class CaseResult:
    case_id: str
    method: str
    metric: str
    measured_bytes: int
    predicted_bytes: int | None
    scored: bool
    error: str = ""
    #: The band of the predicted figure (None where the row could not be estimated).
    low_bytes: int | None = None
    high_bytes: int | None = None

    @property
    def in_band(self) -> bool | None:
        if self.low_bytes is None or self.high_bytes is None:
            return None
        return self.low_bytes <= self.measured_bytes <= self.high_bytes

    def band_text(self) -> str:
        """'in', 'below' or 'above' the band; 'n/a' where there is none."""
        if self.in_band is None:
            return "n/a"
        if self.in_band:
            return "in"
        return "below" if self.measured_bytes < (self.low_bytes or 0) else "above"

    def to_json(self) -> dict[str, object]:
        """One row of `validate --json` (design.md)."""
        return {"id": self.case_id, "scored": self.scored, "metric": self.metric,
                "predicted_bytes": self.predicted_bytes, "low_bytes": self.low_bytes,
                "high_bytes": self.high_bytes, "measured_bytes": self.measured_bytes}

    @property
    def pct_error(self) -> float | None:
        if self.predicted_bytes is None or not self.measured_bytes:
            return None
        return 100.0 * (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def _column_name(knob: SetupKnob) -> str:
    return knob.column or knob.name


def _column(knob: SetupKnob) -> str:
    """A knob's case-file column; a knob the schema has no column for may come under its
    field name (`sharding_engine`, which the `sharding` cell also sets)."""
    return knob.column or knob.name


def setup_from_row(row: dict[str, str]) -> TrainingSetup:
    """A TrainingSetup from one case-file row: each knob's column, empty = the default.

    A bad cell raises `KnobError` naming its column. The schema names the sharding engine with
    the stage (DeepSpeed's `zero1-3`, FSDP's `fsdp-*`): without a `sharding_engine` column the
    `sharding` cell sets that knob too, as a person would on the command line; `grad_ckpt =
    selective` is checkpointing with `ckpt_selective`.
    """
    if (row.get("grad_ckpt") or "").strip().lower() == "selective":
        row = {**row, "grad_ckpt": "true", "ckpt_selective": "true"}
    sharding = (row.get("sharding") or "").strip().lower()
    if not (row.get("sharding_engine") or "").strip() and sharding in CASE_FILE_DEEPSPEED_NAMES:
        row = {**row, "sharding_engine": "deepspeed"}
    return setup_from_texts(row, _column_name, _column)


def _is_scored(row: dict[str, str]) -> bool:
    return row.get("confidence", "") in SCORED_CONFIDENCE and not row.get(
        "notes", "").startswith("UPPER BOUND")


#: The columns `run_cases` itself reads; a missing one stops the run with its name.
CASE_COLUMNS = ("id", "model", "method", "metric", "measured_bytes")


def _measured_bytes(path: Path, line: int, row: dict[str, str]) -> int:
    text = row["measured_bytes"].strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise CatalogError(f"case file {path.name} line {line}, column measured_bytes: must be "
                           f"a whole number of bytes (0 to 10^18), got {text[:40]!r}")
    return int(text)


def run_cases(csv_path: str | Path) -> list[CaseResult]:
    """Estimate every row of a case file."""
    path = Path(csv_path)
    results: list[CaseResult] = []
    try:  # a regular UTF-8 CSV with the needed columns; a bad file is named (vram.files)
        rows = read_csv_rows(path, what="case file", required=CASE_COLUMNS)
    except FileReadError as exc:
        raise CatalogError(str(exc)) from None
    for line, row in rows:
        measured = _measured_bytes(path, line, row)
        scored = _is_scored(row)
        try:
            model = model_from_config_file(path.parent / row["model"])
            setup = setup_from_row(row)
            result = estimate(model, setup)
            low, high = result.bounds.band(row["metric"])
            results.append(CaseResult(row["id"], row["method"], row["metric"], measured,
                                      result.figure(row["metric"]), scored, "", low, high))
        except (VramError, ValidationError, ValueError, KeyError, TypeError) as exc:
            message = str(exc).splitlines()[0][:120]
            results.append(CaseResult(row["id"], row.get("method", ""), row.get("metric", ""),
                                      measured, None, scored, message))
    return results


@dataclass(frozen=True, slots=True)
class Summary:
    cases: int
    median_abs_pct: float
    p90_abs_pct: float
    max_abs_pct: float
    unsupported: int
    #: Scored rows with an error to summarize (estimated): 0 means the figures above are not
    #: figures, and `line` says so instead of printing 0.0.
    errors: int = 0

    def line(self) -> str:
        if not self.errors:
            return (f"cases={self.cases} median_abs_pct=n/a p90_abs_pct=n/a max_abs_pct=n/a "
                    "(nothing scored: no row of confidence high or medium that is not an "
                    "upper bound could be estimated)")
        return (f"cases={self.cases} median_abs_pct={self.median_abs_pct:.1f} "
                f"p90_abs_pct={self.p90_abs_pct:.1f} max_abs_pct={self.max_abs_pct:.1f}")


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(results: list[CaseResult]) -> Summary:
    scored = [r for r in results if r.scored]
    errors = [abs(e) for r in scored if (e := r.pct_error) is not None]
    return Summary(
        cases=len(scored),
        median_abs_pct=statistics.median(errors) if errors else 0.0,
        p90_abs_pct=_percentile(errors, 0.9),
        max_abs_pct=max(errors, default=0.0),
        unsupported=sum(1 for r in scored if r.predicted_bytes is None),
        errors=len(errors),
    )


METRICS = ("allocated", "active", "reserved", "device")


def coverage_lines(results: list[CaseResult]) -> list[str]:
    """Per metric, how many scored rows' measured figures fall in their band (each band
    claims `bounds_table().rate`)."""
    lines = []
    for metric in METRICS:
        banded = [r for r in results if r.scored and r.metric == metric and r.in_band is not None]
        if banded:
            inside = sum(1 for r in banded if r.in_band)
            lines.append(f"band {metric:<9} covered={inside}/{len(banded)} "
                         f"({100 * inside / len(banded):.1f} %, claimed "
                         f"{100 * bounds_table().rate:.0f} %)")
    return lines


def report_lines(results: list[CaseResult]) -> list[str]:
    """One line per case (with its band), the band's coverage per metric, per-method
    summaries, then the contract's summary line."""
    lines = [f"{'id':<16} {'method':<6} {'metric':<9} {'predicted':>16} {'low':>16} "
             f"{'high':>16} {'measured':>16} {'error %':>8} {'band':>5}  scored"]
    for r in results:
        err = r.pct_error
        predicted = f"{r.predicted_bytes:,}" if r.predicted_bytes is not None else "unsupported"
        low = f"{r.low_bytes:,}" if r.low_bytes is not None else "n/a"
        high = f"{r.high_bytes:,}" if r.high_bytes is not None else "n/a"
        err_text = f"{err:+.1f}" if err is not None else "n/a"
        lines.append(f"{r.case_id:<16} {r.method:<6} {r.metric:<9} {predicted:>16} {low:>16} "
                     f"{high:>16} {r.measured_bytes:>16,} {err_text:>8} {r.band_text():>5}  "
                     f"{'yes' if r.scored else 'no'}" + (f"  ({r.error})" if r.error else ""))
    lines.append("")
    lines += coverage_lines(results)
    for method in ("full", "lora", "qlora"):
        subset = [r for r in results if r.method == method]
        if subset:
            lines.append(f"{method:<6} " + summarize(subset).line())
    summary = summarize(results)
    if summary.unsupported:
        lines.append(f"unsupported scored cases: {summary.unsupported}")
    lines.append(summary.line())
    return lines
