"""The estimate against real training steps measured on one H200 (benchmarks/GPU_H200.md).

No GPU needed: the measurements are committed (`benchmarks/gpu_h200.csv`, written by
`benchmarks/gpu_compare.py` from the raw rows of `benchmarks/gpu_measure.py`); the estimate is
computed afresh here, so a change to the closed form that moves these setups shows up.

Tolerance on `max_memory_allocated`: the measurements repeat to the byte (the same setup alone
and after other setups in one process: 13571.3 MiB both times), so the tolerance is the model's
resolution, not noise: 1.5 % for dense models (the worst fully modelled dense row is -1.2 %), 3 %
for mixture-of-experts models, whose real routing is uneven where the estimate assumes it even.
Rows the estimate does not model yet are strict xfails with the reason: when the model learns
them, the xfail turns into a failure and must be removed.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.gpu_compare import model_of, setup_of
from vram import estimate

CSV = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_h200.csv"
MIB = 2**20
DENSE_TOLERANCE = 0.015
MOE_TOLERANCE = 0.03
MOE_MODELS = ("mixtral", "moe", "a3b")

Row = dict[str, str]

#: (predicate, reason): rows the closed form does not model yet (see GPU_H200.md, "Gaps").
KNOWN_GAPS: list[tuple[Callable[[Row], bool], str]] = [
    (lambda r: r["model"] == "gemma-2-2b" and r["attn"] == "sdpa" and r["ckpt"] == "off"
     and r["method"] != "full",
     "Gemma 2 ran SDPA on transformers 5.17 (attn_implementation recorded 'sdpa'); the "
     "estimate assumes Transformers refuses SDPA for Gemma 2 and keeps eager s x s scores"),
    (lambda r: r["model"] == "gemma-2-2b" and r["method"] == "full",
     "Gemma 2 full fine-tune, seq 512: 1.2 GB (5.4 %) more than estimated with either "
     "attention kernel; not explained yet"),
    (lambda r: r["model"] == "llama-3.2-1b" and r["precision"] == "fp32",
     "fp32 full fine-tune: the peak comes in steps 2-3, 1.1 GB (5.1 %) above the estimate; "
     "not explained yet"),
    (lambda r: r["model"] == "llama-3.2-3b" and r["method"] == "full" and r["ckpt"] != "off",
     "3B full fine-tune with checkpointing at seq 4096: 0.8 GB (3.1 %) above the estimate; "
     "not explained yet (the 1B at seq 8192 agrees within 0.3 %)"),
]


def _rows() -> list[Row]:
    with CSV.open() as fh:
        return list(csv.DictReader(fh))


def _gap(row: Row) -> str | None:
    for predicate, reason in KNOWN_GAPS:
        if predicate(row):
            return reason
    return None


def _params() -> list[object]:
    params = []
    for row in _rows():
        reason = _gap(row)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(row, id=f"{row['grid']}:{row['id']}", marks=marks))
    return params


def test_the_committed_measurements_cover_the_grid() -> None:
    rows = _rows()
    assert len(rows) == 61
    assert {r["method"] for r in rows} == {"full", "lora", "qlora"}
    assert {r["ckpt"] for r in rows} == {"off", "nonreentrant", "reentrant"}


@pytest.mark.parametrize("row", _params())
def test_allocated_peak_matches_the_h200(row: Row) -> None:
    est = estimate(model_of(row), setup_of(row))
    measured = float(row["measured_allocated_mib"]) * MIB
    moe = any(key in row["model"] for key in MOE_MODELS)
    tolerance = MOE_TOLERANCE if moe else DENSE_TOLERANCE
    error = (est.allocated_peak_bytes - measured) / measured
    assert abs(error) <= tolerance, f"estimate {error:+.1%} off the measured allocated peak"


def _paged_rows() -> list[object]:
    rows = [r for r in _rows() if r["optimizer"].startswith("paged")
            and float(r["measured_paged_mib"]) > 1024]
    params = []
    for row in rows:
        params.append(pytest.param(row, id=row["id"]))
    return params


@pytest.mark.parametrize("row", _paged_rows())
def test_paged_state_is_what_only_the_device_wide_figure_shows(row: Row) -> None:
    """Paged (managed) optimizer state is outside torch's counters and outside the process's
    own NVML figure; the device-wide used memory shows it (the row ran alone on the GPU)."""
    est = estimate(model_of(row), setup_of(row))
    measured = float(row["measured_paged_mib"]) * MIB
    assert est.paged_bytes == pytest.approx(measured, rel=0.05)
