"""An exact trace of one training step: a real PyTorch step on fake tensors, every byte counted.

Optional: needs the `trace` extra (torch, transformers, peft): `pip install -e '.[trace]'`
from a checkout.
This package imports without them; `trace_available()` says whether a trace can run, and
`trace_step` raises `TraceUnavailable` with the install command when it cannot.

    >>> from vram.trace import trace_step
    >>> result = trace_step(config_dict, TrainingSetup(method="full", precision="bf16-true"))
    >>> result.allocated_peak_bytes, result.phase, result.buckets
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from vram.trace.report import TimelinePoint, TraceResult

if TYPE_CHECKING:
    from vram.setup import TrainingSetup

__all__ = ["TimelinePoint", "TraceResult", "TraceUnavailable", "trace_available", "trace_step"]

#: `vram` is installed from a checkout (it is not on PyPI, where the name is another project's),
#: so the hint installs the extra from the checkout's root.
INSTALL_HINT = "pip install -e '.[trace]' (from the project's checkout)"
REQUIRED = ("torch", "transformers", "peft")


class TraceUnavailable(RuntimeError):
    """The trace extra is not installed."""


def missing_packages() -> list[str]:
    """The packages of the trace extra that cannot be imported here."""
    return [name for name in REQUIRED if not _installed(name)]


def _installed(name: str) -> bool:
    if name in sys.modules and sys.modules[name] is None:  # import blocked
        return False
    return _findable(name)


@functools.cache
def _findable(name: str) -> bool:
    # Searched once per process: the app asks on every rerun (about 1 ms of path scanning),
    # and what is installed does not change while it runs.
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def trace_available() -> bool:
    """Whether torch, transformers and peft are installed, so `trace_step` can run."""
    return not missing_packages()


def trace_step(config: dict[str, Any], setup: TrainingSetup, *,
               n_layers: int | None = None) -> TraceResult:
    """Trace one training step of `config` under `setup` (see `vram.trace.step.trace_step`)."""
    missing = missing_packages()
    if missing:
        raise TraceUnavailable(
            f"the exact trace needs {', '.join(missing)}: {INSTALL_HINT}")
    from vram.trace.step import trace_step as _trace_step

    return _trace_step(config, setup, n_layers=n_layers)
