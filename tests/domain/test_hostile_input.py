"""Issue 13's breaks, one regression test each: special files, giant numbers, the size parser,
degenerate configs and the API's error types. Every failure is a VramError naming the field."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from vram import ConfigError, VramError, load_model, model_from_config
from vram.errors import CatalogError, FileReadError
from vram.files import read_csv_rows, read_limited, write_text
from vram.gpus import load_gpus
from vram.model.architecture import read_config_text
from vram.model.catalog import load_config, parse_param_count
from vram.model.config_checks import FLOAT_RANGES

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 100}


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    os.mkfifo(path)
    return path


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    path = tmp_path / "loop.json"
    os.symlink(path, path)
    return path


def _fails_fast(call: object, *args: object) -> VramError:
    start = time.monotonic()
    with pytest.raises(VramError) as info:
        call(*args)  # type: ignore[operator]
    assert time.monotonic() - start < 2.0
    assert "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("reader", [load_model, load_config])
def test_devices_are_refused_without_reading(reader: object) -> None:
    error = _fails_fast(reader, "/dev/zero")
    assert "a device, not a regular file" in str(error)


@pytest.mark.parametrize("reader", [load_model, load_config])
def test_a_fifo_as_config_does_not_hang(reader: object, fifo: Path) -> None:
    error = _fails_fast(reader, str(fifo))
    assert "pipe (FIFO)" in str(error)


@pytest.mark.parametrize(("argument", "reason"), [
    ("/tmp", "a folder, not a file"),
    ("a\x00.json", "not a valid file name"),
    ("/no/such/dir/config.json", "no such file"),
    (Path("/dev/null"), "a device"),
])
def test_the_api_raises_only_vram_errors(argument: str | Path, reason: str) -> None:
    error = _fails_fast(load_model, argument)
    assert isinstance(error, ConfigError) and reason in str(error)


def test_a_symlink_loop_is_reported_as_a_loop(loop: Path) -> None:
    assert "symlink loop" in str(_fails_fast(load_model, str(loop)))
    no_suffix = loop.with_suffix("")
    os.symlink(no_suffix, no_suffix)
    assert "symlink loop" in str(_fails_fast(load_model, str(no_suffix)))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_a_permission_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    path.chmod(0)
    assert "permission denied" in str(_fails_fast(load_model, str(path)))


def test_a_permission_error_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Runs as root too (root reads any file): the open itself is refused here."""
    def refuse(*_: object) -> int:
        raise PermissionError(13, "Permission denied")

    path = tmp_path / "config.json"
    path.write_text("{}")
    monkeypatch.setattr(os, "open", refuse)
    error = _fails_fast(load_model, str(path))
    assert "permission denied" in str(error)


def test_a_device_or_fifo_is_never_opened(monkeypatch: pytest.MonkeyPatch, fifo: Path,
                                          tmp_path: Path) -> None:
    """Issue 25: refused before it is opened (opening a device can act), to read or write."""
    opened: list[object] = []
    real_open = os.open

    def spy(path: object, *args: object) -> int:
        opened.append(path)
        return real_open(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", spy)
    for special in ("/dev/zero", "/dev/null", str(fifo)):
        with pytest.raises(FileReadError):
            read_limited(special, 100)
        with pytest.raises(FileReadError):  # FileWriteError is one
            write_text(special, "x")
    assert opened == []
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert read_limited(plain, 100) == b"x" and opened == [plain]


def test_reading_stops_one_byte_past_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 101)
    assert read_limited(path, 101) == b"x" * 101
    with pytest.raises(FileReadError, match="too large"):
        read_limited(path, 100)


@pytest.mark.parametrize("text", ["1e400", "1e309", "1e99999999", "9" * 60 + "B", "1e31"])
def test_absurd_sizes_are_refused_quickly(text: str) -> None:
    error = _fails_fast(load_model, text)
    assert "between 10 million and 10 trillion" in str(error)


def test_sizes_still_parse() -> None:
    assert parse_param_count("7B") == 7_000_000_000
    assert parse_param_count("7e9") == 7_000_000_000
    assert parse_param_count("1.5b") == 1_500_000_000
    assert parse_param_count("1e20") == 10**20  # parsed; the model range check refuses it
    with pytest.raises(ConfigError, match="10 trillion"):
        load_model("1e20")


def test_an_integer_of_5000_digits_in_a_config_is_named(tmp_path: Path) -> None:
    text = '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}"
    path = tmp_path / "config.json"
    path.write_text(text)
    for reader, argument in ((read_config_text, text), (load_model, str(path))):
        error = _fails_fast(reader, argument)
        assert "4,300 digits" in str(error)
    with pytest.raises(ConfigError) as info:
        model_from_config({**LLAMA, "hidden_size": 10**5000})
    assert info.value.field == "hidden_size" and len(str(info.value)) < 200


