"""Library versions as the version knobs read them (`torch_version`, `bitsandbytes_version`,
`liger_version`): leniently, the way case files and people write them."""

from __future__ import annotations

import re

#: major.minor with an optional patch: bitsandbytes and Liger Kernel versions ("0.41.1",
#: "v0.6", "0.6.2.dev0").
MAJOR_MINOR_PATCH = re.compile(r"v?(\d{1,3})\.(\d{1,3})(?:\.(\d{1,3}))?")


def lenient_version(value: object, pattern: re.Pattern[str], what: str) -> object:
    """A version's leading numbers as `pattern` reads them, zero-padded groups joined by dots;
    a case file's "not stated (...)" or "unknown" is None (the knob's default)."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    found = pattern.match(text)
    if found:
        return ".".join(str(int(part)) for part in found.groups(default="0"))
    if not text or text.startswith(("not stated", "unknown", "auto")):
        return None
    raise ValueError(f"{value[:40]!r} is not {what}")
