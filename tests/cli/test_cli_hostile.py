"""Issue 13's CLI breaks: special files, absurd sizes and bad CSVs exit 2 with one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vram.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    start = time.monotonic()
    code = main(argv)
    assert time.monotonic() - start < 5.0
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize("model", ["/dev/zero", "/tmp", "1e400", "1e309", "1e99999999",
                                   "a\x00.json"])
def test_estimate_refuses_in_one_line(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["estimate", "--model", model], capsys)
    assert code == 2
    assert err.startswith("python -m vram estimate: error: model: ") and err.count("\n") == 1


def test_a_fifo_model_does_not_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    code, err = _run(["estimate", "--model", str(fifo)], capsys)
    assert code == 2 and "pipe (FIFO)" in err


@pytest.mark.parametrize(("content", "fragment"), [
    (None, "missing column(s) id, model, method, metric, measured_bytes"),  # /etc/passwd
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xd8" * 50, "line 1 is not UTF-8"),
    (b"id,model,method,metric,measured_bytes\n" + b"x" * 300_000 + b"\n", "line 2: not CSV"),
    (b"id,model,method,metric,measured_bytes\na,m.json,full,allocated,12\n"
     b"b,m.json,full,allocated,\xff\n", "line 3 is not UTF-8"),
    (b"id,model,method,metric,measured_bytes\na,m.json,full,allocated,lots\n",
     "line 2, column measured_bytes"),
])
def test_validate_names_the_bad_row_or_column(tmp_path: Path, content: bytes | None,
                                               fragment: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = Path("/etc/passwd") if content is None else tmp_path / "cases.csv"
    if content is not None:
        path.write_bytes(content)
    code, err = _run(["validate", str(path)], capsys)
    assert code == 2 and fragment in err and err.count("\n") == 1, err


@pytest.mark.parametrize("path", ["/dev/zero", "/tmp", "fifo"])
def test_validate_refuses_special_files(path: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    if path == "fifo":
        path = str(tmp_path / "cases.csv")
        os.mkfifo(path)
    code, err = _run(["validate", path], capsys)
    assert code == 2 and path in err


@pytest.mark.parametrize("content", [None, b"id,name\n", b"\xff" * 64])
def test_a_bad_team_gpu_list_exits_2(tmp_path: Path, content: bytes | None) -> None:
    """VRAM_GPUS_CSV=/dev/zero (or a broken list) is named; nothing is read without limit."""
    path = "/dev/zero"
    if content is not None:
        path = str(tmp_path / "gpus.csv")
        Path(path).write_bytes(content)
    env = {**os.environ, "VRAM_GPUS_CSV": path, "PYTHONPATH": str(ROOT)}
    for argv in (["gpus"], ["estimate", "--model", "llama-3.2-1b"]):
        done = subprocess.run([sys.executable, "-m", "vram", *argv], env=env, timeout=30,
                              capture_output=True, text=True, check=False)
        assert done.returncode == 2, done.stderr
        assert "GPU list" in done.stderr and path in done.stderr
        assert "Traceback" not in done.stderr
