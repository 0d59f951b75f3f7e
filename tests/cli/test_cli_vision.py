"""The vision-language inputs on the command line (issue 22): flags, the JSON's `vision`
object and the resolved setup, the text report's token budget, one-line errors."""

from __future__ import annotations

import json

import pytest

from vram.cli import main

ISSUE = ["estimate", "--model", "qwen2.5-vl-7b", "--method", "lora", "--precision",
         "bf16-true", "--seq", "4096", "--images", "2", "--image-height", "1080",
         "--image-width", "1920", "--max-pixels", "1003520"]


def test_the_json_says_the_image_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ISSUE, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    vision = payload["vision"]
    assert (vision["tokens_per_image"], vision["tower_tokens_per_image"]) == (1222, 4888)
    assert vision["image_tokens_per_sample"] == 2444
    assert payload["setup"]["images_per_sample"] == 2
    assert payload["setup"]["freeze_vision"] is False  # the HF Trainer's, resolved


def test_a_text_models_json_has_no_vision(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "llama-3.2-1b", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert "vision" not in payload and payload["setup"]["max_pixels"] is None


def test_the_text_report_gives_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ISSUE) == 0
    out = capsys.readouterr().out
    assert "2 x 1080x1920 px -> 728x1316: 4,888 vision-tower tokens, 1,222 LM tokens" in out
    assert "2,444 image + 1,652 text tokens = 4,096 (--seq)" in out


@pytest.mark.parametrize(("extra", "message"), [
    (["--seq", "2048"], "seq_len: 2 image(s) x 1,222 tokens"),
    (["--image-width", "0"], "--image-width: 0 is outside 1 to 32,768"),
    (["--max-pixels", "lots"], "--max-pixels: 'lots' is not a whole number"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], extra: list[str],
                               message: str) -> None:
    try:
        code = main([*ISSUE, *extra])
    except SystemExit as exc:  # argparse's own refusals exit
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
