"""`python -m vram rl`: the design.md JSON keys, and bad flags named in one line."""

from __future__ import annotations

import json

import pytest

from vram.cli import main

FLAGS = ["rl", "--algo", "grpo", "--model", "qwen2.5-7b-instruct", "--method", "lora",
         "--num-generations", "8", "--prompt-len", "512", "--completion-len", "1024",
         "--batch", "8", "--rollout", "colocate", "--gpu-memory-utilization", "0.3",
         "--gpu", "h100-sxm", "--gpu-count", "1"]


def test_json_has_the_design_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*FLAGS, "--sleep", "1", "--beta", "0.04", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for phase in ("generation", "training"):
        buckets = out["phases"][phase]["buckets"]
        assert set(buckets) == {"weights", "gradients", "optimizer", "activations",
                                "rollout_weights", "kv_cache", "overhead"}
        assert sum(buckets.values()) == out["phases"][phase]["device_peak_bytes"]
    assert out["peak_phase"] in ("generation", "training")
    assert out["device_peak_bytes"] == max(out["phases"][p]["device_peak_bytes"]
                                           for p in ("generation", "training"))
    assert out["host_bytes"] >= 7_615_616_512 * 2  # sleep 1 parks the engine's weights
    assert {m["role"] for m in out["models"]} >= {"policy", "reference", "rollout"}
    assert out["phases"]["training"]["buckets"]["kv_cache"] == 0  # slept
    assert out["advice"]
    assert set(out["peak_by_sleep"]) == {"0", "1", "2"}
    assert out["peak_by_sleep"]["1"] == out["device_peak_bytes"]


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(FLAGS) == 0
    assert "generation (training GPUs)" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "named"), [
    (["--rollout", "server", "--sleep", "1"], "sleep"),
    (["--reference", "model", "--beta", "0"], "reference"),
    (["--gpu", "nope"], "--gpu"),
    (["--num-generations", "0"], "num_generations"),
])
def test_bad_flags_exit_2_naming_the_field(extra: list[str], named: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*FLAGS, *extra]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_from_a_trl_grpo_config_with_a_typed_override(capsys: pytest.CaptureFixture[str]) -> None:
    config = "tests/data/configs/trl/open-r1-qwen2.5-1.5b-grpo.yaml"
    assert main(["rl", "--from", config, "--sleep", "2", "--gpu", "h100-sxm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"].startswith("Qwen2.5 1.5B")
    assert out["kv"]["sequences"] == 16  # 1 prompt x num_generations 16
    assert out["kv"]["tokens_per_sequence"] == 1536
    assert out["phases"]["training"]["buckets"]["kv_cache"] == 0  # --sleep 2 typed


def test_rl_without_a_model_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rl"]) == 2
    assert "--model" in capsys.readouterr().err
