"""Accuracy on the published measured runs (../shared/validation/cases.csv)."""

from __future__ import annotations

from pathlib import Path

from vram.validate import context_correction, run_cases, summarize


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


def test_device_rows_use_the_context_their_machine_measured() -> None:
    """HF's V100 guide measures a 1,343 MiB CUDA context; its nvidia-smi rows are scored with
    it instead of the estimate's 1 GiB constant. Other rows and metrics are left alone."""
    notes = "device memory = ... + CUDA context (the doc measures 1343 MiB after a 1x1 tensor)"
    assert context_correction({"metric": "device", "notes": notes}) == (1343 - 1024) * 2**20
    assert context_correction({"metric": "reserved", "notes": notes}) == 0
    assert context_correction({"metric": "device", "notes": "nvidia-smi"}) == 0
