"""Showing text a person typed (URL parameters, an uploaded config, its name) as text.

Streamlit renders `st.error`, `st.caption`, `st.markdown` and widget help as Markdown, with
GitHub's autolinks, LaTeX (`$...$`), emoji and colour directives (`:red[...]`). A URL such as
`?method=[Fix](https://evil.example/x)` must show those characters, not a link, and
`![t](http://host/t.png)` must not make the browser fetch an image. `plain` backslash-escapes
every ASCII punctuation character (CommonMark allows that for all of them) and breaks the
patterns GitHub-flavoured Markdown turns into links without any punctuation (`http://`,
`www.`, `a@b.c`) with an invisible zero-width space.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

import streamlit as st

_ZWSP = "\u200b"
_ESCAPE = {ord(ch): "\\" + ch for ch in string.punctuation}
_AUTOLINKS = re.compile(r"(?i)(://|www\.|@)")


def plain(text: object) -> str:
    """`text` as Markdown that renders as exactly these characters, on one line."""
    one_line = " ".join(str(text).split())
    broken = _AUTOLINKS.sub(lambda m: m.group(0)[0] + _ZWSP + m.group(0)[1:], one_line)
    return broken.translate(_ESCAPE)


def error(lines: Iterable[str], *, lead: str = "") -> None:
    """An error box with one paragraph per message; every message is shown as plain text.

    `lead` is the app's own Markdown (trusted), shown first."""
    body = [lead] if lead else []
    body.extend(plain(line) for line in lines)
    st.error("\n\n".join(body))


def shown(markdown: str) -> str:
    """What a reader sees of `plain`'s output (for tests and logs): escapes and breaks undone."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace(_ZWSP, "")
