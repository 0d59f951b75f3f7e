"""Fuzz the command line with generated argument lists: exit 0 with a sound result or exit 2
with a message, never a traceback, within 5 s. In-process for speed, plus real processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings

from tests.fuzz.surfaces import ROOT, SPECIAL, cli_argv, run_cli

FUZZ = settings.get_profile("fuzz")


@FUZZ
@given(argv=cli_argv())
def test_any_argument_list(argv: list[str]) -> None:
    run_cli(argv)


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "/dev/zero", "--json"],
    ["estimate", "--model", SPECIAL["fifo"]],
    ["estimate", "--model", "1e99999999", "--batch", "9" * 5000],
    ["validate", "/etc/passwd"],
    ["estimate", "--model", "llama-3.2-1b", "--json", "--gpus", "8", "--sharding", "zero3"],
])
def test_real_processes(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "vram", *argv], cwd=ROOT, timeout=20,
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode in (0, 2) and "Traceback" not in done.stderr, done.stderr[-500:]
    assert (done.returncode == 0) == ("llama-3.2-1b" in argv)
