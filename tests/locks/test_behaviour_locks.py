"""The behaviour locks: every committed figure of the closed form, recomputed and compared.

A refactor must not move a number. These tests read the two committed fingerprints and fail on
any difference, naming the first records that moved:

- `benchmarks/estimate_snapshot.jsonl`: all 3,000 setups of `benchmarks/estimate_snapshot.py`
  (every line item, bucket, peak, phase and moment; a refusal by its text). The whole sample
  runs in about five seconds, so CI regenerates all of it, not a sample.
- `benchmarks/validation.txt`: `python -m vram validate ../shared/validation/cases.csv`, when
  the shared case file is beside the project.

A change that is meant to move numbers regenerates both files (the commands are in each
file's docstring or in the README) and says in its message which rows moved and why.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from benchmarks.estimate_snapshot import DEFAULT_COUNT, SEED, fingerprint, sample_setups
from vram.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "benchmarks" / "estimate_snapshot.jsonl"
VALIDATION = ROOT / "benchmarks" / "validation.txt"


def _first_differences(expected: list[str], actual: list[str], most: int = 3) -> list[str]:
    moved = [f"line {n + 1}: {e[:160]}\n    now: {a[:160]}"
             for n, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a]
    if len(expected) != len(actual):
        moved.append(f"{len(expected)} lines committed, {len(actual)} now")
    return moved[:most] + ([f"... {len(moved) - most} more"] if len(moved) > most else [])


def test_every_snapshot_setup_gives_the_committed_figures() -> None:
    committed = SNAPSHOT.read_text().splitlines()
    now = [json.dumps(fingerprint(slug, fields), sort_keys=True, default=list)
           for slug, fields in sample_setups(DEFAULT_COUNT, SEED)]
    moved = _first_differences(committed, now)
    assert not moved, ("the estimate moved; regenerate benchmarks/estimate_snapshot.jsonl only "
                       "if the change means to, and say why:\n" + "\n".join(moved))


def test_validate_on_the_shared_cases_prints_the_committed_report(cases_csv: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli_main(["validate", str(cases_csv)])
    assert status == 0
    moved = _first_differences(VALIDATION.read_text().splitlines(),
                               out.getvalue().splitlines())
    assert not moved, ("validate moved; regenerate benchmarks/validation.txt only if the change "
                       "means to, and say why:\n" + "\n".join(moved))
