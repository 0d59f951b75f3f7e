"""Chart labels in the browser: each capacity label on its own line, no label with a line
through it, no two labels overlapping, none cut; in 12 states (10 calculator charts, Compare
and Learn), at 400, 1280 and 1920 px, in normal and presentation mode: 72 charts.

The figures are the app's own (`ui.results.breakdown_figure`, `ui.compare.figure`, built for
the same state as a page), drawn by plotly.js in Chromium at the width the app gives them at
that screen width (measured in the app, CHART_PX): one page per screen width holds all 24 of
its charts, so the whole check takes a few seconds. The lesson's walk
(test_lesson_walk.py) checks the same rules on the served app itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly
import pytest
from plotly.utils import PlotlyJSONEncoder

from tests.browser import labels

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

#: The calculator's chart in 10 states a class meets (URL keys, as the app reads them).
CALCULATOR: dict[str, dict[str, Any]] = {
    "8b-qlora": {},
    "8b-full": {"method": "full"},
    "1b-8kx16": {"model": "llama-3.2-1b", "method": "full", "seq": 8192, "batch": 16},
    "70b-full": {"model": "llama-3.1-70b", "method": "full"},
    "70b-full-ckpt": {"model": "llama-3.1-70b", "method": "full", "ckpt": True},
    "70b-lora-ckpt": {"model": "llama-3.1-70b", "method": "lora", "ckpt": True},
    "70b-qlora-ckpt": {"model": "llama-3.1-70b", "method": "qlora", "ckpt": True},
    "70b-qlora": {"model": "llama-3.1-70b", "method": "qlora"},
    "70b-zero3-64": {"model": "llama-3.1-70b", "method": "full", "gpus": 64,
                     "shard": "zero3"},
    "mixtral-32k": {"model": "mixtral-8x7b-v0.1", "method": "lora", "seq": 32768},
}
COMPARE_PINS = [{"model": "llama-3.1-8b", "method": "full"},
                {"model": "llama-3.1-8b", "method": "lora"},
                {"model": "llama-3.1-8b", "method": "qlora"},
                {"model": "llama-3.1-70b", "method": "qlora"}]

#: The chart's width (px) in the app, by screen width: (calculator, Compare/Learn), measured
#: with Chromium on the served app; presentation mode draws every chart at least
#: ui.present.MIN_FIGURE_PX wide (scrolled on a phone).
CHART_PX: dict[tuple[int, bool], tuple[int, int]] = {
    (400, False): (364, 364), (1280, False): (449, 763), (1920, False): (833, 1403),
    (400, True): (840, 840), (1280, True): (1100, 1100), (1920, True): (1740, 1740),
}


def _figures(present: bool) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, kind, figure dict) of the 12 states in one mode."""
    import vram
    from ui import compare, data, lesson_bar, params, results

    base = data.registry().defaults()
    out: list[tuple[str, str, dict[str, Any]]] = []
    for name, overrides in CALCULATOR.items():
        state = {**base, **overrides}
        assert not results.result(state).errors, name
        fig = results.breakdown_figure(state, "GB", present=present)
        out.append((name, "calculator", fig.to_dict()))
    pinned = []
    for n, pin in enumerate(COMPARE_PINS):
        state = {**base, **pin}
        res = results.result(state)
        assert res.model is not None and res.estimate is not None
        pinned.append((f"{n + 1}. {params.pin_label(state, res.model.name)}", res.estimate))
    out.append(("compare-4-pins", "compare", compare.figure(pinned, "GB",
                                                           present=present).to_dict()))
    model = vram.load_model("llama-3.1-70b")
    three = []
    for method in ("full", "lora", "qlora"):
        setup, _ = params.build_setup({**base, "model": "llama-3.1-70b", "method": method,
                                       "opt": "adamw", "ckpt": True})
        assert setup is not None
        three.append((lesson_bar.SHORT_METHODS[method], vram.estimate(model, setup)))
    out.append(("learn-70b", "compare", compare.figure(three, "GB", present=present,
                                                      height=480).to_dict()))
    return out


def _page(width: int, charts: list[tuple[str, str, dict[str, Any], int]]) -> str:
    divs = "\n".join(f'<div id="c{i}" style="width:{px}px;margin:8px 0"></div>'
                     for i, (_, _, _, px) in enumerate(charts))
    figs = json.dumps([fig for _, _, fig, _ in charts], cls=PlotlyJSONEncoder)
    return f"""<!doctype html><html><head><meta charset="utf-8">
<script src="{PLOTLY_JS.as_uri()}"></script></head>
<body style="margin:0;background:white;width:{max(width, 1760)}px">{divs}
<script>
const figs = {figs};
window.drawn = Promise.all(figs.map((f, i) => Plotly.newPlot('c' + i, f.data, f.layout,
  {{displayModeBar: false, responsive: true}}))).then(() => true);
</script></body></html>"""


@pytest.mark.parametrize("width", [400, 1280, 1920])
def test_labels_sit_on_their_lines_and_never_overlap(browser: Any, tmp_path: Path,
                                                     width: int) -> None:
    charts = []
    for present in (False, True):
        calc_px, compare_px = CHART_PX[(width, present)]
        mode = "present" if present else "normal"
        for name, kind, fig in _figures(present):
            charts.append((f"{name}-{mode}", kind, fig,
                           calc_px if kind == "calculator" else compare_px))
    html = tmp_path / f"charts-{width}.html"
    html.write_text(_page(width, charts), encoding="utf-8")
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.goto(html.as_uri())
    page.evaluate("() => window.drawn")
    page.wait_for_timeout(300)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"label-lines-{width}.png"), full_page=True)
    plots = labels.measure(page)
    page.close()
    assert len(plots) == len(charts) == 24
    found = {name: labels.problems(plot)
             for (name, *_), plot in zip(charts, plots, strict=True)}
    found = {name: lines for name, lines in found.items() if lines}
    assert not found, found
    for (name, kind, _, _), plot in zip(charts, plots, strict=True):
        named = [t for t in plot["texts"] if "·" in t["text"]]
        assert len(named) == len(plot["lines"]), f"{name}: a line without its label"
        if kind == "calculator":
            assert plot["lines"], f"{name}: no capacity line kept"
