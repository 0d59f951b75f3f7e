"""What a chart's labels look like in the browser, and the rules they must keep.

`measure(page)` reads every plotly chart on the page as Chromium drew it: each text box, and
each capacity line with its pixel height (from plotly's own axis, `_fullLayout`). `problems`
checks, by positions and not only by overlaps:

- no two text boxes overlap, and none is cut by its chart's edge;
- a capacity label ("H100 · 85.5 GB") has exactly one line through its box, that line is the
  one its figure names, and the line runs inside it (not along its edge);
- no other label (a bucket's, a bar's total) has a capacity line through it.

Used by the chart test (many states at once in one page) and by the lesson's walk (the app).
"""

from __future__ import annotations

import itertools
import re
from typing import Any

#: Boxes may touch: a text box includes the font's ascent and descent.
TOUCH_PX = 1.0
#: A capacity line must run at least this far inside its label's box.
INSIDE_PX = 2.0

MEASURE_JS = """() => {
  const plots = [];
  document.querySelectorAll('.js-plotly-plot').forEach((plot) => {
    const box = plot.getBoundingClientRect();
    const fl = plot._fullLayout;
    if (!fl || box.width < 1) return;
    const top = box.top + fl._size.t;
    const px = (v) => top + fl.yaxis.l2p(v);
    const lines = [];
    (plot.data || []).forEach((t) => {
      if (t.type === 'scatter' && t.mode === 'lines' && t.y && t.y.length === 2
          && t.y[0] === t.y[1] && (t.hovertemplate || '').includes('capacity')) {
        lines.push({value: t.y[0], y: px(t.y[0])});
      }
    });
    (fl.shapes || []).forEach((s) => {
      if (s.type === 'line' && s.yref === 'y' && s.y0 === s.y1) {
        lines.push({value: s.y0, y: px(s.y0)});
      }
    });
    const texts = [];
    plot.querySelectorAll('svg text').forEach((t) => {
      const text = (t.textContent || '').trim();
      const r = t.getBoundingClientRect();
      const style = getComputedStyle(t);
      if (!text || r.width < 1 || r.height < 1 || style.visibility === 'hidden'
          || style.display === 'none' || style.opacity === '0') return;
      const ann = t.closest('g.annotation');
      texts.push({text, l: r.left, t: r.top, r: r.right, b: r.bottom,
                  annotation: !!ann,
                  inside: r.left >= box.left - 1 && r.right <= box.right + 1
                          && r.top >= box.top - 1 && r.bottom <= box.bottom + 1});
    });
    plots.push({lines, texts, width: box.width});
  });
  return plots;
}"""

_SIZE = re.compile(r"·\s*([\d,.]+)\s*(GB|GiB)")


def measure(page: Any) -> list[dict[str, Any]]:
    plots: list[dict[str, Any]] = page.evaluate(MEASURE_JS)
    return plots


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["l"] < b["r"] - TOUCH_PX and b["l"] < a["r"] - TOUCH_PX
            and a["t"] < b["b"] - TOUCH_PX and b["t"] < a["b"] - TOUCH_PX)


def _labels(texts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Annotation text, a multi-line label joined into one box (plotly draws one text
    element with a tspan per line, so one box already)."""
    return [t for t in texts if t["annotation"]]


def problems(plot: dict[str, Any]) -> list[str]:
    """Every broken rule in one measured chart, as readable lines."""
    texts, lines = plot["texts"], plot["lines"]
    found = [f"{t['text']!r} cut by the chart's edge" for t in texts if not t["inside"]]
    found += [f"{a['text']!r} over {b['text']!r}"
              for a, b in itertools.combinations(texts, 2) if _overlap(a, b)]
    for label in _labels(texts):
        through = [line for line in lines if label["t"] + 0.5 < line["y"] < label["b"] - 0.5]
        named = _SIZE.search(label["text"].replace("\u00a0", " "))
        if named is None:  # a bucket's label or a total: no line may run through it
            found += [f"{label['text']!r} has the {line['value']:.1f} line through it"
                      for line in through]
            continue
        if len(through) != 1:
            found.append(f"{label['text']!r} has {len(through)} lines through it")
            continue
        line = through[0]
        shown = float(named.group(1).replace(",", ""))
        if abs(line["value"] - shown) > max(0.06, 0.006 * shown):
            found.append(f"{label['text']!r} sits on the {line['value']:.1f} line")
        if not label["t"] + INSIDE_PX <= line["y"] <= label["b"] - INSIDE_PX:
            found.append(f"{label['text']!r}: its line runs along its edge")
    return found
