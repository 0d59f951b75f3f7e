"""AppTest fixtures: the calculator and its pages, run headless in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
#: Every page of the app, as AppTest names them (a new page is tested without listing it).
PAGES = tuple(sorted(f"pages/{path.name}" for path in (ROOT / "pages").glob("*.py")))


@pytest.fixture
def app() -> AppTest:
    """The calculator, not yet run (set `query_params` first to test links)."""
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)


def open_advanced(app: AppTest) -> AppTest:
    """Open the sidebar's Advanced expander (its controls are drawn only while it is open)."""
    from ui.inputs import ADVANCED

    app.session_state[ADVANCED] = True
    return app