@pytest.mark.parametrize(("key", "value"), [
    *((key, -0.5) for key in FLOAT_RANGES),
    ("dropout_rate", 7.0),
    ("attention_probs_dropout_prob", 1.5),
    ("rope_theta", float("inf")),
    ("rope_theta", float("nan")),
    ("initializer_range", 10**30),
])
def test_every_numeric_field_has_a_range(key: str, value: float) -> None:
    with pytest.raises(ConfigError) as info:
        model_from_config({**LLAMA, key: value})
    assert info.value.field == key
    assert "must be" in str(info.value)


#: One small config per family whose heads outnumber the hidden units (head width 0).
TOO_MANY_HEADS: dict[str, tuple[dict[str, object], str]] = {
    "llama": ({**LLAMA, "hidden_size": 4, "num_attention_heads": 8, "num_key_value_heads": 8},
              "num_attention_heads"),
    "phi": ({"hidden_size": 4, "num_attention_heads": 8, "intermediate_size": 16,
             "num_hidden_layers": 1, "vocab_size": 10}, "num_attention_heads"),
    "phi3": ({"hidden_size": 4, "num_attention_heads": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "vocab_size": 10}, "num_attention_heads"),
    "falcon": ({"hidden_size": 4, "num_attention_heads": 8, "num_hidden_layers": 1,
                "vocab_size": 10}, "num_attention_heads"),
    "gpt_neox": ({"hidden_size": 4, "num_attention_heads": 8, "num_hidden_layers": 1,
                  "vocab_size": 10}, "num_attention_heads"),
    "bloom": ({"hidden_size": 4, "n_head": 8, "n_layer": 1, "vocab_size": 10}, "n_head"),
    "bert": ({"hidden_size": 4, "num_attention_heads": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "vocab_size": 10}, "num_attention_heads"),
}


@pytest.mark.parametrize("family", sorted(TOO_MANY_HEADS))
def test_more_heads_than_hidden_units_is_refused(family: str) -> None:
    config, key = TOO_MANY_HEADS[family]
    with pytest.raises(ConfigError) as info:
        model_from_config({"model_type": family, **config})
    assert info.value.field == key and "0 units wide" in str(info.value)


@pytest.mark.parametrize(("family", "config", "key"), [
    ("phi", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("phi3", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 3}, "num_kv_heads"),
    ("llama", {"num_key_value_heads": 3}, "num_key_value_heads"),
])
def test_kv_heads_must_divide_the_heads(family: str, config: dict[str, object],
                                         key: str) -> None:
    base = {"model_type": family, "hidden_size": 64, "num_attention_heads": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "vocab_size": 10}
    with pytest.raises(ConfigError) as info:
        model_from_config({**base, **config})
    assert info.value.field == key and "must divide" in str(info.value)
    base_ok = {**base, **{k: v for k, v in config.items() if k != key}, key: 4}
    assert model_from_config(base_ok).n_params > 0


def test_an_uploaded_configs_name_is_its_name_or_path() -> None:
    spec = load_model({**LLAMA, "_name_or_path": "org/Tiny-<b>Llama</b>\x07"})
    assert spec.name == "org/Tiny-bLlama/b"
    assert load_model(json.dumps({**LLAMA, "_name_or_path": "org/x"})).name == "org/x"
    assert load_model(LLAMA).name == "custom model"


def _csv(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "list.csv"
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(("content", "fragment"), [
    (b"id,name\nx,y\n", "missing column(s) segment, memory_bytes"),
    (b"\x00\x01\x02\xff\xfe" * 100, "line 1 is not UTF-8"),
    (b"id,name,segment,memory_bytes\n" + b"a" * 200_000 + b",b,datacenter,1\n",
     "line 2: not CSV (field larger than field limit"),
    (b"id,name,segment,memory_bytes\nh,H,datacenter,1\nx,\xe9,datacenter,1\n", "line 3 is not"),
    (b"id,name,segment,memory_bytes\nh,H,datacenter," + b"9" * 5000 + b"\n", "line 2"),
    (b"id,name,segment,memory_bytes\nh,H,datacenter\n", "line 2"),
])
def test_a_bad_gpu_list_is_named_by_line_or_column(tmp_path: Path, content: bytes,
                                                    fragment: str) -> None:
    path = _csv(tmp_path, content)
    with pytest.raises(CatalogError) as info:
        load_gpus(path)
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("path", ["/dev/zero", "/etc/passwd", "/tmp", "fifo"])
def test_a_gpu_list_that_is_not_a_csv_file_is_refused(path: str, fifo: Path) -> None:
    path = str(fifo) if path == "fifo" else path
    error = _fails_fast(load_gpus, path)
    assert isinstance(error, CatalogError) and path in str(error)


def test_csv_rows_carry_their_physical_line(tmp_path: Path) -> None:
    path = _csv(tmp_path, b'a,b\n1,"two\nlines"\n3\n')
    assert read_csv_rows(path, what="x") == [(3, {"a": "1", "b": "two\nlines"}),
                                             (4, {"a": "3", "b": ""})]
