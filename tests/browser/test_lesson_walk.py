"""The lesson, clicked on the served app: from the default page, 70B full -> LoRA -> QLoRA
with gradient checkpointing reaches "fits one 80 GB GPU" in four clicks without opening
Advanced, and presentation mode at 1280x720 and 1920x1080 walks it with the same numbers, the
headline and chart above the fold, every chart label on its line. And the Learn page's link
to the calculator keeps the path the app is served under."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser import labels

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
#: The walk: the 70B teaching size (checkpointing on, as the lesson), then the methods.
STEPS = (("70B", "qlora"), ("full", "full"), ("lora", "lora"), ("qlora", "qlora"))
_METRICS = """() => Array.from(document.querySelectorAll('[data-testid="stMetric"]')).map((m) =>
  [m.querySelector('[data-testid="stMetricValue"]')?.innerText.trim() ?? '',
   m.querySelector('[data-testid="stMetricDelta"]')?.innerText.trim() ?? ''])"""


#: The headline and the chart's title both show the step's peak (the chart is redrawn).
_SHOWN = """(want) => {
  const m = document.querySelector('[data-testid="stMetricValue"]');
  const t = document.querySelector('.js-plotly-plot .gtitle');
  return m && m.innerText.trim() === want && t && t.textContent.includes(want); }"""


def _expected(method: str) -> str:
    """The peak vram gives the lesson's run (70B, checkpointing on) with `method`."""
    import vram
    from ui.charts import format_bytes

    est = vram.estimate(vram.load_model("llama-3.1-70b"),
                        vram.TrainingSetup(method=method, grad_ckpt=True))  # type: ignore[arg-type]
    return format_bytes(est.device_peak_bytes, "GB")


def _click(page: Any, present: bool, target: str) -> None:
    if target == "70B":
        scope = "main" if present else '[data-testid="stSidebar"]'
        button = page.locator(f'{scope} [data-testid="stButtonGroup"] button').filter(
            has_text=re.compile(r"^\s*70B\s*$"))
    elif present:
        name = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA"}[target]
        button = page.locator('main [data-testid="stButtonGroup"] button').filter(
            has_text=re.compile(rf"^\s*{name}\s*$"))
    else:
        name = {"full": "Full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (4-bit base)"}
        button = page.locator('[data-testid="stSidebar"] label').filter(
            has_text=re.compile(rf"^\s*{re.escape(name[target])}\s*$"))
    button.first.click()


def _walk(page: Any, url: str, present: bool, name: str) -> list[list[list[str]]]:
    """Open the default page, click the four steps; the headline at each, checked."""
    page.goto(url)
    page.locator('[data-testid="stMetricValue"]').first.wait_for(timeout=90_000)
    page.locator(".js-plotly-plot svg text").first.wait_for(timeout=90_000)
    seen = []
    for clicks, (target, method) in enumerate(STEPS, start=1):
        _click(page, present, target)
        want = _expected(method)
        page.wait_for_function(_SHOWN, arg=want, timeout=60_000)
        page.wait_for_timeout(400)  # plotly lays its text out after the title shows
        metrics = page.evaluate(_METRICS)
        seen.append(metrics)
        if clicks == len(STEPS):
            page.screenshot(path=str(ARTIFACTS / f"lesson-{name}.png"))
        assert not page.locator('[data-testid="stException"]').count(), (name, clicks)
        chart = labels.measure(page)[0]  # the breakdown chart
        assert not labels.problems(chart), (name, method, labels.problems(chart))
        if present:
            height = page.viewport_size["height"]
            box = page.locator(".js-plotly-plot").first.bounding_box()
            assert box["y"] + box["height"] <= height + 2, (name, method, "chart below fold")
            last = page.locator('[data-testid="stMetric"]').nth(2).bounding_box()
            assert last["y"] + last["height"] <= height, (name, method, "verdict below fold")
    assert clicks == 4
    return seen


def test_the_lesson_in_four_clicks_and_on_the_projector(server: str, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    normal = _walk(page, server + "/", False, "normal-1280")
    assert page.locator('[data-testid="stSidebar"] [data-testid="stExpander"] details[open]'
                        ).count() == 0, "Advanced was opened"
    page.close()
    peak, _, lesson = normal[-1]
    assert peak == [_expected("qlora"), "at the loss (the backward pass)"], peak
    assert lesson == ["1× 80 GB", "fits one 80 GB GPU"], lesson
    # 70B full: on 16 GPUs each holds 86.7 GB under FSDP1 (the root unit's 128k-vocabulary
    # embedding and head and the all-gather stream's blocks; tests/domain/test_gpu_class.py)
    assert normal[1][2][0] == "32× 80 GB" and "by capacity" in normal[1][2][1]
    for width, height in ((1280, 720), (1920, 1080)):
        page = browser.new_page(viewport={"width": width, "height": height})
        shown = _walk(page, server + "/?present=1", True, f"present-{width}x{height}")
        page.close()
        assert shown == normal, (width, shown, normal)


def test_learn_link_keeps_the_base_path(server_under_path: str, browser: Any) -> None:
    """Served under /vram (docs/app.md's reverse proxy), "Open it in the calculator" opens
    /vram/?..., the calculator with the seed's run, not the server's root ("Not Found")."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(server_under_path + "/Learn")
    link = page.get_by_role("link", name="Open it in the calculator")
    link.wait_for(timeout=90_000)
    href = link.evaluate("(a) => a.href")
    assert href.startswith(server_under_path + "/?"), href
    page.goto(href)
    page.locator('[data-testid="stMetricValue"]').first.wait_for(timeout=90_000)
    assert "Llama 2 7B" in page.locator("body").inner_text()
    page.close()
