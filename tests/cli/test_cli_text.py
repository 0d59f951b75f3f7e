"""The CLI's text: labels broken between words, one account of the peak, warnings, ratios."""

from __future__ import annotations

import re

import pytest

import vram
from vram.io.report import estimate_table, inference_line, setup_warnings
from vram.setup import TrainingSetup


@pytest.fixture(scope="module")
def full_8b() -> vram.Estimate:
    return vram.estimate(vram.load_model("llama-3.1-8b"), TrainingSetup(method="full"))


def test_labels_are_never_cut_inside_a_word(full_8b: vram.Estimate) -> None:
    text = estimate_table(full_8b)
    labels = {item.label for b in full_8b.buckets for item in b.items if item.bytes}
    words = {w for label in labels for w in label.split()}
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            body = re.sub(r"\s+\d[\d.,]* GiB\s+\d[\d.,]* GB$", "", line).strip()
            for word in body.split():
                assert word in words, f"{word!r} in {line!r} is cut"


def test_the_peak_line_names_the_moment_the_note_names(full_8b: vram.Estimate) -> None:
    text = estimate_table(full_8b)
    peak = next(line for line in text.splitlines() if line.startswith("peak during"))
    assert "backward pass, at the loss" in peak
    assert "The peak is at the loss" in text


def test_zero3_on_one_gpu_is_said() -> None:
    assert setup_warnings(TrainingSetup(method="full", sharding="zero3"))
    assert not setup_warnings(TrainingSetup(method="full", sharding="zero3", n_gpus=8))


def test_many_gpus_compare_the_whole_run_with_inference() -> None:
    est = vram.estimate(vram.load_model("llama-3.1-70b"),
                        TrainingSetup(method="full", sharding="zero3", n_gpus=32))
    line = inference_line(est)
    whole = est.device_peak_bytes * 32 / est.inference.total_bytes
    assert f"{whole:.1f}x across its 32 GPUs" in line
    assert whole > 1 > est.training_to_inference or whole > est.training_to_inference


def test_every_flag_of_every_command_says_what_it_does() -> None:
    """`--help` of each subcommand: no flag without a line of help (gpus and models --json,
    export --to and plan --nodes had none)."""
    import argparse

    from vram.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = [(name, a.option_strings) for name, command in sub.choices.items()
            for a in command._actions
            if a.option_strings and not a.help and a.dest != "help"]
    assert not bare, bare


def test_text_sizes_are_gb_and_gib_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    """The app shows GB by default; the CLI's text shows GB beside every GiB (gpus, rl, the
    estimate's headroom column), each labelled, never GiB alone."""
    from vram.cli import main

    for argv in (["gpus"], ["rl", "--model", "llama-3.1-8b"],
                 ["estimate", "--model", "llama-3.1-8b"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        lone = [line for line in out.splitlines() if "GiB" in line and " GB" not in line]
        assert not lone, (argv, lone[:3])
