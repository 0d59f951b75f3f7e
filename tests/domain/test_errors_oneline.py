"""Error messages are one line even when the key or path a person sent holds control characters."""

from __future__ import annotations

import pytest

import vram
from vram.errors import ConfigError, FileReadError, TrainingConfigError, VramError


def test_a_config_key_with_a_newline_is_named_on_one_line() -> None:
    # Found by the long fuzz run (benchmarks/fuzz.txt, api surface): a key "a\nb" holding a
    # 19-digit number gave a two-line message.
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
              "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "bad\nkey\x01": 10**19}
    with pytest.raises(VramError) as info:
        vram.load_model(config)
    message = str(info.value)
    assert "\n" not in message and "\x01" not in message
    assert message.startswith("bad\\nkey\\x01: must be below 10^18"), message


@pytest.mark.parametrize("error", [
    ConfigError("a\nb", "bad"), TrainingConfigError("a\rb", "bad"),
    FileReadError("model config", "/tmp/a\nb.json", "no such file"),
])
def test_every_error_that_names_input_escapes_it(error: VramError) -> None:
    assert "\n" not in str(error) and "\r" not in str(error)
