"""Where the package's data files are: the repository's `data/`, or the copy in the wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir() -> Path:
    """`data/` beside the package in a checkout; `vram/_data` in an installed wheel."""
    for candidate in (_PACKAGE.parent / "data", _PACKAGE / "_data"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("vram data files not found (expected data/ beside vram/)")
