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


#: The app's dependencies: none of them is needed by the package or its command line.
APP_ONLY = ("streamlit", "plotly", "pandas")


def test_the_install_is_light() -> None:
    """`pip install vram` installs the estimate and the CLI only; the app's dependencies are
    the `app` extra (httpx's `[cli]`, the other way round)."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml")
                            .read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    assert not [name for name in APP_ONLY if name in core], core
    app = " ".join(project["optional-dependencies"]["app"]).lower()
    assert all(name in app for name in APP_ONLY), app


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "llama-3.2-1b", "--method", "qlora", "--json"],
    ["plan", "--model", "llama-3.1-8b", "--method", "qlora", "--gpu", "rtx-4090", "--json"],
    ["gpus", "--json"],
    ["models"],
])
def test_the_cli_runs_where_the_app_dependencies_cannot_be_imported(argv: list[str]) -> None:
    """An environment without streamlit, plotly or pandas (each import made to fail, as in a
    `pip install vram` without the extra) still imports vram and runs the command line."""
    code = ("import sys\n"
            f"for name in {APP_ONLY!r}:\n"
            "    sys.modules[name] = None  # `import name` now raises ImportError\n"
            "import vram\n"
            "from vram.cli import main\n"
            f"raise SystemExit(main({argv!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()


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
