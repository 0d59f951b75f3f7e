"""The README's accuracy table is `validate`'s output, not typed in (issue 9, item 5)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.accuracy_table import END, START, replaced, table
from vram.io.validate import CaseResult, run_cases

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_accuracy_block_equals_the_generated_table(cases_csv: Path) -> None:
    readme = README.read_text(encoding="utf-8")
    block = readme[readme.index(START):readme.index(END) + len(END)]
    assert block == table(run_cases(cases_csv)), (
        "README.md's accuracy table is stale: PYTHONPATH=. python benchmarks/accuracy_table.py "
        "--write")


def test_the_table_counts_only_scored_rows_and_replaces_only_its_block() -> None:
    results = [CaseResult("a", "full", "allocated", 100, 110, True),
               CaseResult("b", "lora", "allocated", 100, 95, True),
               CaseResult("c", "lora", "allocated", 100, 300, False)]
    text = table(results)
    assert "| full | 1 | 10.0 % | 10.0 % | 10.0 % |" in text
    assert "| LoRA | 1 | 5.0 % | 5.0 % | 5.0 % |" in text
    assert "| all | 2 | 7.5 % |" in text
    assert replaced(f"x\n{START}\nold\n{END}\ny", text) == f"x\n{text}\ny"
