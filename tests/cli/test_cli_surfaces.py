"""Issue 25's CLI breaks: every subcommand answers bad input with one line and exit status 2,
never a traceback and never a hang.

Special files (a FIFO, a device, a 2 GB sparse file) are refused before they are read or
written; `validate-speed` checks its table row by row; `trace` refuses what it cannot trace by
name; a training config with a null key is named; `validate` that scored nothing says so.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.fuzz.more_surfaces import TINY, TINY_MOE
from tests.fuzz.surfaces import within
from vram import TrainingSetup
from vram.cli import commands, main
from vram.paths import data_dir

ROOT = Path(__file__).resolve().parents[2]


def _one_line(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    """Run the CLI (an alarm stops a hang); the exit status and one line on stderr."""
    with within(60, what=argv):
        code = main(argv)
    err = capsys.readouterr().err
    assert code == status, (argv, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"python -m vram {argv[0]}: error: "), err
    return err


@pytest.fixture
def special(tmp_path: Path) -> Iterator[dict[str, Path]]:
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    sparse = tmp_path / "sparse.csv"
    with sparse.open("wb") as handle:
        handle.truncate(2 * 10**9)
    yield {"fifo": fifo, "device": Path("/dev/zero"), "sparse": sparse,
           "random": Path("/dev/urandom"), "folder": tmp_path}


def test_validate_speed_refuses_special_files_before_reading_them(
        special: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    reasons = {"fifo": "pipe (FIFO)", "device": "a device", "sparse": "too large",
               "random": "a device", "folder": "a folder"}
    for kind, path in special.items():
        err = _one_line(["validate-speed", str(path)], capsys)
        assert reasons[kind] in err, (kind, err)


def _table(tmp_path: Path, **changes: str) -> Path:
    rows = list(csv.DictReader((data_dir() / "throughput.csv").open(encoding="utf-8")))
    path = tmp_path / "throughput.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerow({**rows[0], **changes})
    return path


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"tokens_per_second_per_gpu": "0"}, "line 2: tokens_per_second_per_gpu: '0'"),
    ({"tokens_per_second_per_gpu": "inf"}, "line 2: tokens_per_second_per_gpu: 'inf'"),
    ({"tokens_per_second_per_gpu": "nan"}, "line 2: tokens_per_second_per_gpu: 'nan'"),
    ({"tokens_per_second_per_gpu": "1e400"}, "line 2: tokens_per_second_per_gpu"),
    ({"notes": "x" * 200_000}, "line 2: not CSV"),
    ({"n_gpus": "9" * 5000}, "line 2: n_gpus: '99999999999999999999' is not a whole number"),
    ({"n_gpus": "100000000"}, "line 2: n_gpus: Input should be less than or equal to"),
    ({"recompute": "sometimes"}, "line 2: recompute: 'sometimes'; allowed:"),
    ({"gpu": "our-h100"}, "line 2: gpu 'our-h100' is not in the GPU catalog"),
    ({"model": "/dev/zero"}, "line 2: model: config.json /dev/zero: a device"),
])
def test_validate_speed_names_the_row_and_column(tmp_path: Path, changes: dict[str, str],
                                                 fragment: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line(["validate-speed", str(_table(tmp_path, **changes))], capsys)
    assert fragment in err, err


def test_validate_speed_on_an_empty_or_headless_table(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "missing column(s) id, model" in _one_line(["validate-speed", str(empty)], capsys)
    header = tmp_path / "header.csv"
    header.write_text((data_dir() / "throughput.csv").read_text().splitlines()[0] + "\n")
    assert "no rows" in _one_line(["validate-speed", str(header)], capsys)
    noise = tmp_path / "noise.csv"
    noise.write_bytes(b"id,model\n" + b"\xff\xfe\x00\x9c" * 1024)  # what /dev/urandom gives
    assert "line 2 is not UTF-8" in _one_line(["validate-speed", str(noise)], capsys)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_export_out_refuses_a_special_file_before_opening_it(
        kind: str, special: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = special[kind]
    err = _one_line(["export", "--to", "trl", "--model", "llama-3.1-8b", "--method", "lora",
                     "--out", str(path)], capsys)
    assert f"--out {path}: " in err


def test_export_out_writes_a_regular_file(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trl.yml"
    out.write_text("old, longer content that must not survive the rewrite\n" * 10)
    assert main(["export", "--to", "trl", "--model", "llama-3.1-8b", "--method", "lora",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# TRL config") and "old, longer" not in text


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.mark.parametrize("layers", ["0", "-1", "3", "100000"])
def test_trace_layers_has_a_range(layers: str, tiny: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    err = _one_line(["trace", "--model", str(tiny), "--method", "full", "--layers", layers],
                    capsys)
    assert f"n_layers (--layers): {layers}; the config has 2 layers: 1 to 2" in err


@pytest.mark.parametrize("optimizer", ["galore-adamw8bit-per-layer", "adamw-4bit"])
def test_trace_names_an_optimizer_it_does_not_run(optimizer: str, tiny: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    err = _one_line(["trace", "--model", str(tiny), "--method", "full", "--optimizer",
                     optimizer], capsys)
    assert f"optimizer: {optimizer} is not traced" in err


def test_trace_of_moe_lora_at_the_defaults_runs_as_axolotl_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """PEFT's ParamWrapper refuses lora_dropout on the expert banks that all-linear reaches
    (peft@v0.21.2); the trace builds those adapters without it, as axolotl does, and keeps the
    run's dropout on every other adapter: the default 0.05 traces, and holds more than 0."""
    pytest.importorskip("peft")
    config = tmp_path / "moe.json"
    config.write_text(json.dumps(TINY_MOE))
    peaks = {}
    for dropout in ("0.05", "0"):
        assert main(["trace", "--model", str(config), "--method", "lora",
                     "--lora-dropout", dropout, "--json"]) == 0
        peaks[dropout] = json.loads(capsys.readouterr().out)["allocated_peak_bytes"]
    assert peaks["0.05"] > peaks["0"]


