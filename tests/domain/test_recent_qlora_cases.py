"""Published QLoRA runs on recent stacks (issue 21 item 6), `benchmarks/recent_qlora/cases.csv`:
the ms-swift row reads as the `ms-swift` stack, whose QLoRA base stays bf16 (no
`prepare_model_for_kbit_training`), and its validation report is a lock."""

from __future__ import annotations

import csv
from pathlib import Path

from vram.io.validate import report_lines, run_cases, setup_from_row
from vram.stacks.profile import profile_for

RECENT = Path(__file__).resolve().parents[2] / "benchmarks" / "recent_qlora"


def test_the_swift_row_keeps_its_base_in_bf16() -> None:
    with (RECENT / "cases.csv").open(newline="", encoding="utf-8") as handle:
        rows = {row["id"]: row for row in csv.DictReader(handle)}
    profile = profile_for(setup_from_row(rows["swift-qlora-01"]))
    assert not profile.kbit_prepared and not profile.upcasts_frozen_to_fp32
    assert (profile.precision.frozen_weights, profile.precision.residual) == (2, 2)


def test_validate_reads_the_recent_qlora_cases_as_recorded() -> None:
    """`vram validate benchmarks/recent_qlora/cases.csv` is its validation.txt: swift-qlora-01
    +4.2 % reserved (+42.3 % when ms-swift counted as the HF Trainer's fp32 upcast)."""
    lines = report_lines(run_cases(RECENT / "cases.csv"))
    assert "\n".join(lines) + "\n" == (RECENT / "validation.txt").read_text(encoding="utf-8")
