"""`python -m vram estimate --from FILE`: the file sets the run, typed flags override it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vram.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_from_file_json_has_setup_and_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--from", str(CONFIGS / "axolotl/llama3-qlora.yml"),
                       "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["setup"]["method"] == "qlora" and payload["setup"]["seq_len"] == 4096
    assert payload["setup"]["micro_batch"] == 2
    assert payload["from"]["format"] == "axolotl"
    assert payload["from"]["fields"]["ckpt_reentrant"] is True  # axolotl normalize_config
    assert any(r["key"] == "sequence_len" for r in payload["from"]["mapping"]["mapped"])
    assert payload["device_peak_bytes"] > 0


def test_typed_flags_override_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "torchtune/llama3_1-8B_full.yaml")
    code, out, _ = run(capsys, "estimate", "--from", path, "--gpus", "8", "--batch", "4",
                       "--json")
    assert code == 0
    setup = json.loads(out)["setup"]
    assert (setup["n_gpus"], setup["micro_batch"], setup["sharding"]) == (8, 4, "zero3")
    assert setup["precision"] == "bf16-true"  # not the --precision default (bf16-mixed)
    code, out, _ = run(capsys, "estimate", "--from", path, "--precision", "fp32",
                       "--override", "batch_size=3", "--json")
    setup = json.loads(out)["setup"]
    assert (setup["precision"], setup["micro_batch"]) == ("fp32", 3)


def test_from_file_text_shows_the_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "estimate", "--from",
                       str(CONFIGS / "llamafactory/llama3_fsdp_qlora_sft.yaml"))
    assert code == 0
    assert out.startswith("Read as llamafactory")
    assert "checkpoints unless told not to" in out


def test_unknown_model_in_file_asks_for_model(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    # Qwen/Qwen3-4B-Instruct-2507 is in the catalog since issue 22: an unknown id stands in
    text = (CONFIGS / "llamafactory/qwen3_lora_sft.yaml").read_text()
    unknown = tmp_path / "unknown_model.yaml"
    unknown.write_text(text.replace("Qwen/Qwen3-4B-Instruct-2507", "acme/Widget-7B"))
    path = str(unknown)
    code, _, err = run(capsys, "estimate", "--from", path)
    assert code == 2
    assert "config.json" in err and "--model" in err
    code, out, _ = run(capsys, "estimate", "--from", path, "--model", "qwen2.5-7b-instruct",
                       "--json")
    assert code == 0 and json.loads(out)["setup"]["lora_rank"] == 8
    known = str(CONFIGS / "llamafactory/qwen3_lora_sft.yaml")
    assert run(capsys, "estimate", "--from", known)[0] == 0


def test_bad_file_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                     tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("base_model: meta-llama/Llama-3.1-8B\nmicro_batch_size: lots\n")
    code, _, err = run(capsys, "estimate", "--from", str(bad))
    assert code == 2
    assert err.strip().endswith("micro_batch_size: must be a whole number, got lots")
    assert err.count("\n") == 1
    code, _, err = run(capsys, "estimate")
    assert code == 2 and "--model" in err


def test_export_command_round_trips(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_file = tmp_path / "run.yml"
    code, _, _ = run(capsys, "export", "--to", "axolotl", "--model", "llama-3.1-8b",
                     "--method", "qlora", "--quant", "nf4", "--lora-rank", "64", "--batch", "4",
                     "--seq", "4096", "--grad-ckpt", "--precision", "bf16-mixed",
                     "--out", str(out_file))
    assert code == 0
    code, out, _ = run(capsys, "estimate", "--from", str(out_file), "--json")
    setup = json.loads(out)["setup"]
    assert (setup["method"], setup["quant"], setup["lora_rank"], setup["micro_batch"],
            setup["seq_len"], setup["grad_ckpt"]) == ("qlora", "nf4", 64, 4, 4096, True)
    code, out, _ = run(capsys, "export", "--to", "trl", "--from",
                       str(CONFIGS / "torchtune/llama3_1-8B_qlora_single_device.yaml"))
    assert code == 0 and "model_name_or_path: meta-llama/Llama-3.1-8B-Instruct" in out
    assert "stack was torchtune" in out


def test_method_flag_drops_the_files_quantized_base(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "estimate", "--from", str(CONFIGS / "axolotl/llama3-qlora.yml"),
                         "--method", "lora", "--json")
    assert code == 0, err
    setup = json.loads(out)["setup"]
    assert (setup["method"], setup["lora_rank"]) == ("lora", 32)
    assert setup["quant"] in (None, "none")


def test_abbreviated_flags_override_too() -> None:
    from vram.cli import build_parser
    from vram.io.readers.cli_hook import explicit_dests
    parser = build_parser()
    dests = explicit_dests(parser, ["estimate", "--from", "x.yml", "--bat", "4",
                                    "--seq=8192", "--json"])
    assert {"micro_batch", "seq_len", "from_file", "json"} <= dests


def test_from_an_ms_swift_script(capsys: pytest.CaptureFixture[str]) -> None:
    """A `swift sft` launch script is read (never run): its environment sets the GPU count."""
    path = str(CONFIGS / "ms-swift/multi-gpu-deepspeed-train_zero3.sh")
    code, out, _ = run(capsys, "estimate", "--from", path, "--json")
    assert code == 0
    payload = json.loads(out)
    assert payload["from"]["format"] == "ms-swift"
    setup = payload["setup"]
    assert (setup["n_gpus"], setup["sharding"], setup["method"]) == (2, "zero3", "lora")
    code, out, _ = run(capsys, "estimate", "--from", path, "--format", "ms-swift", "--gpus",
                       "4", "--json")
    assert code == 0 and json.loads(out)["setup"]["n_gpus"] == 4
    code, _, err = run(capsys, "estimate", "--from", path, "--format", "trl")
    assert code == 2 and err.count("\n") == 1
