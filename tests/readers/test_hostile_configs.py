"""Hostile and broken training configs: parsed as data only, refused with a message that names
the key, never executed, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vram.errors import TrainingConfigError
from vram.io.readers import load_training_config
from vram.io.readers.safe_yaml import MAX_EXPANDED_NODES, parse_mapping

AXOLOTL = "base_model: meta-llama/Llama-3.1-8B\nadapter: qlora\nload_in_4bit: true\nlora_r: 16\n"


def refused(text: str, key: str, fragment: str = "", **kwargs: object) -> str:
    with pytest.raises(TrainingConfigError) as info:
        load_training_config(text, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"{key}: "), message
    assert fragment in message, message
    assert "\n" not in message
    return message


def test_billion_laughs_is_refused_quickly() -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in "bcdefghi":
        prev = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [" + ",".join([f"*{prev}"] * 9) + "]")
    refused("\n".join(lines), "file", "YAML aliases")


def test_alias_expansion_is_capped_below_the_alias_count_limit() -> None:
    # 5 levels x 10 aliases = 50 aliases (under the cap) but 10^5+ nodes once expanded.
    lines = ["a: &a [1,2,3,4,5,6,7,8,9,10]"]
    for level in "bcdef":
        prev = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [" + ",".join([f"*{prev}"] * 10) + "]")
    message = refused("\n".join(lines), "file", "expands to more than")
    assert f"{MAX_EXPANDED_NODES:,}" in message


def test_python_tags_are_not_constructed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f'base_model: !!python/object/apply:os.system ["touch {marker}"]\n'
    refused(text, "file", "not valid YAML")
    refused("x: !!python/name:os.system\n", "file", "not valid YAML")
    refused("x: !!python/object/new:subprocess.Popen [[ls]]\n", "file", "not valid YAML")
    assert not marker.exists()


def test_deep_nesting_and_size() -> None:
    refused("a: " + "[" * 200 + "]" * 200, "file", "nested deeper")
    refused("a: " + "x" * 600_000, "file", "too large")


@pytest.mark.parametrize(("line", "key", "fragment"), [
    ("micro_batch_size: 1000000000000000000000000000000", "micro_batch_size", "between 1"),
    ("micro_batch_size: two", "micro_batch_size", "whole number"),
    ("micro_batch_size: 2.5", "micro_batch_size", "whole number"),
    ("micro_batch_size: .inf", "micro_batch_size", "whole number"),
    ("micro_batch_size: true", "micro_batch_size", "whole number"),
    ("sequence_len: -5", "sequence_len", "between 1"),
    ("lora_r: [1, 2]", "lora_r", "whole number"),
    ("gradient_checkpointing: maybe", "gradient_checkpointing", "true or false"),
    ("lora_dropout: 7", "lora_dropout", "between 0"),
    ("load_in_8bit: true", "load_in_8bit", "contradicts load_in_4bit"),
    ("adapter: ia3", "adapter", "not modelled"),
    ("gradient_checkpointing: true\ngradient_checkpointing_kwargs: 3",
     "gradient_checkpointing_kwargs", "mapping"),
    ("lora_target_linear: false\nlora_target_modules: [wq, wk]", "lora_target_modules",
     "none of"),
])
def test_wrong_types_and_contradictions_name_the_key(line: str, key: str, fragment: str) -> None:
    refused(AXOLOTL + line + "\n", key, fragment, format="axolotl")


def test_huge_integer_literal() -> None:
    refused(AXOLOTL + "micro_batch_size: " + "9" * 5000 + "\n", "file", "cannot be read")


def test_unknown_keys_are_listed_with_a_reason() -> None:
    loaded = load_training_config(AXOLOTL + "micro_batch_sise: 4\nnum_epochs: 3\n")
    ignored = {i.key: i.reason for i in loaded.report.ignored}
    assert "check its spelling" in ignored["micro_batch_sise"]
    assert "does not change training memory" in ignored["num_epochs"]
    assert loaded.setup.micro_batch == 1  # the typo did not set it


def test_not_a_mapping_and_nan_json() -> None:
    refused("- a\n- b\n", "file", "mapping")
    refused('{"micro_batch_size": NaN}', "file", "cannot be read")
    refused("", "file", "mapping")


def test_format_that_cannot_be_told() -> None:
    refused("foo: 1\nbar: 2\n", "format", "give --format")


def test_bf16_and_fp16_contradict_in_trl() -> None:
    refused("model_name_or_path: x/y\nbf16: true\nfp16: true\n", "fp16", "contradicts bf16",
            format="trl")


def test_trl_4bit_without_peft() -> None:
    refused("model_name_or_path: x/y\nload_in_4bit: true\n", "load_in_4bit", "use_peft",
            format="trl")


def test_deepspeed_outside_the_folder_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    inner = tmp_path / "inner"
    inner.mkdir()
    config = inner / "run.yml"
    config.write_text(AXOLOTL + "deepspeed: ../outside/ds.json\n")
    loaded = load_training_config(config)
    assert loaded.setup.sharding.value == "none"
    row = next(r for r in loaded.report.mapped if r.key == "deepspeed")
    assert "not read" in row.sets


def test_bad_deepspeed_stage_names_the_key() -> None:
    refused(AXOLOTL + "deepspeed: {zero_optimization: {stage: 7}}\n",
            "deepspeed zero_optimization.stage", "0, 1, 2 or 3")


def test_torchtune_override_values_are_data() -> None:
    recipe = ("model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\n"
              "  lora_attn_modules: [q_proj, v_proj]\n  lora_rank: 8\n"
              "optimizer:\n  _component_: torch.optim.AdamW\nbatch_size: 2\ndtype: bf16\n")
    with pytest.raises(TrainingConfigError, match=r"batch_size: value .* is not a YAML value"):
        load_training_config(recipe, overrides=["batch_size=!!python/object/apply:os.getpid []"])
    with pytest.raises(TrainingConfigError, match="key=value"):
        load_training_config(recipe, overrides=["no equals sign"])
    with pytest.raises(TrainingConfigError, match="overrides"):
        load_training_config(AXOLOTL, overrides=["lora_r=4"])


def test_parse_mapping_accepts_plain_yaml_and_json() -> None:
    assert parse_mapping("a: 1\n") == {"a": 1}
    assert parse_mapping('{"a": 1}') == {"a": 1}


def test_deep_flow_nesting_is_refused_before_the_scanner_goes_quadratic() -> None:
    """Found by the long fuzz run: 50,000 nested `[` took minutes in PyYAML's scanner."""
    import time

    depth = 50_000
    started = time.process_time()
    refused("a: " + "[" * depth + "]" * depth, "file", "nested deeper than 32 levels")
    assert time.process_time() - started < 1.0


