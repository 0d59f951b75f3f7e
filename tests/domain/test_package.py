"""The package's shape: a curated public API, no Streamlit, typed."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import vram


def test_the_core_is_light() -> None:
    """`import vram` (and its CLI, validation and trace entry points) loads none of the app's
    dependencies: no Streamlit, no plotly, no pandas (a light core, issue 15)."""
    code = ("import sys, vram, vram.cli, vram.io.knobs, vram.io.validate, vram.trace, "
            "vram.io.export, vram.io.readers; "
            "print(sorted(m for m in ('streamlit', 'plotly', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_package_is_typed() -> None:
    assert (Path(vram.__file__).parent / "py.typed").exists()


@pytest.mark.parametrize("module", ["vram.step.estimate", "ui.render", "ui"])
@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning])
def test_a_deprecation_from_our_own_code_fails_the_tests(module: str,
                                                         category: type[Warning]) -> None:
    """pyproject's filterwarnings turn our own modules' deprecations into errors; a library's
    stay warnings (the filters match the module a warning is attributed to)."""
    with pytest.raises(category):
        warnings.warn_explicit("old API", category, "x.py", 1, module=module)
    with warnings.catch_warnings(record=True):
        warnings.warn_explicit("old API", category, "x.py", 1, module="uvicorn.config")
