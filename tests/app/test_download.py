"""The app's JSON download is the CLI's ``estimate --json``, byte for byte (vram.io.report)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ui import data, results

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("state", "flags"),
    [
        ({"model": "llama-3.1-8b", "method": "full"}, ["--method", "full"]),
        ({"model": "llama-3.1-8b", "method": "qlora", "seq": 4096, "batch": 4},
         ["--method", "qlora", "--seq", "4096", "--batch", "4"]),
    ],
)
def test_download_is_the_cli_json(state: dict[str, object], flags: list[str]) -> None:
    app_text = results.download_json({**data.registry().defaults(), **state})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("VRAM_GPUS_CSV", None)
    cli = subprocess.run(
        [sys.executable, "-m", "vram", "estimate", "--model", str(state["model"]), *flags,
         "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT, env=env,
    )
    assert cli.stdout == app_text
    assert '"buckets": {' in app_text and '"sharding"' in app_text
