"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.streamlit_speed import scan_components_once

scan_components_once()

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
CASES = SHARED / "validation" / "cases.csv"


@pytest.fixture(scope="session")
def cases_csv() -> Path:
    if not CASES.exists():
        pytest.skip("../shared/validation/cases.csv is not beside the project")
    return CASES
