"""Presentation mode (`present=1`): the peak and the whole four-bucket chart above the fold of a
1280x720 projector, no sidebar, big type; on the calculator, Learn and Compare. Screenshots at
1280x720 and 1920x1080 go to artifacts/ for a person to look at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
#: The lesson's walk (test_lesson_walk.py) covers 70B in every method; this is the default run.
PAGES = {
    # the default run's cheapest card has a long name ("RTX 6000 Ada Generation"): it wrapped
    # over three lines of big type and pushed the chart past the fold
    "calculator-default": "/?present=1",
    "learn": "/Learn?present=1",
    "compare": "/Compare?present=1&pin=%7B%7D&pin=%7B%22method%22%3A%22full%22%7D",
}


@pytest.mark.parametrize(("width", "height"), [(1280, 720), (1920, 1080)])
def test_presentation_mode_fits_the_projector(server: str, browser: Any, width: int,
                                              height: int) -> None:
    page = browser.new_page(viewport={"width": width, "height": height})
    for name, path in PAGES.items():
        page.goto(server + path)
        page.locator(".js-plotly-plot svg text").first.wait_for(timeout=90_000)
        # The header (and its running indicator) is hidden in this mode: wait for the page to
        # stop changing instead.
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(4000)
        page.screenshot(path=str(ARTIFACTS / f"present-{name}-{width}x{height}.png"))
        assert not page.locator('[data-testid="stException"]').count(), name
        assert not page.locator('[data-testid="stSidebar"]').is_visible(), name
        # tables in the mode's large type (HTML tables there), not the grid's small font
        for cell in page.locator('[data-testid="stTable"] td').all()[:3]:
            assert float(cell.evaluate("(e) => parseFloat(getComputedStyle(e).fontSize)")) >= 18
        if name.startswith("calculator"):
            peak = page.locator('[data-testid="stMetricValue"]').first.bounding_box()
            chart = page.locator(".js-plotly-plot").first.bounding_box()
            assert peak["y"] + peak["height"] <= height, "the peak is below the fold"
            assert chart["y"] + chart["height"] <= height + 2, "the chart runs past the fold"
            size = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector("
                                 "'[data-testid=\"stMetricValue\"]')).fontSize)")
            assert size >= 48, "the peak is not large type"
    page.close()
