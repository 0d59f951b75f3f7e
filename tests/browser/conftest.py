"""Fixtures for the browser tests: the app served by Streamlit, and headless Chromium.

Needs Debian's `chromium` (apt-get install -y chromium) and the `playwright` Python package; no
`playwright install` (it would download its own browser). Screenshots go to `artifacts/`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("VRAM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
if not Path(CHROMIUM).exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set VRAM_CHROMIUM)",
        allow_module_level=True,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _serve(*extra: str, base_path: str = "") -> Iterator[str]:
    """`streamlit run app.py` on a free port (with `extra` flags) until the block ends; yields
    the app's URL (with `base_path`, for `--server.baseUrlPath`)."""
    port = _free_port()
    log = ARTIFACTS / f"streamlit{base_path.replace('/', '-')}.log"
    ARTIFACTS.mkdir(exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                "app.py",
                "--server.headless",
                "true",
                "--server.port",
                str(port),
                "--server.address",
                "127.0.0.1",
                "--browser.gatherUsageStats",
                "false",
                *extra,
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}{base_path}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                        if r.read().strip() == b"ok":
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"streamlit did not become healthy; see {log}")
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="session")
def server() -> Iterator[str]:
    with _serve() as url:
        yield url


@pytest.fixture(scope="session")
def server_under_path() -> Iterator[str]:
    """The app behind a reverse proxy's sub-path, as docs/app.md serves it: /vram."""
    with _serve("--server.baseUrlPath", "/vram", base_path="/vram") as url:
        yield url


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        yield browser
        browser.close()
