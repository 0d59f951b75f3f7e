"""The command-line contract of design.md: flags, JSON keys, exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vram.cli import build_parser, main
from vram.cli.flags import setup_from_args
from vram.io.knobs import setup_knobs
from vram.setup import TrainingSetup

ESTIMATE = ["estimate", "--model", "llama-3.1-8b", "--method", "qlora", "--optimizer", "adamw",
            "--precision", "bf16-mixed", "--batch", "1", "--seq", "2048"]


def test_estimate_json_has_the_contract_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ESTIMATE, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload["buckets"]) == {"weights", "gradients", "optimizer", "activations",
                                       "overhead"}
    assert all(isinstance(v, int) for v in payload["buckets"].values())
    assert isinstance(payload["allocated_peak_bytes"], int)
    assert isinstance(payload["device_peak_bytes"], int)
    assert sum(payload["buckets"].values()) == payload["device_peak_bytes"]
    assert isinstance(payload["inference"]["total_bytes"], int)
    cheapest = payload["cheapest"]
    assert cheapest and {"gpu", "count", "usd_per_hour"} <= set(cheapest[0])
    priced = [c["usd_per_hour"] for c in cheapest if c["usd_per_hour"] is not None]
    assert priced == sorted(priced)
    # the cheapest are sure fits; where fewer GPUs likely do, they are listed as borderline
    assert all(c["verdict"] == "fits" and c["device_high_bytes"] <= c["device_peak_bytes"]
               + c["headroom_bytes"] for c in cheapest)
    assert all(b["verdict"] == "borderline" and 0.5 <= b["fit_probability"] < 0.95
               for b in payload["borderline"])


def test_estimate_json_bounds_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """design.md: bounds: {allocated|reserved|device: {low_bytes, high_bytes}}, ints, around
    the figure, at the rate the calibration claims."""
    assert main([*ESTIMATE, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    bounds = payload["bounds"]
    assert set(bounds) == {"allocated", "reserved", "device"}
    for figure, band in bounds.items():
        assert set(band) == {"low_bytes", "high_bytes"}
        assert all(isinstance(v, int) for v in band.values())
        assert band["low_bytes"] <= payload[f"{figure}_peak_bytes"] <= band["high_bytes"]
    assert payload["bounds_rate"] == 0.9


def test_validate_json_rows(cases_csv: Path) -> None:
    """design.md: {"rows": [{id, scored, metric, predicted_bytes, low_bytes, high_bytes,
    measured_bytes}, ...]}, one per case, in the text report's order."""
    out = subprocess.run([sys.executable, "-m", "vram", "validate", str(cases_csv), "--json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)["rows"]
    assert rows and all(set(row) == {"id", "scored", "metric", "predicted_bytes", "low_bytes",
                                     "high_bytes", "measured_bytes"} for row in rows)
    for row in rows:
        if row["predicted_bytes"] is not None:
            assert row["low_bytes"] <= row["predicted_bytes"] <= row["high_bytes"]
    text = subprocess.run([sys.executable, "-m", "vram", "validate", str(cases_csv)],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert [line.split()[0] for line in text[1:len(rows) + 1]] == [row["id"] for row in rows]
    assert any(line.startswith("band ") and "covered=" in line for line in text)


def test_every_documented_flag_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "--model", "llama-3.1-70b", "--method", "lora", "--lora-rank", "8",
            "--lora-targets", "q_proj,v_proj", "--quant", "none", "--optimizer",
            "paged-adamw-8bit", "--precision", "bf16-true", "--batch", "2", "--seq", "4096",
            "--grad-ckpt", "--attention", "flash", "--gpus", "8", "--sharding", "zero3",
            "--offload", "optimizer", "--framework", "torchtune", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["device_peak_bytes"] > 0


def test_config_json_path_works(capsys: pytest.CaptureFixture[str]) -> None:
    config = Path(__file__).resolve().parents[2] / "data" / "models" / "phi-2.json"
    assert main(["estimate", "--model", str(config), "--method", "full", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"]["total"] == 2_779_683_840


@pytest.mark.parametrize(("argv", "flag"), [
    (["estimate", "--model", "llama-3.1-8b", "--batch", "0"], "--batch"),
    (["estimate", "--model", "llama-3.1-8b", "--batch", "many"], "--batch"),
    (["estimate", "--model", "llama-3.1-8b", "--seq", "-5"], "--seq"),
    (["estimate", "--model", "llama-3.1-8b", "--method", "dora"], "--method"),
    (["estimate", "--model", "llama-3.1-8b", "--optimizer", "adam9"], "--optimizer"),
    (["estimate", "--model", "llama-3.1-8b", "--method", "lora", "--quant", "nf4"], "--quant"),
    (["estimate", "--model", "llama-3.1-8b", "--gpus", "4"], "--sharding"),
    (["estimate", "--model", "llama-3.1-8b", "--lora-targets", "x_proj"], "--lora-targets"),
    (["estimate", "--model", "no-such-model"], "model"),
    (["estimate"], "--model"),
])
def test_bad_flags_exit_2_with_one_line_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        code = main(argv)
        raise SystemExit(code)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert flag in err


def test_gpus_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    assert len(gpus) >= 20 and all(isinstance(g["memory_bytes"], int) for g in gpus)


def test_validate_last_line_is_the_contract(cases_csv: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "vram", "validate", str(cases_csv)],
                         capture_output=True, text=True, check=True).stdout
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"cases=\d+ median_abs_pct=\d+\.\d p90_abs_pct=\d+\.\d max_abs_pct=\d+\.\d", last)
    assert "unsupported" not in out


def test_text_output_labels_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ESTIMATE) == 0
    out = capsys.readouterr().out
    assert "GiB" in out and "GB" in out and "device peak" in out


def test_single_longest_batch_drops_the_previous_step(capsys: pytest.CaptureFixture[str]) -> None:
    """LitGPT keeps the previous step's graph into the next forward; with one longest batch
    there is no equally long previous step, and the estimate says less."""
    base = ["estimate", "--model", "llama-3.2-1b", "--method", "qlora", "--quant", "nf4",
            "--framework", "litgpt", "--precision", "bf16-true", "--seq", "1024", "--json"]
    assert main(base) == 0
    repeats = json.loads(capsys.readouterr().out)["allocated_peak_bytes"]
    assert main([*base, "--single-longest-batch"]) == 0
    single = json.loads(capsys.readouterr().out)["allocated_peak_bytes"]
    assert single < repeats


def test_flags_default_to_the_library_defaults() -> None:
    """One source of defaults: no setup flag gives exactly `TrainingSetup()`."""
    args = build_parser().parse_args(["estimate", "--model", "llama-3.2-1b"])
    assert setup_from_args(args) == TrainingSetup()


def test_every_knob_has_its_flag() -> None:
    """Each knob's flag takes its default's text (`--quant auto`, `--no-grad-ckpt`)."""
    parser = build_parser()
    for knob in setup_knobs():
        if knob.kind != "bool":
            flag = [knob.flag, knob.text(knob.default)]
        elif knob.default is None:
            continue  # `--compile` / `--no-compile`, or neither for the stack's default
        else:
            flag = [knob.flag if knob.outer(knob.default) else f"--no-{knob.flag[2:]}"]
        args = parser.parse_args(["estimate", "--model", "x", *flag])
        assert setup_from_args(args) == TrainingSetup(), flag


@pytest.mark.parametrize(("argv", "message"), [
    (["--batch", "0"], "--batch: 0 is outside 1 to 4,096"),
    (["--lora-dropout", "1"], "--lora-dropout: 1 is outside at least 0 and below 1"),
    (["--gpus", "8"], "--sharding: 8 GPUs need a strategy"),
    (["--method", "full", "--quant", "nf4"], "--quant: nf4 is for QLoRA"),
])
def test_errors_name_the_flag_and_the_range(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(["estimate", "--model", "llama-3.2-1b", *argv]))
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_estimate_json_setup_speaks_the_case_file(capsys: pytest.CaptureFixture[str]) -> None:
    """design.md: `estimate --json` includes the resolved setup in the case-file vocabulary."""
    argv = ["estimate", "--model", "llama-3.2-1b", "--grad-ckpt", "--gpus", "2", "--sharding",
            "fsdp-full", "--framework", "litgpt", "--torch-version", "2.1.0", "--json"]
    assert main(argv) == 0
    setup = json.loads(capsys.readouterr().out)["setup"]
    contract = {"method", "lora_rank", "lora_targets", "quant", "optimizer", "precision",
                "micro_batch", "seq_len", "grad_accum", "grad_ckpt", "ckpt_reentrant",
                "fsdp_version", "attention", "loss", "compile", "n_gpus", "sharding", "offload",
                "framework"}
    assert contract <= set(setup)
    # the stack's defaults, resolved: LitGPT QLoRA is NF4, chunked loss, eager, FSDP1,
    # non-reentrant checkpointing
    assert (setup["quant"], setup["loss"], setup["compile"], setup["fsdp_version"],
            setup["ckpt_reentrant"], setup["torch_version"]) == (
        "nf4", "chunked", False, 1, False, "2.1")
    assert setup["longest_batch_once"] is False and setup["lora_targets"] == "all-linear"


def test_new_knob_flags_reach_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    # bitsandbytes <= 0.43.0 kept the 4-bit matmul's input, which reentrant checkpointing drops
    base = ["estimate", "--model", "llama-3.2-1b", "--grad-ckpt", "--json",
            "--bitsandbytes-version", "0.41.1"]
    peaks = {}
    for extra in ([], ["--ckpt-reentrant"], ["--context-mib", "2048"],
                  ["--bitsandbytes-version", "0.50.2"]):
        assert main([*base, *extra]) == 0
        peaks[tuple(extra)] = json.loads(capsys.readouterr().out)["device_peak_bytes"]
    assert peaks[("--ckpt-reentrant",)] < peaks[()]
    assert peaks[("--bitsandbytes-version", "0.50.2")] < peaks[()]
    assert peaks[("--context-mib", "2048")] - peaks[()] == 1024 * 2**20


def test_compile_loss_flag_reaches_the_record_and_the_loss(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--compile --no-compile-loss` (torchtitan@9dec370: blocks compiled, loss eager) comes
    back under the case-file column `compile_loss`, and the eager fp32 loss costs more."""
    base = ["estimate", "--model", "llama-3.2-1b", "--method", "full", "--optimizer", "adamw",
            "--precision", "bf16-mixed", "--seq", "4096", "--framework", "torchtitan",
            "--compile", "--json"]
    peaks = {}
    for flag in ("--compile-loss", "--no-compile-loss"):
        assert main([*base, flag]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["setup"]["compile"], out["setup"]["compile_loss"]) == (
            True, flag == "--compile-loss")
        peaks[flag] = out["allocated_peak_bytes"]
    assert peaks["--no-compile-loss"] > peaks["--compile-loss"]
