"""Each setup knob is declared once (on its `TrainingSetup` field) and read the same everywhere."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vram.knobs import KnobError, SetupKnob, knob_for, setup_knobs
from vram.setup import TrainingSetup
from vram.validate import setup_from_row

CASES = Path(__file__).resolve().parents[3] / "shared" / "validation" / "cases.csv"


def test_every_field_is_a_knob_with_unique_names() -> None:
    knobs = setup_knobs()
    assert [k.name for k in knobs] == list(TrainingSetup.model_fields)
    for surface in ("key", "flag", "column"):
        names = [getattr(k, surface) for k in knobs if getattr(k, surface)]
        assert len(names) == len(set(names)), surface


def test_ranges_and_choices_come_from_the_field() -> None:
    batch = knob_for("micro_batch")
    assert (batch.kind, batch.low, batch.high, batch.default) == ("int", 1, 4096, 1)
    assert knob_for("method").choices == ("full", "lora", "qlora")
    assert knob_for("method").default == "qlora"
    assert knob_for("compile").optional and knob_for("compile").kind == "bool"
    dropout = knob_for("lora_dropout")
    assert dropout.high_open and not dropout.within(1.0) and dropout.within(0.99)


@pytest.mark.parametrize("knob", setup_knobs(), ids=lambda k: k.name)
def test_default_round_trips_through_text(knob: SetupKnob) -> None:
    assert knob.parse(knob.text(knob.default)) == knob.default


@given(st.integers(-10, 10_000), st.sampled_from(["micro_batch", "seq_len", "n_gpus"]))
def test_numbers_in_range_parse_and_others_say_the_range(number: int, name: str) -> None:
    knob = knob_for(name)
    if knob.within(number):
        assert knob.parse(str(number)) == number
    else:
        with pytest.raises(ValueError, match=r"outside 1 to [\d,]+"):
            knob.parse(str(number))


def test_huge_numbers_are_refused_before_conversion() -> None:
    with pytest.raises(ValueError, match="not a number"):
        knob_for("seq_len").parse("9" * 5000)


def test_inverse_knob_states_the_opposite() -> None:
    once = knob_for("longest_batch_repeats")
    assert once.flag == "--longest-batch-once"
    assert once.parse("true") is False and once.text(False) == "true"


def _row(**cells: str) -> dict[str, str]:
    base = {"method": "lora", "optimizer": "adamw", "precision": "bf16-mixed",
            "micro_batch": "2", "seq_len": "512", "grad_ckpt": "true", "attention": "sdpa",
            "n_gpus": "1", "sharding": "none", "offload": "none", "framework": "hf-trainer",
            "lora_rank": "", "lora_targets": "", "quant": "", "notes": "x"}
    return {**base, **cells}


def test_case_rows_read_columns_with_library_defaults() -> None:
    setup = setup_from_row(_row())
    assert (setup.method.value, setup.micro_batch, setup.seq_len, setup.grad_ckpt) == (
        "lora", 2, 512, True)
    assert setup.lora_rank == TrainingSetup().lora_rank  # empty cell: the library's default


@pytest.mark.parametrize(("cells", "column"), [
    ({"framework": "nope"}, "framework"),
    ({"micro_batch": "0"}, "micro_batch"),
    ({"grad_ckpt": "maybe"}, "grad_ckpt"),
    ({"n_gpus": "8"}, "sharding"),  # a cross-field rule names the column it is about
])
def test_a_bad_cell_names_its_column(cells: dict[str, str], column: str) -> None:
    with pytest.raises(KnobError) as info:
        setup_from_row(_row(**cells))
    assert str(info.value).startswith(f"{column}: ")


@pytest.mark.skipif(not CASES.exists(), reason="needs the shared case file")
def test_every_declared_column_is_in_the_case_file() -> None:
    with CASES.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    for knob in setup_knobs():
        if knob.column:
            assert knob.column in header, knob.column
