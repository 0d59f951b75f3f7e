"""docs/stacks.md, generated from the stack table (a test keeps the file equal to it):

    python -m vram.stacks.docs > docs/stacks.md
"""

from __future__ import annotations

from vram.setup import Framework
from vram.stacks.table import BEHAVIOURS, OVERLAYS, stacks

#: How the knob-defaults table names an overlay's column.
_OVERLAY_LABELS = {"when_adapters": "LoRA/QLoRA", "when_sharded_qlora": "sharded QLoRA"}


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "n/a"
    if value == "":
        return "none"  # an empty setting: the library's own defaults (alloc_conf)
    return str(getattr(value, "value", value))


def _knob_columns() -> list[tuple[str, str, str]]:
    """(part, field, label) of each knob default: `defaults` first, then each overlay."""
    base = stacks()[Framework.HF_TRAINER]
    columns = [("defaults", field, field) for field in base.defaults]
    for part in OVERLAYS:
        columns += [(part, field, f"{field} ({_OVERLAY_LABELS[part]})")
                    for field in getattr(base, part)]
    return columns


def stacks_markdown() -> str:
    """The knob defaults and behaviours of every stack, each value with its numbered source."""
    rows = stacks()
    sources: dict[str, int] = {}

    def cite(framework: Framework, part: str, name: str) -> str:
        row = rows[framework]
        value = getattr(row, name) if part == "" else getattr(row, part)[name]
        source = row.sources[f"{part}.{name}" if part else name]
        number = sources.setdefault(source, len(sources) + 1)
        return f"{_cell(value)} [{number}]"

    columns = _knob_columns()
    lines = [
        "# Training stacks: knob defaults and behaviours",
        "",
        "Generated from `data/stacks.toml` by `python -m vram.stacks.docs`; "
        "`tests/domain/test_tables.py` keeps this file equal to it. Each value names the "
        "source it was read from (`file@version`, numbered below). A setup's own value "
        "overrides the stack's default (`vram.stacks.resolve`).",
        "",
        "## Knob defaults",
        "",
        "| stack | " + " | ".join(label for _, _, label in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for framework in rows:
        cells = [cite(framework, part, field) for part, field, _ in columns]
        lines.append(f"| {framework.value} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Behaviours",
        "",
        "| behaviour | " + " | ".join(f.value for f in rows) + " |",
        "|---" * (len(rows) + 1) + "|",
    ]
    for name in BEHAVIOURS:
        cells = [cite(framework, "", name) for framework in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Sources", ""]
    lines += [f"{number}. {source}" for source, number in sources.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(stacks_markdown(), end="")
