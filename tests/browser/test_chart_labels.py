"""Every chart's text, measured in the browser: no two text boxes overlap, on any screen.

The charts place labels from estimated text extents (ui.label_layout); this checks the real
boxes Chromium draws (`svg text` in each `.js-plotly-plot`) in the states a class sees most,
at 1280 and 1400 px, and on a 400 px phone that the bar stays wide and the labels on screen.
"""

from __future__ import annotations

import itertools
import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

pytestmark = pytest.mark.browser

#: Boxes may touch: a text box includes the font's ascent and descent, so 1 px of shared edge
#: between two lines is not an overlap anyone can see.
TOUCH_PX = 1.0

CALCULATOR_STATES: dict[str, dict[str, str]] = {
    "70b-full": {"model": "llama-3.1-70b", "method": "full"},
    "8b-qlora-4kx4": {"model": "llama-3.1-8b", "method": "qlora", "seq": "4096", "batch": "4"},
    "70b-zero3-64": {"model": "llama-3.1-70b", "method": "full", "gpus": "64",
                     "shard": "zero3"},
    "1b-8kx16": {"model": "llama-3.2-1b", "method": "full", "seq": "8192", "batch": "16"},
    "mixtral-32k": {"model": "mixtral-8x7b-v0.1", "method": "lora", "seq": "32768"},
}
PINS = [
    {"model": "llama-3.1-8b", "method": "full"},
    {"model": "llama-3.1-8b", "method": "lora"},
    {"model": "llama-3.1-8b", "method": "qlora"},
    {"model": "llama-3.1-70b", "method": "qlora"},
]
OTHER_PAGES: dict[str, str] = {
    "compare-4-pins": "/Compare?" + "&".join(
        "pin=" + urllib.parse.quote(json.dumps(p, separators=(",", ":"))) for p in PINS),
    "learn-70b": "/Learn?model=llama-3.1-70b",
}

_MEASURE = """() => {
  const out = [];
  document.querySelectorAll('.js-plotly-plot').forEach((plot, p) => {
    const box = plot.getBoundingClientRect();
    plot.querySelectorAll('svg text').forEach((t) => {
      const text = (t.textContent || '').trim();
      const r = t.getBoundingClientRect();
      const style = getComputedStyle(t);
      if (!text || r.width < 1 || r.height < 1 || style.visibility === 'hidden'
          || style.display === 'none' || style.opacity === '0') return;
      out.push({plot: p, text, l: r.left, t: r.top, r: r.right, b: r.bottom,
                inside: r.left >= box.left - 1 && r.right <= box.right + 1
                        && r.top >= box.top - 1 && r.bottom <= box.bottom + 1});
    });
  });
  return out;
}"""

_BARS = """() => {
  const plot = document.querySelector('.js-plotly-plot');
  return Array.from(plot.querySelectorAll('g.trace.bars g.point path')).map((p) => {
    const r = p.getBoundingClientRect(); return {w: r.width, h: r.height};
  });
}"""


def _open(page: Any, url: str, name: str) -> list[dict[str, Any]]:
    page.goto(url)
    page.locator(".js-plotly-plot svg text").first.wait_for(timeout=90_000)
    page.wait_for_timeout(500)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden", timeout=60_000)
    page.wait_for_timeout(1500)  # plotly lays out after the element appears
    assert not page.locator('[data-testid="stException"]').count(), name
    page.screenshot(path=str(ARTIFACTS / f"labels-{name}.png"), full_page=True)
    boxes: list[dict[str, Any]] = page.evaluate(_MEASURE)
    assert boxes, f"{name}: no chart text found"
    return boxes


def _overlaps(boxes: list[dict[str, Any]]) -> list[str]:
    """Pairs of text boxes that overlap, and text cut by its chart's edge."""
    found = [f"{b['text']!r} cut by the chart's edge" for b in boxes if not b["inside"]]
    for a, b in itertools.combinations(boxes, 2):
        if (a["l"] < b["r"] - TOUCH_PX and b["l"] < a["r"] - TOUCH_PX
                and a["t"] < b["b"] - TOUCH_PX and b["t"] < a["b"] - TOUCH_PX):
            found.append(f"{a['text']!r} over {b['text']!r}")
    return found


def _states() -> list[tuple[str, str]]:
    calc = [(name, "/?" + urllib.parse.urlencode(q)) for name, q in CALCULATOR_STATES.items()]
    return calc + list(OTHER_PAGES.items())


@pytest.mark.parametrize("width", [1280, 1400])
def test_no_chart_text_overlaps(server: str, browser: Any, width: int) -> None:
    page = browser.new_page(viewport={"width": width, "height": 900})
    problems: dict[str, list[str]] = {}
    for name, path in _states():
        boxes = _open(page, server + path, f"{name}-{width}")
        if found := _overlaps(boxes):
            problems[name] = found
    page.close()
    assert not problems, problems


def test_phone_bars_are_wide_and_labels_on_screen(server: str, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 400, "height": 900})
    problems: dict[str, list[str]] = {}
    for name, query in CALCULATOR_STATES.items():
        boxes = _open(page, server + "/?" + urllib.parse.urlencode(query), f"{name}-400")
        found = _overlaps(boxes)
        found += [f"{b['text']!r} off screen ({b['l']:.0f}..{b['r']:.0f} px)"
                  for b in boxes if b["l"] < 0 or b["r"] > 400]
        bars = [bar for bar in page.evaluate(_BARS) if bar["h"] >= 1]
        assert bars, name
        found += [f"bar {bar['w']:.0f} px wide" for bar in bars if bar["w"] < 40]
        if found:
            problems[name] = found
    page.close()
    assert not problems, problems