# ---- no file system from the app (issue 25) ----------------------------------------------------

def _server_paths(tmp_path: Path) -> dict[str, Path]:
    """Things that exist on a server, each a different kind, and one that does not."""
    import os

    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, '
                      '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}')
    (tmp_path / "folder").mkdir()
    (tmp_path / "not-json.json").write_text("not json")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return {"json file": config, "folder": tmp_path / "folder",
            "bad json": tmp_path / "not-json.json", "fifo": tmp_path / "fifo",
            "device": Path("/dev/zero"), "symlink loop": tmp_path / "loop",
            "missing": tmp_path / "missing.json"}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path: the report cuts long values, which would make
    the paths' reports differ by where the cut falls."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="vr"))
    yield folder
    shutil.rmtree(folder)


def test_without_the_filesystem_a_path_says_the_same_whatever_is_there(short_tmp: Path) -> None:
    from tests.fuzz.surfaces import within
    from vram.io.readers import NOT_IN_CATALOG

    problems = {}
    for kind, path in _server_paths(short_tmp).items():
        text = f"base_model: {path}\nsequence_len: 1024\nmicro_batch_size: 1\n"
        with within(10, what=kind):  # opening the FIFO would hang
            loaded = load_training_config(text, filesystem=False)
        assert loaded.model is None, kind
        problems[kind] = (loaded.model_problem or "").replace(str(path), "PATH")
        # the report says the same for all of them too
        report = " ".join(" ".join(loaded.report.lines()).split())  # columns pad to the path
        problems[kind + " report"] = report.replace(str(path), "PATH")
    assert problems["json file"] == f"'PATH': {NOT_IN_CATALOG}"
    assert len({v for k, v in problems.items() if not k.endswith("report")}) == 1, problems
    assert len({v for k, v in problems.items() if k.endswith("report")}) == 1, problems


def test_without_the_filesystem_catalog_names_and_hub_ids_still_resolve() -> None:
    for ref, slug in (("llama-3.1-8b", "llama-3.1-8b"),
                      ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
                      ("https://huggingface.co/Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct")):
        loaded = load_training_config(f"base_model: {ref}\n", filesystem=False)
        assert loaded.model_slug == slug and loaded.model is not None, ref


def test_without_the_filesystem_the_source_is_text_even_if_it_names_a_file(
        tmp_path: Path) -> None:
    real = tmp_path / "run.yml"
    real.write_text("base_model: llama-3.1-8b\nsequence_len: 4096\n")
    with pytest.raises(TrainingConfigError):  # the path itself, read as YAML: not a mapping
        load_training_config(str(real), filesystem=False)
    assert load_training_config(str(real)).setup.seq_len == 4096  # the CLI reads the file


def test_the_cli_still_resolves_a_model_path(tmp_path: Path) -> None:
    config = _server_paths(tmp_path)["json file"]
    loaded = load_training_config(f"base_model: {config}\n")
    assert loaded.model is not None and loaded.model.hidden_size == 64
