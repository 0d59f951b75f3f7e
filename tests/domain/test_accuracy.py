"""Accuracy on the published measured runs (../shared/validation/cases.csv)."""

from __future__ import annotations

from pathlib import Path

from vram.validate import run_cases, summarize


def test_every_scored_case_is_estimated(cases_csv: Path) -> None:
    results = run_cases(cases_csv)
    assert all(r.predicted_bytes is not None for r in results), [
        (r.case_id, r.error) for r in results if r.predicted_bytes is None]


def test_issue_targets_on_the_scored_cases(cases_csv: Path) -> None:
    """Issue 4: median absolute error <= 6 % and p90 <= 15 % over the scored rows (issue 2
    asked for 10 % and 25 %)."""
    summary = summarize(run_cases(cases_csv))
    assert summary.cases >= 60
    assert summary.unsupported == 0
    assert summary.median_abs_pct <= 6.0, summary.line()
    assert summary.p90_abs_pct <= 15.0, summary.line()