@pytest.mark.parametrize("yaml_text", [
    "base_model: llama-3.1-8b\n~: 1\n",
    "base_model: llama-3.1-8b\nnull: 1\n",
    "base_model: llama-3.1-8b\n1: 2\n",
    "base_model: llama-3.1-8b\ndeepspeed:\n  zero_optimization:\n    ~: 3\n",
])
@pytest.mark.parametrize("command", [["estimate"], ["plan"], ["export", "--to", "trl"],
                                     ["rl"]])
def test_a_key_that_is_not_text_is_named(yaml_text: str, command: list[str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.yml"
    path.write_text(yaml_text)
    err = _one_line([*command, "--from", str(path)], capsys)
    assert "a key must be text" in err


def test_validate_that_scores_nothing_says_so(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    cases = (ROOT.parent / "shared" / "validation" / "cases.csv")
    if not cases.exists():
        pytest.skip("the shared case file is not beside the checkout")
    rows = list(csv.DictReader(cases.open(encoding="utf-8")))
    unscored = [r for r in rows if r.get("confidence") == "low"][:3]
    path = tmp_path / "cases.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(unscored)
    for row in unscored:  # model paths are relative to the case file
        source = cases.parent / row["model"]
        target = tmp_path / row["model"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
    assert main(["validate", str(path)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("cases=0 median_abs_pct=n/a") and "nothing scored" in last


@pytest.mark.parametrize("command", ["gpus", "models", "validate", "estimate", "trace",
                                     "export", "plan", "validate-speed", "rl"])
def test_every_subcommand_prints_a_validation_error_as_one_line(
        command: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A pydantic ValidationError from any handler: `field: message`, exit status 2."""
    import vram.cli as cli

    def refuse(*_: object, **__: object) -> int:
        TrainingSetup(micro_batch=0)
        return 0

    handlers = {"gpus": "run_gpus", "models": "run_models", "validate": "run_validate",
                "estimate": "run_estimate", "trace": "run_trace", "export": "run_export"}
    if command in handlers:
        monkeypatch.setattr(commands, handlers[command], refuse)
    elif command == "rl":
        monkeypatch.setattr(cli.rl_cli, "run", refuse)
    else:
        monkeypatch.setattr(cli.plan_cli, "register_handlers",
                            lambda: {"plan": refuse, "validate-speed": refuse})
    argv = {"validate": ["validate", "x.csv"], "estimate": ["estimate", "--model", "1B"],
            "trace": ["trace", "--model", "1B"], "export": ["export", "--to", "trl"],
            "rl": ["rl", "--model", "1B"]}.get(command, [command])
    with pytest.raises(ValidationError):
        TrainingSetup(micro_batch=0)
    err = _one_line(argv, capsys)
    assert err.endswith("error: micro_batch: Input should be greater than or equal to 1\n")
