"""What serving the app to a team relies on: server settings, pinned image, the load client."""

from __future__ import annotations

import asyncio
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from benchmarks import load

ROOT = Path(__file__).resolve().parents[2]


def test_server_settings_keep_reruns_cheap() -> None:
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    # A full gc.collect(2) after every run was a third of the server's CPU (benchmarks/load.txt).
    assert config["runner"]["postScriptGC"] is False
    assert config["server"]["fileWatcherType"] == "none"
    assert config["browser"]["gatherUsageStats"] is False  # nothing written to ~/.streamlit


def _lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements" / "app.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"app.lock: {line!r} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_lock_pins_every_app_dependency_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _lock()
    for text in project["dependencies"]:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} is not in requirements/app.lock"
        assert req.specifier.contains(pins[name]), f"{req.name}=={pins[name]} outside {text}"
    assert "torch" not in pins  # the image has no trace extra


def test_image_installs_the_lock_and_keeps_its_health_check() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "--constraint requirements/app.lock" in dockerfile
    assert "/_stcore/health" in dockerfile.split("HEALTHCHECK", 1)[1]
    assert re.search(r"^ENV HOME=/tmp", dockerfile, re.M)  # read-only root: writes go to /tmp
    assert re.search(r"^USER \d+:\d+$", dockerfile, re.M)
    assert "--constraint requirements/app.lock" in (ROOT / "scripts" / "test.sh").read_text()


def test_load_client_only_talks_to_loopback() -> None:
    load.loopback_only("ws://127.0.0.1:8501/_stcore/stream")
    with pytest.raises(SystemExit, match="loopback"):
        load.loopback_only("ws://10.0.0.7:8501/_stcore/stream")


@pytest.mark.slow
def test_load_client_renders_and_moves_the_slider() -> None:
    """Two sessions against a real server: first render, one slider move, no errors."""
    port = load.free_port()
    with load.served(port) as pid:
        url = f"ws://127.0.0.1:{port}/_stcore/stream"
        wave = asyncio.run(load.wave(url, [pid], 2, "distinct", 0))
    assert wave.errors == []
    assert wave.runs == 4
    assert all(r.first_s is not None and r.change_s is not None for r in wave.results)
    assert wave.cpu_s > 0 and wave.rss_mib[0] > 50
