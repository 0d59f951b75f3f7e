"""The closed-form reserved and device figures beside what was measured (issue 21, item 2).

    PYTHONPATH=. python benchmarks/reserved_closed_form.py [--rows]

Prints the |error| median / p90 / max of the estimate's allocated, reserved and device figures
on the 61 H200 steps (`benchmarks/gpu_h200_raw/`, compared as `gpu_compare.py` does), then on
the shared case file's scored rows (all metrics, and the reserved and device rows alone), then
the warm time of one `estimate()`. `--rows` adds every H200 row's reserved error and the
measured and estimated slack (reserved - allocated) in MiB, so a term's effect can be read row
by row. Targets (issue 21): H200 reserved median <= 2 %, p90 <= 5 %; case file median <= 3 %,
p90 <= 8 %, max <= 20 %; `estimate()` under 0.15 ms warm.
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path

from benchmarks.gpu_compare import compare, model_of, setup_of
from vram import estimate
from vram.io.validate import CaseResult, _percentile, run_cases

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "benchmarks" / "gpu_h200_raw"
CASES = ROOT.parent / "shared" / "validation" / "cases.csv"


def h200_rows() -> list[dict[str, object]]:
    """The measured rows that ran, with their grid, as `gpu_compare.main` reads them."""
    rows: list[dict[str, object]] = []
    for path in sorted(RAW.glob("grid*/rows*.jsonl")):
        context = json.loads((path.parent / "context.json").read_text())
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("status") == "ok":
                rows.append(dict(row, grid=path.parent.name,
                                 ran_alone=path.name == "rows_alone.jsonl",
                                 idle_device_used=context["device_used_before"]))
    return rows


def stats(errors: list[float]) -> str:
    absolute = [abs(e) for e in errors]
    if not absolute:
        return "n=0"
    return (f"n={len(absolute):>2} median {_percentile(absolute, 0.5):5.2f} %  "
            f"p90 {_percentile(absolute, 0.9):5.2f} %  max {max(absolute):5.2f} %")


def h200_table(show_rows: bool) -> None:
    compared = [compare(row) for row in h200_rows()]
    print("H200 steps (61): |error| of the estimate")
    for metric in ("allocated", "reserved", "device"):
        errors = [float(c[f"{metric}_error_pct"]) for c in compared
                  if c[f"{metric}_error_pct"] is not None]
        print(f"  {metric:<9} {stats(errors)}")
    if show_rows:
        print(f"  {'reserved %':>10} {'slack meas':>10} {'slack est':>10}  row")
        for c in compared:
            slack_measured = c["measured_reserved_mib"] - c["measured_allocated_mib"]
            slack_estimated = c["estimate_reserved_mib"] - c["estimate_allocated_mib"]
            print(f"  {c['reserved_error_pct']:>+10.1f} {slack_measured:>10.0f} "
                  f"{slack_estimated:>10.0f}  {c['grid']}:{c['id']}")


def case_table() -> None:
    results = [r for r in run_cases(CASES) if r.scored]

    def errors(subset: list[CaseResult]) -> list[float]:
        return [e for r in subset if (e := r.pct_error) is not None]

    print("shared case file: |error| of the scored rows")
    print(f"  {'all':<9} {stats(errors(results))}")
    for metric in ("reserved", "device"):
        print(f"  {metric:<9} {stats(errors([r for r in results if r.metric == metric]))}")


def warm_time_ms() -> float:
    row = h200_rows()[0]
    model, setup = model_of(row), setup_of(row)
    estimate(model, setup)
    runs = 200
    return 1000.0 * min(timeit.repeat(lambda: estimate(model, setup), number=runs,
                                      repeat=3)) / runs


def main(argv: list[str]) -> None:
    h200_table("--rows" in argv)
    case_table()
    print(f"estimate() warm: {warm_time_ms():.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
