"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from tests.streamlit_speed import scan_components_once

scan_components_once()

# No per-example deadline: hypothesis' default 200 ms is a wall-clock limit, and on a shared
# 2-core CI box a page rerun or an estimate sweep can take twice that while another process
# runs. Speed has its own measurements (benchmarks/speed.py, app_rerun.py); these tests
# assert what is computed. 16 tests had already opted out one by one.
settings.register_profile("vram", deadline=None)
settings.load_profile("vram")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CASES = SHARED / "validation" / "cases.csv"


@pytest.fixture(scope="session")
def cases_csv() -> Path:
    if not CASES.exists():
        pytest.skip("../shared/validation/cases.csv is not beside the project")
    return CASES
