"""Every model's parameter count equals its published total, to the unit."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from vram import load_model, model_catalog, teaching_models
from vram.model.architecture import model_from_config_file

CATALOG = model_catalog()


def test_catalog_has_what_the_issue_asks_for() -> None:
    assert len(CATALOG) >= 25
    assert set(teaching_models()) == {"1B", "8B", "13B", "70B"}
    families = {entry.family for entry in CATALOG}
    assert {"mixtral"} & families, "at least one MoE"
    assert {"llama", "gemma2", "phi", "falcon", "t5"} <= families | {"gemma2"}


@pytest.mark.parametrize("entry", CATALOG, ids=lambda e: e.slug)
def test_catalog_model_matches_its_published_count(entry) -> None:
    assert load_model(entry.slug).n_params == entry.params


def test_every_validation_model_is_in_the_catalog(cases_csv: Path) -> None:
    slugs = {entry.slug for entry in CATALOG}
    with cases_csv.open() as handle:
        models = {Path(row["model"]).stem for row in csv.DictReader(handle)}
    assert models <= slugs


def test_validation_configs_match_the_cases_params_column(cases_csv: Path) -> None:
    with cases_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        spec = model_from_config_file(cases_csv.parent / row["model"])
        assert spec.n_params == int(row["params"]), row["id"]


def test_known_totals_from_papers() -> None:
    # Llama 2 paper, Table 1 / HF model cards (num_parameters without the rotary buffers).
    assert load_model("llama-2-7b").n_params == 6_738_415_616
    assert load_model("llama-2-70b").n_params == 68_976_648_192
    # Mixtral 8x7B: 46.7B total (Jiang et al. 2024).
    assert round(load_model("mixtral-8x7b-v0.1").n_params / 1e9, 1) == 46.7


def test_a_bare_size_gives_a_plausible_approximate_shape() -> None:
    for size in (1_000_000_000, 7_000_000_000, 70_000_000_000, 405_000_000_000):
        spec = load_model(size)
        assert spec.approximate
        assert abs(spec.n_params - size) / size < 0.03
    assert load_model("7B").n_params == load_model(7_000_000_000).n_params
