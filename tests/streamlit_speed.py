"""Scan for Streamlit components once per process, not on every AppTest run.

Streamlit 1.5x+ `AppTest.run()` calls `discover_and_register_components()`, which reads the
metadata of every installed distribution (`streamlit/components/v2/manifest_scanner.py`,
`scan_component_manifests`). A real server does that once at start-up
(`streamlit/runtime/runtime.py`); under AppTest it is ~95 % of a page run's CPU in a venv with
torch and transformers (cProfile of 15 fuzz renders: 136 of 143 s). The installed set cannot
change inside a test process, so the first scan's answer is kept.
"""

from __future__ import annotations

import functools

from streamlit.components.v2 import manifest_scanner


def scan_components_once() -> None:
    """Replace the scanner with a cached copy of itself (idempotent)."""
    scan = manifest_scanner.scan_component_manifests
    if not hasattr(scan, "cache_info"):
        manifest_scanner.scan_component_manifests = functools.cache(scan)  # type: ignore[assignment]
