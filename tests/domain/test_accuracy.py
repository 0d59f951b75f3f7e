"""Accuracy on the published measured runs (../shared/validation/cases.csv)."""

from __future__ import annotations

from pathlib import Path

import vram
from vram.io.validate import run_cases, setup_from_row, summarize


def test_every_scored_case_is_estimated(cases_csv: Path) -> None:
    results = run_cases(cases_csv)
    assert all(r.predicted_bytes is not None for r in results), [
        (r.case_id, r.error) for r in results if r.predicted_bytes is None]


def test_issue_targets_on_the_scored_cases(cases_csv: Path) -> None:
    """Issue 9: median absolute error <= 4 % (holds); p90 <= 15 % (issue 4's bar; issue 9's
    10 % and max 25 % do not hold yet: benchmarks/ACCURACY.md)."""
    summary = summarize(run_cases(cases_csv))
    assert summary.cases >= 60
    assert summary.unsupported == 0
    assert summary.median_abs_pct <= 4.0, summary.line()
    assert summary.p90_abs_pct <= 15.0, summary.line()


def test_device_rows_use_the_context_their_machine_measured() -> None:
    """HF's V100 guide measures a 1,343 MiB CUDA context; its rows say so in the `context_mib`
    column, which sets the setup's knob: the device figure grows by exactly the difference from
    the 1 GiB constant, and the allocated and reserved figures do not move. No notes are read."""
    row = {"method": "full", "optimizer": "adamw", "precision": "fp16-mixed",
           "micro_batch": "4", "seq_len": "512", "grad_ckpt": "false", "attention": "sdpa",
           "n_gpus": "1", "sharding": "none", "offload": "none", "framework": "hf-trainer",
           "notes": "the doc measures 1343 MiB after a 1x1 tensor"}
    model = vram.load_model("llama-3.2-1b")
    plain = vram.estimate(model, setup_from_row(row))
    measured = vram.estimate(model, setup_from_row({**row, "context_mib": "1343"}))
    assert plain.device_peak_bytes - plain.reserved_peak_bytes >= 1024 * 2**20
    assert measured.device_peak_bytes - plain.device_peak_bytes == (1343 - 1024) * 2**20
    assert measured.allocated_peak_bytes == plain.allocated_peak_bytes
    assert measured.reserved_peak_bytes == plain.reserved_peak_bytes
