"""The served app in headless Chromium: move the batch slider, see the total and chart change.

Needs Debian's `chromium` (apt-get install -y chromium) and the `playwright` Python package; no
`playwright install` (it would download its own browser). Screenshots go to `artifacts/`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"


def _expected_peak(**setup: object) -> str:
    """What vram says for the calculator's default run (the library's defaults) + `setup`."""
    import vram
    from ui.charts import format_bytes

    est = vram.estimate(vram.load_model("llama-3.1-8b"), vram.TrainingSetup(**setup))  # type: ignore[arg-type]
    return format_bytes(est.device_peak_bytes, "GB")


def _peak(page: object) -> str:
    metric = page.locator('[data-testid="stMetric"]').first  # type: ignore[attr-defined]
    return str(metric.locator('[data-testid="stMetricValue"]').inner_text()).strip()


def _chart_text(page: object) -> str:
    chart = page.locator(".js-plotly-plot").first  # type: ignore[attr-defined]
    return " | ".join(chart.locator("g.annotation").all_text_contents())


def _wait_idle(page: object) -> None:
    # Streamlit shows a "running" status widget while the script runs.
    page.wait_for_timeout(300)  # type: ignore[attr-defined]
    page.locator('[data-testid="stStatusWidget"]').wait_for(  # type: ignore[attr-defined]
        state="hidden", timeout=20_000
    )


def test_batch_slider_changes_total_and_chart(server: str, browser: object) -> None:
    page = browser.new_page(viewport={"width": 1600, "height": 1100})  # type: ignore[attr-defined]
    page.goto(server)
    page.locator('[data-testid="stMetricValue"]').first.wait_for(timeout=60_000)
    page.locator(".js-plotly-plot g.annotation").first.wait_for(timeout=60_000)
    _wait_idle(page)
    before_total, before_chart = _peak(page), _chart_text(page)
    page.screenshot(path=str(ARTIFACTS / "calculator-before.png"), full_page=True)

    thumb = page.locator('[data-testid="stSlider"] input[type="range"][aria-label^="Micro-batch"]')
    thumb.focus()
    for _ in range(20):  # batch 1 -> 8, as a keyboard user would (a rerun may eat a key)
        if thumb.input_value() == "8":
            break
        thumb.press("ArrowRight")
        page.wait_for_timeout(100)
    expected = _expected_peak(micro_batch=8)
    page.wait_for_function(
        "(want) => { const m = document.querySelector('[data-testid=\"stMetricValue\"]');"
        " return m && m.innerText.trim() === want; }",
        arg=expected,
        timeout=30_000,
    )
    _wait_idle(page)
    after_total, after_chart = _peak(page), _chart_text(page)
    page.screenshot(path=str(ARTIFACTS / "calculator-after.png"), full_page=True)

    assert before_total == _expected_peak(micro_batch=1)
    assert after_total == expected != before_total
    assert after_chart != before_chart
    assert thumb.input_value() == "8"
    assert "batch=8" in page.url  # the link carries the new state
    assert not page.locator('[data-testid="stException"]').count()


#: Horizontal overflow of every table (HTML tables and the grid's scroller), in px.
_OVERFLOW = """() => Array.from(document.querySelectorAll(
  '[data-testid="stTable"], [data-testid="stDataFrame"] .dvn-scroller')).map(
  (e) => e.scrollWidth - e.clientWidth)"""


def test_pages_render_in_the_browser(server: str, browser: object) -> None:
    """Learn, Compare and GPUs at 1280 px (a laptop beside the sidebar): each renders, and
    no table hides columns behind a sideways scroll."""
    page = browser.new_page(viewport={"width": 1280, "height": 1100})  # type: ignore[attr-defined]
    compare = "/Compare?pin=%7B%7D&pin=%7B%22method%22%3A%22full%22%7D"
    for path, name, ready in (
        ("/Learn", "learn", ".js-plotly-plot g.annotation"),
        (compare, "compare", ".js-plotly-plot g.annotation"),
        ("/GPUs", "gpus", '[data-testid="stDataFrame"]'),
    ):
        page.goto(server + path)
        page.locator(ready).first.wait_for(timeout=60_000)
        _wait_idle(page)
        page.wait_for_timeout(800)
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        assert not page.locator('[data-testid="stException"]').count(), name
        overflow = page.evaluate(_OVERFLOW)  # type: ignore[attr-defined]
        assert overflow and max(overflow) <= 1, (name, overflow)
