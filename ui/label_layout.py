"""Where chart labels go so that no two overlap: text extents from font size and length.

Plotly places annotations where it is told and does not move them apart, and the figure is
built on the server, which does not know the browser's fonts. So the extents are estimated
from the font size and the number of characters, on the safe side (a wide sans-serif digit is
about 0.55 em; we take 0.6 em), and labels are placed in pixel space, where the figure's fixed
height makes the vertical scale exact. Labels in one column are spread vertically so that no
two boxes share a pixel row; a label that has no room is dropped (its figure stays in the hover
and the tables).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: Advance width of an average character of the chart font, in em (safe side of Arial's digits).
CHAR_WIDTH_EM = 0.6
#: Height of one line of text, in em, including the box plotly draws around an annotation.
LINE_HEIGHT_EM = 1.45

_TAG = re.compile(r"<[^>]+>")


def visible_text(text: str) -> str:
    """The characters a label shows: its HTML tags removed, entities counted as one."""
    return re.sub(r"&[a-z#0-9]+;", "x", _TAG.sub("", text))


def text_width_px(text: str, font_px: float) -> float:
    """Estimated width of the longest line of `text` (``<br>`` breaks lines) at `font_px`."""
    lines = re.split(r"<br\s*/?>", text)
    return max(len(visible_text(line)) for line in lines) * CHAR_WIDTH_EM * font_px


def text_height_px(text: str, font_px: float) -> float:
    """Estimated height of `text`: one line per ``<br>``-separated line."""
    return (len(re.split(r"<br\s*/?>", text))) * LINE_HEIGHT_EM * font_px


def spread_in_column(
    wanted_px: Sequence[float], heights_px: Sequence[float], low_px: float, high_px: float
) -> list[float] | None:
    """Centres (px, upwards) for labels in one column, none overlapping, all in [low, high].

    Each label stays as close to where it is wanted as the others allow: the labels are sorted
    by where they want to be, pushed up from the lowest so that neighbours' boxes just touch,
    then pushed down from the top if the stack ran past `high`. None when they cannot all fit.
    """
    n = len(wanted_px)
    if n == 0:
        return []
    if sum(heights_px) > high_px - low_px:
        return None
    order = sorted(range(n), key=lambda i: wanted_px[i])
    placed: list[float] = []
    previous_top = low_px
    for i in order:
        half = heights_px[i] / 2
        centre = max(wanted_px[i], previous_top + half)
        placed.append(centre)
        previous_top = centre + half
    # Run past the top: push down from the top, keeping the gaps.
    ceiling = high_px
    for slot in range(n - 1, -1, -1):
        half = heights_px[order[slot]] / 2
        if placed[slot] + half > ceiling:
            placed[slot] = ceiling - half
        ceiling = placed[slot] - half
    out = [0.0] * n
    for slot, i in enumerate(order):
        out[i] = placed[slot]
    return out


def boxes_overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float],
                  ) -> bool:
    """Whether two (left, bottom, right, top) boxes share more than an edge."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def free_intervals(obstacles: Sequence[tuple[float, float]], low: float, high: float,
                   ) -> list[tuple[float, float]]:
    """The parts of [low, high] that no obstacle (bottom, top) covers, bottom first."""
    free: list[tuple[float, float]] = []
    start = low
    for bottom, top in sorted(obstacles):
        if bottom > start:
            free.append((start, min(bottom, high)))
        start = max(start, top)
        if start >= high:
            break
    if start < high:
        free.append((start, high))
    return [(a, b) for a, b in free if b > a]


def spread_avoiding(
    wanted_px: Sequence[float], heights_px: Sequence[float],
    obstacles: Sequence[tuple[float, float]], low_px: float, high_px: float,
) -> list[float] | None:
    """Like `spread_in_column`, but no label may cover an obstacle (another label's box, or a
    line a label must not sit on): the labels, in the order they want to be, are shared out
    over the free intervals between obstacles (each interval holds a run of them, spread by
    `spread_in_column`), choosing the sharing that moves them least. None when there is no
    room."""
    n = len(wanted_px)
    order = sorted(range(n), key=lambda i: wanted_px[i])
    gaps = free_intervals(obstacles, low_px, high_px)
    inf = float("inf")
    # best[j][k]: least total move with the first k labels (in order) in the first j gaps
    best = [[inf] * (n + 1) for _ in range(len(gaps) + 1)]
    choice: list[list[tuple[int, list[float]] | None]] = [
        [None] * (n + 1) for _ in range(len(gaps) + 1)]
    best[0][0] = 0.0
    for j, (bottom, top) in enumerate(gaps, start=1):
        for k in range(n + 1):
            for start in range(k + 1):
                if best[j - 1][start] == inf:
                    continue
                run = order[start:k]
                placed = spread_in_column([wanted_px[i] for i in run],
                                          [heights_px[i] for i in run], bottom, top)
                if placed is None:
                    continue
                cost = best[j - 1][start] + sum(
                    abs(p - wanted_px[i]) for p, i in zip(placed, run, strict=True))
                if cost < best[j][k]:
                    best[j][k] = cost
                    choice[j][k] = (start, placed)
    if best[len(gaps)][n] == inf:
        return None
    out = [0.0] * n
    k = n
    for j in range(len(gaps), 0, -1):
        step = choice[j][k]
        assert step is not None
        start, placed = step
        for p, i in zip(placed, order[start:k], strict=True):
            out[i] = p
        k = start
    return out


#: A label that names a line keeps its line this far inside its box (px), so the line is seen
#: to run into it, not past it.
LINE_MARGIN_PX = 4.0


def on_lines(wanted_px: Sequence[float], heights_px: Sequence[float],
             lines_px: Sequence[float], low_px: float, high_px: float) -> list[float] | None:
    """Centres for labels that each name a line (wanted at its line): none overlapping
    another, each moved at most so far that its own line stays inside its box
    (LINE_MARGIN_PX from the edge), and no other line of `lines_px` inside its box, so no
    label can be read as another line's. None when that cannot be done."""
    placed = spread_in_column(wanted_px, heights_px, low_px, high_px)
    if placed is None:
        return None
    for centre, wanted, height in zip(placed, wanted_px, heights_px, strict=True):
        half = height / 2
        if abs(centre - wanted) > half - LINE_MARGIN_PX:
            return None
        if any(abs(line - wanted) > 0.5 and centre - half - 1 <= line <= centre + half + 1
               for line in lines_px):
            return None
    return placed
