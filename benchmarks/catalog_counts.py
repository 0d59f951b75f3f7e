"""Recount the catalog rows whose count comes from transformers, and fail if one moved.

    PYTHONPATH=. .venv/bin/python benchmarks/catalog_counts.py

Rows of `data/models/catalog.csv` whose `params_source` starts with
"transformers 5.24.0 meta-device count" were counted by building the row's config.json with
`AutoConfig.for_model` and instantiating the class a fine-tuner loads on the meta device
(`benchmarks/family_defaults.py`: image-text-to-text where the type has one, else causal LM),
summing `p.numel()` over `model.parameters()`. This script does it again for every such row.

`kimi_k2` is not a transformers model type: Kimi K2's config.json names
`DeepseekV3ForCausalLM` (remote code), so it is built as `deepseek_v3`.
"""

from __future__ import annotations

import csv
import json
import sys
import warnings
from pathlib import Path

from benchmarks.family_defaults import build_config, instantiate

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
PREFIX = "transformers 5.24.0 meta-device count"
#: Hub model types transformers does not register, and the type whose code they run.
BUILT_AS = {"kimi_k2": "deepseek_v3"}


def count(slug: str) -> int:
    config = json.loads((MODELS / f"{slug}.json").read_text())
    model_type = BUILT_AS.get(config["model_type"], config["model_type"])
    return sum(p.numel() for p in instantiate(build_config(model_type, config)).parameters())


def main() -> None:
    warnings.filterwarnings("ignore")
    moved = []
    for name in ("catalog.csv",):
        with (MODELS / name).open(newline="") as handle:
            for row in csv.DictReader(handle):
                if not row["params_source"].startswith(PREFIX):
                    continue
                got = count(row["slug"])
                mark = "ok" if got == int(row["params"]) else "MOVED"
                print(f"{name:<20} {row['slug']:<26} {got:>18,} {mark}")
                if mark != "ok":
                    moved.append(row["slug"])
    if moved:
        sys.exit(f"counts moved: {', '.join(moved)}")


if __name__ == "__main__":
    main()
